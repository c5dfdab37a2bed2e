package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"time"

	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/store"
)

const (
	// onlineIdle is how long the writers apply changes with no run in
	// progress, in each round.
	onlineIdle = 2 * time.Second
	// onlineLead is how long the writers run before the rebuild starts, so
	// that changes arrive at their rate from the run's first item; and
	// after it ends, so that the changes after its publish land on the new
	// keys.
	onlineLead = 100 * time.Millisecond
)

// onlineResult is the online section: the latency of Rebuilder.Apply with
// and without a run in progress, and a rebuild of the multi workload while
// changes arrive at a steady rate, next to the same rebuild with none.
type onlineResult struct {
	Items    int     `json:"items"`
	Rounds   int     `json:"rounds"`
	Workload string  `json:"workload"`
	Rate     float64 `json:"changes_per_s"`
	Writers  int     `json:"writers"`
	// The bounds of the catch-up, as the runs had them.
	PublishTail    int           `json:"publish_tail"`
	MaxChanges     int           `json:"max_changes"`
	CatchUpTimeout time.Duration `json:"catch_up_timeout_ns"`
	// Quiet is the rebuild with no changes, Online the same with changes
	// arriving; Ratio compares them round by round.
	Quiet   series        `json:"quiet"`
	Online  series        `json:"online"`
	Runs    []onlineRound `json:"rounds_detail"`
	Summary onlineSummary `json:"summary"`
	// BacklogChanges is -online-backlog, and Backlog the runs that caught
	// up with such a backlog, one per round.
	BacklogChanges int            `json:"backlog_changes,omitempty"`
	Backlog        []backlogRound `json:"backlog,omitempty"`
}

// onlineRound is what one round measured besides the runs' samples.
type onlineRound struct {
	// Idle is the Apply calls with no run in progress; During those that
	// started and ended while the rebuild ran.
	Idle   latency `json:"idle_apply"`
	During latency `json:"during_apply"`
	// Applied is the Apply calls that overlapped the rebuild, AppliedRate
	// their rate.
	Applied     int     `json:"applied_during_run"`
	AppliedRate float64 `json:"applied_per_s_during_run"`
	// Replayed and CatchUp are the online run's Stats.Changes and
	// Stats.CatchUp; QuietCatchUp the quiet run's Stats.CatchUp.
	Replayed     int64         `json:"replayed"`
	CatchUp      time.Duration `json:"catch_up_ns"`
	QuietCatchUp time.Duration `json:"quiet_catch_up_ns"`
	// Ratio is the online run's items/s over the quiet run's.
	Ratio float64 `json:"ratio"`
	// Changed is the items the round changed in all, every one checked
	// after each run.
	Changed int `json:"items_changed"`
	// Backlog is the round's run with a backlog, with -online-backlog.
	Backlog *backlogRound `json:"-"`
}

// spread is a median and min–max over rounds.
type spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func newSpread(xs []float64) spread {
	if len(xs) == 0 {
		return spread{}
	}
	return spread{Median: median(xs), Min: slices.Min(xs), Max: slices.Max(xs)}
}

// onlineSummary holds medians and min–max over rounds; durations are in ns.
type onlineSummary struct {
	IdleP50      spread `json:"idle_apply_p50_ns"`
	IdleP99      spread `json:"idle_apply_p99_ns"`
	IdleMax      spread `json:"idle_apply_max_ns"`
	DuringP50    spread `json:"during_apply_p50_ns"`
	DuringP99    spread `json:"during_apply_p99_ns"`
	DuringMax    spread `json:"during_apply_max_ns"`
	IdleServer   spread `json:"idle_apply_server_ns"`
	DuringServer spread `json:"during_apply_server_ns"`
	Ratio        spread `json:"ratio"`
	Applied      spread `json:"applied_during_run"`
	AppliedRate  spread `json:"applied_per_s_during_run"`
	Replayed     spread `json:"replayed"`
	CatchUp      spread `json:"catch_up_ns"`
	QuietCatchUp spread `json:"quiet_catch_up_ns"`
}

// onlineWorkload is the workload of the online section: the multi
// workload, three indexes of one source, as applications keep them.
func onlineWorkload(buckets int) workload {
	for _, w := range allWorkloads(buckets) {
		if w.name == "multi" {
			return w
		}
	}
	panic("keyswap: bench: no multi workload") // allWorkloads has it
}

// online runs the online section. Each round loads the dataset as the live
// keys, applies changes with no run in progress, then runs the rebuild
// with no changes (quiet), then with changes arriving at -online-rate
// (online), checking the keys against the truth after each run.
func (r *runner) online(ctx context.Context) (*onlineResult, error) {
	cfg := r.cfg
	s := r.srv
	w := onlineWorkload(cfg.buckets)
	d := newDataset(cfg.onlineItems(), cfg.buckets)
	appClient, err := dial(s.addr)
	if err != nil {
		return nil, err
	}
	defer appClient.Close()
	app, err := rebuilder(appClient, w, cfg.keyswap)
	if err != nil {
		return nil, err
	}
	rb, err := rebuilder(s.client, w, cfg.keyswap)
	if err != nil {
		return nil, err
	}
	// A run and an Apply of one item first load their scripts into the
	// server's script cache, so that the measured ones are EVALSHA, as in
	// steady state, not NOSCRIPT followed by EVAL.
	r.bar.describe("online: warm-up")
	if err := s.reset(ctx); err != nil {
		return nil, err
	}
	warm := &application{rb: app, truth: newTruth(newDataset(1, cfg.buckets))}
	if _, err := rb.Run(ctx, warm.truth.source()); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	if _, err := warm.change(ctx, 0, rand.New(rand.NewPCG(0, 0))); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}

	opts := cfg.keyswap
	res := &onlineResult{
		Items: d.n, Rounds: cfg.rounds, Workload: w.title, Rate: cfg.onlineRate, Writers: onlineWriters,
		PublishTail:    rebuild.PublishTail,
		MaxChanges:     cmp.Or(opts.MaxChanges, rebuild.Defaults().MaxChanges),
		CatchUpTimeout: cmp.Or(opts.CatchUpTimeout, rebuild.Defaults().CatchUpTimeout),
		BacklogChanges: cfg.onlineBacklog,
	}
	var quiet, online []sample
	for round := range cfg.rounds {
		rd, q, o, err := r.onlineRound(ctx, round, w, d, rb, app)
		if err != nil {
			return nil, fmt.Errorf("%s, %d items, round %d: %w", w.name, d.n, round+1, err)
		}
		res.Runs = append(res.Runs, rd)
		if rd.Backlog != nil {
			res.Backlog = append(res.Backlog, *rd.Backlog)
		}
		quiet, online = append(quiet, q), append(online, o)
	}
	res.Quiet, res.Online = newSeries(quiet, nil), newSeries(online, nil)
	res.summarize()
	return res, nil
}

// onlineRound runs one round of the online section.
func (r *runner) onlineRound(ctx context.Context, round int, w workload, d dataset, rb, app *rebuild.Rebuilder[item]) (rd onlineRound, quiet, online sample, err error) {
	s := r.srv
	tr := newTruth(d)
	a := &application{rb: app, truth: tr, seed: uint64(round)}
	r.bar.describe("online %d/%d: loading %d items", round+1, r.cfg.rounds, d.n)
	if err := s.reset(ctx); err != nil {
		return rd, quiet, online, err
	}
	if err := pipeline(ctx, s.client, w, d, perCommand, rebuild.Defaults().Writers); err != nil {
		return rd, quiet, online, fmt.Errorf("load: %w", err)
	}
	if err := s.settle(ctx); err != nil {
		return rd, quiet, online, err
	}

	r.bar.describe("online %d/%d: Apply with no run in progress", round+1, r.cfg.rounds)
	before, err := s.usage(ctx)
	if err != nil {
		return rd, quiet, online, err
	}
	idleCtx, stop := context.WithTimeout(ctx, onlineIdle)
	calls, err := a.run(idleCtx, r.cfg.onlineRate)
	stop()
	if err == nil {
		err = context.Cause(ctx)
	}
	if err != nil {
		return rd, quiet, online, err
	}
	after, err := s.usage(ctx)
	if err != nil {
		return rd, quiet, online, err
	}
	rd.Idle = newLatency(calls, time.Time{}, time.Time{})
	rd.Idle.Server = perCall(after.since(before).commands["evalsha"])

	r.bar.describe("online %d/%d: rebuild with no changes", round+1, r.cfg.rounds)
	q, err := r.onlineRun(ctx, round, "quiet", rb, tr, nil)
	if err != nil {
		return rd, quiet, online, err
	}
	if q.stats.Changes != 0 {
		return rd, quiet, online, fmt.Errorf("the run with no changes replayed %d", q.stats.Changes)
	}
	rd.QuietCatchUp = q.stats.CatchUp
	r.bar.step()

	r.bar.describe("online %d/%d: rebuild with %.0f changes/s", round+1, r.cfg.rounds, r.cfg.onlineRate)
	o, err := r.onlineRun(ctx, round, "online", rb, tr, a)
	if err != nil {
		return rd, quiet, online, err
	}
	rd.During = newLatency(o.calls, o.from, o.to)
	rd.During.Server = perCall(o.sample.Commands["evalsha"])
	rd.Applied = overlapping(o.calls, o.from, o.to)
	rd.AppliedRate = float64(rd.During.Calls) / o.to.Sub(o.from).Seconds()
	rd.Replayed, rd.CatchUp = o.stats.Changes, o.stats.CatchUp
	// Every change writes each builder's keys at most once, so the run
	// replays at most one entry per builder per change it overlapped.
	if limit := int64(len(w.targets) * rd.Applied); o.stats.Changes > limit {
		return rd, quiet, online, fmt.Errorf("the run replayed %d changes, more than the %d builders × %d changes applied while it ran", o.stats.Changes, len(w.targets), rd.Applied)
	}
	rd.Ratio = o.sample.Rate() / q.sample.Rate()
	r.bar.step()
	if r.cfg.onlineBacklog > 0 {
		r.bar.describe("online %d/%d: rebuild catching up with %d changes", round+1, r.cfg.rounds, r.cfg.onlineBacklog)
		b, err := r.backlogRun(ctx, round, rb, tr, a)
		if err != nil {
			return rd, quiet, online, err
		}
		rd.Backlog = &b
	}
	rd.Changed = tr.changes()
	return rd, q.sample, o.sample, nil
}

// perCall returns the mean server time of one call.
func perCall(st commandStat) time.Duration {
	if st.Calls == 0 {
		return 0
	}
	return time.Duration(st.Usec) * time.Microsecond / time.Duration(st.Calls)
}

// onlineRun is one measured rebuild of the online section.
type onlineRun struct {
	stats    rebuild.Stats
	sample   sample
	from, to time.Time // the call of Run
	calls    []call    // the application's, from onlineLead before the run to onlineLead after
}

// onlineRun measures one rebuild from the truth, with the application a
// changing items around it unless a is nil, then checks its stats and,
// once a has stopped, the live keys against the truth.
func (r *runner) onlineRun(ctx context.Context, round int, label string, rb *rebuild.Rebuilder[item], tr *truth, a *application) (onlineRun, error) {
	s := r.srv
	w := onlineWorkload(r.cfg.buckets)
	var out onlineRun
	if err := s.settle(ctx); err != nil {
		return out, err
	}
	stopWriters := func() error { return nil }
	if a != nil {
		wctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			var err error
			out.calls, err = a.run(wctx, r.cfg.onlineRate)
			done <- err
		}()
		stopWriters = func() error {
			time.Sleep(onlineLead)
			stop()
			return errors.Join(<-done, context.Cause(ctx))
		}
		time.Sleep(onlineLead)
	}
	profile := ""
	if r.cfg.cpuProfile != "" {
		profile = filepath.Join(r.cfg.cpuProfile, fmt.Sprintf("%s-%s-%s-r%d.pprof", sectionOnline, w.name, label, round+1))
	}
	var err error
	out.sample, err = measure(ctx, s, tr.d.n, profile, func() (*child, error) {
		var err error
		out.from = time.Now()
		out.stats, err = rb.Run(ctx, tr.source())
		out.to = time.Now()
		return nil, err
	})
	if err = errors.Join(err, stopWriters()); err == nil {
		err = checkStats(out.stats, w, tr.d.n)
	}
	if err == nil {
		if verr := tr.verify(ctx, s.admin, w); verr != nil {
			err = fmt.Errorf("wrong result: %w", verr)
		}
	}
	if err != nil {
		return out, fmt.Errorf("%s run: %w", label, err)
	}
	return out, nil
}

// checkStats checks the stats of a run of w over n items: every item seen,
// every entry written, every plain target swapped.
func checkStats(stats rebuild.Stats, w workload, n int) error {
	if stats.Items != int64(n) {
		return fmt.Errorf("the run saw %d items, want %d", stats.Items, n)
	}
	for _, t := range w.targets {
		if got := stats.Entries[t.key]; got != int64(n) {
			return fmt.Errorf("%s: %d entries written, want %d", t.key, got, n)
		}
		if o, ok := stats.Outcomes[t.key]; t.kind != kindIndex && (!ok || o != store.Swapped) {
			return fmt.Errorf("%s: outcome %v, want %v", t.key, o, store.Swapped)
		}
	}
	return nil
}

// onlineSpread returns the spread of f over rounds.
func onlineSpread(rounds []onlineRound, f func(onlineRound) float64) spread {
	var xs []float64
	for _, rd := range rounds {
		xs = append(xs, f(rd))
	}
	return newSpread(xs)
}

func (res *onlineResult) summarize() {
	get := func(f func(onlineRound) float64) spread { return onlineSpread(res.Runs, f) }
	ns := func(d time.Duration) float64 { return float64(d) }
	s := &res.Summary
	s.IdleP50 = get(func(rd onlineRound) float64 { return ns(rd.Idle.P50) })
	s.IdleP99 = get(func(rd onlineRound) float64 { return ns(rd.Idle.P99) })
	s.IdleMax = get(func(rd onlineRound) float64 { return ns(rd.Idle.Max) })
	s.DuringP50 = get(func(rd onlineRound) float64 { return ns(rd.During.P50) })
	s.DuringP99 = get(func(rd onlineRound) float64 { return ns(rd.During.P99) })
	s.DuringMax = get(func(rd onlineRound) float64 { return ns(rd.During.Max) })
	s.IdleServer = get(func(rd onlineRound) float64 { return ns(rd.Idle.Server) })
	s.DuringServer = get(func(rd onlineRound) float64 { return ns(rd.During.Server) })
	s.Ratio = get(func(rd onlineRound) float64 { return rd.Ratio })
	s.Applied = get(func(rd onlineRound) float64 { return float64(rd.Applied) })
	s.AppliedRate = get(func(rd onlineRound) float64 { return rd.AppliedRate })
	s.Replayed = get(func(rd onlineRound) float64 { return float64(rd.Replayed) })
	s.CatchUp = get(func(rd onlineRound) float64 { return ns(rd.CatchUp) })
	s.QuietCatchUp = get(func(rd onlineRound) float64 { return ns(rd.QuietCatchUp) })
}

// summaryLine is the section's line of the report's summary.
func (res *onlineResult) summaryLine() string {
	s := res.Summary
	line := fmt.Sprintf("Online, %s at %s items, changes at %s/s (%s/s applied during the rebuild): one Apply takes **%s** at p99 with no run in progress, **%s** during a rebuild; the rebuild runs at **%.2f** of its speed without changes; catch-up %s (%s changes replayed); 0 lost changes.",
		res.Workload, commas(res.Items), commas(int(res.Rate)), rate(s.AppliedRate.Median), durS(s.IdleP99.Median), durS(s.DuringP99.Median), s.Ratio.Median,
		durS(s.CatchUp.Median), commas(int(s.Replayed.Median)))
	if len(res.Backlog) > 0 {
		var xs []float64
		for _, rd := range res.Backlog {
			xs = append(xs, rd.Rate)
		}
		line += fmt.Sprintf(" A catch-up of a backlog of %s changes replays **%s** changes/s.", commas(res.BacklogChanges), rate(median(xs)))
	}
	return line
}

// markdown writes the online section.
func (res *onlineResult) markdown(b *bytes.Buffer) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	s := res.Summary
	builders := len(onlineWorkload(1).targets)
	changed := 0
	for _, rd := range res.Runs {
		changed += rd.Changed
	}
	p("## Online\n\n")
	p("A rebuild of the %s of %s items (the multi workload, %d rounds) while the application changes items: %d writers, on their own connection and `Rebuilder`, ", res.Workload, commas(res.Items), res.Rounds, res.Writers)
	p("commit each change to a source of truth first, then apply it with `Rebuilder.Apply` of one `index.Update` that rewrites the item's hash value, score and bucket (4 writes, one script, one round trip), %s changes/s in all. ", commas(int(res.Rate)))
	p("In each round: %s of changes with no run in progress, then the rebuild with no changes, then the same rebuild with changes arriving from %s before it to %s after it. ", dur(onlineIdle), dur(onlineLead), dur(onlineLead))
	p("The writers run in the bench's process, next to the rebuild, and share the machine's CPUs with it and with the server. ")
	p("The run's source is a snapshot of the truth taken when it starts, after the run took its locks; every change committed later is applied while the run holds them, so Apply logs it for the run, which replays it. ")
	p("After every run the bench compares every entry of every key with the truth (the snapshot, plus every change in order) and fails on any missing, out-of-date or stale entry, or any temp key, lock, record or log left: **0 lost changes** in %d runs (%s items changed in all).\n\n", 2*len(res.Runs), commas(changed))

	p("| Apply of one Update | calls per round | p50 | p99 | max | server time per call |\n|---|--:|--:|--:|--:|--:|\n")
	callsOf := func(f func(onlineRound) int) string {
		return commas(int(onlineSpread(res.Runs, func(rd onlineRound) float64 { return float64(f(rd)) }).Median))
	}
	p("| no run in progress | %s | %s | %s | %s | %s |\n", callsOf(func(rd onlineRound) int { return rd.Idle.Calls }), durSpread(s.IdleP50), durSpread(s.IdleP99), durSpread(s.IdleMax), durSpread(s.IdleServer))
	p("| during the rebuild | %s | %s | %s | %s | %s |\n\n", callsOf(func(rd onlineRound) int { return rd.During.Calls }), durSpread(s.DuringP50), durSpread(s.DuringP99), durSpread(s.DuringMax), durSpread(s.DuringServer))

	q, o := res.Quiet.Summary, res.Online.Summary
	p("| rebuild | items/s, median | min–max | ratio to no changes (min–max) |\n|---|--:|--:|--:|\n")
	p("| no changes | %s | %s–%s | — |\n", rate(q.Rate), rate(q.RateMin), rate(q.RateMax))
	p("| changes at %s/s (%s/s applied during the run) | %s | %s–%s | %.2f (%.2f–%.2f) |\n\n", commas(int(res.Rate)), rate(s.AppliedRate.Median),
		rate(o.Rate), rate(o.RateMin), rate(o.RateMax), s.Ratio.Median, s.Ratio.Min, s.Ratio.Max)

	p("| catch-up | median | min–max |\n|---|--:|--:|\n")
	p("| changes applied while the rebuild ran | %s | %s–%s |\n", commas(int(s.Applied.Median)), commas(int(s.Applied.Min)), commas(int(s.Applied.Max)))
	p("| changes replayed (`Stats.Changes`, per builder) | %s | %s–%s |\n", commas(int(s.Replayed.Median)), commas(int(s.Replayed.Min)), commas(int(s.Replayed.Max)))
	p("| end of the source to the publish (`Stats.CatchUp`) | %s | %s–%s |\n", durS(s.CatchUp.Median), durS(s.CatchUp.Min), durS(s.CatchUp.Max))
	replay := onlineSpread(res.Runs, func(rd onlineRound) float64 { return float64(rd.Replayed) / rd.CatchUp.Seconds() })
	p("| changes replayed per second of catch-up | %s | %s–%s |\n", rate(replay.Median), rate(replay.Min), rate(replay.Max))
	p("| the same, with no changes | %s | %s–%s |\n\n", durS(s.QuietCatchUp.Median), durS(s.QuietCatchUp.Min), durS(s.QuietCatchUp.Max))

	p("What the numbers mean, and what bounds them:\n\n")
	p("- **Apply's latency** is one round trip of one script, as the application sees it; the server's time per call is EVALSHA's mean in INFO commandstats. With no run in progress the script writes the live keys; during a run it also appends the change to the log of each builder's lock, ")
	p("and it waits behind whatever the server is executing: the run's transactions of `BatchSize` items, and its publish, which replays the last changes (at most `PublishTail` = %s per log) inside its script. The max during a run is about the longest of those, plus, on a busy machine, the wait for a CPU.\n", commas(res.PublishTail))
	p("- **Throughput** is source items/s of the whole run, lock to release. Changes cost the run the server time of the Apply calls, the writers' CPU, and the replay of each (`Stats.Changes` counts an Update once per builder whose keys it writes: up to 3 here).\n")
	p("- **Catch-up** replays the changes logged while the source ran, in pipelined chunks, until at most `PublishTail` = %s per log are left, which the publish replays itself. It converges only while changes arrive slower than it replays them: here up to about %s changes a second (its median rate of replayed entries over the %d builders). ", commas(res.PublishTail), rate(replay.Median/float64(builders)), builders)
	p("`Options.CatchUpTimeout` (%v here) bounds it: a run whose changes arrive faster than it replays them fails with `ErrFallingBehind`, and leaves the live keys, which hold every change, as they are. ", res.CatchUpTimeout)
	p("`Options.MaxChanges` (%s here) bounds each log, one entry per Apply and lock: at %s changes/s a run may last %s before its log is full and it fails with `ErrFallingBehind` in the same way.\n\n",
		commas(res.MaxChanges), commas(int(res.Rate)), (time.Duration(float64(res.MaxChanges) / res.Rate * float64(time.Second))).Round(time.Second))
	res.backlogMarkdown(b)
}

// durS formats a duration in ns held in a float64.
func durS(ns float64) string { return dur(time.Duration(ns)) }

// durSpread formats a median and its min–max.
func durSpread(s spread) string {
	return fmt.Sprintf("%s (%s–%s)", durS(s.Median), durS(s.Min), durS(s.Max))
}

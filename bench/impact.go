package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

const (
	// impactIdle is how long the reader reads with no rebuild, per round.
	impactIdle = 2 * time.Second
	// impactEvery is the reader's pace: one read per tick.
	impactEvery = time.Millisecond
	// impactLead is how long the reader reads before and after each run.
	impactLead = 100 * time.Millisecond
	// The reader's keys, which no run touches, outside keyPrefix, under
	// which the checks of each run want only the run's keys. The section
	// deletes them when it ends.
	impactString = "keyswap-bench-impact:string"
	impactHash   = "keyswap-bench-impact:hash"
	// impactField is the hash field that the Apply probe updates in the
	// rebuilt hash, again and again; no item of the dataset has it, and
	// the section deletes it after each run, before the check.
	impactField = "keyswap-bench-probe"
)

// impactResult is the "impact on other clients" section: the latency of a
// reader of other keys with no rebuild, during an unthrottled rebuild, and
// during a rebuild with Options.LatencyBudget; and the rebuilds'
// throughput.
type impactResult struct {
	Items     int           `json:"items"`
	Rounds    int           `json:"rounds"`
	Workload  string        `json:"workload"`
	Budget    time.Duration `json:"budget_ns"`
	BatchSize int           `json:"batch_size"` // the paced run's
	// FreeBatchSize is the unthrottled run's BatchSize.
	FreeBatchSize int `json:"unthrottled_batch_size"`
	// Unthrottled and Budget are the runs; Ratio compares them round by
	// round.
	Unthrottled series        `json:"unthrottled"`
	Paced       series        `json:"paced"`
	Runs        []impactRound `json:"rounds_detail"`
	Summary     impactSummary `json:"summary"`
}

// impactRound is the probes' latency in each condition of a round.
type impactRound struct {
	// Idle, Unthrottled and Paced are the reader's on a client of its own.
	Idle        latency `json:"idle"`
	Unthrottled latency `json:"unthrottled"`
	Paced       latency `json:"paced"`
	// Shared is the same reader on the client the Rebuilder writes
	// through; Apply is Rebuilder.Apply of one update on that client.
	Shared impactProbe `json:"shared"`
	Apply  impactProbe `json:"apply"`
	// Ratio is the paced run's items/s over the unthrottled run's.
	Ratio float64 `json:"ratio"`
}

// impactProbe is one probe's latency in each condition of a round.
type impactProbe struct {
	Idle        latency `json:"idle"`
	Unthrottled latency `json:"unthrottled"`
	Paced       latency `json:"paced"`
}

// impactCondition names a condition of a round.
type impactCondition int

const (
	condIdle impactCondition = iota
	condUnthrottled
	condPaced
)

// of returns p's latency in condition c.
func (p impactProbe) of(c impactCondition) latency {
	return [...]latency{p.Idle, p.Unthrottled, p.Paced}[c]
}

// separate returns the separate reader's latency.
func (rd impactRound) separate() impactProbe {
	return impactProbe{Idle: rd.Idle, Unthrottled: rd.Unthrottled, Paced: rd.Paced}
}

// probeRatios is, per condition, the median and min–max over rounds of a
// probe's p99 over the separate reader's p99 in the same condition of the
// same round.
type probeRatios struct {
	Idle        spread `json:"idle"`
	Unthrottled spread `json:"unthrottled"`
	Paced       spread `json:"paced"`
}

// probeSummary holds a probe's medians and min–max over rounds; in ns.
type probeSummary struct {
	P50    [3]spread   `json:"p50_ns"` // idle, unthrottled, paced
	P99    [3]spread   `json:"p99_ns"`
	Max    [3]spread   `json:"max_ns"`
	Ratios probeRatios `json:"p99_over_separate"`
}

// impactSummary holds medians and min–max over rounds; durations in ns.
type impactSummary struct {
	IdleP50        spread `json:"idle_p50_ns"`
	IdleP99        spread `json:"idle_p99_ns"`
	IdleMax        spread `json:"idle_max_ns"`
	UnthrottledP50 spread `json:"unthrottled_p50_ns"`
	UnthrottledP99 spread `json:"unthrottled_p99_ns"`
	UnthrottledMax spread `json:"unthrottled_max_ns"`
	PacedP50       spread `json:"paced_p50_ns"`
	PacedP99       spread `json:"paced_p99_ns"`
	PacedMax       spread `json:"paced_max_ns"`
	Ratio          spread `json:"ratio"`
	// Shared and Apply are the probes on the Rebuilder's client.
	Shared probeSummary `json:"shared"`
	Apply  probeSummary `json:"apply"`
}

// impact runs the section. Each round measures the probes alone, then
// during an unthrottled rebuild of the hash workload, then during the same
// rebuild with the latency budget, each from the same live keys, checking
// the keys after each run. The probes are a reader on a client of its own,
// the same reader on the client the Rebuilders write through, and
// Rebuilder.Apply of one update on that client.
func (r *runner) impact(ctx context.Context) (*impactResult, error) {
	cfg := r.cfg
	s := r.srv
	w := hashWorkload()
	d := newDataset(cfg.impactItems(), cfg.buckets)
	reader, err := dial(s.addr)
	if err != nil {
		return nil, err
	}
	defer reader.Close()
	defer s.admin.Do(context.WithoutCancel(ctx), s.admin.B().Del().Key(impactString, impactHash).Build())
	free, err := rebuilder(s.client, w, cfg.keyswap)
	if err != nil {
		return nil, err
	}
	popts := cfg.keyswap
	popts.LatencyBudget = cfg.impactBudget
	popts.BatchSize = cmp.Or(cfg.impactBatchSize, popts.BatchSize)
	paced, err := rebuilder(s.client, w, popts)
	if err != nil {
		return nil, err
	}
	// The application's own Rebuilder of the same index, on the same
	// client, as a service has it.
	app, err := rebuilder(s.client, w, rebuild.Options{})
	if err != nil {
		return nil, err
	}
	p := &impactProbes{separate: reader, shared: s.client, app: app, key: w.targets[0].key}
	res := &impactResult{Items: d.n, Rounds: cfg.rounds, Workload: w.title, Budget: cfg.impactBudget,
		BatchSize: cmp.Or(popts.BatchSize, rebuild.Defaults().BatchSize), FreeBatchSize: cmp.Or(cfg.keyswap.BatchSize, rebuild.Defaults().BatchSize)}
	var us, ps []sample
	for round := range cfg.rounds {
		var rd impactRound
		r.bar.describe("impact %d/%d: probes with no rebuild", round+1, cfg.rounds)
		if err := r.impactSetup(ctx, w, d); err != nil {
			return nil, err
		}
		idleCtx, stop := context.WithTimeout(ctx, impactIdle)
		calls, err := p.run(idleCtx)
		stop()
		if err = errors.Join(err, context.Cause(ctx)); err != nil {
			return nil, err
		}
		l := calls.latency(time.Time{}, time.Time{})
		rd.Idle, rd.Shared.Idle, rd.Apply.Idle = l[0], l[1], l[2]

		u, l, err := r.impactRun(ctx, round, "unthrottled", free, p, w, d)
		if err != nil {
			return nil, err
		}
		rd.Unthrottled, rd.Shared.Unthrottled, rd.Apply.Unthrottled = l[0], l[1], l[2]
		pc, l, err := r.impactRun(ctx, round, fmt.Sprintf("budget %v", cfg.impactBudget), paced, p, w, d)
		if err != nil {
			return nil, err
		}
		rd.Paced, rd.Shared.Paced, rd.Apply.Paced = l[0], l[1], l[2]
		rd.Ratio = pc.Rate() / u.Rate()
		res.Runs = append(res.Runs, rd)
		us, ps = append(us, u), append(ps, pc)
	}
	res.Unthrottled, res.Paced = newSeries(us, nil), newSeries(ps, nil)
	res.summarize()
	return res, nil
}

// impactSetup resets the server, writes the reader's keys and the live keys
// the rebuild replaces, and waits for the server to settle.
func (r *runner) impactSetup(ctx context.Context, w workload, d dataset) error {
	s := r.srv
	if err := s.reset(ctx); err != nil {
		return err
	}
	c := s.admin
	for _, cmd := range []rueidis.Completed{
		c.B().Set().Key(impactString).Value("a value of some thirty bytes..").Build(),
		c.B().Hset().Key(impactHash).FieldValue().FieldValue("f", "v").FieldValue("g", "w").Build(),
	} {
		if err := c.Do(ctx, cmd).Error(); err != nil {
			return fmt.Errorf("reader's keys: %w", err)
		}
	}
	if err := preload(ctx, s.client, w, d); err != nil {
		return err
	}
	return s.settle(ctx)
}

// impactRun measures one rebuild with the probes running around it, and
// returns its sample and the latency of each probe's calls made while it
// ran: the separate reader's, the shared reader's, Apply's.
func (r *runner) impactRun(ctx context.Context, round int, label string, rb *rebuild.Rebuilder[item], p *impactProbes, w workload, d dataset) (sample, [3]latency, error) {
	r.bar.describe("impact %d/%d: probes during a rebuild, %s", round+1, r.cfg.rounds, label)
	var none [3]latency
	if err := r.impactSetup(ctx, w, d); err != nil {
		return sample{}, none, err
	}
	pctx, stop := context.WithCancel(ctx)
	type result struct {
		calls impactCalls
		err   error
	}
	done := make(chan result, 1)
	go func() {
		calls, err := p.run(pctx)
		done <- result{calls, err}
	}()
	time.Sleep(impactLead)
	var from, to time.Time
	profile := ""
	if r.cfg.cpuProfile != "" {
		profile = filepath.Join(r.cfg.cpuProfile, fmt.Sprintf("%s-%s-r%d.pprof", sectionImpact, strings.ReplaceAll(label, " ", "-"), round+1))
	}
	s, err := measure(ctx, r.srv, d.n, profile, func() (*child, error) {
		from = time.Now()
		defer func() { to = time.Now() }()
		return nil, runKeyswap(ctx, rb, w, d)
	})
	time.Sleep(impactLead)
	stop()
	res := <-done
	if err = errors.Join(err, res.err); err == nil {
		// The Apply probe's field went into the index through the run's
		// log; it is not the dataset's.
		err = r.srv.admin.Do(ctx, r.srv.admin.B().Hdel().Key(p.key).Field(impactField).Build()).Error()
	}
	if err == nil {
		if verr := w.verify(ctx, r.srv.admin, d); verr != nil {
			err = fmt.Errorf("wrong result: %w", verr)
		}
	}
	if err != nil {
		return sample{}, none, fmt.Errorf("impact, %s run, round %d: %w", label, round+1, err)
	}
	r.bar.step()
	return s, res.calls.latency(from, to), nil
}

// impactProbes are the section's probes: a reader on a client of its own
// (separate), the same reader on the client the Rebuilders write through
// (shared), and the application's Rebuilder on that client, whose Apply
// updates one field of the rebuilt hash (key).
type impactProbes struct {
	separate, shared rueidis.Client
	app              *rebuild.Rebuilder[item]
	key              string
}

// impactCalls are the calls of each probe: separate, shared, Apply.
type impactCalls [3][]call

// latency returns each probe's latency over the calls between from and to.
func (c impactCalls) latency(from, to time.Time) [3]latency {
	var out [3]latency
	for i, calls := range c {
		out[i] = newLatency(calls, from, to)
	}
	return out
}

// run runs the probes until ctx ends, each at its own pace, and returns
// their calls.
func (p *impactProbes) run(ctx context.Context) (impactCalls, error) {
	var calls impactCalls
	var errs [3]error
	var wg sync.WaitGroup
	wg.Go(func() { calls[0], errs[0] = read(ctx, p.separate) })
	wg.Go(func() { calls[1], errs[1] = read(ctx, p.shared) })
	wg.Go(func() { calls[2], errs[2] = p.apply(ctx) })
	wg.Wait()
	return calls, errors.Join(errs[:]...)
}

// apply applies one update of the probe's item, whose hash field is
// impactField, one every impactEvery, until ctx ends, and returns each
// Apply's start and duration. Each call runs to its end once started,
// whatever ctx does: the section deletes the field once the probe has
// stopped, and a call still queued would write it again.
func (p *impactProbes) apply(ctx context.Context) ([]call, error) {
	tick := time.NewTicker(impactEvery)
	defer tick.Stop()
	var calls []call
	at := func(v int) item { return item{member: impactField, value: fmt.Sprintf("v%d", v%2)} }
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return calls, nil
		case <-tick.C:
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), applyTimeout)
		start := time.Now()
		err := p.app.Apply(actx, index.Update(at(i), at(i+1)))
		took := time.Since(start)
		cancel()
		if err != nil {
			return calls, fmt.Errorf("the Apply probe: %w", err)
		}
		calls = append(calls, call{start: start, took: took})
	}
}

// read reads the reader's keys, a GET and an HGET in turn, one every
// impactEvery, until ctx ends, and returns each read's start and round
// trip. (A read slower than the pace delays the next one: the reader is
// one client that waits for each reply, as an application's request
// does.)
func read(ctx context.Context, c rueidis.Client) ([]call, error) {
	tick := time.NewTicker(impactEvery)
	defer tick.Stop()
	var calls []call
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return calls, nil
		case <-tick.C:
		}
		cmd := c.B().Get().Key(impactString).Build()
		if i%2 == 1 {
			cmd = c.B().Hget().Key(impactHash).Field("f").Build()
		}
		start := time.Now()
		err := c.Do(ctx, cmd).Error()
		took := time.Since(start)
		if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return calls, nil // the end of the reading, not a slow read
		}
		if err != nil {
			return calls, fmt.Errorf("reader: %w", err)
		}
		calls = append(calls, call{start: start, took: took})
	}
}

func (res *impactResult) summarize() {
	get := func(f func(impactRound) time.Duration) spread {
		var xs []float64
		for _, rd := range res.Runs {
			xs = append(xs, float64(f(rd)))
		}
		return newSpread(xs)
	}
	s := &res.Summary
	s.IdleP50 = get(func(rd impactRound) time.Duration { return rd.Idle.P50 })
	s.IdleP99 = get(func(rd impactRound) time.Duration { return rd.Idle.P99 })
	s.IdleMax = get(func(rd impactRound) time.Duration { return rd.Idle.Max })
	s.UnthrottledP50 = get(func(rd impactRound) time.Duration { return rd.Unthrottled.P50 })
	s.UnthrottledP99 = get(func(rd impactRound) time.Duration { return rd.Unthrottled.P99 })
	s.UnthrottledMax = get(func(rd impactRound) time.Duration { return rd.Unthrottled.Max })
	s.PacedP50 = get(func(rd impactRound) time.Duration { return rd.Paced.P50 })
	s.PacedP99 = get(func(rd impactRound) time.Duration { return rd.Paced.P99 })
	s.PacedMax = get(func(rd impactRound) time.Duration { return rd.Paced.Max })
	var ratios []float64
	for _, rd := range res.Runs {
		ratios = append(ratios, rd.Ratio)
	}
	s.Ratio = newSpread(ratios)
	s.Shared = res.summarizeProbe(func(rd impactRound) impactProbe { return rd.Shared })
	s.Apply = res.summarizeProbe(func(rd impactRound) impactProbe { return rd.Apply })
}

// summarizeProbe summarises the probe that f picks from each round.
func (res *impactResult) summarizeProbe(f func(impactRound) impactProbe) probeSummary {
	var out probeSummary
	var ratios [3]spread
	for c := condIdle; c <= condPaced; c++ {
		var p50, p99, most, ratio []float64
		for _, rd := range res.Runs {
			l := f(rd).of(c)
			p50, p99, most = append(p50, float64(l.P50)), append(p99, float64(l.P99)), append(most, float64(l.Max))
			if sep := rd.separate().of(c).P99; sep > 0 {
				ratio = append(ratio, float64(l.P99)/float64(sep))
			}
		}
		out.P50[c], out.P99[c], out.Max[c], ratios[c] = newSpread(p50), newSpread(p99), newSpread(most), newSpread(ratio)
	}
	out.Ratios = probeRatios{Idle: ratios[condIdle], Unthrottled: ratios[condUnthrottled], Paced: ratios[condPaced]}
	return out
}

// summaryLine is the section's line of the report's summary.
func (res *impactResult) summaryLine() string {
	s := res.Summary
	return fmt.Sprintf("Impact on other clients, a %s of %s items: a reader's p99 is **%s** with no rebuild, **%s** during an unthrottled rebuild, **%s** with `LatencyBudget` %v, which keeps **%.2f** of the unthrottled throughput. During the unthrottled rebuild, the same reader on the Rebuilder's client sees **%.2f×** that p99, and `Apply` on it **%.2f×**.",
		res.Workload, commas(res.Items), durS(s.IdleP99.Median), durS(s.UnthrottledP99.Median), durS(s.PacedP99.Median), res.Budget, s.Ratio.Median,
		s.Shared.Ratios.Unthrottled.Median, s.Apply.Ratios.Unthrottled.Median)
}

// markdown writes the section.
// cpus is the machine's number of CPUs, from the report.
func (res *impactResult) markdown(b *bytes.Buffer, cpus int) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	s := res.Summary
	p("## Impact on other clients\n\n")
	p("A reader on a connection of its own reads two other keys, a GET and an HGET in turn, one every %v, while the bench rebuilds a %s of %s items (%d rounds). ", impactEvery, res.Workload, commas(res.Items), res.Rounds)
	p("In each round: %v of reads with no rebuild; then reads during an unthrottled rebuild (`BatchSize` %s); then during the same rebuild with `Options.LatencyBudget` = %v and `BatchSize` %s. ", impactIdle, commas(cmp.Or(res.FreeBatchSize, rebuild.Defaults().BatchSize)), res.Budget, commas(res.BatchSize))
	p("Latencies are the reader's round trips that started and ended while the run ran; the reader, the rebuild and the server share the machine's CPUs.\n\n")
	p("| condition | reads per round | p50 | p99 | max | rebuild items/s, median (min–max) | ratio to unthrottled (min–max) |\n|---|--:|--:|--:|--:|--:|--:|\n")
	calls := func(f func(impactRound) latency) string {
		var xs []float64
		for _, rd := range res.Runs {
			xs = append(xs, float64(f(rd).Calls))
		}
		return commas(int(newSpread(xs).Median))
	}
	u, pc := res.Unthrottled.Summary, res.Paced.Summary
	p("| no rebuild | %s | %s | %s | %s | — | — |\n", calls(func(rd impactRound) latency { return rd.Idle }), durSpread(s.IdleP50), durSpread(s.IdleP99), durSpread(s.IdleMax))
	p("| unthrottled rebuild | %s | %s | %s | %s | %s (%s–%s) | 1 |\n", calls(func(rd impactRound) latency { return rd.Unthrottled }), durSpread(s.UnthrottledP50), durSpread(s.UnthrottledP99), durSpread(s.UnthrottledMax),
		rate(u.Rate), rate(u.RateMin), rate(u.RateMax))
	p("| `LatencyBudget` %v | %s | %s | %s | %s | %s (%s–%s) | %.2f (%.2f–%.2f) |\n\n", res.Budget, calls(func(rd impactRound) latency { return rd.Paced }), durSpread(s.PacedP50), durSpread(s.PacedP99), durSpread(s.PacedMax),
		rate(pc.Rate), rate(pc.RateMin), rate(pc.RateMax), s.Ratio.Median, s.Ratio.Min, s.Ratio.Max)
	p("### On the Rebuilder's client\n\n")
	p("The same reader on the client the Rebuilders write through (the application's own client, as a service shares it with keyswap), and `Rebuilder.Apply` of one update of one hash field on that client, one every %v, next to the reader on a client of its own, in the same conditions of the same rounds. ", impactEvery)
	p("The ratio is a probe's p99 over the separate reader's p99 in the same round: what sharing the client adds to what the server's load adds.\n\n")
	p("| condition | probe | p50 | p99 | max | p99 / separate reader's p99 |\n|---|---|--:|--:|--:|--:|\n")
	conds := []string{"no rebuild", "unthrottled rebuild", fmt.Sprintf("`LatencyBudget` %v", res.Budget)}
	sep := probeSummary{P50: [3]spread{s.IdleP50, s.UnthrottledP50, s.PacedP50}, P99: [3]spread{s.IdleP99, s.UnthrottledP99, s.PacedP99}, Max: [3]spread{s.IdleMax, s.UnthrottledMax, s.PacedMax}}
	for c := condIdle; c <= condPaced; c++ {
		for _, pr := range []struct {
			name string
			s    probeSummary
		}{{"reader, a client of its own", sep}, {"reader, the Rebuilder's client", s.Shared}, {"`Apply`, the Rebuilder's client", s.Apply}} {
			ratio := "1"
			if pr.name != "reader, a client of its own" {
				r := [3]spread{pr.s.Ratios.Idle, pr.s.Ratios.Unthrottled, pr.s.Ratios.Paced}[c]
				ratio = fmt.Sprintf("%.2f (%.2f–%.2f)", r.Median, r.Min, r.Max)
			}
			p("| %s | %s | %s | %s | %s | %s |\n", conds[c], pr.name, durSpread(pr.s.P50[c]), durSpread(pr.s.P99[c]), durSpread(pr.s.Max[c]), ratio)
		}
	}
	p("\n")
	p("With a budget, the run times a GET on a connection of its own 100 times a second and sets its own rate limit from what those probes see: it starts at ten batches a second and doubles every 200 ms until the 90th percentile of a window goes over the budget, then cuts its rate whenever it is over and raises it by a quarter while it is well under. ")
	p("It can pace only between batches: a read that arrives during one of the run's transactions waits for it, so `BatchSize` bounds what one batch adds. ")
	p("What the run does not cause, it cannot remove: the reader's latency with no rebuild is the floor, and on a machine where the reader, the rebuild and the server share %d CPUs, a read also waits for a CPU whenever the others hold both; the probes see that wait too, and pace the run down for it.\n\n", cpus)
}

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/rebuild"
)

// backlogSlowlog is the shortest command the runs with a backlog log in
// SLOWLOG: reading a slowlog of every command of 20 µs or more, as the
// other sections do, costs the server a share of what the catch-up does.
const backlogSlowlog = 200 * time.Microsecond

// backlogRound is the online section's run with a backlog (-online-backlog):
// a rebuild whose source, once it has given every item, waits while the
// application applies changes as fast as it can, until the run's logs hold
// the backlog; the catch-up then replays them all.
type backlogRound struct {
	// Applied is the Apply calls that built the backlog, and ApplyTime how
	// long they took.
	Applied   int           `json:"applied"`
	ApplyTime time.Duration `json:"apply_ns"`
	// Replayed and CatchUp are the run's Stats.Changes and Stats.CatchUp;
	// Rate is Replayed per second of CatchUp.
	Replayed int64         `json:"replayed"`
	CatchUp  time.Duration `json:"catch_up_ns"`
	Rate     float64       `json:"replayed_per_s"`
	// ServerUsec is the server's time in commands during the catch-up
	// (INFO commandstats, every command), ServerCPU its CPU time (INFO
	// cpu), ClientCPU the bench process's (getrusage).
	ServerUsec int64         `json:"server_usec"`
	ServerCPU  time.Duration `json:"server_cpu_ns"`
	ClientCPU  time.Duration `json:"client_cpu_ns"`
	// Commands is INFO commandstats during the catch-up.
	Commands map[string]commandStat `json:"server_commands"`
	// Longest is the longest call of each command the run sent during the
	// catch-up, as SLOWLOG logged them (those of backlogSlowlog or more).
	Longest []commandTime `json:"longest"`
}

// perChange returns d per replayed change, in µs.
func (b backlogRound) perChange(d time.Duration) float64 {
	if b.Replayed == 0 {
		return 0
	}
	return float64(d) / float64(time.Microsecond) / float64(b.Replayed)
}

// burst changes random items of a's truth from onlineWriters goroutines,
// as fast as Apply takes them, until n changes are applied. The first
// failed Apply stops them all, and is the error.
func (a *application) burst(ctx context.Context, n int) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var left atomic.Int64
	left.Store(int64(n))
	items := a.truth.d.n
	seed := uint64(a.runs.Add(1)) << 32
	errs := make([]error, onlineWriters)
	var wg sync.WaitGroup
	for w := range onlineWriters {
		owned := (items - w + onlineWriters - 1) / onlineWriters
		if owned <= 0 {
			continue
		}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(a.seed, seed|uint64(w)))
			for ctx.Err() == nil && left.Add(-1) >= 0 {
				if _, err := a.change(ctx, w+onlineWriters*rng.IntN(owned), rng); err != nil {
					errs[w] = err
					stop()
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(append(errs, context.Cause(ctx))...)
}

// backlogRun measures one rebuild from the truth whose catch-up replays a
// backlog of about r.cfg.onlineBacklog changes: the application applies
// them once the source has given its last item, each Update logging one
// change per builder. It checks the live keys against the truth after.
func (r *runner) backlogRun(ctx context.Context, round int, rb *rebuild.Rebuilder[item], tr *truth, a *application) (backlogRound, error) {
	s := r.srv
	w := onlineWorkload(r.cfg.buckets)
	var out backlogRound
	if err := s.settle(ctx); err != nil {
		return out, err
	}
	restore, err := r.saveSlowlog(ctx)
	if err != nil {
		return out, err
	}
	defer func() { _ = restore() }()
	scripts, err := keyswapScripts(ctx, s.admin, false)
	if err != nil {
		return out, err
	}
	profile := ""
	if r.cfg.cpuProfile != "" {
		profile = filepath.Join(r.cfg.cpuProfile, fmt.Sprintf("%s-%s-backlog-catchup-r%d.pprof", sectionOnline, w.name, round+1))
	}
	calls := (r.cfg.onlineBacklog + len(w.targets) - 1) / len(w.targets)
	var (
		before    serverUsage
		ru0       time.Duration
		watch     *slowlogWatch
		stopProf  = func() error { return nil }
		sourceErr error
	)
	src := func(sctx context.Context) iter.Seq2[item, error] {
		return func(yield func(item, error) bool) {
			for it, err := range tr.source()(sctx) {
				if !yield(it, err) {
					return
				}
			}
			start := time.Now()
			err := a.burst(sctx, calls)
			out.Applied, out.ApplyTime = calls, time.Since(start)
			if err == nil {
				before, err = s.usage(ctx)
			}
			if err == nil {
				watch, err = r.watchSlowlogOver(ctx, backlogSlowlog, scripts, benchClientName)
			}
			if err == nil && profile != "" {
				stopProf, err = startProfile(profile)
			}
			ru0 = rusage()
			if err != nil {
				sourceErr = err
				yield(item{}, err)
			}
		}
	}
	stats, err := rb.Run(ctx, src)
	ru1 := rusage()
	err = errors.Join(err, stopProf())
	if watch != nil {
		entries, werr := watch.stop(ctx)
		err = errors.Join(err, werr)
		out.Longest = longestByCommand(entries)
	}
	if err != nil {
		return out, fmt.Errorf("backlog run: %w", errors.Join(err, sourceErr))
	}
	after, err := s.usage(ctx)
	if err != nil {
		return out, err
	}
	used := after.since(before)
	out.Replayed, out.CatchUp = stats.Changes, stats.CatchUp
	out.Rate = float64(stats.Changes) / stats.CatchUp.Seconds()
	out.ServerCPU, out.ClientCPU, out.Commands = used.cpu, ru1-ru0, used.commands
	for _, c := range used.commands {
		out.ServerUsec += c.Usec
	}
	if err := checkStats(stats, w, tr.d.n); err != nil {
		return out, fmt.Errorf("backlog run: %w", err)
	}
	if err := tr.verify(ctx, s.admin, w); err != nil {
		return out, fmt.Errorf("backlog run: wrong result: %w", err)
	}
	return out, nil
}

// backlogMarkdown writes the online section's table of the runs with a
// backlog.
func (res *onlineResult) backlogMarkdown(b *bytes.Buffer) {
	if len(res.Backlog) == 0 {
		return
	}
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	get := func(f func(backlogRound) float64) spread {
		var xs []float64
		for _, rd := range res.Backlog {
			xs = append(xs, f(rd))
		}
		return newSpread(xs)
	}
	num := func(s spread) string {
		return fmt.Sprintf("%s | %s–%s", commas(int(s.Median)), commas(int(s.Min)), commas(int(s.Max)))
	}
	us := func(s spread) string { return fmt.Sprintf("%.2f | %.2f–%.2f", s.Median, s.Min, s.Max) }
	p("### Catch-up of a backlog\n\n")
	p("The same rebuild, whose source, once it has given its last item, waits while the writers apply changes as fast as Apply takes them (%s Updates, each logging one change for each of the %d builders), so that the catch-up starts with a backlog of about %s changes. ",
		commas(res.Backlog[0].Applied), len(onlineWorkload(1).targets), commas(res.BacklogChanges))
	p("Server time is every command's in INFO commandstats from the end of the source to the publish, per replayed change; the longest calls are SLOWLOG's (of %s or more).\n\n", dur(backlogSlowlog))
	p("| catch-up of a backlog | median | min–max |\n|---|--:|--:|\n")
	p("| changes replayed (`Stats.Changes`) | %s |\n", num(get(func(rd backlogRound) float64 { return float64(rd.Replayed) })))
	p("| changes replayed per second of catch-up | %s |\n", num(get(func(rd backlogRound) float64 { return rd.Rate })))
	p("| end of the source to the publish (`Stats.CatchUp`) | %s |\n", func() string {
		s := get(func(rd backlogRound) float64 { return float64(rd.CatchUp) })
		return fmt.Sprintf("%s | %s–%s", durS(s.Median), durS(s.Min), durS(s.Max))
	}())
	p("| server µs in commands per change (commandstats: a script's or EXEC's commands count in it as well) | %s |\n", us(get(func(rd backlogRound) float64 { return rd.perChange(time.Duration(rd.ServerUsec) * time.Microsecond) })))
	p("| server CPU µs per change | %s |\n", us(get(func(rd backlogRound) float64 { return rd.perChange(rd.ServerCPU) })))
	p("| bench process CPU µs per change | %s |\n\n", us(get(func(rd backlogRound) float64 { return rd.perChange(rd.ClientCPU) })))
	longest := map[string][]float64{}
	var names []string
	for _, rd := range res.Backlog {
		for _, ct := range rd.Longest {
			if longest[ct.Command] == nil {
				names = append(names, ct.Command)
			}
			longest[ct.Command] = append(longest[ct.Command], float64(ct.Longest))
		}
	}
	if len(names) > 0 {
		p("| command during the catch-up | longest call, median | min–max |\n|---|--:|--:|\n")
		for _, n := range names {
			s := newSpread(longest[n])
			p("| %s | %s | %s–%s |\n", n, durS(s.Median), durS(s.Min), durS(s.Max))
		}
		p("\n")
	}
}

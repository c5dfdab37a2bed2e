package rebuild

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/hook"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/sources"
)

// Run rebuilds every builder's keys from src and publishes them in one
// fenced atomic step. Readers see the old keys or the new ones, never a
// missing, empty or half-built key, and never a mixture of the two runs. The
// steps are those of the package documentation, "Lifecycle".
//
// A run is all or nothing. A source error, a builder error, a write error, a
// lost lease or a cancelled ctx discards every temp key, leaves every live
// key untouched, releases the locks, and returns the cause wrapped in an
// *Error, so that errors.Is and errors.As see it. A panic in the source or
// a builder gets the same cleanup, then propagates (see [PanicError]), and
// so does a runtime.Goexit. The package documentation, "Errors", lists what
// each error means.
//
// Stats are returned on failure too, with what was done before it.
func (r *Rebuilder[T]) Run(ctx context.Context, src sources.Source[T]) (Stats, error) {
	return r.run(ctx, src, nil)
}

// run is Run, or Build when held is not nil: then the run waits before its
// publish for held's decision.
func (r *Rebuilder[T]) run(ctx context.Context, src sources.Source[T], held *Held[T]) (stats Stats, err error) {
	start := time.Now()
	stats = Stats{Entries: map[string]int64{}, Outcomes: map[string]Outcome{}, Generations: map[string]int64{}, Skipped: map[string]int64{}}
	if src == nil {
		return stats, &Error{Op: "config", Key: r.key, Err: errNilSource}
	}
	if err := r.redis.Durable.CheckDurable(ctx, "config", r.key, r.lockKeys[0], r.durability()); err != nil {
		return stats, err
	}
	observer := r.opts.Observer
	if observer == nil {
		observer = noObserver{}
	}
	obs := observer.Start(ctx, r.key)
	returned := false
	defer func() {
		if !returned {
			// A panic or a Goexit on its way up: the run failed.
			err = &Error{Op: "run", Key: r.key, Err: errAbnormal}
		}
		obs.End(stats, err)
	}()
	x := newExecution(r, start, &stats)
	x.obs = obs
	if held != nil {
		x.held = held.held
	}
	locks, err := r.redis.Locks.Acquire(ctx, protocol.AcquireOptions{
		Op: "acquire", Key: r.key, Lives: r.lives, Families: r.families(), Mode: protocol.ModeRebuild, TTL: r.opts.TTL,
		Checks: r.checks(x.targets, x.held != nil), Record: x.recordFields(), Stamp: r.stamp(),
	})
	if err != nil {
		returned = true
		return stats, err
	}
	x.locks = locks
	if r.opts.Publish == Generations {
		if err := x.allocate(ctx); err != nil {
			returned = true
			return stats, r.redis.Locks.ReleaseAfter(ctx, locks, err)
		}
	}
	obs.Phase(PhaseBuilding)
	err = x.run(ctx, src)
	if err == nil && x.gen != nil {
		// The flip happened: the old generation stays readable for the
		// grace period, then goes.
		r.retire(ctx, x.publisher.retired, x.buckets())
	}
	returned = true
	stats.Elapsed = time.Since(start)
	return stats, err
}

// errAbnormal is what an Observer's End gets for a run that panicked or
// called runtime.Goexit: the panic goes on to the caller.
var errAbnormal = errors.New("the run panicked, or a builder or the source called runtime.Goexit")

// execution is one Run's source, pump and build: the only stages that
// depend on the items' type. The stages after build are the pipeline's,
// and share the runState.
type execution[T any] struct {
	*runState
	r    *Rebuilder[T]
	free chan []T // batch buffers to reuse
}

// runState is what the stages after build share of one Run: its locks,
// targets, progress and stats, and what the publish needs. The stages
// themselves are the pipeline's.
type runState struct {
	r       *core
	locks   []*protocol.Lock
	suffix  string // every temp key of the run ends with it
	stats   *Stats
	targets *targets
	progress

	catchUp *catchUp // the catch-up, and the counts of the logs of changes: made by startPipeline
	held    *held    // Build's run, nil for Run
	// stalePrevs are, per family, the kept previous values of its buckets
	// found by the reviewer's scans: written by them, read by the publish
	// once they are done.
	stalePrevs []map[string]bool
	// gen is the state of a run in Generations mode, nil in
	// RenameInPlace mode.
	gen       *generations
	publisher *publisher // the publish stage: made by startPipeline, with the catch-up
}

// newExecution returns the state of a run of r started at start.
func newExecution[T any](r *Rebuilder[T], start time.Time, stats *Stats) *execution[T] {
	return &execution[T]{runState: newRunState(&r.core, start, stats), r: r, free: make(chan []T, r.opts.Writers+1)}
}

// newRunState returns the state of a run of r started at start.
func newRunState(r *core, start time.Time, stats *Stats) *runState {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:]) // crypto/rand.Read never fails (Go 1.24+)
	x := &runState{
		r: r, stats: stats,
		suffix: keys.TempSuffix(start.Unix(), binary.BigEndian.Uint64(nonce[:])),
		progress: progress{
			start: start, entries: make([]int64, len(r.owners)), skipped: make([]int64, len(r.owners)),
			rates: newRateMeter(start), report: r.opts.Progress,
		},
	}
	x.phase.Store(PhaseBuilding)
	x.targets = x.newTargets()
	return x
}

// newTargets returns the run's targets: temp keys in RenameInPlace mode,
// the keys of the run's generation in Generations mode, where a family's
// keys may spread over every slot of a cluster and MaxKeys does not bind
// (the flip is O(indexes)).
func (x *runState) newTargets() *targets {
	r := x.r
	var ts *targets
	if r.opts.Publish == Generations {
		ts = newTargets(r.owners, false, x.genTemp)
	} else {
		ts = newTargets(r.owners, r.redis.Cluster(), func(live string) string {
			return keys.Base(live, r.redis.Cluster()) + x.suffix
		})
		ts.max = max(0, r.opts.MaxKeys)
	}
	ts.log = func(live string) {
		r.opts.Logger.Warn("keyswap: skipped entries whose key has the shape of keyswap's own keys; the rest is rebuilt",
			"key", r.key, "skipped_key", live)
	}
	return ts
}

// recordFields returns the fields the run's record starts with, besides
// its keys and mode.
func (x *runState) recordFields() []string {
	host, _ := os.Hostname()
	return []string{
		protocol.FieldSuffix, x.suffix, protocol.FieldHost, host, protocol.FieldPID, strconv.Itoa(os.Getpid()),
		protocol.FieldStarted, protocol.Now(x.start), protocol.FieldTTL, strconv.FormatInt(x.r.ttlSecs, 10),
		protocol.FieldExpected, strconv.FormatInt(x.r.opts.Expected, 10), protocol.FieldPhase, string(PhaseBuilding),
	}
}

// families reports which builders are families.
func (r *core) families() []bool {
	out := make([]bool, len(r.owners))
	for i, o := range r.owners {
		out[i] = o.family
	}
	return out
}

// run is Run after the locks are taken. Every way out of it, a panic or a
// Goexit included, ends every goroutine it started, then either publishes or
// discards every temp key, and releases the locks. The stages are those of
// the package documentation, "Pipeline": the caller's goroutine pulls the
// source (pump), each batch is built in a goroutine of its own (build), and
// one sender hands them to the writer; the pipeline wires the stages after
// build together, and publishes.
func (x *execution[T]) run(ctx context.Context, src sources.Source[T]) (err error) {
	p := startPipeline(ctx, x.runState)
	defer p.cancel(nil)
	defer p.stop(ctx, &err) // on every path, a panic or a Goexit in the source included
	srcErr := x.pump(p.sendCtx, p.sends, p.send, p.throttle, src(hook.WithOwnKeys(p.sendCtx, x.r.owns)))
	return p.finish(srcErr)
}

// isPanic reports whether err is a builder's panic, which Run re-panics.
func isPanic(err error) bool {
	_, ok := err.(*PanicError)
	return ok
}

// owns reports whether key is one r rebuilds: a builder's key, or a bucket
// of a family.
func (r *core) owns(key string) bool {
	for _, o := range r.owners {
		if key == o.key || o.family && strings.HasPrefix(key, o.key+":") {
			return true
		}
	}
	return false
}

// errGoexit marks a batch whose builder called runtime.Goexit.
var errGoexit = errors.New("keyswap: a builder called runtime.Goexit")

// stamp returns what the run's acquire does with the owner stamps of its
// indexes' bases (SPEC C104): a run in Generations mode, whose base keeps
// a pointer and a registry without a TTL, stamps it; a run in
// RenameInPlace mode only checks, so that it never deletes the pointer of
// another index sharing its base, and leaves no key of its own there. The
// acquire reads stamps on a cluster, outside a group, for the keys whose
// base another key can have (keys.Aliasable) only.
func (r *core) stamp() protocol.Stamp {
	if r.opts.Publish == Generations {
		return protocol.StampSet
	}
	return protocol.StampCheck
}

package rebuild

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/internal/run"
	"golang.org/x/sync/errgroup"
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
// a builder gets the same cleanup, then propagates (see [PanicError]). The
// package documentation, "Errors", lists what each error means.
//
// Stats are returned on failure too, with what was done before it.
func (r *Rebuilder[T]) Run(ctx context.Context, src Source[T]) (Stats, error) {
	start := time.Now()
	stats := Stats{Entries: map[string]int64{}, Outcomes: map[string]Outcome{}}
	if src == nil {
		return stats, &Error{Op: "config", Key: r.key, Err: errNilSource}
	}
	lives := make([]string, len(r.owners))
	for i, o := range r.owners {
		lives[i] = o.key
	}
	locks, err := r.redis.Acquire(ctx, "acquire", lives, r.opts.TTL)
	if err != nil {
		return stats, err
	}
	x := &execution[T]{r: r, start: start, locks: locks, stats: &stats}
	err = x.run(ctx, src)
	stats.Elapsed = time.Since(start)
	return stats, err
}

// execution is the state of one Run.
type execution[T any] struct {
	r       *Rebuilder[T]
	start   time.Time
	locks   []*run.Lock
	stats   *Stats
	targets *targets
	lease   *lease

	items, batches atomic.Int64  // items in sent batches, sent batches
	entries        []int64       // entries written per builder; only the sender writes
	free           chan []T      // batch buffers to reuse
	slots          chan struct{} // one per batch in flight: built, queued or being sent
}

// run is Run after the locks are taken. Every way out of it, a panic
// included, ends every goroutine it started, then either publishes or
// discards every temp key, and releases the locks. The stages are those of
// the package documentation, "Pipeline": the caller's goroutine pulls the
// source (pump), each batch is built in a goroutine of its own (build), and
// one sender writes them (send, write).
func (x *execution[T]) run(ctx context.Context, src Source[T]) (err error) {
	r := x.r
	x.entries = make([]int64, len(r.builders))
	x.free = make(chan []T, r.opts.Writers+1)
	x.slots = make(chan struct{}, r.opts.Writers)
	x.targets = newTargets(r.owners, r.redis.Cluster(), r.newTemp)

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	x.lease = newLease(r.redis, x.locks, x.targets, r.opts.TTL, r.key, cancel, x.batches.Load, x.start)
	var leaseDone sync.WaitGroup
	leaseDone.Go(func() { x.lease.run(runCtx) })

	// The family scans run concurrently with the source.
	scans, scanCtx := errgroup.WithContext(runCtx)
	live := x.scanFamilies(scanCtx, scans)
	g, gctx := errgroup.WithContext(runCtx)
	queue := make(chan *batch[T], r.opts.Writers)
	g.Go(func() error { return x.send(gctx, queue) })

	published := false
	defer func() {
		// On every path, a panic in the source included: stop, wait, clean up.
		cancel(errors.New("keyswap: run ended"))
		_ = g.Wait()
		_ = scans.Wait()
		x.lease.stop()
		leaseDone.Wait()
		if !published {
			r.redis.Discard(ctx, r.key, run.TempKeys(x.targets.temps())...)
		}
		err = r.redis.ReleaseAfter(ctx, x.locks, err)
		x.stats.Batches = x.batches.Load()
	}()

	srcErr := x.pump(gctx, g, queue, src(gctx))
	if failure := x.failure(runCtx, g.Wait(), srcErr); failure != nil {
		cancel(failure) // stops the family scans: nothing will be published
		_ = scans.Wait()
		if isPanic(failure) {
			panic(failure) // after the deferred cleanup, in the caller's goroutine
		}
		return failure
	}
	if err := scans.Wait(); err != nil {
		return &Error{Op: "scan", Key: r.key, Err: err}
	}

	x.lease.stop()
	leaseDone.Wait()
	published, err = x.publish(runCtx, live)
	return err
}

// failure returns the first failure of a run whose writers returned werr
// and whose source returned srcErr, or nil: a write or build error (a panic
// included) or the source's error, which happen before anything cancels the
// run; or else the caller's cancellation or a lost lease, which stop the
// pipeline without an error of its own.
func (x *execution[T]) failure(runCtx context.Context, werr, srcErr error) error {
	switch cause := context.Cause(runCtx); {
	case isPanic(werr):
		return werr
	case werr != nil && errors.Is(cause, ErrLockLost):
		// A stall that outlived the lease also timed out the batch in
		// flight: the lost lease is the cause, the write error its symptom.
		return errors.Join(run.Wrap("lease", x.r.key, cause), werr)
	case werr != nil:
		return werr
	case srcErr != nil:
		return &Error{Op: "source", Key: x.r.key, Err: srcErr}
	case cause != nil:
		return run.Wrap("run", x.r.key, cause)
	}
	return nil
}

// isPanic reports whether err is a builder's panic, which Run re-panics.
func isPanic(err error) bool {
	_, ok := err.(*PanicError)
	return ok
}

// newTemp returns a new temp key for live.
func (r *Rebuilder[T]) newTemp(live string) string {
	return r.redis.NewTempKey(live, time.Now())
}

package rebuild

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
	"golang.org/x/sync/errgroup"
)

// pipeline wires a run's stages after build together, in one place. An
// item goes one way through them: the pump (execution) hands each built
// batch to the sender, which hands round trips to the writer; the catch-up
// writes through the writer too, then the family scans and the guards
// review the result, and the publisher ends the run. Beside that path, the
// throttle holds the pump back, and the lease renews the locks with
// heartbeats that carry the run's status and bring back an operator's
// requests (status, control). startPipeline starts the stages; finish waits
// for them, catches up, and publishes; stop ends them all and cleans up.
type pipeline struct {
	x      *runState
	ctx    context.Context // the run's: cancelled, with a cause, when it fails
	cancel context.CancelCauseFunc

	send     *sender   // build to writer
	writer   *writer   // the writes, with the heartbeats riding them
	throttle *throttle // holds the pump back, and watches it for a stall
	lease    *lease    // replaced by a resumed one after a publish that did not happen
	reviewer *reviewer // the family scans, the guards, and a held run's decision

	sends   *errgroup.Group // the sender and the builds
	sendCtx context.Context

	owner     leaseOwner // what the lease heartbeats see of the run
	leaseDone sync.WaitGroup
	published bool
}

// startPipeline starts the stages of x after build: the writer, the
// throttle, the catch-up and the publisher, the lease, the family scans,
// the sender and the pacer.
func startPipeline(ctx context.Context, x *runState) *pipeline {
	r := x.r
	p := &pipeline{x: x}
	p.ctx, p.cancel = context.WithCancelCause(ctx)
	p.writer = newWriter(p.ctx, r, x.gen, &x.acked, func() *lease { return p.lease })
	p.throttle = newThrottle(r, x.start, &x.pulled)
	x.catchUp = newCatchUp(catchUpScope{
		redis: r.redis, key: r.key, lives: r.lives, owners: r.owners, targets: x.targets,
		batchSize: r.opts.BatchSize, timeout: r.opts.CatchUpTimeout, exact: r.opts.Publish == Generations && r.spreads(),
		write: func(ctx context.Context, txns []*txn) error {
			p.lease.temps.Lock()
			defer p.lease.temps.Unlock()
			return p.writer.write(ctx, txns)
		},
	}, x.locks)
	x.publisher = x.newPublisher()
	p.owner = p.leaseOwner()
	p.lease = newLease(p.owner, x.start)
	p.leaseDone.Go(func() { p.lease.run(p.ctx) })

	// The family scans run concurrently with the source.
	p.reviewer = newReviewer(p.ctx, x)
	p.sends, p.sendCtx = errgroup.WithContext(p.ctx)
	p.send = newSender(r, p.writer, &x.progress)
	p.sends.Go(func() error { return p.send.run(p.sendCtx) })

	// The pacer runs while the source does (Options.LatencyBudget).
	p.throttle.start(p.ctx)
	return p
}

// stop ends every stage, then publishes or discards, releases the locks,
// and completes the stats. It runs on every path out of the run, a panic or
// a Goexit in the source included; *err is the run's error.
func (p *pipeline) stop(ctx context.Context, err *error) {
	x, r := p.x, p.x.r
	p.cancel(errors.New("keyswap: run ended"))
	p.throttle.stop()
	_ = p.sends.Wait()
	_ = p.reviewer.wait()
	p.writer.bulk.Close() // every write has returned
	p.lease.end()
	p.leaseDone.Wait()
	switch {
	case x.gen != nil:
		if !p.published {
			x.discardGen(ctx)
		}
		x.gen.counters.drop(ctx)
	case !p.published:
		r.redis.Discard(ctx, r.key, protocol.TempKeys(x.targets.temps())...)
	}
	*err = r.redis.Locks.ReleaseAfter(ctx, x.locks, *err)
	x.stats.Items = x.pulled.Load()
	x.stats.Batches = x.batches.Load()
	for i, o := range r.owners {
		if n := x.skipped[i]; n > 0 {
			x.stats.Skipped[o.key] = n
		}
	}
}

// finish waits for the sender and the scans once the pump, which returned
// srcErr, is done; then, unless the run failed, catches up and publishes.
func (p *pipeline) finish(srcErr error) error {
	x := p.x
	p.throttle.sourceEnded()
	if failure := p.failure(p.sends.Wait(), srcErr); failure != nil {
		p.cancel(failure) // stops the family scans: nothing will be published
		_ = p.reviewer.wait()
		switch {
		case isPanic(failure):
			panic(failure) // after the deferred cleanup, in the caller's goroutine
		case failure == errGoexit:
			runtime.Goexit() // the same, for a builder's Goexit
		}
		return failure
	}
	if err := p.reviewer.wait(); err != nil {
		return &Error{Op: "scan", Key: x.r.key, Err: err}
	}
	return p.publish()
}

// failure returns the first failure of the run whose writers returned werr
// and whose source returned srcErr, or nil: a write or build error (a panic
// included) or the source's error, which happen before anything cancels the
// run; or else the caller's cancellation, a lost lease, a stalled source or
// an operator's cancel, which stop the pipeline without an error of its own.
func (p *pipeline) failure(werr, srcErr error) error {
	x := p.x
	switch cause := context.Cause(p.ctx); {
	case isPanic(werr), werr == errGoexit:
		return werr
	case werr != nil && errors.Is(cause, ErrLockLost):
		// A stall that outlived the lease also timed out the batch in
		// flight: the lost lease is the cause, the write error its symptom.
		return errors.Join(protocol.Wrap("lease", x.r.key, cause), werr)
	case werr != nil && p.lease.lapsed(time.Now()):
		// The same, with the watchdog not run yet (a loaded machine runs
		// its timer late).
		return errors.Join(p.lease.lapseError(), werr)
	case werr != nil:
		return werr
	case srcErr != nil:
		return &Error{Op: "source", Key: x.r.key, Err: srcErr}
	case cause != nil:
		return protocol.Wrap("run", x.r.key, cause)
	}
	return nil
}

// publish catches up with the changes applied during the run, then
// publishes; again while the publish finds more changes than it replays
// itself.
func (p *pipeline) publish() error {
	x, r := p.x, p.x.r
	caughtUp := time.Now()
	deadline := caughtUp.Add(r.opts.CatchUpTimeout)
	defer func() { x.stats.CatchUp = time.Since(caughtUp) }()
	if len(r.opts.Guards) > 0 || x.held != nil {
		// The guards and the holder see the result caught up.
		if err := p.review(deadline); err != nil {
			return err
		}
	}
	if x.held != nil {
		// Held for a while: catch up again, from now.
		caughtUp, deadline = time.Now(), time.Now().Add(r.opts.CatchUpTimeout)
	}
	for {
		behind, err := p.publishOnce(deadline)
		if behind == nil {
			return err
		}
		if time.Now().After(deadline) {
			return &Error{Op: "catch-up", Key: r.key, Err: fmt.Errorf("%w: %d changes still to replay after catching up for %v (Options.CatchUpTimeout): they arrive faster than the run replays them; every live key left unchanged (and holds every change)", ErrFallingBehind, behind.Tail, r.opts.CatchUpTimeout)}
		}
		// Renew the lease again, and catch up with what came meanwhile.
		p.lease = p.lease.resume(p.owner)
		p.leaseDone.Go(func() { p.lease.run(p.ctx) })
	}
}

// review catches up, then runs the guards and holds a held run.
func (p *pipeline) review(deadline time.Time) error {
	x := p.x
	x.setPhase(PhaseCatchingUp)
	if err := x.catchUp.run(p.ctx, deadline); err != nil {
		return err
	}
	// A run that ended meanwhile (a lost lease, a cancel) says why,
	// rather than what its next command ran into.
	if cause := context.Cause(p.ctx); cause != nil {
		return protocol.Wrap("run", x.r.key, cause)
	}
	return p.reviewer.decide(p.ctx)
}

// publishOnce catches up, waits for the durability asked for, ends the
// lease and publishes (or flips). It returns behind when the publish found
// more changes than it replays itself: nothing was published, and the run
// catches up again.
func (p *pipeline) publishOnce(deadline time.Time) (behind *protocol.BehindError, err error) {
	x, r := p.x, p.x.r
	x.setPhase(PhaseCatchingUp)
	if err := x.publisher.cutOver(p.ctx); err != nil {
		return nil, err
	}
	if err := x.catchUp.run(p.ctx, deadline); err != nil {
		return nil, err
	}
	if cause := context.Cause(p.ctx); cause != nil {
		return nil, protocol.Wrap("run", r.key, cause)
	}
	// The lease lives on through the durability wait: the heartbeats
	// keep the locks, show the phase, and read an operator's cancel.
	if d := r.durability(); d != (protocol.Durability{}) {
		x.setPhase(PhaseWaiting)
		if err := x.publisher.waitDurable(p.ctx, d); err != nil {
			if cause := context.Cause(p.ctx); cause != nil {
				return nil, protocol.Wrap("run", r.key, cause)
			}
			return nil, err
		}
	}
	x.setPhase(PhasePublishing)
	p.lease.end()
	p.leaseDone.Wait()
	if cause := context.Cause(p.ctx); cause != nil {
		return nil, protocol.Wrap("run", r.key, cause)
	}
	if x.gen != nil {
		p.published, err = x.publisher.flip(p.ctx)
	} else {
		p.published, err = x.publisher.publish(p.ctx, p.reviewer.live, x.stalePrevs)
	}
	if !errors.As(err, &behind) {
		return nil, err
	}
	return behind, nil
}

package rebuild

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
	"golang.org/x/sync/errgroup"
)

// pipeline wires a run's stages after build together, in one place: the
// lease and its heartbeats, the family scans, the sender, the pacer and the
// stall watch start with it; finish waits for them, catches up, and
// publishes; stop ends them all and cleans up.
type pipeline struct {
	x      *runState
	ctx    context.Context // the run's: cancelled, with a cause, when it fails
	cancel context.CancelCauseFunc

	sends   *errgroup.Group // the sender and the builds
	sendCtx context.Context
	queue   chan *batch // built batches, in source order, to the sender

	scans *errgroup.Group   // the family scans, concurrent with the source
	live  []map[string]bool // what they found: the families' live buckets

	stopPacing context.CancelFunc
	paced      sync.WaitGroup

	owner      leaseOwner // what the lease heartbeats see of the run
	leaseDone  sync.WaitGroup
	sourceDone atomic.Bool
	published  bool
}

// startPipeline starts the stages of x after build: the lease, the family
// scans, the sender and the pacer.
func (x *runState) startPipeline(ctx context.Context) *pipeline {
	r := x.r
	p := &pipeline{x: x}
	p.ctx, p.cancel = context.WithCancelCause(ctx)
	x.cancel = p.cancel
	x.writer = newWriter(p.ctx, r, x.gen, &x.acked, func() *lease { return x.lease })
	x.stall = &stallWatch{timeout: r.opts.StallTimeout, items: &x.pulled, lastChange: x.start, idle: func() bool {
		return p.sourceDone.Load() || x.gate.isPaused()
	}}
	p.owner = x.leaseOwner(p.cancel)
	x.lease = newLease(p.owner, x.start)
	p.leaseDone.Go(func() { x.lease.run(p.ctx) })

	// The family scans run concurrently with the source.
	scans, scanCtx := errgroup.WithContext(p.ctx)
	p.scans, p.live = scans, x.scanFamilies(scanCtx, scans)
	p.sends, p.sendCtx = errgroup.WithContext(p.ctx)
	p.queue = make(chan *batch, r.opts.Writers)
	p.sends.Go(func() error { return x.send(p.sendCtx, p.queue) })

	// The pacer runs while the source does (Options.LatencyBudget).
	paceCtx, stopPacing := context.WithCancel(p.ctx)
	p.stopPacing = stopPacing
	if r.opts.LatencyBudget > 0 {
		p.paced.Go(func() { x.pacing.run(paceCtx) })
	}
	return p
}

// leaseOwner returns what the lease of x sees of it.
func (x *runState) leaseOwner(cancel context.CancelCauseFunc) leaseOwner {
	r := x.r
	owner := leaseOwner{
		redis: r.redis, locks: x.locks, targets: x.targets, ttl: r.opts.TTL, key: r.key, cancel: cancel,
		acked: x.acked.Load, status: x.status, control: x.control,
		stall: x.stall, tempSecs: &x.writer.tempSecs, log: r.opts.Logger,
	}
	if x.gen != nil {
		// No temp key to refresh: the data keys have no TTL, and the
		// counters of a cluster's slots are renewed instead.
		owner.renew = x.gen.counters.renew
		if r.redis.Cluster() {
			// The writes are counted per slot, not in the record.
			owner.acked = func() int64 { return 0 }
		}
	}
	return owner
}

// stop ends every stage, then publishes or discards, releases the locks,
// and completes the stats. It runs on every path out of the run, a panic or
// a Goexit in the source included; *err is the run's error.
func (p *pipeline) stop(ctx context.Context, err *error) {
	x, r := p.x, p.x.r
	p.cancel(errors.New("keyswap: run ended"))
	p.stopPacing()
	p.paced.Wait()
	_ = p.sends.Wait()
	_ = p.scans.Wait()
	x.writer.bulk.Close() // every write has returned
	x.lease.end()
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
	p.sourceDone.Store(true)
	p.stopPacing()
	p.paced.Wait()
	if failure := x.failure(p.ctx, p.sends.Wait(), srcErr); failure != nil {
		p.cancel(failure) // stops the family scans: nothing will be published
		_ = p.scans.Wait()
		switch {
		case isPanic(failure):
			panic(failure) // after the deferred cleanup, in the caller's goroutine
		case failure == errGoexit:
			runtime.Goexit() // the same, for a builder's Goexit
		}
		return failure
	}
	if err := p.scans.Wait(); err != nil {
		return &Error{Op: "scan", Key: x.r.key, Err: err}
	}
	return p.publish()
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
		x.lease = x.lease.resume(p.owner)
		p.leaseDone.Go(func() { x.lease.run(p.ctx) })
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
	return x.decide(p.ctx, p.live)
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
	x.lease.end()
	p.leaseDone.Wait()
	if cause := context.Cause(p.ctx); cause != nil {
		return nil, protocol.Wrap("run", r.key, cause)
	}
	if x.gen != nil {
		p.published, err = x.publisher.flip(p.ctx)
	} else {
		p.published, err = x.publisher.publish(p.ctx, p.live, x.stalePrevs)
	}
	if !errors.As(err, &behind) {
		return nil, err
	}
	return behind, nil
}

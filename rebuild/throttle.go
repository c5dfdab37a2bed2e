package rebuild

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
)

// throttle holds a run's source back, and watches it, while the pump pulls
// it: its gate holds the pump while the run is paused, and keeps it under a
// rate (Options.MaxRate or an operator's, and the pacer's); its pacer sets
// the gate's adaptive rate by the latency other clients see
// (Options.LatencyBudget), while the source runs; its stall watch notices a
// source that yields nothing for Options.StallTimeout, and the lease checks
// it. The heartbeats read the throttle for the run's status, and set it as
// an operator asks (control).
type throttle struct {
	gate   *gate
	pacing *pacing
	stall  *stallWatch

	stopPacing context.CancelFunc
	paced      sync.WaitGroup
	sourceDone atomic.Bool // the source ended: it is not expected to yield
}

// newThrottle returns the throttle of a run of r started at start, whose
// pump counts the items it pulls in pulled.
func newThrottle(r *core, start time.Time, pulled *atomic.Int64) *throttle {
	th := &throttle{gate: newGate(r.opts.MaxRate)}
	th.pacing = &pacing{
		redis: r.redis, key: r.key, lockKeys: r.lockKeys, budget: r.opts.LatencyBudget,
		batchSize: r.opts.BatchSize, logger: r.opts.Logger, gate: th.gate, items: pulled.Load,
	}
	th.stall = &stallWatch{timeout: r.opts.StallTimeout, items: pulled, lastChange: start, idle: func() bool {
		return th.sourceDone.Load() || th.gate.isPaused()
	}}
	return th
}

// start starts the pacer (Options.LatencyBudget), until ctx ends or the
// source does.
func (th *throttle) start(ctx context.Context) {
	ctx, th.stopPacing = context.WithCancel(ctx)
	if th.pacing.budget > 0 {
		th.paced.Go(func() { th.pacing.run(ctx) })
	}
}

// wait lets the pump pull the next item: see gate.wait.
func (th *throttle) wait(ctx context.Context) bool { return th.gate.wait(ctx) }

// sourceEnded stops the pacer, and the stall watch, once the source has
// ended: the catch-up and the publish are not paced.
func (th *throttle) sourceEnded() {
	th.sourceDone.Store(true)
	th.stop()
}

// stop stops the pacer and waits for it. Calling it again does nothing.
func (th *throttle) stop() {
	th.stopPacing()
	th.paced.Wait()
}

// control applies an operator's throttle and pause, read by a heartbeat:
// without a throttle, the run goes at maxRate (Options.MaxRate).
func (th *throttle) control(c protocol.Control, maxRate float64) {
	if c.Rate > 0 {
		th.gate.setRate(c.Rate)
	} else {
		th.gate.setRate(maxRate)
	}
	th.gate.setPaused(c.Paused)
}

// stallWatch notices a source that yields nothing for a whole timeout.
type stallWatch struct {
	timeout time.Duration
	items   *atomic.Int64 // items pulled so far
	idle    func() bool   // the source is not expected to yield: paused, or done

	mu         sync.Mutex
	last       int64
	lastChange time.Time
}

// check returns an error matching ErrStalled when no item has come for
// the timeout, and nil otherwise.
func (s *stallWatch) check(now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.items.Load(); n != s.last || s.idle() || s.lastChange.IsZero() {
		s.last, s.lastChange = n, now
		return nil
	}
	if now.Sub(s.lastChange) >= s.timeout {
		return fmt.Errorf("%w: it yielded no item for %v (Options.StallTimeout)", ErrStalled, s.timeout)
	}
	return nil
}

// lastProgress returns when the source was last seen yielding an item (or
// the run started).
func (s *stallWatch) lastProgress() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastChange
}

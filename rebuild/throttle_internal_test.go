package rebuild

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
)

// TestThrottleStall: the throttle's stall watch fails a source that yields
// nothing for StallTimeout (C61), but not while an operator pauses the run,
// nor once the source has ended; an item resets it.
func TestThrottleStall(t *testing.T) {
	const timeout = time.Minute
	start := time.Now()
	var pulled atomic.Int64
	th := newThrottle(&core{opts: Options{StallTimeout: timeout, MaxRate: 100}}, start, &pulled)
	th.start(t.Context()) // no LatencyBudget: no pacer runs
	defer th.stop()
	check := func(at time.Duration, want bool) {
		t.Helper()
		err := th.stall.check(start.Add(at))
		if got := errors.Is(err, ErrStalled); got != want {
			t.Fatalf("at %v: stalled %v (%v), want %v", at, got, err, want)
		}
	}
	check(timeout-time.Second, false)
	check(timeout, true)
	pulled.Add(1) // an item came
	check(timeout+time.Second, false)
	check(2*timeout, false)
	check(2*timeout+time.Second, true)

	th.control(protocol.Control{Paused: true}, 100)
	check(4*timeout, false) // paused: nothing is expected
	th.control(protocol.Control{}, 100)
	if got := th.gate.rate(); got != 100 {
		t.Errorf("rate after the operator's throttle is lifted: got %v, want MaxRate 100", got)
	}
	check(5*timeout-time.Second, false)
	check(5*timeout, true)

	th.sourceEnded()
	check(7*timeout, false) // the source ended: a stall is no longer its
	if got := th.stall.lastProgress(); !got.Equal(start.Add(7 * timeout)) {
		t.Errorf("lastProgress: got %v, want the last check's %v", got, start.Add(7*timeout))
	}
}

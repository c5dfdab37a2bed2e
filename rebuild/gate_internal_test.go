package rebuild

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestGateWaitSurvivesBurstChanges: the pacer and an operator change the
// limit, and with it the limiter's burst, while the pump waits. wait lets
// every item through as long as its context lives: a false would end the
// source early and publish part of it.
func TestGateWaitSurvivesBurstChanges(t *testing.T) {
	g := newGate(50_000) // chunks of 256 items
	ctx := t.Context()
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			if i%2 == 0 {
				g.setAdaptive(2_000) // chunks of 100
			} else {
				g.setAdaptive(0)
			}
			time.Sleep(50 * time.Microsecond)
		}
	})
	defer func() { stop.Store(true); wg.Wait() }()
	for i := range 20_000 {
		if !g.wait(ctx) {
			t.Fatalf("wait returned false at item %d with its context alive", i)
		}
	}
}

// TestGateWaitUntilTheDeadline: a limit that the context's deadline cuts
// short holds the item until the context ends, and only then reports false:
// never earlier, which the pump would take for the end of the source.
func TestGateWaitUntilTheDeadline(t *testing.T) {
	g := newGate(5) // one item at a time, 200 ms apart
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	for i := 0; ; i++ {
		if !g.wait(ctx) {
			if ctx.Err() == nil {
				t.Fatalf("wait returned false at item %d before its context ended", i)
			}
			return
		}
		if i > 10 {
			t.Fatalf("wait let %d items through in 300 ms at 5 items/s", i)
		}
	}
}

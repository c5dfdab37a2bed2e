package rebuild

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// gate paces the source: it holds the pump while the run is paused, and
// keeps it under a rate of items per second when one is set. Its fast path,
// unpaced, is two atomic loads per item.
type gate struct {
	paced   atomic.Bool // paused or rate-limited: take the slow path
	limiter *rate.Limiter
	owed    int // items pulled since the limiter was last asked; only the pump uses it

	mu       sync.Mutex
	paused   bool
	resumed  chan struct{} // closed when the run resumes
	base     float64       // items/s of Options.MaxRate or an operator's throttle; 0 is none
	adaptive float64       // items/s the pacer allows (Options.LatencyBudget); 0 is none
	limit    float64       // the lower of the two that are set: the limit in force; 0 is none
}

// newGate returns a gate limited to perSecond items per second (0: none).
func newGate(perSecond float64) *gate {
	g := &gate{limiter: rate.NewLimiter(rate.Inf, 1)}
	g.setRate(perSecond)
	return g
}

// gateChunk is how many items the pump takes from the limiter at once, so
// that a limited run asks it a few times per second, not per item.
func gateChunk(perSecond float64) int {
	return int(min(256, max(1, perSecond/20)))
}

// setRate sets the limit of Options.MaxRate or of an operator; 0 or less
// removes it.
func (g *gate) setRate(perSecond float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.base = validRate(perSecond)
	g.apply()
}

// setAdaptive sets the limit of the pacer; 0 or less removes it.
func (g *gate) setAdaptive(perSecond float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.adaptive = validRate(perSecond)
	g.apply()
}

// validRate returns perSecond, or 0 (no limit) when it is not a positive
// finite number.
func validRate(perSecond float64) float64 {
	if perSecond <= 0 || math.IsInf(perSecond, 1) || math.IsNaN(perSecond) {
		return 0
	}
	return perSecond
}

// apply puts the lower of the limits that are set in force. g.mu is held.
func (g *gate) apply() {
	limit := g.base
	if g.adaptive > 0 && (limit == 0 || g.adaptive < limit) {
		limit = g.adaptive
	}
	if limit == g.limit {
		return
	}
	g.limit = limit
	if limit == 0 {
		g.limiter.SetLimit(rate.Inf)
	} else {
		g.limiter.SetLimit(rate.Limit(limit))
		g.limiter.SetBurst(gateChunk(limit))
	}
	g.paced.Store(g.paused || g.limit > 0)
}

// rate returns the limit in force, 0 for none.
func (g *gate) rate() float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limit
}

// setPaused pauses or resumes the run.
func (g *gate) setPaused(paused bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if paused == g.paused {
		return
	}
	g.paused = paused
	if paused {
		g.resumed = make(chan struct{})
	} else {
		close(g.resumed)
	}
	g.paced.Store(g.paused || g.limit > 0)
}

// isPaused reports whether the run is paused.
func (g *gate) isPaused() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.paused
}

// wait lets the next item through: at once when the run is not paced,
// otherwise when the run is not paused and the rate allows. It reports false
// when ctx ended first.
func (g *gate) wait(ctx context.Context) bool {
	if !g.paced.Load() {
		return true
	}
	for {
		g.mu.Lock()
		paused, resumed, limit := g.paused, g.resumed, g.limit
		g.mu.Unlock()
		if paused {
			select {
			case <-resumed:
				continue
			case <-ctx.Done():
				return false
			}
		}
		if limit == 0 {
			return true
		}
		if g.owed++; g.owed < gateChunk(limit) {
			return true
		}
		n := g.owed
		g.owed = 0
		return g.take(ctx, n)
	}
}

// take waits for n items' worth of the limiter, or as much as its burst
// allows. It reports false only once ctx has ended: the pump takes false for
// the end of the source, so nothing of the limiter's own may surface as
// one. A reservation that the burst refuses (the limit changed under it)
// is asked again, and a long wait is cut into takeSlice steps, each
// re-reserved at the limit then in force, so that a raised or lifted limit
// takes effect within one.
func (g *gate) take(ctx context.Context, n int) bool {
	for {
		if ctx.Err() != nil {
			return false
		}
		r := g.limiter.ReserveN(time.Now(), min(n, g.limiter.Burst()))
		if !r.OK() {
			continue // the burst shrank since it was read
		}
		d := r.Delay()
		if d == 0 {
			return true
		}
		t := time.NewTimer(min(d, takeSlice))
		select {
		case <-t.C:
			if d <= takeSlice {
				return true
			}
			r.Cancel() // wait again, at the limit now in force
		case <-ctx.Done():
			t.Stop()
			r.Cancel()
			return false
		}
	}
}

// takeSlice is the longest take waits before it asks the limiter again.
const takeSlice = 250 * time.Millisecond

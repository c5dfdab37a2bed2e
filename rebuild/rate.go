package rebuild

import (
	"slices"
	"sync"
	"time"
)

// rateWindow is the span of the current rate that a run's heartbeat writes
// into its record (rate_now), next to the average since the start (rate):
// after an operator's throttle or pause, the average takes minutes to
// show it, the current rate a few seconds.
const rateWindow = 5 * time.Second

// rateMeter measures the current rate of items pulled from the counts the
// heartbeats sample: the items since the newest sample that is at least
// rateWindow old (so over rateWindow plus up to a heartbeat period), or
// since the start while the run is younger than that.
type rateMeter struct {
	mu      sync.Mutex
	samples []rateSample // oldest first; samples[0] is the base of the window
}

// rateSample is the count of items pulled at a time.
type rateSample struct {
	at    time.Time
	items int64
}

// newRateMeter returns the meter of a run started at start, with nothing
// pulled yet.
func newRateMeter(start time.Time) *rateMeter {
	return &rateMeter{samples: []rateSample{{at: start}}}
}

// observe records that items were pulled by now, and returns the current
// rate in items per second. Samples older than the window's base are
// dropped, so that the meter keeps about rateWindow's worth of heartbeats.
func (m *rateMeter) observe(now time.Time, items int64) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	drop := 0
	for drop+1 < len(m.samples) && now.Sub(m.samples[drop+1].at) >= rateWindow {
		drop++
	}
	m.samples = slices.Delete(m.samples, 0, drop)
	base := m.samples[0]
	m.samples = append(m.samples, rateSample{at: now, items: items})
	return float64(items-base.items) / max(now.Sub(base.at).Seconds(), 1e-3)
}

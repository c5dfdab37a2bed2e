package rebuild

import (
	"testing"
	"time"
)

func TestRateMeter(t *testing.T) {
	// Heartbeats every second: 1000 items/s for 10 s, then 100/s, then
	// none. The current rate is over the newest sample at least 5 s old,
	// or since the start while the run is younger.
	start := time.Unix(1_700_000_000, 0)
	m := newRateMeter(start)
	items := int64(0)
	rateAt := func(sec int64) float64 {
		switch {
		case sec <= 10:
			return 1000
		case sec <= 20:
			return 100
		}
		return 0
	}
	want := map[int64]float64{
		1: 1000, 2: 1000, 5: 1000, 10: 1000,
		11: (4*1000 + 100) / 5.0, 14: (1000 + 4*100) / 5.0, 15: 100, 20: 100,
		21: 4 * 100 / 5.0, 25: 0, 30: 0,
	}
	for sec := int64(1); sec <= 30; sec++ {
		items += int64(rateAt(sec))
		got := m.observe(start.Add(time.Duration(sec)*time.Second), items)
		if w, ok := want[sec]; ok && got != w {
			t.Errorf("at %ds: got %v items/s, want %v", sec, got, w)
		}
		if len(m.samples) > 7 {
			t.Errorf("at %ds: %d samples kept, want at most the window's", sec, len(m.samples))
		}
	}

	// A late heartbeat: the window stretches to the last sample.
	m = newRateMeter(start)
	m.observe(start.Add(time.Second), 10)
	if got := m.observe(start.Add(time.Minute), 70); got != 60/59.0 {
		t.Errorf("a heartbeat 59 s late: got %v items/s, want %v", got, 60/59.0)
	}
	// A heartbeat at the very start does not divide by zero.
	if got := newRateMeter(start).observe(start, 0); got != 0 {
		t.Errorf("at the start: got %v, want 0", got)
	}
}

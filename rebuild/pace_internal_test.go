package rebuild

import (
	"testing"
	"time"
)

// TestPacerNext: in slow start, well under the budget, a limit that holds
// the run back doubles, and the first window over the budget ends slow
// start; after it, over the budget the limit drops to paceDecrease of what the
// run achieved, or of the limit if lower, never under the floor; well under
// the budget a limit that holds the run back rises by paceIncrease; one
// that does not, or a latency between paceHeadroom and the budget, stays;
// without a limit, a latency under the budget sets none.
func TestPacerNext(t *testing.T) {
	const budget = 10 * time.Millisecond
	for _, tc := range []struct {
		name      string
		limit     float64
		q         time.Duration
		achieved  float64
		slow      bool
		wantLimit float64
	}{
		{"no limit, under budget", 0, 2 * time.Millisecond, 50_000, false, 0},
		{"slow start, well under, binding", 10_000, 2 * time.Millisecond, 9_900, true, 20_000},
		{"slow start, well under, not binding", 10_000, 2 * time.Millisecond, 3_000, true, 10_000},
		{"slow start, over budget", 10_000, 20 * time.Millisecond, 9_900, true, 5_940},
		{"no limit, over budget", 0, 20 * time.Millisecond, 50_000, false, 30_000},
		{"over budget, limit above achieved", 80_000, 20 * time.Millisecond, 50_000, false, 30_000},
		{"over budget, limit below achieved", 10_000, 20 * time.Millisecond, 50_000, false, 6_000},
		{"over budget, nothing achieved", 10_000, 20 * time.Millisecond, 0, false, 6_000},
		{"over budget, nothing achieved, no limit", 0, 20 * time.Millisecond, 0, false, 100},
		{"over budget, at the floor", 120, 20 * time.Millisecond, 120, false, 100},
		{"well under, limit binding", 10_000, 2 * time.Millisecond, 9_900, false, 12_500},
		{"well under, limit not binding", 10_000, 2 * time.Millisecond, 3_000, false, 10_000},
		{"between headroom and budget", 10_000, 8 * time.Millisecond, 10_000, false, 10_000},
		{"at the budget", 10_000, budget, 10_000, false, 10_000},
	} {
		p := &pacer{budget: budget, floor: 100, limit: tc.limit, slow: tc.slow}
		if got := p.next(tc.q, tc.achieved); got != tc.wantLimit || p.limit != tc.wantLimit || (p.slow && tc.q > budget) {
			t.Errorf("%s: next(%v, %v) from limit %v: got %v (state %v), want %v", tc.name, tc.q, tc.achieved, tc.limit, got, p.limit, tc.wantLimit)
		}
	}
}

// TestPercentile90: the 90th percentile of n samples is the ceil(0.9n)-th
// smallest.
func TestPercentile90(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		out := make([]time.Duration, len(vs))
		for i, v := range vs {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	for _, tc := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{ms(5), 5 * time.Millisecond},
		{ms(10, 1, 9, 2, 8, 3, 7, 4, 6, 5), 9 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11), 10 * time.Millisecond},
		{ms(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 30, 50, 90), 30 * time.Millisecond},
		{ms(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 50, 90), time.Millisecond}, // the two slowest of 20 are the 10%
	} {
		if got := percentile90(append([]time.Duration(nil), tc.in...)); got != tc.want {
			t.Errorf("percentile90(%v): got %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestNewPacer: a pacer starts in slow start at ten batches a second, with
// a floor of a quarter of a batch per second (one item at least).
func TestNewPacer(t *testing.T) {
	for _, tc := range []struct {
		batch        int
		limit, floor float64
	}{{2000, 20_000, 500}, {100, 1000, 25}, {1, 10, 1}} {
		p := newPacer(time.Millisecond, tc.batch)
		if p.limit != tc.limit || p.floor != tc.floor || !p.slow || p.budget != time.Millisecond {
			t.Errorf("newPacer(1ms, %d): got %+v, want limit %v, floor %v, in slow start", tc.batch, *p, tc.limit, tc.floor)
		}
	}
}

package diff

import (
	"math"
	"testing"
)

// TestWilson checks the interval against published values of the Wilson
// score interval (95%), for samples from a population large enough that
// the finite population correction vanishes.
func TestWilson(t *testing.T) {
	for _, tc := range []struct {
		x, n       float64
		wantLo, hi float64
	}{
		{50, 1000, 0.0381, 0.0653},
		{0, 100, 0, 0.0370},
		{100, 100, 0.9630, 1},
		{5, 10, 0.2366, 0.7634},
	} {
		lo, hi := wilson(tc.x, tc.n, 1e15, z95)
		if math.Abs(lo-tc.wantLo) > 1e-4 || math.Abs(hi-tc.hi) > 1e-4 {
			t.Errorf("wilson(%v of %v): got [%.4f, %.4f], want [%.4f, %.4f]", tc.x, tc.n, lo, hi, tc.wantLo, tc.hi)
		}
	}
	// Drawn without replacement, a sample of most of the population says
	// more: the interval narrows.
	lo1, hi1 := wilson(100, 900, 1e15, z95)
	lo2, hi2 := wilson(100, 900, 1000, z95)
	if !(lo2 > lo1 && hi2 < hi1) {
		t.Errorf("900 of 1000: got [%v, %v], want narrower than [%v, %v] of an infinite population", lo2, hi2, lo1, hi1)
	}
}

func TestEstimate(t *testing.T) {
	for _, tc := range []struct {
		name        string
		x, n, size  int64
		want        int64
		wantLo, wHi int64
	}{
		{"no sample", 0, 0, 1000, 0, 0, 0},
		{"empty key", 0, 0, 0, 0, 0, 0},
		{"the whole key", 7, 1000, 1000, 7, 7, 7},
		{"more than the whole key", 7, 1000, 900, 7, 7, 7},
		// 50 of 1000 of a million: 50,000, within [38,100, 65,300].
		{"5%", 50, 1000, 1_000_000, 50_000, 38_100, 65_400},
		// None found: the interval starts at 0, and ends where the
		// sample's size allows.
		{"none", 0, 1000, 1_000_000, 0, 0, 3_900},
		// The sample proves at least x and at most size-(n-x).
		{"nearly all drawn", 10, 990, 1000, 10, 10, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, iv := estimate(tc.x, tc.n, tc.size)
			if got != tc.want {
				t.Errorf("estimate: got %d, want %d", got, tc.want)
			}
			if tc.name == "5%" || tc.name == "none" {
				// Published Wilson bounds, to the hundred.
				if iv.Low > tc.wantLo+100 || iv.Low < tc.wantLo-100 || iv.High > tc.wHi+100 || iv.High < tc.wHi-100 {
					t.Errorf("interval: got %+v, want about [%d, %d]", iv, tc.wantLo, tc.wHi)
				}
				return
			}
			if iv.Low < tc.wantLo || iv.High > tc.wHi || iv.Low > got || iv.High < got {
				t.Errorf("interval: got %+v, want within [%d, %d] and around %d", iv, tc.wantLo, tc.wHi, got)
			}
		})
	}
}

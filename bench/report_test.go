package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestCommas(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1000000: "1,000,000", 5000000: "5,000,000", 12345: "12,345"} {
		if got := commas(n); got != want {
			t.Errorf("commas(%d): got %q, want %q", n, got, want)
		}
	}
}

func TestNewSeries(t *testing.T) {
	mk := func(items int, d time.Duration) sample { return sample{Items: items, Elapsed: d} }
	limit := []sample{mk(1000, time.Second), mk(1000, 2*time.Second), mk(1000, time.Second)}
	got := newSeries([]sample{mk(1000, time.Second), mk(1000, time.Second), mk(1000, 2*time.Second)}, limit).Summary
	// Ratios per round: 1, 2, 0.5.
	if got.Ratio != 1 || got.RatioMin != 0.5 || got.RatioMax != 2 {
		t.Errorf("ratio: got %v (%v–%v), want 1 (0.5–2): paired by round", got.Ratio, got.RatioMin, got.RatioMax)
	}
	if got.Rate != 1000 || got.RateMin != 500 || got.RateMax != 1000 {
		t.Errorf("rate: got %v (%v–%v), want 1000 (500–1000)", got.Rate, got.RateMin, got.RateMax)
	}
}

func TestMedian(t *testing.T) {
	for _, tt := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tt.xs); got != tt.want {
			t.Errorf("median(%v): got %v, want %v", tt.xs, got, tt.want)
		}
	}
}

// TestPublishMarkdownBusy checks that the report says when a publish ran
// past busy-reply-threshold, and only then.
func TestPublishMarkdownBusy(t *testing.T) {
	for _, tt := range []struct {
		publish time.Duration
		want    bool
	}{{time.Second, false}, {6 * time.Second, true}} {
		pr := &publishResult{Rounds: 1, BusyThreshold: 5 * time.Second, Sizes: []publishSize{{Buckets: 100000, Runs: []publishRun{{Publish: tt.publish, Build: time.Second}}}}}
		pr.Sizes[0].summarize()
		var b bytes.Buffer
		pr.markdown(&b)
		if got := strings.Contains(b.String(), "ran past the server's busy-reply-threshold (5 s) in 1 of 1 rounds"); got != tt.want {
			t.Errorf("publish of %v: the report mentions busy-reply-threshold: %v, want %v:\n%s", tt.publish, got, tt.want, b.String())
		}
	}
}

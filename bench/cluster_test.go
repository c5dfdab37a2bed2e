package main

import (
	"slices"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
)

// TestClusterKeyOn checks that Rebuilder i's key is on the master asked
// for, by its hash tag, and that no two Rebuilders share a key.
func TestClusterKeyOn(t *testing.T) {
	cl := &cluster{ranges: [][][2]int64{{{0, 5460}}, {{5461, 10922}}, {{10923, 16383}}}}
	seen := map[string]bool{}
	for i := range 12 {
		m := i % clusterMasters
		key := cl.keyOn(m, i)
		slot := int64(keys.Slot(key))
		if r := cl.ranges[m][0]; slot < r[0] || slot > r[1] || cl.master(key) != m {
			t.Errorf("keyOn(%d, %d) = %q in slot %d, master %d; want master %d (slots %d–%d)", m, i, key, slot, cl.master(key), m, r[0], r[1])
		}
		if _, ok := keys.HashTag(key); !ok || seen[key] {
			t.Errorf("keyOn(%d, %d) = %q: want a hash tag and a key of its own", m, i, key)
		}
		seen[key] = true
	}
	other := (int64(keys.Slot("x")) + 1) % keys.SlotCount
	if got := (&cluster{ranges: [][][2]int64{{{other, other}}}}).master("x"); got != -1 {
		t.Errorf("master of a slot no node serves: got %d, want -1", got)
	}
}

func TestClusterSummarize(t *testing.T) {
	s := func(elapsed time.Duration, each ...time.Duration) clusterRun {
		return clusterRun{Elapsed: elapsed, Each: each, ServerCPU: []time.Duration{time.Second, time.Second, 0}, ClientCPU: time.Second}
	}
	single := []clusterRun{s(time.Second, time.Second), s(2*time.Second, 2*time.Second)}
	cs := clusterSeries{Rebuilders: 2, Samples: []clusterRun{s(time.Second, time.Second, time.Second/2), s(time.Second, time.Second, time.Second)}}
	cs.summarize(1000, single)
	got := cs.Summary
	// 2000 items in 1 s, against 1000 in 1 s and 1000 in 2 s.
	if got.Rate != 2000 || got.SpeedupMin != 2 || got.SpeedupMax != 4 || got.Speedup != 3 {
		t.Errorf("rate %v, speedup %v (%v–%v): want 2000, 3 (2–4), paired by round", got.Rate, got.Speedup, got.SpeedupMin, got.SpeedupMax)
	}
	if got.Summed != 2500 { // (1000 + 2000) and (1000 + 1000), median
		t.Errorf("summed: got %v, want 2500", got.Summed)
	}
	if got.Cores != 3 || got.ClientPerItem != 500*time.Microsecond || got.ServerPerItem != time.Millisecond || !slices.Equal(got.ServerCPU, []time.Duration{time.Second, time.Second, 0}) {
		t.Errorf("cores %v, client and server CPU per item %v and %v, server CPU %v: want 3, 500µs and 1ms, [1s 1s 0]", got.Cores, got.ClientPerItem, got.ServerPerItem, got.ServerCPU)
	}
}

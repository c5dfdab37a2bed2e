package rebuild

import (
	"context"
	"testing"
	"time"
)

// TestSenderSlots: the sender's slots bound the batches in flight to
// Writers, which bounds the run's memory to the batch being filled plus
// Writers in flight; a written batch, once accounted, gives its slot back
// and adds to the run's progress (C51: counts per batch).
func TestSenderSlots(t *testing.T) {
	p := &progress{start: time.Now(), entries: make([]int64, 1), skipped: make([]int64, 1), obs: noObserver{}}
	s := newSender(&core{opts: Options{Writers: 2}}, nil, p)
	ctx := t.Context()
	for i := range 2 {
		if !s.take(ctx) {
			t.Fatalf("slot %d: take returned false with a live context", i+1)
		}
	}
	full, cancel := context.WithCancel(ctx)
	cancel()
	if s.take(full) {
		t.Fatal("a third slot with Writers 2: got one, want take to wait until its context ended")
	}
	released := false
	b := &batch{seq: 1, items: 3, c: &commands{entries: []int64{5}, skipped: []int64{1}}, release: func() { released = true }}
	s.account(b)
	if !released || p.done.Load() != 3 || p.batches.Load() != 1 || p.entries[0] != 5 || p.skipped[0] != 1 {
		t.Errorf("after account: released %v, items %d, batches %d, entries %v, skipped %v; want true, 3, 1, [5], [1]",
			released, p.done.Load(), p.batches.Load(), p.entries, p.skipped)
	}
	if n := len(s.slots); n != 1 {
		t.Fatalf("after a batch was accounted: %d slots taken, want 1", n)
	}
}

package main

import (
	"context"
	"testing"
	"time"

	"github.com/keyswap/keyswap/rebuild"
)

// TestApplicationStops checks that writers stopped while they apply
// changes apply every change they committed: the keys equal the truth.
func TestApplicationStops(t *testing.T) {
	ctx := t.Context()
	srv, err := openServer(ctx, env.Standalone.Addr, -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.close() })
	if err := srv.reset(ctx); err != nil {
		t.Fatal(err)
	}
	w := onlineWorkload(10)
	d := newDataset(1000, 10)
	if err := pipeline(ctx, srv.client, w, d, perCommand, rebuild.Defaults().Writers); err != nil {
		t.Fatal(err)
	}
	rb, err := rebuilder(srv.client, w, rebuild.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := &application{rb: rb, truth: newTruth(d)}
	for range 3 {
		// Stopped once some changes were applied, with many in flight.
		before := a.applied.Load()
		wctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		var calls []call
		var werr error
		go func() {
			defer close(done)
			calls, werr = a.run(wctx, 1e6)
		}()
		deadline := time.After(time.Minute)
		for a.applied.Load() < before+100 {
			select {
			case <-done:
				t.Fatalf("the writers stopped by themselves: %v", werr)
			case <-deadline:
				t.Fatalf("%d changes applied in a minute, want 100", a.applied.Load()-before)
			case <-time.After(time.Millisecond): // poll
			}
		}
		stop()
		<-done
		if werr != nil {
			t.Fatal(werr)
		}
		if got, want := int64(len(calls)), a.applied.Load()-before; got != want {
			t.Errorf("got %d calls, want the %d changes applied", got, want)
		}
	}
	if err := a.truth.verify(ctx, srv.admin, w); err != nil {
		t.Errorf("after %d changes: %v", a.applied.Load(), err)
	}
}

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var out []time.Duration
		for _, n := range ns {
			out = append(out, time.Duration(n)*time.Millisecond)
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tt := range []struct {
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 99, 7 * time.Millisecond},
		{ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{ms(hundred...), 99, 99 * time.Millisecond},
		{ms(hundred...), 100, 100 * time.Millisecond},
		{ms(hundred...), 0, time.Millisecond},
	} {
		if got := percentile(tt.sorted, tt.p); got != tt.want {
			t.Errorf("percentile(%d values, %v): got %v, want %v", len(tt.sorted), tt.p, got, tt.want)
		}
	}
}

// TestNewLatency checks which calls count as during a run: those that
// started and ended within it; overlapping counts those that ran in part.
func TestNewLatency(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(start, took int) call {
		return call{start: t0.Add(time.Duration(start) * time.Millisecond), took: time.Duration(took) * time.Millisecond}
	}
	calls := []call{at(0, 5), at(8, 4), at(12, 1), at(15, 10), at(30, 2)}
	from, to := t0.Add(10*time.Millisecond), t0.Add(20*time.Millisecond)
	if got, want := newLatency(calls, from, to), (latency{Calls: 1, P50: time.Millisecond, P99: time.Millisecond, Max: time.Millisecond}); got != want {
		t.Errorf("newLatency within [10 ms, 20 ms]: got %+v, want %+v", got, want)
	}
	if got := newLatency(calls, time.Time{}, time.Time{}); got.Calls != 5 || got.P50 != 4*time.Millisecond || got.Max != 10*time.Millisecond {
		t.Errorf("newLatency of all: got %+v, want 5 calls, p50 4 ms, max 10 ms", got)
	}
	if got := overlapping(calls, from, to); got != 3 {
		t.Errorf("overlapping [10 ms, 20 ms]: got %d, want 3", got)
	}
}

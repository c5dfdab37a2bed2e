package rebuild_test

import (
	"context"
	"fmt"
	"iter"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// busyScript keeps the server busy for ARGV[1] ms: every other client waits
// behind it, as behind a long transaction.
const busyScript = `
local t = redis.call('TIME')
local from = t[1] * 1000 + t[2] / 1000
repeat
  t = redis.call('TIME')
until t[1] * 1000 + t[2] / 1000 - from >= tonumber(ARGV[1])
return 1`

// TestLatencyBudgetPaces (Options.LatencyBudget): on private servers (the
// test makes them slow for everyone), a run with a 20 ms budget builds from
// an endless source. Its limit, which its status reports, starts at ten
// batches a second and rises while the probes see no more than the budget.
// While another client keeps the server of the run's lock busy 40 ms out
// of every 100, the probes see more than the budget and the limit drops
// under half its peak; once the server is free again it rises to twice the
// lowest it was seen at. Then the
// source ends, and the run publishes every item it pulled, exactly, without
// a TTL, and leaves nothing behind.
func TestLatencyBudgetPaces(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		s := redistest.OwnServer(t)
		testLatencyBudgetPaces(t, s.Client(t), s.Client(t), false)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl, err := redistest.StartCluster(3)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := cl.Stop(); err != nil {
				t.Error(err)
			}
		})
		testLatencyBudgetPaces(t, cl.Client(t), cl.Client(t), true)
	})
}

func testLatencyBudgetPaces(t *testing.T, c, other rueidis.Client, cluster bool) {
	ctx := redistest.Ctx(t)
	key := "{pace}:by-email"
	lock := keys.LockKey(key, cluster)
	record := keys.RecordKey(lock)

	// An endless source, until released; it counts what it yields.
	release := make(chan struct{})
	var yielded atomic.Int64
	src := func(ctx context.Context) iter.Seq2[user, error] {
		return func(yield func(user, error) bool) {
			for i := 0; ; i++ {
				select {
				case <-release:
					return
				default:
				}
				u := user{ID: fmt.Sprintf("u%08d", i), Email: fmt.Sprintf("user%08d@example.com", i)}
				if !yield(u, nil) {
					return
				}
				yielded.Add(1)
			}
		}
	}
	r := redistest.Rebuilder(t, c, rebuild.Options{BatchSize: 100, TTL: 3 * time.Second, LatencyBudget: 20 * time.Millisecond},
		builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, src)
		done <- err
	}()
	var end sync.Once
	finish := func() error {
		var err error
		end.Do(func() {
			close(release)
			err = <-done
		})
		return err
	}
	defer finish() // on a failed check: the run ends before the servers stop

	// limit reads the limit in force from the run's status (0: none).
	limit := func() float64 {
		rec := redistest.HGetAll(t, other, record)
		l, _ := strconv.ParseFloat(rec["limit"], 64)
		return l
	}
	// Slow start: the run starts at ten batches a second, and doubles.
	const start = 10 * 100
	waitFor(t, "the run's first heartbeat", func() bool { return redistest.HGetAll(t, other, record)["beat_at"] != "" })
	peak := 0.0
	waitFor(t, "the limit to rise from the start", func() bool {
		peak = max(peak, limit())
		return peak >= 4*start
	})

	// Keep the lock's server busy 40 ms out of 100.
	busy := rueidis.NewLuaScript(busyScript)
	stopBusy := make(chan struct{})
	var busyDone sync.WaitGroup
	busyDone.Go(func() {
		for {
			select {
			case <-stopBusy:
				return
			case <-time.After(60 * time.Millisecond):
			}
			if err := busy.Exec(ctx, other, []string{lock}, []string{"40"}).Error(); err != nil {
				t.Errorf("busy script: %v", err)
				return
			}
		}
	})
	low := 0.0
	waitFor(t, "the limit to drop while the server is busy", func() bool {
		l := limit()
		peak = max(peak, l)
		low = l
		return l > 0 && l < peak/2
	})
	waitFor(t, "the status to report a latency over the 20 ms budget", func() bool {
		us, _ := strconv.ParseInt(redistest.HGetAll(t, other, record)["latency_us"], 10, 64)
		return us > 20_000
	})
	close(stopBusy)
	busyDone.Wait()

	// Free again: the limit rises (it has a floor, so it stays set).
	waitFor(t, "the limit to rise once the server is free", func() bool { return limit() >= 2*low })
	if err := finish(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	n := yielded.Load()
	if n == 0 {
		t.Fatal("the source yielded nothing")
	}
	got := redistest.HGetAll(t, other, key)
	if int64(len(got)) != n {
		t.Fatalf("published %d fields, want the %d items yielded", len(got), n)
	}
	for i := range n {
		if f := fmt.Sprintf("user%08d@example.com", i); got[f] != fmt.Sprintf("u%08d", i) {
			t.Fatalf("field %s: got %q, want u%08d", f, got[f], i)
		}
	}
	if ttl := redistest.PTTL(t, other, key); ttl != -1 {
		t.Errorf("PTTL %s: got %v, want none", key, ttl)
	}
	redistest.WantClean(t, other, "{pace}")
}

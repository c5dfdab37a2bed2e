package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
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

// TestLatencyBudgetPaces (Options.LatencyBudget, C71): on private servers (the
// test makes them slow for everyone), a run with a 50 ms budget builds from
// an endless source. Its limit, which its status reports, starts at ten
// batches a second and rises while the probes stay well under the budget.
// While another client keeps the server of the run's lock busy 80 ms out
// of every 140, the probes see more than the budget and the limit drops
// under an eighth of its peak; once the server is free again it rises to
// twice what it had dropped to. Then the
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
		cl := redistest.OwnCluster(t, 3)
		testLatencyBudgetPaces(t, cl.Client(t), cl.Client(t), true)
	})
}

func testLatencyBudgetPaces(t *testing.T, c, other rueidis.Client, cluster bool) {
	ctx := redistest.Ctx(t)
	// A budget well above what a loaded test machine adds to a round trip
	// (the limit rises only while the probes stay under 0.7 of it), and a
	// busy server well above the budget.
	const budget, busyFor = 50 * time.Millisecond, "80"
	key := "{pace}:by-email"
	lock := keys.LockKey(key, cluster)
	record := keys.RecordKey(lock)

	finish, yielded := endlessRun(t, c, key, rebuild.Options{BatchSize: 100, TTL: 3 * time.Second, LatencyBudget: budget})
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

	// Keep the lock's server busy 80 ms out of 140.
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
			if err := busy.Exec(ctx, other, []string{lock}, []string{busyFor}).Error(); err != nil {
				t.Errorf("busy script: %v", err)
				return
			}
		}
	})
	// Well down, so that twice as much is within what the run achieves
	// once the server is free.
	low := 0.0
	waitFor(t, "the limit to drop while the server is busy", func() bool {
		l := limit()
		peak = max(peak, l)
		low = l
		return l > 0 && l < peak/8
	})
	waitFor(t, "the status to report a latency over the budget", func() bool {
		us, _ := strconv.ParseInt(redistest.HGetAll(t, other, record)["latency_us"], 10, 64)
		return us > budget.Microseconds()
	})
	close(stopBusy)
	busyDone.Wait()

	// Free again: the limit rises (it has a floor, so it stays set).
	waitFor(t, "the limit to rise once the server is free", func() bool { return limit() >= 2*low })
	if err := finish(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	wantEndless(t, other, key, yielded.Load())
	redistest.WantClean(t, other, "{pace}")
}

// endlessRun starts a run of a Hash at key with opts, from a source that
// yields users until finish is called, which ends the run and returns its
// error; yielded counts the users yielded.
func endlessRun(t *testing.T, c rueidis.Client, key string, opts rebuild.Options) (finish func() error, yielded *atomic.Int64) {
	t.Helper()
	release := make(chan struct{})
	yielded = new(atomic.Int64)
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
	r := redistest.Rebuilder(t, c, opts, builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(redistest.Ctx(t), src)
		done <- err
	}()
	var end sync.Once
	var err error
	return func() error {
		end.Do(func() {
			close(release)
			err = <-done
		})
		return err
	}, yielded
}

// wantEndless fails t unless key holds exactly the n first users of
// endlessRun's source, without a TTL.
func wantEndless(t *testing.T, c rueidis.Client, key string, n int64) {
	t.Helper()
	if n == 0 {
		t.Fatal("the source yielded nothing")
	}
	got := redistest.HGetAll(t, c, key)
	if int64(len(got)) != n {
		t.Fatalf("published %d fields, want the %d items yielded", len(got), n)
	}
	for i := range n {
		if f := fmt.Sprintf("user%08d@example.com", i); got[f] != fmt.Sprintf("u%08d", i) {
			t.Fatalf("field %s: got %q, want u%08d", f, got[f], i)
		}
	}
	if ttl := redistest.PTTL(t, c, key); ttl != -1 {
		t.Errorf("PTTL %s: got %v, want none", key, ttl)
	}
}

// probedRun is endlessRun under "pace" with a 50 ms LatencyBudget, batches
// of 100, and a log recorded at every level.
func probedRun(t *testing.T, c rueidis.Client, key string) (rec logRecorder, finish func() error, yielded *atomic.Int64) {
	t.Helper()
	rec = newLogRecorder()
	finish, yielded = endlessRun(t, c, key, rebuild.Options{BatchSize: 100, LatencyBudget: 50 * time.Millisecond, Logger: slog.New(rec)})
	return rec, finish, yielded
}

// wantProbedEnd ends a probedRun: Run must return nil within a minute of
// its source's end, with exactly the items it pulled published and nothing
// left under "pace".
func wantProbedEnd(t *testing.T, finish func() error, other rueidis.Client, key string, yielded *atomic.Int64) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- finish() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of its source's end")
	}
	wantEndless(t, other, key, yielded.Load())
	redistest.WantClean(t, other, "pace")
}

// TestLatencyProbeCut: the server kills the connection of a run's latency
// probes. The run logs one warning, probes on a new connection, goes on
// pacing (decisions logged at the Debug level), and publishes every item,
// exactly; nothing is left.
func TestLatencyProbeCut(t *testing.T) {
	t.Parallel()
	s := redistest.OwnServer(t)
	c, other := s.Client(t), s.Client(t)
	key := "pace:by-email"
	rec, finish, yielded := probedRun(t, c, key)
	defer finish()

	// The probes' connection is the only one whose last command is GET.
	probes := func() []string {
		list, err := other.Do(t.Context(), other.B().ClientList().Build()).ToString()
		if err != nil {
			t.Fatalf("CLIENT LIST: %v", err)
		}
		var ids []string
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, " cmd=get ") {
				for _, f := range strings.Fields(line) {
					if id, ok := strings.CutPrefix(f, "id="); ok {
						ids = append(ids, id)
					}
				}
			}
		}
		return ids
	}
	var ids []string
	waitFor(t, "the probes' connection", func() bool { ids = probes(); return len(ids) > 0 })
	for _, id := range ids {
		if err := other.Do(t.Context(), other.B().ClientKill().Id(atoi64(t, id)).Build()).Error(); err != nil {
			t.Fatalf("CLIENT KILL ID %s: %v", id, err)
		}
	}
	waitFor(t, "the warning of the failed probe", func() bool {
		return len(rec.matching("keyswap: a latency probe failed", "key="+key)) > 0
	})
	decided := len(rec.matching("keyswap: paced", "key="+key))
	waitFor(t, "probes on a new connection, and decisions from them", func() bool {
		return len(rec.matching("keyswap: paced", "key="+key)) >= decided+2 && len(probes()) > 0 && !slices.Equal(probes(), ids)
	})
	if n := len(rec.matching("keyswap: a latency probe failed")); n != 1 {
		t.Errorf("got %d warnings of failed probes, want 1", n)
	}
	wantProbedEnd(t, finish, other, key, yielded)
}

// TestLatencyProbeNoConnection (C71): the application holds every connection of
// the client's blocking pool (BlockingPoolSize 2: one for the run's writes,
// C81, and one for its probes) to the server of the run's lock, as
// blocking commands would. The probes cannot have one: the
// run warns once, makes no pacing decision (a cluster client's wait for
// the pool is not taken for a slow server), goes on at its starting limit,
// and once the connections are free the probes take one and the pacer
// decides again. The run returns, publishes every item it pulled, exactly, and
// leaves nothing behind. Before, rueidis kept a standalone client's pacer,
// and with it the run's end, waiting for the pool.
func TestLatencyProbeNoConnection(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		s := redistest.OwnServer(t)
		testLatencyProbeNoConnection(t, rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true}, s.Client(t), false)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.OwnCluster(t, 3)
		testLatencyProbeNoConnection(t, rueidis.ClientOption{InitAddress: cl.Addrs}, cl.Client(t), true)
	})
}

func testLatencyProbeNoConnection(t *testing.T, opt rueidis.ClientOption, other rueidis.Client, cluster bool) {
	opt.DisableCache, opt.BlockingPoolSize = true, 2
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(c.Close)
	key := "pace:starved"
	var frees []func()
	for range opt.BlockingPoolSize {
		// A cluster client takes a dedicated connection on its first
		// command, from the pool of the server of that command's key.
		held, release := c.Dedicate()
		var once sync.Once
		frees = append(frees, func() { once.Do(release) })
		t.Cleanup(frees[len(frees)-1])
		if err := held.Do(t.Context(), held.B().Get().Key(keys.LockKey(key, cluster)).Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
			t.Fatalf("GET on a held connection: %v", err)
		}
	}
	free := func() {
		for _, f := range frees {
			f()
		}
	}

	rec, finish, yielded := probedRun(t, c, key)
	defer finish()
	waitFor(t, "the warning that no connection is free for the probes", func() bool {
		return len(rec.matching("keyswap: no connection is free for the latency probes", "key="+key)) > 0
	})
	if n := len(rec.matching("keyswap: paced")); n != 0 {
		t.Errorf("%d pacing decisions without a probe, want none", n)
	}
	pulled := yielded.Load()
	waitFor(t, "the run going on meanwhile", func() bool { return yielded.Load() > pulled })

	free()
	waitFor(t, "decisions from probes on the freed connection", func() bool {
		return len(rec.matching("keyswap: paced", "key="+key)) >= 2
	})
	if n := len(rec.matching("keyswap: no connection is free")); n != 1 {
		t.Errorf("got %d warnings that no connection is free, want 1", n)
	}
	if n := len(rec.matching("keyswap: a latency probe failed")); n != 0 {
		t.Errorf("got %d warnings of failed probes, want none: waiting for the pool is not a failure", n)
	}
	wantProbedEnd(t, finish, other, key, yielded)
}

// TestLatencyProbeTimeout (C71): while another client keeps the server busy for
// 2.5 s, longer than a probe waits (1 s), a probe times out. It counts as a
// round trip of at least 1 s, the pacer decides over the budget, and the
// probes go on, timed, on the same connection: neither a failure nor a
// missing connection is reported. The run then publishes every item it
// pulled, exactly, and leaves nothing behind.
func TestLatencyProbeTimeout(t *testing.T) {
	t.Parallel()
	s := redistest.OwnServer(t)
	c, other := s.Client(t), s.Client(t)
	key := "pace:stalled"
	rec, finish, yielded := probedRun(t, c, key)
	defer finish()
	waitFor(t, "pacing decisions", func() bool { return len(rec.matching("keyswap: paced", "key="+key)) >= 2 })

	busy := s.Client(t)
	if err := busy.Do(t.Context(), busy.B().Eval().Script(busyScript).Numkeys(0).Arg("2500").Build()).Error(); err != nil {
		t.Fatalf("the busy script: %v", err)
	}
	slowest := func() time.Duration {
		var most time.Duration
		for _, line := range rec.matching("keyswap: paced", "key="+key) {
			f := strings.Fields(line[strings.Index(line, " p90=")+len(" p90="):])
			if d, err := time.ParseDuration(f[0]); err == nil && d > most {
				most = d
			}
		}
		return most
	}
	waitFor(t, "a decision on a probe that timed out", func() bool { return slowest() >= time.Second })
	decided := len(rec.matching("keyswap: paced", "key="+key))
	waitFor(t, "decisions after the stall", func() bool { return len(rec.matching("keyswap: paced", "key="+key)) >= decided+2 })
	for _, msg := range []string{"keyswap: no connection is free", "keyswap: a latency probe failed"} {
		if n := len(rec.matching(msg)); n != 0 {
			t.Errorf("got %d warnings %q, want none: a probe that timed out measured the stall", n, msg)
		}
	}
	wantProbedEnd(t, finish, other, key, yielded)
}

func atoi64(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMaxRateDeadline: a run whose MaxRate cannot pull its source before
// its context's deadline fails with that deadline and changes nothing. (The
// rate limiter refuses at once a wait that would pass the deadline; the
// pump took that for the end of the source, and the run published the
// items pulled so far as the whole index.)
func TestMaxRateDeadline(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "paced:by-email"
		old := map[string]string{"old@example.com": "u0"}
		redistest.SeedHash(t, d.Other, key, old)
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 10, MaxRate: 50},
			builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
		ctx, cancel := context.WithTimeout(redistest.Ctx(t), time.Second)
		defer cancel()
		_, err := r.Run(ctx, rebuild.FromSlice(users(1000))) // 20 s at 50 items/s
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run: got %v, want context.DeadlineExceeded", err)
		}
		if got := redistest.HGetAll(t, d.Other, key); !maps.Equal(got, old) {
			t.Errorf("live key: got %d fields, want the old %v", len(got), old)
		}
		if ttl := redistest.PTTL(t, d.Other, key); ttl != -1 {
			t.Errorf("PTTL %s: got %v, want none", key, ttl)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

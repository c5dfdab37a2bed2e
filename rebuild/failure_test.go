package rebuild_test

// All or nothing (Guarantees 3-5; C8, C16, C16+,
// C18, C20, C26, C29, C34, C43-C45, C52): every way a run can fail is made to
// happen for real against a live server, after a first successful run has
// populated the live keys, and every test then checks that each live key is
// byte-identical to before and that no temp key and no lock of ours is left.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// failN is the size of both runs of the all-or-nothing tests: 10 batches of
// failBatch items.
const (
	failN     = 10000
	failBatch = 1000
)

// failShape is the Rebuilder shape of the all-or-nothing tests: a Hash, a
// SortedSet, a SetIndex and a Func builder (the set of ids, where faults are
// injected) over users.
type failShape struct {
	email, score, country, ids string
}

func failNewShape(d deployment) failShape {
	return failShape{
		email:   d.Prefix + "users:by-email",
		score:   d.Prefix + "users:by-score",
		country: d.Prefix + "users:by-country",
		ids:     d.Prefix + "users:ids",
	}
}

// three returns the Hash, SortedSet and SetIndex builders.
func (s failShape) three() []index.Builder[user] {
	return []index.Builder[user]{
		builders.Hash(s.email, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SortedSet(s.score, func(u user) (string, float64, bool) { return u.ID, u.Score, true }),
		builders.SetIndex(s.country, func(u user) (string, string, bool) { return u.Country, u.ID, true }),
	}
}

// builders returns three() and a Func builder of the set of ids that calls
// fault, if not nil, with each batch before building it.
func (s failShape) builders(fault func(items []user)) []index.Builder[user] {
	return append(s.three(), builders.Func(s.ids, func(c *index.Commands, items []user) error {
		if fault != nil {
			fault(items)
		}
		temp, err := c.Temp(s.ids)
		if err != nil {
			return err
		}
		ids := make([]string, len(items))
		for i, u := range items {
			ids[i] = u.ID
		}
		c.Add(c.B().Sadd().Key(temp).Member(ids...).Build(), len(ids))
		return nil
	}))
}

// finals returns the live keys a run over users(n) produces: those of
// three(), and with withIDs the Func builder's too.
func (s failShape) finals(withIDs bool) []string {
	out := []string{s.email, s.score, s.country + ":fr", s.country + ":de", s.country + ":us"}
	if withIDs {
		out = append(out, s.ids)
	}
	slices.Sort(out)
	return out
}

// failSecondUsers is the data of the failing second run: every key would
// change, and the buckets would move from fr/de/us to it/es.
func failSecondUsers(n int) []user {
	us := users(n)
	for i := range us {
		us[i].Email = fmt.Sprintf("changed%06d@example.org", i)
		us[i].Country = []string{"it", "es"}[i%2]
		us[i].Score = float64(-i)
	}
	return us
}

// failPopulate runs bs once successfully over users(failN) and returns the
// snapshot of every key under d.Prefix.
func failPopulate(t *testing.T, d deployment, s failShape, bs []index.Builder[user]) map[string]redistest.KeyState {
	t.Helper()
	if _, err := redistest.Rebuilder(t, d.Client, rebuild.Options{}, bs...).Run(redistest.Ctx(t), sources.Slice(users(failN))); err != nil {
		t.Fatalf("first run: %v", err)
	}
	if got := len(redistest.HGetAll(t, d.Other, s.email)); got != failN {
		t.Fatalf("first run: HLEN %s: got %d, want %d", s.email, got, failN)
	}
	redistest.WantClean(t, d.Other, d.Prefix)
	before := redistest.Snapshot(t, d.Other, d.Prefix)
	want := s.finals(len(bs) == 4)
	var got []string
	for k := range before {
		if !keys.Reserved(k) { // the generations stay, by design
			got = append(got, k)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("first run: live keys: got %q, want %q", got, want)
	}
	return before
}

// failWantNothingChanged is the all-or-nothing check: live keys
// byte-identical, no temp key and no lock left.
func failWantNothingChanged(t *testing.T, d deployment, before map[string]redistest.KeyState) {
	t.Helper()
	redistest.WantUnchanged(t, d.Other, d.Prefix, before)
	redistest.WantClean(t, d.Other, d.Prefix)
}

// failWantError checks that err is a *rebuild.Error of op matching target.
func failWantError(t *testing.T, err error, op string, target error) *rebuild.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("Run: got nil error, want one of op %q matching %v", op, target)
	}
	if target != nil && !errors.Is(err, target) {
		t.Errorf("Run: got error %v, want one matching %v", err, target)
	}
	t.Logf("Run: %v", err)
	var e *rebuild.Error
	if !errors.As(err, &e) {
		t.Fatalf("Run: got error %T %v, want a *rebuild.Error", err, err)
	}
	if op != "" && e.Op != op {
		t.Errorf("Run: got Op %q (%v), want %q", e.Op, err, op)
	}
	return e
}

// failSource yields items[:at], then err.
func failSource(items []user, at int, err error) sources.Source[user] {
	return sources.Seq2(func(yield func(user, error) bool) {
		for _, u := range items[:at] {
			if !yield(u, nil) {
				return
			}
		}
		yield(user{}, err)
	})
}

// failTemps returns the temp keys under prefix whose base is base, scanning
// every node of c. It does not take a testing.TB, so that it can run in a
// Progress callback, on a writer goroutine.
func failTemps(ctx context.Context, c rueidis.Client, prefix, base string) ([]string, error) {
	var out []string
	for addr, node := range c.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(prefix+"*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				return nil, fmt.Errorf("SCAN on %s: %w", addr, err)
			}
			for _, k := range e.Elements {
				if b, _, ok := store.ParseTempKey(k); ok && b == base {
					out = append(out, k)
				}
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return out, nil
}

// failRun runs r and returns its error, or the value it panicked with.
// check runs inside the recover handler, before the panic is swallowed:
// whatever it sees is what the caller sees when the panic reaches it.
func failRun(r *rebuild.Rebuilder[user], ctx context.Context, src sources.Source[user], check func()) (panicked any, err error) {
	defer func() {
		if panicked = recover(); panicked != nil {
			check()
		}
	}()
	_, err = r.Run(ctx, src)
	return nil, err
}

// TestFailSourceError: a source error at item 5,000 of 10,000 discards the
// run and comes back as a *rebuild.Error of Op "source" that errors.Is
// matches to the source's own error (C45, C52).
func TestFailSourceError(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.builders(nil))
		errSource := errors.New("source: database connection reset")
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: failBatch, Writers: 4}, s.builders(nil)...)
		stats, err := r.Run(redistest.Ctx(t), failSource(failSecondUsers(failN), failN/2, errSource))
		failWantError(t, err, "source", errSource)
		if len(stats.Outcomes) != 0 {
			t.Errorf("Stats.Outcomes: got %v, want none after a failure", stats.Outcomes)
		}
		failWantNothingChanged(t, d, before)
	})
}

// failPanicValue is what the panicking builder and source panic with, so
// that identity shows the original value came through.
type failPanicValue struct{ where string }

// TestFailPanic: a panic in a builder (on a writer goroutine) or in the
// source (on Run's goroutine) gets the full cleanup before it reaches the
// caller (C18), a builder's wrapped in a *rebuild.PanicError that keeps the
// original value and its stack, the source's unchanged.
func TestFailPanic(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.builders(nil))

		t.Run("builder", func(t *testing.T) {
			val := &failPanicValue{"builder"}
			var built atomic.Int64
			r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: failBatch, Writers: 4}, s.builders(func(items []user) {
				built.Add(1)
				if items[0].ID == fmt.Sprintf("u%06d", failN/2) {
					panic(val)
				}
			})...)
			checked := false
			p, err := failRun(r, redistest.Ctx(t), sources.Slice(failSecondUsers(failN)), func() {
				// The panic has reached us: the cleanup must be over.
				checked = true
				failWantNothingChanged(t, d, before)
			})
			if err != nil || p == nil {
				t.Fatalf("Run: got error %v and no panic, want a panic", err)
			}
			if !checked {
				t.Error("the recover handler did not run its checks")
			}
			pe, ok := p.(*rebuild.PanicError)
			if !ok {
				t.Fatalf("panic value: got %T %v, want *rebuild.PanicError", p, p)
			}
			if pe.Value != val {
				t.Errorf("PanicError.Value: got %#v, want the builder's %#v", pe.Value, val)
			}
			if !strings.Contains(string(pe.Stack), "failure_test.go") {
				t.Errorf("PanicError.Stack: got %q, want the panicking goroutine's stack, through failure_test.go", pe.Stack)
			}
			if built.Load() < 2 {
				t.Errorf("builder calls: got %d, want the panic mid-run, after other batches", built.Load())
			}
		})

		t.Run("source", func(t *testing.T) {
			val := &failPanicValue{"source"}
			us := failSecondUsers(failN)
			src := func(yield func(user, error) bool) {
				for i, u := range us {
					if i == failN/2 {
						panic(val)
					}
					if !yield(u, nil) {
						return
					}
				}
			}
			r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: failBatch, Writers: 4}, s.builders(nil)...)
			checked := false
			p, err := failRun(r, redistest.Ctx(t), sources.Seq2(src), func() {
				checked = true
				failWantNothingChanged(t, d, before)
			})
			if err != nil || p == nil {
				t.Fatalf("Run: got error %v and no panic, want a panic", err)
			}
			if !checked {
				t.Error("the recover handler did not run its checks")
			}
			if p != any(val) {
				t.Errorf("panic value: got %T %#v, want the source's own %#v, unwrapped", p, p, val)
			}
		})
	})
}

// TestFailCancel: a ctx cancelled mid-run (from Progress, after 3 of 10
// batches) discards the run and returns context.Canceled, or the cause given
// to a context.CancelCauseFunc (cancellation returns
// context.Cause(ctx)).
func TestFailCancel(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.builders(nil))
		errCause := errors.New("operator pressed ctrl-c")
		for _, tc := range []struct {
			name string
			want error
			ctx  func(parent context.Context) (context.Context, func())
		}{
			{"cancel", context.Canceled, func(p context.Context) (context.Context, func()) {
				ctx, cancel := context.WithCancel(p)
				return ctx, cancel
			}},
			{"cancel cause", errCause, func(p context.Context) (context.Context, func()) {
				ctx, cancel := context.WithCancelCause(p)
				return ctx, func() { cancel(errCause) }
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx, cancel := tc.ctx(redistest.Ctx(t))
				defer cancel()
				var once sync.Once
				r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: failBatch, Writers: 4, Progress: func(p rebuild.Progress) {
					if p.Batches >= 3 {
						once.Do(cancel)
					}
				}}, s.builders(nil)...)
				_, err := r.Run(ctx, sources.Slice(failSecondUsers(failN)))
				failWantError(t, err, "", tc.want)
				failWantNothingChanged(t, d, before)
			})
		}
	})
}

// TestFailLockStolen: another process takes a lock over (DEL, then SET to
// its own token), mid-run from Progress, or just before the publish script
// runs (from a hook on its EVALSHA, so that only the script's own fence can
// see it). The run fails with ErrLockLost, never publishes, drops its temp
// keys and leaves the thief's lock alone (C8, C16, C22, C27, C44).
func TestFailLockStolen(t *testing.T) {
	t.Parallel()
	publishSHA := redistest.ScriptNamed("publish").SHA1
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.builders(nil))
		st := store.New(d.Other, store.Options{})
		for _, tc := range []struct {
			name      string
			key       string
			atPublish bool
		}{
			{"hash lock mid-run", s.email, false},
			{"family lock mid-run", s.country, false},
			{"family lock before the publish script", s.country, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				lock := st.LockKey(tc.key)
				var once sync.Once
				stolen := false
				steal := func() {
					once.Do(func() {
						ctx := context.Background()
						if err := d.Other.Do(ctx, d.Other.B().Del().Key(lock).Build()).Error(); err != nil {
							t.Errorf("DEL %s: %v", lock, err)
						}
						if err := d.Other.Do(ctx, d.Other.B().Set().Key(lock).Value("thief").ExSeconds(60).Build()).Error(); err != nil {
							t.Errorf("SET %s: %v", lock, err)
						}
						stolen = true
					})
				}
				client := d.Client
				opts := rebuild.Options{BatchSize: failBatch, Writers: 4, TTL: 3 * time.Second}
				if tc.atPublish {
					client = rueidishook.WithHook(d.Client, redistest.Hook{
						OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
							if args := cmd.Commands(); args[0] == "EVALSHA" && args[1] == publishSHA {
								steal()
							}
							return c.Do(ctx, cmd)
						},
					})
				} else {
					opts.Progress = func(p rebuild.Progress) {
						if p.Batches >= 2 {
							steal()
						}
					}
				}
				_, err := redistest.Rebuilder(t, client, opts, s.builders(nil)...).Run(redistest.Ctx(t), sources.Slice(failSecondUsers(failN)))
				if !stolen {
					t.Fatal("the lock was never stolen")
				}
				failWantError(t, err, "", rebuild.ErrLockLost)

				// The thief's lock is untouched, value and TTL.
				got, gerr := d.Other.Do(context.Background(), d.Other.B().Get().Key(lock).Build()).ToString()
				if gerr != nil || got != "thief" {
					t.Errorf("GET %s: got %q, %v, want the thief's %q", lock, got, gerr, "thief")
				}
				if ttl := redistest.PTTL(t, d.Other, lock); ttl <= 50*time.Second {
					t.Errorf("PTTL %s: got %v, want the thief's (50s, 60s]", lock, ttl)
				}
				if err := d.Other.Do(context.Background(), d.Other.B().Del().Key(lock).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				failWantNothingChanged(t, d, before)
			})
		}
	})
}

// TestFailStall (C16+, C61, 11.7): a source that yields no item for
// StallTimeout fails the run with ErrStalled, which is not ErrInProgress:
// no other process is involved. Nothing is published, nothing is left.
func TestFailStall(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.builders(nil))
		us := failSecondUsers(failN)
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: failBatch, StallTimeout: time.Second}, s.builders(nil)...)
		_, err := r.Run(redistest.Ctx(t), sources.Seq2(func(yield func(user, error) bool) {
			for _, u := range us[:failN/2] {
				if !yield(u, nil) {
					return
				}
			}
			<-redistest.Ctx(t).Done() // the source hangs: the injected fault
		}))
		failWantError(t, err, "source", rebuild.ErrStalled)
		if errors.Is(err, rebuild.ErrInProgress) {
			t.Errorf("Run: got %v, which matches ErrInProgress; want a stall not to", err)
		}
		failWantNothingChanged(t, d, before)
	})
}

// TestFailLeaseLapses (C16, C16+, C36): when no heartbeat reaches Redis for
// a whole TTL (here the hook fails every one before it leaves, as a broken
// network would), the locks expire in Redis, and the run fails with
// ErrLockLost without publishing.
func TestFailLeaseLapses(t *testing.T) {
	t.Parallel()
	heartbeat := redistest.ScriptNamed("heartbeat")
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.builders(nil))
		cut := errors.New("injected: the network is down")
		var dropped atomic.Int64
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if heartbeat.Is(cmd.Commands()) {
					dropped.Add(1)
					return rueidis.NewErrorResult(cut)
				}
				return c.Do(ctx, cmd)
			},
			OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				if heartbeat.Is(multi[len(multi)-1].Commands()) {
					dropped.Add(1)
					res := c.DoMulti(ctx, multi[:len(multi)-1]...)
					return append(res, rueidis.NewErrorResult(cut))
				}
				return c.DoMulti(ctx, multi...)
			},
		})
		us := failSecondUsers(failN)
		r := redistest.Rebuilder(t, hooked, rebuild.Options{BatchSize: failBatch, TTL: 2 * time.Second}, s.builders(nil)...)
		_, err := r.Run(redistest.Ctx(t), sources.Seq2(func(yield func(user, error) bool) {
			for i := 0; ; i++ { // a live source, until the run ends
				u := us[i%failN]
				u.ID += "." + strconv.Itoa(i/failN) // a member of a SetIndex belongs to one item
				if !yield(u, nil) {
					return
				}
			}
		}))
		failWantError(t, err, "lease", rebuild.ErrLockLost)
		if dropped.Load() == 0 {
			t.Fatal("no heartbeat was dropped: the test did not test")
		}
		failWantNothingChanged(t, d, before)
	})
}

// TestSlowSourceKeepsLease (11.7, C61): a source that yields one item every
// 300 ms, far fewer than a batch per TTL, rebuilds: the heartbeat keeps
// the lease without completed batches, and each partial batch is written
// after FlushInterval, so the run makes progress while the source is slow.
func TestSlowSourceKeepsLease(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "slow:ids"
		var progressed atomic.Int64 // Progress calls while the source still runs
		var sourceDone atomic.Bool
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{
			// A source that yields for longer than the lease's TTL (5.7 s
			// against 4 s), with a TTL long enough that a loaded machine
			// running -race still sends a heartbeat in each third of it.
			TTL: 4 * time.Second, FlushInterval: 200 * time.Millisecond,
			Progress: func(rebuild.Progress) {
				if !sourceDone.Load() {
					progressed.Add(1)
				}
			},
		}, builders.Set(key, func(u user) (string, bool) { return u.ID, true }))
		us := users(20)
		_, err := r.Run(redistest.Ctx(t), sources.Seq2(func(yield func(user, error) bool) {
			defer sourceDone.Store(true)
			for i, u := range us {
				if i > 0 {
					wait := time.NewTimer(300 * time.Millisecond) // the slow source: that is the test
					<-wait.C
				}
				if !yield(u, nil) {
					return
				}
			}
		}))
		if err != nil {
			t.Fatalf("Run: got %v, want success: a slow source is not a stalled one", err)
		}
		if got := redistest.SMembers(t, d.Other, key); len(got) != len(us) {
			t.Errorf("SCARD %s: got %d, want %d", key, len(got), len(us))
		}
		if n := progressed.Load(); n < 3 {
			t.Errorf("got %d batches written while the 5.7 s source ran, want at least 3: partial batches must be flushed", n)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// TestFailWrite: the server rejects one batch's HSET (the hook replaces it
// with an HSET missing its value). The run fails with Op "write", carrying
// the server's error, publishes nothing and discards its temp keys (C52).
func TestFailWrite(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.builders(nil))
		us := failSecondUsers(failN)
		marker := us[failN/2].Email
		var replaced atomic.Int64
		r := redistest.Rebuilder(t, failRejectHSET(d.Client, marker, &replaced), rebuild.Options{BatchSize: failBatch, Writers: 4}, s.builders(nil)...)
		_, err := r.Run(redistest.Ctx(t), sources.Slice(us))
		if n := replaced.Load(); n != 1 {
			t.Fatalf("HSETs replaced: got %d, want 1", n)
		}
		failWantError(t, err, "write", nil)
		var rerr *rueidis.RedisError
		if !errors.As(err, &rerr) || !strings.Contains(err.Error(), "wrong number of arguments") {
			t.Errorf("Run: got %v, want the server's error for the rejected HSET", err)
		}
		failWantNothingChanged(t, d, before)
	})
}

// failRejectHSET returns c with a hook that replaces every HSET carrying
// marker with one the server rejects (a field without its value), and
// counts the replacements in replaced.
func failRejectHSET(c rueidis.Client, marker string, replaced *atomic.Int64) rueidis.Client {
	return rueidishook.WithHook(c, redistest.Hook{
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			cmds := slices.Clone(multi)
			for i, cmd := range cmds {
				if args := cmd.Commands(); args[0] == "HSET" && slices.Contains(args, marker) {
					cmds[i] = c.B().Arbitrary("HSET").Keys(args[1]).Args(failRejectedField).Build()
					replaced.Add(1)
				}
			}
			return c.DoMulti(ctx, cmds...)
		},
	})
}

// failRejectedField is the lone argument of the HSETs failRejectHSET makes.
const failRejectedField = "field-without-value"

// TestFailTempKeyDeleted: another client deletes a temp key mid-run. Whether
// nothing writes it again (it is found gone before the swap, C20) or later
// batches re-create it with only part of the rebuild (the hole Familia has:
// a re-created key looks populated; our EXPIRE NX reply catches it, C45),
// the run fails with ErrTempKeyLost and publishes nothing.
func TestFailTempKeyDeleted(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.builders(nil))
		for _, tc := range []struct {
			name    string
			base    string // live key whose temp key is deleted
			batches int64  // after this many batches
		}{
			{"hash after the last batch", s.email, failN / failBatch},
			{"bucket after the last batch", s.country + ":es", failN / failBatch},
			{"hash after batch 1 then re-created", s.email, 1},
			{"bucket after batch 1 then re-created", s.country + ":it", 1},
		} {
			t.Run(tc.name, func(t *testing.T) {
				// Progress calls come one at a time: done needs no lock.
				done, deleted := false, ""
				r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: failBatch, Writers: 4, Progress: func(p rebuild.Progress) {
					if done || p.Batches < tc.batches {
						return
					}
					ctx := context.Background()
					temps, err := failTemps(ctx, d.Other, d.Prefix, tc.base)
					if err == nil && len(temps) == 0 && p.Batches < failN/failBatch-1 {
						// A bucket's members are merged across batches and
						// sent when a command is full (index.MaxArgs): its temp
						// key may not exist yet. Later batches still write it.
						return
					}
					done = true
					if err != nil || len(temps) != 1 {
						t.Errorf("temp keys of %s after batch %d: got %q, %v, want one", tc.base, p.Batches, temps, err)
						return
					}
					if n, err := d.Other.Do(ctx, d.Other.B().Del().Key(temps[0]).Build()).AsInt64(); err != nil || n != 1 {
						t.Errorf("DEL %s: got %d, %v, want 1", temps[0], n, err)
						return
					}
					deleted = temps[0]
				}}, s.builders(nil)...)
				_, err := r.Run(redistest.Ctx(t), sources.Slice(failSecondUsers(failN)))
				if deleted == "" {
					t.Fatal("no temp key was deleted")
				}
				failWantError(t, err, "", rebuild.ErrTempKeyLost)
				failWantNothingChanged(t, d, before)
			})
		}
	})
}

// TestFailPublishScript: the publish script itself fails with a server
// error (the hook answers its EVALSHA with a script's OOM error reply). The
// error is returned wrapped, the live keys are unchanged, the locks are
// released, and the temp keys are kept, for diagnosis, with
// 0 < TTL <= PreserveFor (C29, C34.4).
func TestFailPublishScript(t *testing.T) {
	t.Parallel()
	publishSHA := redistest.ScriptNamed("publish").SHA1
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.builders(nil))
		var failed atomic.Int64
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if args := cmd.Commands(); (args[0] == "EVALSHA" || args[0] == "EVAL") && args[1] == publishSHA {
					failed.Add(1)
					// A real server error reply, in the slot of the script's first key.
					return c.Do(ctx, c.B().Eval().Script("return redis.error_reply('OOM command not allowed (injected by failure_test)')").
						Numkeys(1).Key(args[3]).Build())
				}
				return c.Do(ctx, cmd)
			},
		})
		const preserve = 60 * time.Second
		r := redistest.Rebuilder(t, hooked, rebuild.Options{BatchSize: failBatch, Writers: 4, PreserveFor: preserve}, s.builders(nil)...)
		_, err := r.Run(redistest.Ctx(t), sources.Slice(failSecondUsers(failN)))
		if n := failed.Load(); n != 1 {
			t.Fatalf("publish scripts failed: got %d, want 1", n)
		}
		failWantError(t, err, "publish", nil)
		var rerr *rueidis.RedisError
		if !errors.As(err, &rerr) || !strings.Contains(err.Error(), "OOM command not allowed") {
			t.Errorf("Run: got %v, want the script's OOM error, wrapped", err)
		}

		// The temp keys are kept, one per live key the run built, each with
		// PreserveFor (not the 300 s lease).
		want := []string{s.email, s.score, s.country + ":es", s.country + ":it", s.ids}
		slices.Sort(want)
		var bases, temps []string
		for _, k := range redistest.Keys(t, d.Other, d.Prefix) {
			base, _, ok := store.ParseTempKey(k)
			switch {
			case ok:
				bases = append(bases, base)
				temps = append(temps, k)
				if ttl := redistest.PTTL(t, d.Other, k); ttl <= 0 || ttl > preserve {
					t.Errorf("PTTL %s: got %v, want (0, %v]", k, ttl, preserve)
				}
			case strings.HasSuffix(k, ":rebuild-lock"):
				t.Errorf("lock %s left behind, want it released", k)
			}
		}
		slices.Sort(bases)
		if !slices.Equal(bases, want) {
			t.Errorf("temp keys kept for: got %q, want %q", bases, want)
		}
		if len(temps) > 0 {
			if err := d.Other.Do(context.Background(), d.Other.B().Del().Key(temps...).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		failWantNothingChanged(t, d, before)
	})
}

// TestFailScriptFlushMidRun: SCRIPT FLUSH while a run is going (on a server
// of the test's own) makes the heartbeat that rides in a batch's DoMulti hit
// NOSCRIPT, where rueidis has no EVAL fallback. The Rebuilder handles it and
// the run succeeds (C16+).
func TestFailScriptFlushMidRun(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	client, other := srv.Client(t), srv.Client(t)
	ctx := redistest.Ctx(t)
	lease := redistest.ScriptNamed("heartbeat")
	leaseSHA, leaseSrc := lease.SHA1, lease.Source
	// Loaded first, so that the NOSCRIPT below comes from the flush.
	if sha, err := other.Do(ctx, other.B().ScriptLoad().Script(leaseSrc).Build()).ToString(); err != nil || sha != leaseSHA {
		t.Fatalf("SCRIPT LOAD heartbeat.lua: got %q, %v, want %s", sha, err, leaseSHA)
	}

	var flushed, sawNoScript atomic.Bool
	var noScripts atomic.Int64
	hooked := rueidishook.WithHook(client, redistest.Hook{
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			at := slices.IndexFunc(multi, func(cmd rueidis.Completed) bool {
				args := cmd.Commands()
				return args[0] == "EVALSHA" && args[1] == leaseSHA
			})
			if at >= 0 && flushed.CompareAndSwap(false, true) {
				if err := other.Do(ctx, other.B().ScriptFlush().Build()).Error(); err != nil {
					t.Errorf("SCRIPT FLUSH: %v", err)
				}
			}
			res := c.DoMulti(ctx, multi...)
			if at >= 0 {
				if rerr, ok := rueidis.IsRedisErr(res[at].Error()); ok && rerr.IsNoScript() {
					noScripts.Add(1)
					sawNoScript.Store(true)
				}
			}
			return res
		},
	})

	// The source runs until a heartbeat has ridden in a DoMulti after the
	// flush (heartbeats are due every TTL/3 = 1 s), then a little longer. It
	// cycles over 1000 users, so that the hash stays small however long
	// that takes; each cycle's users have ids of their own, as a member of
	// the SetIndex belongs to one item.
	const n = 1000
	us := users(n)
	deadline := time.Now().Add(30 * time.Second)
	yielded := 0
	src := func(yield func(user, error) bool) {
		after := -1
		for i := 0; ; i++ {
			if after < 0 && sawNoScript.Load() {
				after = i
			}
			if (after >= 0 && i >= after+5*n && i >= n) || time.Now().After(deadline) {
				return
			}
			yielded++
			u := us[i%n]
			u.ID += "." + strconv.Itoa(i/n)
			if !yield(u, nil) {
				return
			}
		}
	}
	p := redistest.Prefix(t)
	key, idx := p+"users:by-email", p+"users:by-country"
	r := redistest.Rebuilder(t, hooked, rebuild.Options{BatchSize: 50, Writers: 4, TTL: 3 * time.Second},
		builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SetIndex(idx, func(u user) (string, string, bool) { return u.Country, u.ID, true }),
	)
	stats, err := r.Run(ctx, sources.Seq2(src))
	if !sawNoScript.Load() {
		t.Fatalf("no lease renewal inside a DoMulti hit NOSCRIPT after SCRIPT FLUSH (flushed: %v, %d items)", flushed.Load(), yielded)
	}
	if err != nil {
		t.Fatalf("Run: got %v, want success after SCRIPT FLUSH", err)
	}
	// Handled, the renewal that hit NOSCRIPT is re-run at once through
	// EVALSHA with EVAL fallback, which loads the script again, and it
	// counts as the renewal. Unhandled, it would count as a failed one, so
	// the very next batch would carry the renewal again and hit NOSCRIPT
	// again.
	if n := noScripts.Load(); n != 1 {
		t.Errorf("lease renewals in a DoMulti that hit NOSCRIPT: got %d, want 1 (the one right after the flush)", n)
	}
	if stats.Items != int64(yielded) {
		t.Errorf("Stats.Items: got %d, want %d", stats.Items, yielded)
	}
	if got := len(redistest.HGetAll(t, other, key)); got != n {
		t.Errorf("HLEN %s: got %d, want %d", key, got, n)
	}
	// Every item, each cycle's with an id of its own, in its country.
	fr := 0
	for i := range yielded {
		if us[i%n].Country == "fr" {
			fr++
		}
	}
	if got := len(redistest.SMembers(t, other, idx+":fr")); got != fr {
		t.Errorf("SCARD %s: got %d, want %d", idx+":fr", got, fr)
	}
	redistest.WantClean(t, other, p)
}

// TestFailInProgress: a lock held by someone else on any one of three
// builders' keys makes Run fail at once with ErrInProgress naming that key
// (C7, C43): the source is never read, no temp key is created, the locks the
// run took are released, and the held lock and the live keys are untouched.
func TestFailInProgress(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.three())
		st := store.New(d.Other, store.Options{})
		for _, key := range []string{s.email, s.score, s.country} {
			t.Run(strings.TrimPrefix(key, d.Prefix), func(t *testing.T) {
				ctx := context.Background()
				lock := st.LockKey(key)
				if err := d.Other.Do(ctx, d.Other.B().Set().Key(lock).Value("someone-else").ExSeconds(60).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				read := false
				src := func(yield func(user, error) bool) {
					read = true
					for _, u := range failSecondUsers(failN) {
						if !yield(u, nil) {
							return
						}
					}
				}
				r := redistest.Rebuilder(t, d.Client, rebuild.Options{Progress: func(rebuild.Progress) { read = true }}, s.three()...)
				_, err := r.Run(redistest.Ctx(t), sources.Seq2(src))
				e := failWantError(t, err, "", rebuild.ErrInProgress)
				if errors.Is(err, rebuild.ErrLockLost) {
					t.Errorf("Run: got %v, want ErrInProgress, not ErrLockLost", err)
				}
				if e.Key != key || !strings.Contains(err.Error(), key) {
					t.Errorf("Run: got Key %q in %q, want %q", e.Key, err, key)
				}
				if read {
					t.Error("the source was read, want Run to fail before it")
				}
				got, gerr := d.Other.Do(ctx, d.Other.B().Get().Key(lock).Build()).ToString()
				if gerr != nil || got != "someone-else" {
					t.Errorf("GET %s: got %q, %v, want %q", lock, got, gerr, "someone-else")
				}
				if ttl := redistest.PTTL(t, d.Other, lock); ttl <= 50*time.Second {
					t.Errorf("PTTL %s: got %v, want the holder's (50s, 60s]", lock, ttl)
				}
				if left := redistest.Leftovers(t, d.Other, d.Prefix); !slices.Equal(left, []string{lock}) {
					t.Errorf("left behind: got %q, want only the held lock %q", left, lock)
				}
				if err := d.Other.Do(ctx, d.Other.B().Del().Key(lock).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				failWantNothingChanged(t, d, before)
			})
		}
	})
}

// TestFailConcurrentRuns: two Runs of the same Rebuilder at once. The first
// holds its locks while its source blocks until the second has returned, so
// exactly one fails, with ErrInProgress, and the other publishes (C43,
// Guarantee 2).
func TestFailConcurrentRuns(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		failPopulate(t, d, s, s.builders(nil))
		ctx := redistest.Ctx(t)
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{}, s.builders(nil)...)
		us := failSecondUsers(failN)

		started, secondDone := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			_, err := r.Run(ctx, sources.Seq2(func(yield func(user, error) bool) {
				close(started)
				select {
				case <-secondDone:
				case <-ctx.Done():
					yield(user{}, ctx.Err())
					return
				}
				for _, u := range us {
					if !yield(u, nil) {
						return
					}
				}
			}))
			first <- err
		}()
		select {
		case <-started:
		case err := <-first:
			t.Fatalf("first Run returned %v before reading its source", err)
		}
		secondRead := false
		_, err2 := r.Run(ctx, sources.Seq2(func(yield func(user, error) bool) { secondRead = true }))
		close(secondDone)
		err1 := <-first

		if err1 != nil {
			t.Errorf("first Run: got %v, want success", err1)
		}
		failWantError(t, err2, "", rebuild.ErrInProgress)
		if errors.Is(err2, rebuild.ErrLockLost) {
			t.Errorf("second Run: got %v, want ErrInProgress, not ErrLockLost", err2)
		}
		if secondRead {
			t.Error("second Run read its source, want it to fail first")
		}
		if got := redistest.HGetAll(t, d.Other, s.email)[us[0].Email]; got != us[0].ID {
			t.Errorf("HGET %s %s: got %q, want %q (the first Run's data)", s.email, us[0].Email, got, us[0].ID)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// TestFailSourceErrorCancelsFamilyScan: a run that fails must not wait for
// its SetIndex's SCAN of the live buckets (fail fast: Run stops at
// the first error). The hook holds the SCAN
// until its ctx is done, as a SCAN of a large keyspace or of an unreachable
// node does (rueidis retries a read-only SCAN until ctx expires); the source
// fails meanwhile. Run must cancel the scan and return the source's error.
func TestFailSourceErrorCancelsFamilyScan(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.three())
		scanning := make(chan struct{})
		var once sync.Once
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if args := cmd.Commands(); args[0] == "SCAN" && slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, s.country) }) {
					once.Do(func() { close(scanning) })
					<-ctx.Done()
					return rueidis.NewErrorResult(context.Cause(ctx))
				}
				return c.Do(ctx, cmd)
			},
		})
		ctx, cancel := context.WithCancel(redistest.Ctx(t))
		defer cancel()
		errSource := errors.New("source: database connection reset")
		us := failSecondUsers(failN)
		src := func(yield func(user, error) bool) {
			for _, u := range us[:10] {
				if !yield(u, nil) {
					return
				}
			}
			select {
			case <-scanning:
			case <-ctx.Done():
			}
			yield(user{}, errSource)
		}
		done := make(chan error, 1)
		go func() {
			_, err := redistest.Rebuilder(t, hooked, rebuild.Options{}, s.three()...).Run(ctx, sources.Seq2(src))
			done <- err
		}()
		var err error
		select {
		case err = <-done:
		case <-time.After(5 * time.Second):
			t.Errorf("Run: still running 5s after its source failed: the SetIndex's SCAN is not cancelled when the run fails, so Run waits for it (here until ctx ends)")
			cancel()
			err = <-done
		}
		failWantError(t, err, "source", errSource)
		failWantNothingChanged(t, d, before)
	})
}

// TestFailCancelDuringAcquire (11.2): a context cancelled while the lock is
// being taken (here Redis pauses writes for 500 ms, and ctx is cancelled
// after 100 ms) leaves no lock behind: the acquire may have run after its reply
// was lost, so it is released, on a context of its own that outlives ctx.
// The next run succeeds at once, instead of meeting ErrInProgress for the
// lock's whole TTL.
func TestFailCancelDuringAcquire(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	client, admin := srv.Client(t), srv.Client(t)
	p := redistest.Prefix(t)
	key := p + "by-email"
	bs := []index.Builder[user]{builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true })}
	r := redistest.Rebuilder(t, client, rebuild.Options{}, bs...)

	// Cached, so that the paused EVALSHA runs once the pause ends instead of
	// answering NOSCRIPT to a caller that has gone.
	for _, name := range []string{"acquire", "release"} {
		if err := admin.Do(redistest.Ctx(t), admin.B().ScriptLoad().Script(redistest.ScriptNamed(name).Source).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	redistest.Cmd(t, admin, "CLIENT", "PAUSE", "500", "WRITE")
	ctx, cancel := context.WithCancel(redistest.Ctx(t))
	stop := time.AfterFunc(100*time.Millisecond, cancel) // the caller gives up
	defer stop.Stop()
	_, err := r.Run(ctx, sources.Slice(users(10)))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: got %v, want context.Canceled", err)
	}
	// Once the pause is over, the paused acquire runs, then the release the
	// failed run sent after it: two scripts. Wait for both (at most 5 s),
	// then the lock must be gone.
	lock := store.New(admin, store.Options{}).LockKey(key)
	deadline := time.Now().Add(5 * time.Second)
	for evalshaCalls(t, admin) < 2 && time.Now().Before(deadline) {
		poll := time.NewTimer(20 * time.Millisecond)
		<-poll.C
	}
	if redistest.Exists(t, admin, lock) {
		t.Fatalf("%s held after the run failed (PTTL %v), want it released", lock, redistest.PTTL(t, admin, lock))
	}
	if _, err := r.Run(redistest.Ctx(t), sources.Slice(users(10))); err != nil {
		t.Fatalf("next Run: got %v, want success", err)
	}
	if got := len(redistest.HGetAll(t, admin, key)); got != 10 {
		t.Errorf("HLEN %s = %d, want 10", key, got)
	}
	redistest.WantClean(t, admin, p)
}

// TestFailAcquireReplyLost (11.2): the acquire script ran, but its reply
// was lost and the caller's context is cancelled. The locks it may have
// taken are released on a context of their own: none is left, and the next
// run succeeds at once.
func TestFailAcquireReplyLost(t *testing.T) {
	t.Parallel()
	acquire := redistest.ScriptNamed("acquire")
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.builders(nil))
		ctx, cancel := context.WithCancel(redistest.Ctx(t))
		var ran atomic.Bool
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, hctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if acquire.Is(cmd.Commands()) && !ran.Load() {
					res := c.Do(context.WithoutCancel(hctx), cmd) // it runs...
					if res.Error() == nil {
						ran.Store(true)
						cancel() // ...the caller gives up, and its reply is lost
						return rueidis.NewErrorResult(context.Canceled)
					}
					return res
				}
				return c.Do(hctx, cmd)
			},
		})
		_, err := redistest.Rebuilder(t, hooked, rebuild.Options{}, s.builders(nil)...).Run(ctx, sources.Slice(failSecondUsers(failN)))
		if !ran.Load() {
			t.Fatal("the acquire script never ran through the hook")
		}
		failWantError(t, err, "acquire", context.Canceled)
		failWantNothingChanged(t, d, before) // no lock, no record left
		if _, err := redistest.Rebuilder(t, d.Client, rebuild.Options{}, s.builders(nil)...).Run(redistest.Ctx(t), sources.Slice(failSecondUsers(failN))); err != nil {
			t.Fatalf("next Run: got %v, want success", err)
		}
	})
}

// evalshaCalls returns the number of EVALSHA calls c's server has run.
func evalshaCalls(t *testing.T, c rueidis.Client) int {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// TestFailGoexit (11.9): runtime.Goexit in a builder or in the source is
// treated like a panic: the run cleans up (no lock, no temp key, the live
// keys untouched), then the Goexit goes on in the caller's goroutine, which
// ends without Run returning.
func TestFailGoexit(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"builder", "source"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			forEachDeployment(t, func(t *testing.T, d deployment) {
				s := failNewShape(d)
				before := failPopulate(t, d, s, s.builders(nil))
				var fault func([]user)
				if where == "builder" {
					fault = func(items []user) {
						if items[0].ID == fmt.Sprintf("u%06d", failN/2) {
							runtime.Goexit()
						}
					}
				}
				r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: failBatch, Writers: 4}, s.builders(fault)...)
				us := failSecondUsers(failN)
				src := sources.Seq2(func(yield func(user, error) bool) {
					for i, u := range us {
						if where == "source" && i == failN/2 {
							runtime.Goexit()
						}
						if !yield(u, nil) {
							return
						}
					}
				})
				returned := make(chan bool, 1)
				go func() {
					ok := false
					defer func() { returned <- ok }()
					_, _ = r.Run(redistest.Ctx(t), src)
					ok = true
				}()
				if <-returned {
					t.Fatal("Run returned; want its goroutine ended by Goexit")
				}
				failWantNothingChanged(t, d, before)
			})
		})
	}
}

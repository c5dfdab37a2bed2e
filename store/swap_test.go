package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// swapCall is one command a swapSpy saw: its words, and which of the
// package's scripts it runs ("" for a plain command).
type swapCall struct {
	args   []string
	script string
}

func (c swapCall) String() string {
	if c.script != "" {
		return c.args[0] + " <" + c.script + ".lua>"
	}
	return strings.Join(c.args, " ")
}

// swapSpy is a rueidishook.Hook that records every command sent through Do
// and DoMulti and, when onPublish is set, hands the publish script's
// EVALSHA/EVAL to it instead of sending it.
type swapSpy struct {
	redistest.Hook // everything else passes through
	t              *testing.T

	onPublish func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult

	mu    sync.Mutex
	calls []swapCall
}

var _ rueidishook.Hook = (*swapSpy)(nil)

func (sp *swapSpy) record(cmd rueidis.Completed) swapCall {
	c := swapCall{args: slices.Clone(cmd.Commands())}
	for _, name := range []string{"publish", "touch", "release"} {
		if isScript(cmd, name) {
			c.script = name
		}
	}
	sp.mu.Lock()
	sp.calls = append(sp.calls, c)
	sp.mu.Unlock()
	return c
}

func (sp *swapSpy) Do(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if sp.record(cmd).script == "publish" && sp.onPublish != nil {
		return sp.onPublish(c, ctx, cmd)
	}
	return c.Do(ctx, cmd)
}

func (sp *swapSpy) DoMulti(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	for _, cmd := range multi {
		sp.record(cmd)
	}
	return c.DoMulti(ctx, multi...)
}

// recorded returns the calls seen so far and forgets them.
func (sp *swapSpy) recorded() []swapCall {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	calls := sp.calls
	sp.calls = nil
	return calls
}

// swapSpied returns a Store whose client goes through a new swapSpy.
func swapSpied(t *testing.T, c rueidis.Client, onPublish func(rueidis.Client, context.Context, rueidis.Completed) rueidis.RedisResult) (*store.Store, *swapSpy) {
	sp := &swapSpy{t: t, onPublish: onPublish}
	return store.New(rueidishook.WithHook(c, sp), store.Options{}), sp
}

// swapWantError fails unless err is a *store.Error for Op "swap" on live.
func swapWantError(t *testing.T, err error, live string) {
	t.Helper()
	var e *store.Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v (%T), want a *store.Error", err, err)
	}
	if e.Op != "swap" || e.Key != live {
		t.Errorf("error Op, Key = %q, %q; want %q, %q", e.Op, e.Key, "swap", live)
	}
}

// swapFixture is one live key with old contents, a temp key with new
// contents and a TTL, and optionally our lock on the live key with its TTL
// lowered to lockTTL, so that any extension would show.
type swapFixture struct {
	live, temp string
	old, new   map[string]string
	lock       *store.Lock // nil when unfenced
}

const (
	swapTempTTL = 30 * time.Second // the temp key's TTL before the swap
	swapLockTTL = 50 * time.Second // the lock's TTL before the swap
)

// swapSetup seeds a fixture for live. The live key holds more fields than
// the temp key, so a merge would show.
func swapSetup(t *testing.T, ctx context.Context, s *store.Store, tg target, live string, fenced, withTemp bool) swapFixture {
	t.Helper()
	f := swapFixture{live: live, temp: s.NewTempKey(live), old: redistest.Fields("old", 40), new: redistest.Fields("new", 5)}
	redistest.Clean(t, tg.other, f.live, f.temp, s.LockKey(live))
	redistest.SeedHash(t, tg.other, f.live, f.old)
	if withTemp {
		redistest.SeedHash(t, tg.other, f.temp, f.new)
		redistest.Cmd(t, tg.other, "EXPIRE", f.temp, "30")
	}
	if fenced {
		l, err := s.Acquire(ctx, live, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		redistest.Cmd(t, tg.other, "EXPIRE", l.Key, "50")
		f.lock = l
	}
	return f
}

// wantLockUnchanged fails unless the fixture's lock (if any) still holds our
// token with a TTL no longer than the test left it.
func (f swapFixture) wantLockUnchanged(t *testing.T, c rueidis.Client) {
	t.Helper()
	if f.lock != nil {
		redistest.WantLock(t, c, f.lock.Key, f.lock.Token, swapLockTTL)
	}
}

// wantLiveUntouched fails unless the live key still holds its old contents
// without a TTL (C35).
func (f swapFixture) wantLiveUntouched(t *testing.T, c rueidis.Client) {
	t.Helper()
	redistest.WantHash(t, c, f.live, f.old)
}

func TestSwapOutcomes(t *testing.T) {
	// C23: a populated temp key publishes: the live key ends with exactly
	// the temp key's contents, replaced not merged, with no TTL; the temp
	// key is gone; Swapped (C32). C24: an absent, never-populated temp key
	// deletes the live key, and that is idempotent; Emptied (C32). C25:
	// unknown + present swaps, unknown + absent empties. C31: our lock is
	// never touched.
	forEachTarget(t, func(t *testing.T, tg target) {
		for _, tt := range []struct {
			name      string
			fenced    bool
			populated store.Populated
			temp      bool          // the temp key exists
			want      store.Outcome // Swapped, or Emptied (twice: the second Swap finds neither key)
		}{
			{"fenced/yes", true, store.PopulatedYes, true, store.Swapped},
			{"fenced/unknown", true, store.PopulatedUnknown, true, store.Swapped},
			{"unfenced/yes", false, store.PopulatedYes, true, store.Swapped},
			{"unfenced/unknown", false, store.PopulatedUnknown, true, store.Swapped},
			// A '0' flag with an existing temp key still publishes it.
			{"fenced/no-but-present", true, store.PopulatedNo, true, store.Swapped},
			{"fenced/no", true, store.PopulatedNo, false, store.Emptied},
			{"fenced/unknown-absent", true, store.PopulatedUnknown, false, store.Emptied},
			{"unfenced/no", false, store.PopulatedNo, false, store.Emptied},
			{"unfenced/unknown-absent", false, store.PopulatedUnknown, false, store.Emptied},
		} {
			t.Run(tt.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				s := tg.store(store.Options{})
				f := swapSetup(t, ctx, s, tg, tg.live+":"+strings.ReplaceAll(tt.name, "/", "-"), tt.fenced, tt.temp)
				redistest.Cmd(t, tg.other, "EXPIRE", f.live, "1000") // the old TTL must not survive either
				runs := 1
				if tt.want == store.Emptied {
					runs = 2
				}
				for i := range runs {
					got, err := s.Swap(ctx, f.temp, f.live, store.SwapOptions{Lock: f.lock, Populated: tt.populated})
					if err != nil {
						t.Fatalf("Swap #%d: %v", i+1, err)
					}
					if got != tt.want {
						t.Errorf("Swap #%d outcome = %v, want %v", i+1, got, tt.want)
					}
					if tt.want == store.Swapped {
						redistest.WantHash(t, tg.other, f.live, f.new) // exact contents, PTTL -1
					} else {
						redistest.WantAbsent(t, tg.other, f.live)
					}
					redistest.WantAbsent(t, tg.other, f.temp)
					f.wantLockUnchanged(t, tg.other)
				}
			})
		}
	})
}

func TestSwapReplacesOtherType(t *testing.T) {
	// C23: replaced, not merged, even when the live key has another type.
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s := tg.store(store.Options{})
		temp := s.NewTempKey(tg.live)
		redistest.Clean(t, tg.other, tg.live, temp)
		redistest.Cmd(t, tg.other, "SADD", tg.live, "a", "b", "c")
		redistest.SeedHash(t, tg.other, temp, redistest.Fields("new", 3))
		got, err := s.Swap(ctx, temp, tg.live, store.SwapOptions{})
		if err != nil || got != store.Swapped {
			t.Fatalf("Swap = %v, %v; want %v, nil", got, err, store.Swapped)
		}
		typ, err := tg.other.Do(ctx, tg.other.B().Type().Key(tg.live).Build()).ToString()
		if err != nil || typ != "hash" {
			t.Fatalf("TYPE %s = %q, %v; want hash", tg.live, typ, err)
		}
		redistest.WantHash(t, tg.other, tg.live, redistest.Fields("new", 3))
		redistest.WantAbsent(t, tg.other, temp)
	})
}

func TestSwapReadersNeverSeeAbsent(t *testing.T) {
	// C23: readers see the old value or the new one, never a missing key.
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s := tg.store(store.Options{})
		redistest.Clean(t, tg.other, tg.live)
		redistest.SeedHash(t, tg.other, tg.live, redistest.Fields("gen0", 200))

		var stop atomic.Bool
		var reads, misses atomic.Int64
		var wg sync.WaitGroup
		wg.Go(func() {
			for !stop.Load() {
				n, err := tg.other.Do(ctx, tg.other.B().Hlen().Key(tg.live).Build()).AsInt64()
				if err != nil {
					t.Errorf("HLEN %s: %v", tg.live, err)
					return
				}
				reads.Add(1)
				if n != 200 {
					misses.Add(1)
				}
			}
		})
		for i := 1; i <= 40; i++ {
			temp := s.NewTempKey(tg.live)
			redistest.Clean(t, tg.other, temp)
			redistest.SeedHash(t, tg.other, temp, redistest.Fields(fmt.Sprint("gen", i), 200))
			if _, err := s.Swap(ctx, temp, tg.live, store.SwapOptions{Populated: store.PopulatedYes}); err != nil {
				stop.Store(true)
				wg.Wait()
				t.Fatalf("swap %d: %v", i, err)
			}
		}
		stop.Store(true)
		wg.Wait()
		if reads.Load() == 0 {
			t.Fatal("the reader made no reads")
		}
		if m := misses.Load(); m != 0 {
			t.Errorf("%d of %d reads saw HLEN != 200 (absent or partial), want 0", m, reads.Load())
		}
		redistest.WantHash(t, tg.other, tg.live, redistest.Fields("gen40", 200))
	})
}

func TestSwapUnknownAsksExists(t *testing.T) {
	// C25: PopulatedUnknown is decided by one EXISTS just before the script;
	// a known value sends no EXISTS.
	forEachTarget(t, func(t *testing.T, tg target) {
		for _, tt := range []struct {
			name      string
			populated store.Populated
			withTemp  bool
			want      []string
		}{
			{"unknown/present", store.PopulatedUnknown, true, []string{"EXISTS", "publish"}},
			{"unknown/absent", store.PopulatedUnknown, false, []string{"EXISTS", "publish"}},
			{"yes", store.PopulatedYes, true, []string{"publish"}},
			{"no", store.PopulatedNo, false, []string{"publish"}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				s, sp := swapSpied(t, tg.client, nil)
				f := swapSetup(t, ctx, s, tg, tg.live+":"+strings.ReplaceAll(tt.name, "/", "-"), true, tt.withTemp)
				sp.recorded()
				if _, err := s.Swap(ctx, f.temp, f.live, store.SwapOptions{Lock: f.lock, Populated: tt.populated}); err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, c := range sp.recorded() {
					switch {
					case c.script != "":
						if len(got) == 0 || got[len(got)-1] != c.script { // EVALSHA, then EVAL on NOSCRIPT
							got = append(got, c.script)
						}
					case c.args[0] == "EXISTS":
						if !slices.Equal(c.args, []string{"EXISTS", f.temp}) {
							t.Errorf("sent %v, want EXISTS %s", c.args, f.temp)
						}
						got = append(got, "EXISTS")
					default:
						got = append(got, c.String())
					}
				}
				if !slices.Equal(got, tt.want) {
					t.Errorf("commands = %q, want %q", got, tt.want)
				}
			})
		}
	})
}

func TestSwapTempVanishes(t *testing.T) {
	// C26: populated, but the script finds the temp key gone: ErrTempKeyLost
	// "vanished during the swap", naming the temp key; the live key and the
	// lock are untouched.
	forEachTarget(t, func(t *testing.T, tg target) {
		for _, tt := range []struct {
			name      string
			populated store.Populated
			withTemp  bool // the temp key exists when Swap starts
		}{
			// EXISTS sees it, then it is gone when the script runs.
			{"unknown/deleted-before-script", store.PopulatedUnknown, true},
			// A touch saw it, then it is gone when the script runs.
			{"yes/deleted-before-script", store.PopulatedYes, true},
			// A touch saw it, and it was already gone.
			{"yes/already-missing", store.PopulatedYes, false},
		} {
			t.Run(tt.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				var temp string
				var deleted atomic.Int64
				s, _ := swapSpied(t, tg.client, func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
					if tt.withTemp {
						// The saboteur deletes the temp key right before the
						// script is sent.
						n, err := tg.other.Do(ctx, tg.other.B().Del().Key(temp).Build()).AsInt64()
						if err != nil {
							t.Errorf("DEL %s: %v", temp, err)
						}
						deleted.Add(n)
					}
					return c.Do(ctx, cmd)
				})
				f := swapSetup(t, ctx, s, tg, tg.live+":"+strings.ReplaceAll(tt.name, "/", "-"), true, tt.withTemp)
				temp = f.temp

				got, err := s.Swap(ctx, f.temp, f.live, store.SwapOptions{Lock: f.lock, Populated: tt.populated})
				if tt.withTemp && deleted.Load() != 1 {
					t.Fatalf("the hook deleted %d keys, want 1: the publish script was not intercepted", deleted.Load())
				}
				if got != 0 {
					t.Errorf("outcome = %v, want 0 on failure", got)
				}
				redistest.WantErr(t, err, store.ErrTempKeyLost)
				if errors.Is(err, store.ErrLockLost) {
					t.Errorf("err = %v, must not match ErrLockLost", err)
				}
				swapWantError(t, err, f.live)
				for _, want := range []string{"vanished during the swap", f.temp} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not contain %q", err, want)
					}
				}
				f.wantLiveUntouched(t, tg.other)
				redistest.WantAbsent(t, tg.other, f.temp)
				f.wantLockUnchanged(t, tg.other)
			})
		}
	})
}

func TestSwapLockLost(t *testing.T) {
	// C27: fenced, and the lock is not ours: ErrLockLost, the temp key is
	// deleted, the live key and the successor's lock are untouched.
	// C28: the fence comes before the existence check.
	forEachTarget(t, func(t *testing.T, tg target) {
		for _, tt := range []struct {
			name      string
			stolen    bool // a successor holds the lock; else it expired
			withTemp  bool
			populated store.Populated
		}{
			{"stolen/yes", true, true, store.PopulatedYes},
			{"stolen/unknown", true, true, store.PopulatedUnknown},
			{"expired/yes", false, true, store.PopulatedYes},
			// C28: lost lock AND missing populated temp: ErrLockLost, not
			// ErrTempKeyLost.
			{"stolen/yes-temp-missing", true, false, store.PopulatedYes},
			{"expired/yes-temp-missing", false, false, store.PopulatedYes},
			// C28: lost lock and an empty rebuild must not delete the live key.
			{"stolen/no-temp-missing", true, false, store.PopulatedNo},
			{"expired/unknown-temp-missing", false, false, store.PopulatedUnknown},
		} {
			t.Run(tt.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				s := tg.store(store.Options{})
				f := swapSetup(t, ctx, s, tg, tg.live+":"+strings.ReplaceAll(tt.name, "/", "-"), true, tt.withTemp)
				if tt.stolen {
					redistest.Cmd(t, tg.other, "SET", f.lock.Key, "successor", "EX", "40")
				} else {
					redistest.Cmd(t, tg.other, "DEL", f.lock.Key)
				}

				got, err := s.Swap(ctx, f.temp, f.live, store.SwapOptions{Lock: f.lock, Populated: tt.populated})
				if got != 0 {
					t.Errorf("outcome = %v, want 0 on failure", got)
				}
				redistest.WantErr(t, err, store.ErrLockLost)
				redistest.WantErr(t, err, store.ErrInProgress) // C42
				if errors.Is(err, store.ErrTempKeyLost) {
					t.Errorf("err = %v, must not match ErrTempKeyLost (C28: fence first)", err)
				}
				swapWantError(t, err, f.live)
				f.wantLiveUntouched(t, tg.other)
				redistest.WantAbsent(t, tg.other, f.temp)
				if tt.stolen {
					redistest.WantLock(t, tg.other, f.lock.Key, "successor", 40*time.Second)
				} else {
					redistest.WantString(t, tg.other, f.lock.Key, "")
				}
			})
		}
	})
}

func TestSwapLockExpiresByItself(t *testing.T) {
	// C27: a lock that really expired (TTL 1 s, polled until gone) fences
	// the swap as a stolen one does.
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s := tg.store(store.Options{})
		f := swapSetup(t, ctx, s, tg, tg.live, false, true)
		lock, err := s.Acquire(ctx, f.live, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		swapPollUntil(t, 10*time.Second, "lock "+lock.Key+" expired", func() bool { return !redistest.Exists(t, tg.other, lock.Key) })
		_, err = s.Swap(ctx, f.temp, f.live, store.SwapOptions{Lock: lock, Populated: store.PopulatedYes})
		redistest.WantErr(t, err, store.ErrLockLost)
		f.wantLiveUntouched(t, tg.other)
		redistest.WantAbsent(t, tg.other, f.temp)
		redistest.WantString(t, tg.other, lock.Key, "")
	})
}

// swapPollUntil polls cond every 20 ms until it holds, or fails the test
// after timeout.
func swapPollUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline:
			t.Fatalf("not %s within %v", what, timeout)
		case <-tick.C:
		}
	}
}

// swapInjectedScript is a genuine server-side script error.
const swapInjectedScript = "return redis.error_reply('ERR injected')"

// swapFailWithServerError answers the publish script with a real error
// reply from the server, without running it.
func swapFailWithServerError(c rueidis.Client, ctx context.Context, _ rueidis.Completed) rueidis.RedisResult {
	return c.Do(ctx, c.B().Eval().Script(swapInjectedScript).Numkeys(0).Build())
}

// swapTimeOutBeforeRunning waits for ctx to expire, then forwards the
// script, which therefore never reaches the server.
func swapTimeOutBeforeRunning(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	<-ctx.Done()
	return c.Do(ctx, cmd)
}

// swapTimeOutAfterRunning runs the script, then reports a timeout as if the
// reply had been lost.
func swapTimeOutAfterRunning(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if r := c.Do(ctx, cmd); r.Error() != nil {
		return r // e.g. NOSCRIPT: rueidis retries with EVAL, which comes back here
	}
	return rueidis.NewErrorResult(fmt.Errorf("reply lost after the script ran: %w", context.DeadlineExceeded))
}

func TestSwapScriptFails(t *testing.T) {
	// C29: the script itself fails. A populated temp key is kept for
	// PreserveFor (EXPIRE), and the original error is returned wrapped.
	forEachTarget(t, func(t *testing.T, tg target) {
		for _, tt := range []struct {
			name      string
			hook      func(rueidis.Client, context.Context, rueidis.Completed) rueidis.RedisResult
			deadline  time.Duration // 0: ctxT's
			ran       bool          // the script did run
			wantError func(t *testing.T, err error)
		}{
			{"server-error", swapFailWithServerError, 0, false, func(t *testing.T, err error) {
				var re *rueidis.RedisError
				if !errors.As(err, &re) || !strings.Contains(re.Error(), "injected") {
					t.Errorf("err = %v, want errors.As to find the *rueidis.RedisError 'ERR injected'", err)
				}
			}},
			{"timeout-before-running", swapTimeOutBeforeRunning, 500 * time.Millisecond, false, func(t *testing.T, err error) {
				redistest.WantErr(t, err, context.DeadlineExceeded)
			}},
			{"timeout-after-running", swapTimeOutAfterRunning, 0, true, func(t *testing.T, err error) {
				redistest.WantErr(t, err, context.DeadlineExceeded)
			}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				s, sp := swapSpied(t, tg.client, tt.hook)
				f := swapSetup(t, ctx, s, tg, tg.live+":"+tt.name, true, true)
				swapCtx := ctx
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					swapCtx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				sp.recorded()

				got, err := s.Swap(swapCtx, f.temp, f.live, store.SwapOptions{
					Lock: f.lock, Populated: store.PopulatedYes, PreserveFor: 120 * time.Second,
				})
				if err == nil {
					t.Fatalf("Swap = %v, nil; want an error", got)
				}
				tt.wantError(t, err)
				swapWantError(t, err, f.live)
				for _, sentinel := range []error{store.ErrLockLost, store.ErrTempKeyLost} {
					if errors.Is(err, sentinel) {
						t.Errorf("err = %v, must not match %v", err, sentinel)
					}
				}
				var expires int
				for _, c := range sp.recorded() {
					if c.args[0] == "EXPIRE" {
						expires++
						if !slices.Equal(c.args, []string{"EXPIRE", f.temp, "120"}) {
							t.Errorf("sent %v, want EXPIRE %s 120", c.args, f.temp)
						}
					}
				}
				if expires != 1 {
					t.Errorf("sent %d EXPIREs, want 1", expires)
				}
				if tt.ran {
					// The EXPIRE found nothing: the swap had happened.
					redistest.WantHash(t, tg.other, f.live, f.new)
					redistest.WantAbsent(t, tg.other, f.temp)
				} else {
					f.wantLiveUntouched(t, tg.other)
					if got := redistest.HGetAll(t, tg.other, f.temp); !scriptsMapsEqual(got, f.new) {
						t.Errorf("temp %s = %v, want %v", f.temp, got, f.new)
					}
					// Kept for PreserveFor: longer than its 30 s TTL before.
					if got := redistest.PTTL(t, tg.other, f.temp); got <= swapTempTTL || got > 120*time.Second {
						t.Errorf("temp PTTL %v, want in (%v, 120s]", got, swapTempTTL)
					}
				}
				f.wantLockUnchanged(t, tg.other) // C31
			})
		}
	})
}

func TestSwapScriptFailsNotPopulated(t *testing.T) {
	// C29: a swap that was not populated sends no EXPIRE when the script
	// fails, and changes nothing.
	forEachTarget(t, func(t *testing.T, tg target) {
		for _, tt := range []struct {
			name      string
			populated store.Populated
			hook      func(rueidis.Client, context.Context, rueidis.Completed) rueidis.RedisResult
			deadline  time.Duration
		}{
			{"no/server-error", store.PopulatedNo, swapFailWithServerError, 0},
			{"unknown-absent/server-error", store.PopulatedUnknown, swapFailWithServerError, 0},
			{"no/timeout", store.PopulatedNo, swapTimeOutBeforeRunning, 500 * time.Millisecond},
		} {
			t.Run(tt.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				s, sp := swapSpied(t, tg.client, tt.hook)
				f := swapSetup(t, ctx, s, tg, tg.live+":"+strings.ReplaceAll(tt.name, "/", "-"), true, false)
				swapCtx := ctx
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					swapCtx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				sp.recorded()

				_, err := s.Swap(swapCtx, f.temp, f.live, store.SwapOptions{Lock: f.lock, Populated: tt.populated, PreserveFor: 120 * time.Second})
				if err == nil {
					t.Fatal("Swap succeeded, want an error")
				}
				swapWantError(t, err, f.live)
				published := false
				for _, c := range sp.recorded() {
					published = published || c.script == "publish"
					if c.args[0] == "EXPIRE" {
						t.Errorf("sent %v, want no EXPIRE for a swap that was not populated", c)
					}
				}
				if !published {
					t.Error("the publish script was never sent: the failure was not injected")
				}
				f.wantLiveUntouched(t, tg.other)
				redistest.WantAbsent(t, tg.other, f.temp)
				f.wantLockUnchanged(t, tg.other)
			})
		}
	})
}

func TestSwapBlankToken(t *testing.T) {
	// C30: a fenced swap with a blank token is refused before any command.
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s, sp := swapSpied(t, tg.client, nil)
		f := swapSetup(t, ctx, s, tg, tg.live, true, true)
		blank := *f.lock
		blank.Token = ""
		sp.recorded()

		for _, p := range []store.Populated{store.PopulatedUnknown, store.PopulatedYes, store.PopulatedNo} {
			got, err := s.Swap(ctx, f.temp, f.live, store.SwapOptions{Lock: &blank, Populated: p})
			if err == nil || !strings.Contains(err.Error(), "token") {
				t.Errorf("Populated %v: Swap = %v, %v; want an error about the token", p, got, err)
			}
			swapWantError(t, err, f.live)
		}
		if calls := sp.recorded(); len(calls) != 0 {
			t.Errorf("sent %v, want no command", calls)
		}
		f.wantLiveUntouched(t, tg.other)
		if got := redistest.HGetAll(t, tg.other, f.temp); !scriptsMapsEqual(got, f.new) {
			t.Errorf("temp %s = %v, want %v", f.temp, got, f.new)
		}
		redistest.WantTTL(t, tg.other, f.temp, swapTempTTL)
		f.wantLockUnchanged(t, tg.other)
	})
}

func TestSwapNeverTouchesLock(t *testing.T) {
	// C31: Swap never acquires, extends or releases the lock: a fenced swap
	// sends only EXISTS (populated unknown) and the publish script, and on
	// a lost lock only the UNLINK of its own temp key.
	forEachTarget(t, func(t *testing.T, tg target) {
		for _, tt := range []struct {
			name  string
			steal bool
			allow func(c swapCall, temp string) bool
		}{
			{"held", false, func(c swapCall, temp string) bool {
				return c.script == "publish" || slices.Equal(c.args, []string{"EXISTS", temp})
			}},
			{"stolen", true, func(c swapCall, temp string) bool {
				return c.script == "publish" || slices.Equal(c.args, []string{"EXISTS", temp}) ||
					slices.Equal(c.args, []string{"UNLINK", temp})
			}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				s, sp := swapSpied(t, tg.client, nil)
				f := swapSetup(t, ctx, s, tg, tg.live+":"+tt.name, true, true)
				lockValue, lockTTL := f.lock.Token, swapLockTTL
				if tt.steal {
					redistest.Cmd(t, tg.other, "SET", f.lock.Key, "successor", "EX", "40")
					lockValue, lockTTL = "successor", 40*time.Second
				}
				sp.recorded()
				_, err := s.Swap(ctx, f.temp, f.live, store.SwapOptions{Lock: f.lock})
				if tt.steal != (err != nil) {
					t.Fatalf("Swap: err = %v, want error %v", err, tt.steal)
				}
				calls := sp.recorded()
				if !slices.ContainsFunc(calls, func(c swapCall) bool { return c.script == "publish" }) {
					t.Errorf("sent %v, want the publish script among them", calls)
				}
				for _, c := range calls {
					if !tt.allow(c, f.temp) {
						t.Errorf("sent %v, want only EXISTS, the publish script (and UNLINK of the temp key when lost)", c)
					}
				}
				redistest.WantLock(t, tg.other, f.lock.Key, lockValue, lockTTL)
			})
		}
	})
}

func TestSwapOutcomeStrings(t *testing.T) {
	// C32: Swap reports its outcome; both enums print readably.
	for _, tt := range []struct {
		got  fmt.Stringer
		want string
	}{
		{store.Swapped, "swapped"},
		{store.Emptied, "emptied"},
		{store.Outcome(0), "Outcome(0)"},
		{store.Outcome(9), "Outcome(9)"},
		{store.PopulatedUnknown, "unknown"},
		{store.PopulatedYes, "yes"},
		{store.PopulatedNo, "no"},
		{store.Populated(-3), "Populated(-3)"},
	} {
		if got := tt.got.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
	var zero store.SwapOptions
	if zero.Populated != store.PopulatedUnknown {
		t.Errorf("zero SwapOptions.Populated = %v, want %v", zero.Populated, store.PopulatedUnknown)
	}
	if store.Swapped == 0 || store.Emptied == 0 || store.Swapped == store.Emptied {
		t.Errorf("Swapped = %d, Emptied = %d: want distinct and non-zero", store.Swapped, store.Emptied)
	}
}

// swapOtherSlotKey returns a key, derived from base, whose cluster slot
// differs from the slot of key.
func swapOtherSlotKey(t *testing.T, key, base string) string {
	t.Helper()
	want := env.Cluster.KeySlot(t, key)
	for i := range 100 {
		k := fmt.Sprintf("%s:elsewhere%d", base, i)
		if env.Cluster.KeySlot(t, k) != want {
			return k
		}
	}
	t.Fatalf("no key near %q outside slot %d", base, want)
	return ""
}

func TestSwapBadInput(t *testing.T) {
	// Bad input is refused with a *store.Error before any command is sent
	// and before anything changes.
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s, sp := swapSpied(t, tg.client, nil)
		f := swapSetup(t, ctx, s, tg, tg.live, true, true)
		other := tg.live + "-other"
		otherLock := &store.Lock{Live: other, Key: s.LockKey(other), Token: f.lock.Token, TTL: time.Minute}
		type swapCase struct {
			name       string
			temp, live string
			opts       store.SwapOptions
			want       string
		}
		cases := []swapCase{
			{"empty live", f.temp, "", store.SwapOptions{}, "empty key"},
			{"empty temp", "", f.live, store.SwapOptions{}, "empty temp key"},
			{"temp is live", f.live, f.live, store.SwapOptions{}, "temp key is the live key"},
			{"lock for another key", f.temp, f.live, store.SwapOptions{Lock: otherLock}, "not this key"},
			{"lock with empty key", f.temp, f.live, store.SwapOptions{Lock: &store.Lock{Live: f.live, Token: f.lock.Token}}, "empty key"},
			{"negative PreserveFor", f.temp, f.live, store.SwapOptions{PreserveFor: -time.Second}, "must be positive"},
			{"fractional PreserveFor", f.temp, f.live, store.SwapOptions{PreserveFor: 1500 * time.Millisecond}, "whole number of seconds"},
			{"sub-second PreserveFor", f.temp, f.live, store.SwapOptions{PreserveFor: time.Millisecond}, "whole number of seconds"},
		}
		if tg.cluster {
			elsewhere := swapOtherSlotKey(t, f.live, redistest.Prefix(t))
			badLock := *f.lock
			badLock.Key = swapOtherSlotKey(t, f.live, redistest.Prefix(t)+"lock")
			cases = append(cases,
				swapCase{"temp in another slot", elsewhere, f.live, store.SwapOptions{}, "different hash slots"},
				swapCase{"lock in another slot", f.temp, f.live, store.SwapOptions{Lock: &badLock}, "different hash slots"},
			)
		}
		sp.recorded() // forget the fixture's SET
		for _, tt := range cases {
			t.Run(tt.name, func(t *testing.T) {
				var got store.Outcome
				var err error
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Fatalf("Swap panicked: %v", r)
						}
					}()
					got, err = s.Swap(ctx, tt.temp, tt.live, tt.opts)
				}()
				var e *store.Error
				if !errors.As(err, &e) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("Swap = %v, %v; want a *store.Error containing %q", got, err, tt.want)
				}
				if calls := sp.recorded(); len(calls) != 0 {
					t.Errorf("sent %v, want no command", calls)
				}
			})
		}
		f.wantLiveUntouched(t, tg.other)
		redistest.WantTTL(t, tg.other, f.temp, swapTempTTL)
		f.wantLockUnchanged(t, tg.other)
	})
}

func TestSwapHandBuiltLock(t *testing.T) {
	// A Lock is a plain value, and Swap accepts one whose Live is blank
	// (it only refuses a Live naming another key). Its errors must still
	// carry Op "swap" and the live key (C42), like every other Swap error.
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s := tg.store(store.Options{})
		const tok = "00112233445566778899aabbccddeeff"
		lock := &store.Lock{Key: s.LockKey(tg.live), Token: tok, TTL: time.Minute}

		// Held: the fence passes and the swap publishes (C21, C23).
		f := swapSetup(t, ctx, s, tg, tg.live, false, true)
		redistest.Cmd(t, tg.other, "SET", lock.Key, tok, "EX", "50")
		if out, err := s.Swap(ctx, f.temp, f.live, store.SwapOptions{Lock: lock, Populated: store.PopulatedYes}); err != nil || out != store.Swapped {
			t.Fatalf("Swap under a held hand-built lock = %v, %v; want %v, nil", out, err, store.Swapped)
		}
		redistest.WantHash(t, tg.other, f.live, f.new)
		redistest.WantLock(t, tg.other, lock.Key, tok, swapLockTTL)

		// Stolen: ErrLockLost (C27), naming the live key.
		f = swapSetup(t, ctx, s, tg, tg.live, false, true)
		redistest.Cmd(t, tg.other, "SET", lock.Key, "successor", "EX", "40")
		_, err := s.Swap(ctx, f.temp, f.live, store.SwapOptions{Lock: lock, Populated: store.PopulatedYes})
		redistest.WantErr(t, err, store.ErrLockLost)
		f.wantLiveUntouched(t, tg.other)
		redistest.WantAbsent(t, tg.other, f.temp)
		redistest.WantLock(t, tg.other, lock.Key, "successor", 40*time.Second)
		swapWantError(t, err, f.live)
		if !strings.Contains(err.Error(), f.live) {
			t.Errorf("error %q does not name the live key %s", err, f.live)
		}
	})
}

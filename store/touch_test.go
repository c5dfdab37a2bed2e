package store_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
)

// acquired cleans live (rbFresh), acquires its lock with ttl, and returns
// a Store, the lock and a fresh temp key: holding {"a": "1"} without a TTL
// when filled, else not existing yet.
func acquired(t *testing.T, tg target, ttl time.Duration, filled bool) (*store.Store, *store.Lock, string) {
	t.Helper()
	rbFresh(t, tg)
	s := tg.store(store.Options{})
	lock, err := s.Acquire(redistest.Ctx(t), tg.live, ttl)
	if err != nil {
		t.Fatal(err)
	}
	temp := s.NewTempKey(tg.live)
	if filled {
		redistest.Cmd(t, tg.other, "HSET", temp, "a", "1")
	}
	return s, lock, temp
}

// touchPTTLs returns the PTTLs of a and b, read in one script so that both
// are measured at the same instant. a and b must share a hash slot.
func touchPTTLs(t *testing.T, c rueidis.Client, a, b string) (time.Duration, time.Duration) {
	t.Helper()
	const src = "return {redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[2])}"
	v, err := c.Do(context.Background(), c.B().Eval().Script(src).Numkeys(2).Key(a, b).Build()).AsIntSlice()
	if err != nil || len(v) != 2 {
		t.Fatalf("PTTL %s %s: %v %v", a, b, v, err)
	}
	return time.Duration(v[0]) * time.Millisecond, time.Duration(v[1]) * time.Millisecond
}

// touchPoll calls cond every few milliseconds until it returns true, and
// fails the test if that takes longer than within.
func touchPoll(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after %v for %s", within, what)
		}
		<-tick.C
	}
}

// TestTouchPopulated: C11, C13, C34 (1-2). A touch after the first write
// reports populated and resets both TTLs to ttl.
func TestTouchPopulated(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s, lock, temp := acquired(t, tg, 60*time.Second, false)

		redistest.Cmd(t, tg.other, "HSET", temp, "a", "1", "b", "2")
		// C34.1: no TTL until the first touch after the first write.
		if got := redistest.PTTL(t, tg.other, temp); got != -1 {
			t.Errorf("temp PTTL before the first touch = %v, want -1", got)
		}
		populated, err := s.Touch(ctx, lock, temp)
		if err != nil {
			t.Fatal(err)
		}
		if !populated {
			t.Errorf("populated = false after a write, want true")
		}
		redistest.WantTTL(t, tg.other, temp, 60*time.Second)
		redistest.WantTTL(t, tg.other, lock.Key, 60*time.Second)

		// C13: reset, not left to decay: lower both, touch, both are back
		// above the lowered value.
		redistest.Cmd(t, tg.other, "EXPIRE", temp, "5")
		redistest.Cmd(t, tg.other, "EXPIRE", lock.Key, "5")
		populated, err = s.Touch(ctx, lock, temp)
		if err != nil {
			t.Fatal(err)
		}
		if !populated {
			t.Errorf("populated = false on the second touch, want true")
		}
		for _, k := range []string{temp, lock.Key} {
			if got := redistest.PTTL(t, tg.other, k); got <= 5*time.Second || got > 60*time.Second {
				t.Errorf("%s: PTTL after touch = %v, want in (5s, 60s]", k, got)
			}
		}
		// A temp key with a longer TTL is reset down to ttl too.
		redistest.Cmd(t, tg.other, "EXPIRE", temp, "5000")
		if _, err := s.Touch(ctx, lock, temp); err != nil {
			t.Fatal(err)
		}
		redistest.WantTTL(t, tg.other, temp, 60*time.Second)
		// Touch never changes contents or the lock's value.
		wantHashTTL(t, tg.other, temp, map[string]string{"a": "1", "b": "2"})
		redistest.WantString(t, tg.other, lock.Key, lock.Token)
	})
}

// wantHashTTL fails unless key holds exactly want (whatever its TTL).
func wantHashTTL(t *testing.T, c rueidis.Client, key string, want map[string]string) {
	t.Helper()
	got := redistest.HGetAll(t, c, key)
	if len(got) != len(want) {
		t.Errorf("%s = %v, want %v", key, got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", key, got, want)
			return
		}
	}
}

// TestTouchBeforeTempExists: C12. Not an error; populated stays false, the
// temp key stays absent, and the lock is still extended.
func TestTouchBeforeTempExists(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s, lock, temp := acquired(t, tg, 60*time.Second, false)
		redistest.Cmd(t, tg.other, "EXPIRE", lock.Key, "5")

		populated, err := s.Touch(ctx, lock, temp)
		if err != nil {
			t.Fatalf("touch before the first write: %v, want nil", err)
		}
		if populated {
			t.Errorf("populated = true before any write, want false")
		}
		redistest.WantAbsent(t, tg.other, temp)
		if got := redistest.PTTL(t, tg.other, lock.Key); got <= 5*time.Second || got > 60*time.Second {
			t.Errorf("lock PTTL after touch = %v, want in (5s, 60s] (extended)", got)
		}
		redistest.WantString(t, tg.other, lock.Key, lock.Token)
	})
}

// TestTouchLockLost: C11, C16, C9. A lock that was taken over or expired
// gives ErrLockLost naming the live key, and the touch changes nothing: the
// temp key's TTL is not refreshed, the thief's lock is left alone.
func TestTouchLockLost(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		rbFresh(t, tg)
		for _, tt := range []struct {
			name  string
			steal func(t *testing.T, lockKey string)
			thief string // the lock's value after the touch; "" = absent
		}{
			{"stolen", func(t *testing.T, k string) { redistest.Cmd(t, tg.other, "SET", k, "thief", "EX", "40") }, "thief"},
			{"expired", func(t *testing.T, k string) { redistest.Cmd(t, tg.other, "DEL", k) }, ""},
		} {
			t.Run(tt.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				tg := tg
				tg.live += "-" + tt.name // a lock of its own
				s, lock, temp := acquired(t, tg, 60*time.Second, true)
				if _, err := s.Touch(ctx, lock, temp); err != nil {
					t.Fatal(err)
				}
				redistest.Cmd(t, tg.other, "EXPIRE", temp, "5")
				tt.steal(t, lock.Key)

				populated, err := s.Touch(ctx, lock, temp)
				redistest.WantErr(t, err, store.ErrLockLost)
				redistest.WantErr(t, err, store.ErrInProgress) // C42
				var e *store.Error
				if !errors.As(err, &e) || e.Op != "touch" || e.Key != tg.live {
					t.Errorf("err = %#v, want *store.Error{Op: touch, Key: %q}", err, tg.live)
				}
				for _, want := range []string{tg.live, "another rebuild took over"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not contain %q", err, want)
					}
				}
				if populated {
					t.Errorf("populated = true on a lost lock, want false")
				}
				// Nothing changed: temp keeps its lowered TTL and contents.
				redistest.WantTTL(t, tg.other, temp, 5*time.Second)
				wantHashTTL(t, tg.other, temp, map[string]string{"a": "1"})
				redistest.WantString(t, tg.other, lock.Key, tt.thief)
				if tt.thief != "" {
					redistest.WantTTL(t, tg.other, lock.Key, 40*time.Second)
				}
			})
		}
	})
}

// TestTouchTempDeadlineNotBeforeLock: C15. After a touch the temp key's
// deadline is never earlier than the lock's, whatever the TTLs were before:
// both are measured in one script, so the only slack is rounding.
func TestTouchTempDeadlineNotBeforeLock(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s, lock, temp := acquired(t, tg, 60*time.Second, true)
		const tolerance = 2 * time.Millisecond
		for _, before := range []struct{ temp, lock string }{
			{"", ""},       // temp without TTL, lock fresh
			{"3", "50"},    // temp about to expire well before the lock
			{"1000", "10"}, // temp far beyond the lock
		} {
			if before.temp != "" {
				redistest.Cmd(t, tg.other, "EXPIRE", temp, before.temp)
				redistest.Cmd(t, tg.other, "EXPIRE", lock.Key, before.lock)
			}
			if _, err := s.Touch(ctx, lock, temp); err != nil {
				t.Fatal(err)
			}
			tempTTL, lockTTL := touchPTTLs(t, tg.other, temp, lock.Key)
			if lockTTL <= 0 || tempTTL < lockTTL-tolerance {
				t.Errorf("before temp=%q lock=%q: after touch PTTL temp %v, lock %v; want temp >= lock (-%v) > 0",
					before.temp, before.lock, tempTTL, lockTTL, tolerance)
			}
		}
	})
}

// TestTouchOverrun: C16, C15. A batch that overruns ttl loses the lock, and
// the next touch returns ErrLockLost. By then the temp key has expired as
// well, never before the lock.
func TestTouchOverrun(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s, lock, temp := acquired(t, tg, time.Second, true)
		if populated, err := s.Touch(ctx, lock, temp); err != nil || !populated {
			t.Fatalf("touch = %v, %v; want true, nil", populated, err)
		}
		// The "batch" runs past ttl: wait for the temp key to expire. The
		// lock, extended first, must already be gone at that moment.
		touchPoll(t, 10*time.Second, "the temp key to expire", func() bool { return !redistest.Exists(t, tg.other, temp) })
		redistest.WantString(t, tg.other, lock.Key, "")

		populated, err := s.Touch(ctx, lock, temp)
		redistest.WantErr(t, err, store.ErrLockLost)
		if !strings.Contains(err.Error(), tg.live) {
			t.Errorf("error %q does not name the live key %q", err, tg.live)
		}
		if populated {
			t.Errorf("populated = true, want false")
		}
		// The lost touch recreates nothing.
		redistest.WantString(t, tg.other, lock.Key, "")
		redistest.WantAbsent(t, tg.other, temp)
	})
}

// TestTouchOverrunLockFirst: C16. Polling on the lock itself: once it has
// expired, the next touch fails with ErrLockLost and does not resurrect it.
func TestTouchOverrunLockFirst(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s, lock, temp := acquired(t, tg, time.Second, true)
		if _, err := s.Touch(ctx, lock, temp); err != nil {
			t.Fatal(err)
		}
		touchPoll(t, 10*time.Second, "the lock to expire", func() bool { return !redistest.Exists(t, tg.other, lock.Key) })
		_, err := s.Touch(ctx, lock, temp)
		redistest.WantErr(t, err, store.ErrLockLost)
		redistest.WantString(t, tg.other, lock.Key, "")
		// Whatever is left of the temp key was not given a new lease.
		if got := redistest.PTTL(t, tg.other, temp); got > time.Second {
			t.Errorf("temp PTTL after a lost touch = %v, want <= 1s (not refreshed)", got)
		}
	})
}

// TestTouchBadInput: bad arguments are refused with a clear error before
// anything changes (C11's preconditions, C30's blank token).
func TestTouchBadInput(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s, lock, temp := acquired(t, tg, 60*time.Second, true)
		redistest.Cmd(t, tg.other, "EXPIRE", temp, "30")
		redistest.Cmd(t, tg.other, "EXPIRE", lock.Key, "30")

		with := func(f func(l *store.Lock)) *store.Lock {
			l := *lock
			f(&l)
			return &l
		}
		cases := []struct {
			name string
			lock *store.Lock
			temp string
			want string
		}{
			{"nil lock", nil, temp, "nil lock"},
			{"empty temp", lock, "", "empty temp key"},
			{"blank token", with(func(l *store.Lock) { l.Token = "" }), temp, "token must be non-empty"},
			{"empty lock key", with(func(l *store.Lock) { l.Key = "" }), temp, "empty key"},
			{"fractional ttl", with(func(l *store.Lock) { l.TTL = 1500 * time.Millisecond }), temp, "whole number of seconds"},
			{"sub-second ttl", with(func(l *store.Lock) { l.TTL = 500 * time.Millisecond }), temp, "whole number of seconds"},
			{"zero ttl", with(func(l *store.Lock) { l.TTL = 0 }), temp, "must be positive"},
			{"negative ttl", with(func(l *store.Lock) { l.TTL = -time.Second }), temp, "must be positive"},
		}
		if tg.cluster {
			// C5+: a temp key outside the lock's slot is refused, not sent.
			cases = append(cases, struct {
				name string
				lock *store.Lock
				temp string
				want string
			}{"temp in another slot", lock, touchOtherSlotKey(t, lock.Key), "different hash slots"})
		}
		for _, tt := range cases {
			t.Run(tt.name, func(t *testing.T) {
				populated, err := s.Touch(ctx, tt.lock, tt.temp)
				var e *store.Error
				if !errors.As(err, &e) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("err = %v, want *store.Error containing %q", err, tt.want)
				}
				if errors.Is(err, store.ErrLockLost) {
					t.Errorf("bad input reported as ErrLockLost: %v", err)
				}
				if populated {
					t.Errorf("populated = true, want false")
				}
				// Nothing changed.
				redistest.WantString(t, tg.other, lock.Key, lock.Token)
				redistest.WantTTL(t, tg.other, lock.Key, 30*time.Second)
				redistest.WantTTL(t, tg.other, temp, 30*time.Second)
			})
		}
	})
}

// touchOtherSlotKey returns a key whose cluster hash slot differs from k's.
func touchOtherSlotKey(t *testing.T, k string) string {
	t.Helper()
	slot := env.Cluster.KeySlot(t, k)
	for i := 0; ; i++ {
		cand := "{touch-other-" + strconv.Itoa(i) + "}:rebuild:1:0000000000000000"
		if env.Cluster.KeySlot(t, cand) != slot {
			return cand
		}
	}
}

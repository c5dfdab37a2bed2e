package store_test

import (
	"errors"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
)

func TestAcquire(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s := tg.store(store.Options{})
		lock, err := s.Acquire(ctx, tg.live, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		// C6: one SET NX EX of a 128-bit token as 32 hex characters.
		if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(lock.Token) {
			t.Errorf("token %q, want 32 lowercase hex characters", lock.Token)
		}
		if lock.Key != s.LockKey(tg.live) || lock.Live != tg.live || lock.TTL != 60*time.Second {
			t.Errorf("lock = %+v", lock)
		}
		redistest.WantString(t, tg.other, lock.Key, lock.Token)
		redistest.WantTTL(t, tg.other, lock.Key, 60*time.Second)

		// C7: a held lock gives ErrInProgress naming the live key, and
		// changes nothing.
		redistest.Cmd(t, tg.other, "EXPIRE", lock.Key, "50")
		_, err = s.Acquire(ctx, tg.live, 60*time.Second)
		redistest.WantErr(t, err, store.ErrInProgress)
		if errors.Is(err, store.ErrLockLost) {
			t.Errorf("ErrInProgress must not match ErrLockLost: %v", err)
		}
		if !strings.Contains(err.Error(), tg.live) {
			t.Errorf("error %q does not name the live key %q", err, tg.live)
		}
		redistest.WantString(t, tg.other, lock.Key, lock.Token)
		redistest.WantTTL(t, tg.other, lock.Key, 50*time.Second)

		// C6: a fresh token for each rebuild.
		if err := s.Release(ctx, lock); err != nil {
			t.Fatal(err)
		}
		again, err := s.Acquire(ctx, tg.live, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if again.Token == lock.Token {
			t.Errorf("token reused: %q", again.Token)
		}
		if err := s.Release(ctx, again); err != nil {
			t.Fatal(err)
		}
	})
}

func TestAcquireBadInput(t *testing.T) {
	s := store.New(env.Standalone.Client(t), store.Options{})
	live := redistest.Prefix(t) + "idx"
	for _, tt := range []struct {
		name string
		live string
		ttl  time.Duration
		want string
	}{
		{"empty key", "", time.Minute, "empty key"},
		{"zero ttl", live, 0, "must be positive"},
		{"negative ttl", live, -time.Second, "must be positive"},
		{"sub-second ttl", live, 500 * time.Millisecond, "whole number of seconds"},
		{"fractional ttl", live, 1500 * time.Millisecond, "whole number of seconds"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Acquire(redistest.Ctx(t), tt.live, tt.ttl)
			var e *store.Error
			if !errors.As(err, &e) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want *store.Error containing %q", err, tt.want)
			}
			redistest.WantString(t, env.Standalone.Client(t), live+":rebuild-lock", "")
		})
	}
}

func TestExtend(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s, lock, _ := acquired(t, tg, 60*time.Second, false)
		redistest.Cmd(t, tg.other, "EXPIRE", lock.Key, "5")
		// C9: only a matching token resets the TTL.
		if err := s.Extend(ctx, lock); err != nil {
			t.Fatal(err)
		}
		if got := redistest.PTTL(t, tg.other, lock.Key); got <= 5*time.Second {
			t.Errorf("PTTL after extend = %v, want reset to ~60s", got)
		}
		// Steal the lock: extend changes nothing and reports ErrLockLost.
		redistest.Cmd(t, tg.other, "SET", lock.Key, "thief", "EX", "40")
		err := s.Extend(ctx, lock)
		redistest.WantErr(t, err, store.ErrLockLost)
		redistest.WantErr(t, err, store.ErrInProgress) // C42: ErrLockLost matches ErrInProgress
		redistest.WantString(t, tg.other, lock.Key, "thief")
		redistest.WantTTL(t, tg.other, lock.Key, 40*time.Second)
		// Expired lock: still lost, still nothing created.
		redistest.Cmd(t, tg.other, "DEL", lock.Key)
		redistest.WantErr(t, s.Extend(ctx, lock), store.ErrLockLost)
		redistest.WantString(t, tg.other, lock.Key, "")
	})
}

func TestRelease(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s, lock, _ := acquired(t, tg, 60*time.Second, false)
		// C8: never deletes a lock someone else holds.
		redistest.Cmd(t, tg.other, "SET", lock.Key, "successor", "EX", "60")
		redistest.WantErr(t, s.Release(ctx, lock), store.ErrLockLost)
		redistest.WantString(t, tg.other, lock.Key, "successor")
		// Our own lock is deleted.
		redistest.Cmd(t, tg.other, "SET", lock.Key, lock.Token, "EX", "60")
		if err := s.Release(ctx, lock); err != nil {
			t.Fatal(err)
		}
		redistest.WantString(t, tg.other, lock.Key, "")
	})
}

func TestLockBadInput(t *testing.T) {
	s := store.New(env.Standalone.Client(t), store.Options{})
	ctx := redistest.Ctx(t)
	for _, tt := range []struct {
		name string
		lock *store.Lock
		want string
	}{
		{"nil", nil, "nil lock"},
		{"empty key", &store.Lock{Live: "x", Token: "t", TTL: time.Second}, "empty key"},
		{"blank token", &store.Lock{Live: "x", Key: "x:rebuild-lock", TTL: time.Second}, "token must be non-empty"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for op, err := range map[string]error{"extend": s.Extend(ctx, tt.lock), "release": s.Release(ctx, tt.lock)} {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("%s: err = %v, want it to contain %q", op, err, tt.want)
				}
			}
		})
	}
}

func TestAcquireRace(t *testing.T) {
	// C43: at most one rebuild of a key at a time; the others fail at once.
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s := tg.store(store.Options{})
		const n = 16
		var wg sync.WaitGroup
		locks := make(chan *store.Lock, n)
		errs := make(chan error, n)
		for range n {
			wg.Go(func() {
				l, err := s.Acquire(ctx, tg.live, 60*time.Second)
				if err != nil {
					errs <- err
					return
				}
				locks <- l
			})
		}
		wg.Wait()
		close(locks)
		close(errs)
		if len(locks) != 1 {
			t.Fatalf("%d goroutines acquired the lock, want 1", len(locks))
		}
		for err := range errs {
			redistest.WantErr(t, err, store.ErrInProgress)
		}
		winner := <-locks
		redistest.WantString(t, tg.other, s.LockKey(tg.live), winner.Token)
		if err := s.Release(ctx, winner); err != nil {
			t.Fatal(err)
		}
	})
}

func TestReleaseAfterLostReply(t *testing.T) {
	// C8: the release script is retryable. When the connection drops after
	// the script ran but before its reply arrived, rueidis runs it again;
	// the rerun finds the lock gone. That is a release that worked, not
	// ErrLockLost, which would be joined onto a successful rebuild's result.
	p, err := faultproxy.New(env.Standalone.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{p.Addr()}, DisableCache: true, ForceSingleClient: true,
		PipelineMultiplex: -1,                        // one connection, so the cut hits the release
		Dialer:            net.Dialer{KeepAlive: -1}, // and no background PING shares its bytes
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx := redistest.Ctx(t)
	s := store.New(c, store.Options{})
	// Load the script first: otherwise the lost reply would be EVALSHA's
	// NOSCRIPT, and the EVAL fallback would run the script only once.
	warm, err := s.Acquire(ctx, redistest.Prefix(t)+"warm", 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, warm); err != nil {
		t.Fatal(err)
	}
	lock, err := s.Acquire(ctx, redistest.Prefix(t)+"idx", 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other := env.Standalone.Client(t)
	p.CutAfter(faultproxy.ToClient, 0) // the next reply is lost
	if err := s.Release(ctx, lock); err != nil {
		t.Fatalf("Release after a lost reply: %v, want nil", err)
	}
	redistest.WantString(t, other, lock.Key, "")
	if st := p.Stats(); st.Cut == 0 {
		t.Fatalf("the proxy cut nothing (%+v): the test did not lose the reply", st)
	}
}

package faultproxy

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
)

func TestStall(t *testing.T) {
	t.Parallel()
	p := newProxy(t, env.Standalone.Addr)
	c := newClient(t, p.Addr())
	key := redistest.Prefix(t) + "k"
	set(t, c, key, "before")

	const stall = time.Second
	start := time.Now()
	p.Stall(stall)

	// A command with a deadline gives up. (rueidis then drops that
	// connection and dials another, which the stall holds too.)
	err := c.Do(withTimeout(t, 200*time.Millisecond), c.B().Get().Key(key).Build()).Error()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("GET with a 200ms deadline: got %v, want context.DeadlineExceeded", err)
	}
	// Commands without one complete once the stall ends, with their data.
	if err := c.Do(context.Background(), c.B().Set().Key(key).Value("after").Build()).Error(); err != nil {
		t.Fatalf("SET through the stall: %v", err)
	}
	if elapsed := time.Since(start); elapsed < stall {
		t.Errorf("SET through the stall returned after %v, want >= %v", elapsed, stall)
	}
	if got := get(t, c, key); got != "after" {
		t.Fatalf("GET after the stall: got %q, want after", got)
	}
}

func TestStallOutlastsATTLAndDeliversEveryByte(t *testing.T) {
	t.Parallel()
	p := newProxy(t, env.Standalone.Addr)
	c := newClient(t, p.Addr())
	direct := env.Standalone.Client(t)
	prefix := redistest.Prefix(t)
	lease, big := prefix+"lease", prefix+"big"
	direct.Do(t.Context(), direct.B().Del().Key(big).Build()) // left by -count > 1

	// A lease shorter than the stall.
	if err := direct.Do(t.Context(), direct.B().Set().Key(lease).Value("mine").PxMilliseconds(300).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	value := strings.Repeat("0123456789abcdef", 1<<18) // 4 MiB, far more than the proxy's buffer
	const stall = 1500 * time.Millisecond
	start := time.Now()
	p.Stall(stall)
	done := async(func() error { return c.Do(context.Background(), c.B().Set().Key(big).Value(value).Build()).Error() })
	waitHeld(t, p, 1)

	eventually(t, "the lease expires during the stall", func() error {
		if n, _ := direct.Do(t.Context(), direct.B().Exists().Key(lease).Build()).AsInt64(); n != 0 {
			return errors.New("the lease still exists")
		}
		return nil
	})
	if time.Since(start) < stall {
		if n, _ := direct.Do(t.Context(), direct.B().Exists().Key(big).Build()).AsInt64(); n != 0 {
			t.Fatalf("the held SET reached the server during the stall")
		}
	}

	if err := <-done; err != nil {
		t.Fatalf("SET through the stall: %v", err)
	}
	if elapsed := time.Since(start); elapsed < stall {
		t.Errorf("SET through the stall returned after %v, want >= %v", elapsed, stall)
	}
	got, err := direct.Do(t.Context(), direct.B().Get().Key(big).Build()).ToString()
	if err != nil || got != value {
		t.Fatalf("value after the stall: got %d bytes, %v, want the %d bytes sent", len(got), err, len(value))
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	p := newProxy(t, env.Standalone.Addr)
	c := newClient(t, p.Addr())
	direct := env.Standalone.Client(t)
	key := redistest.Prefix(t) + "k"
	set(t, c, key, "old")

	setNew := func(value string) <-chan error {
		before := p.Stats().Held
		done := async(func() error { return c.Do(t.Context(), c.B().Set().Key(key).Value(value).Build()).Error() })
		waitHeld(t, p, before+1)
		return done
	}

	t.Run("Pause holds until Resume", func(t *testing.T) {
		p.Pause()
		done := setNew("paused")
		if got := get(t, direct, key); got != "old" {
			t.Fatalf("value while paused: got %q, want old", got)
		}
		p.Resume()
		if err := <-done; err != nil {
			t.Fatalf("SET after Resume: %v", err)
		}
		if got := get(t, direct, key); got != "paused" {
			t.Fatalf("value after Resume: got %q, want paused", got)
		}
	})
	t.Run("Resume ends a stall early", func(t *testing.T) {
		p.Stall(time.Hour)
		done := setNew("stalled")
		p.Resume()
		if err := <-done; err != nil {
			t.Fatalf("SET after Resume: %v", err)
		}
	})
	t.Run("Stall ends a pause after its duration", func(t *testing.T) {
		p.Pause()
		done := setNew("ended")
		p.Stall(50 * time.Millisecond)
		if err := <-done; err != nil {
			t.Fatalf("SET after the stall's end: %v", err)
		}
	})
	t.Run("Pause cancels the end of a stall", func(t *testing.T) {
		p.Stall(50 * time.Millisecond)
		p.Pause()
		done := setNew("held")
		select {
		case err := <-done:
			t.Fatalf("SET returned %v during the pause, want it held", err)
		case <-time.After(300 * time.Millisecond): // Measures that the stall's end was cancelled.
		}
		p.Heal()
		if err := <-done; err != nil {
			t.Fatalf("SET after Heal: %v", err)
		}
	})
	t.Run("Stall 0 is Resume", func(t *testing.T) {
		p.Pause()
		done := setNew("zero")
		p.Stall(0)
		if err := <-done; err != nil {
			t.Fatalf("SET after Stall(0): %v", err)
		}
	})
}

func TestStallDeliversWhatAClientSentBeforeGivingUp(t *testing.T) {
	t.Parallel()
	p := newProxy(t, env.Standalone.Addr)
	direct := env.Standalone.Client(t)
	key := redistest.Prefix(t) + "k"
	direct.Do(t.Context(), direct.B().Del().Key(key).Build()) // left by -count > 1

	conn, _ := rawConn(t, p)
	p.Pause()
	if _, err := io.WriteString(conn, "SET "+key+" late\r\n"); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, p, 1)
	conn.Close() // The client gives up...
	p.Resume()   // ...but the command was in flight, and arrives.
	eventually(t, "the SET arrives", func() error {
		if got := get(t, direct, key); got != "late" {
			return errors.New("the value is not set yet")
		}
		return nil
	})
	waitClosed(t, p)
}

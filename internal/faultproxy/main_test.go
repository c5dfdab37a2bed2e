package faultproxy

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// waitTimeout bounds every poll of a test.
const waitTimeout = 10 * time.Second

// eventually calls f until it returns nil, failing the test with f's last
// error when it has not within waitTimeout.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not true after %v: %v", what, waitTimeout, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// newProxy starts a proxy to target, closed when the test ends.
func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// newClient returns a single-node rueidis client to addr, closed when the
// test ends. It keeps one connection (PipelineMultiplex -1; by default a
// client opens up to 4, each on first use, and the handshake of a new one
// would count in a CutAfter budget), and its background PING is off
// (Dialer.KeepAlive -1), so that the bytes through a proxy are only the
// test's commands.
func newClient(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{addr},
		DisableCache:      true,
		ForceSingleClient: true,
		PipelineMultiplex: -1,
		Dialer:            net.Dialer{KeepAlive: -1},
	})
	if err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

// set runs SET key value on c, failing the test on error.
func set(t *testing.T, c rueidis.Client, key, value string) {
	t.Helper()
	if err := c.Do(t.Context(), c.B().Set().Key(key).Value(value).Build()).Error(); err != nil {
		t.Fatalf("SET %s: %v", key, err)
	}
}

// get runs GET key on c; a missing key reads as "".
func get(t *testing.T, c rueidis.Client, key string) string {
	t.Helper()
	v, err := c.Do(t.Context(), c.B().Get().Key(key).Build()).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v
}

// async runs f in a goroutine and returns a channel that receives its
// result. The goroutine ends when f does.
func async[T any](f func() T) <-chan T {
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	return ch
}

// waitHeld waits until p holds at least n bytes.
func waitHeld(t *testing.T, p *Proxy, n int64) {
	t.Helper()
	eventually(t, "proxy holds the bytes", func() error {
		if got := p.Stats().Held; got < n {
			return fmt.Errorf("Held: got %d, want >= %d", got, n)
		}
		return nil
	})
}

// withTimeout returns a context that ends after d.
func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitClosed waits until every connection through p is closed on both sides.
// After a cut, this is when the server has run every command delivered to
// it: it closes its side once it reads the end of stream.
func waitClosed(t *testing.T, p *Proxy) {
	t.Helper()
	eventually(t, "every connection closes", func() error {
		if open := p.Stats().Open; open != 0 {
			return fmt.Errorf("Stats.Open: got %d, want 0", open)
		}
		return nil
	})
}

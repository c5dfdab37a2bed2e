package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

// clusterKeys returns one key per node of the cluster, in the order of
// env.Cluster.Nodes.
func clusterKeys(t *testing.T) []string {
	t.Helper()
	keys := make([]string, len(env.Cluster.Nodes))
	found := 0
	for i := 0; found < len(keys); i++ {
		if i == 10000 {
			t.Fatalf("no key found for every node")
		}
		key := redistest.Prefix(t) + strconv.Itoa(i)
		node := env.Cluster.NodeFor(t, key)
		for j, n := range env.Cluster.Nodes {
			if n == node && keys[j] == "" {
				keys[j] = key
				found++
			}
		}
	}
	return keys
}

func TestDialerCoversACluster(t *testing.T) {
	t.Parallel()
	var d Dialer
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	// Create the proxies up front, so that Dialer-wide faults reach every
	// node whether the client has dialed it yet or not.
	proxies := make([]*Proxy, len(env.Cluster.Addrs))
	for i, addr := range env.Cluster.Addrs {
		p, err := d.Proxy(addr)
		if err != nil {
			t.Fatal(err)
		}
		proxies[i] = p
	}
	// Without retries: rueidis (v1.0.79) retries a read whose connection
	// was cut on a new one, and once it succeeds gives the command back to
	// its pool while the cut connection's writer goroutine may still have
	// been reading it, with nothing ordering the two; the race detector
	// reported it in "all cut". The test polls instead.
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  env.Cluster.Addrs,
		DisableCache: true,
		DisableRetry: true,
		DialCtxFn:    d.Dial,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	keys := clusterKeys(t)
	ctx := t.Context()

	getAll := func(ctx context.Context, want string) error {
		for _, k := range keys {
			got, err := c.Do(ctx, c.B().Get().Key(k).Build()).ToString()
			if err != nil {
				return fmt.Errorf("GET %s: %w", k, err)
			}
			if got != want {
				return fmt.Errorf("GET %s: got %q, want %q", k, got, want)
			}
		}
		return nil
	}

	// Every node's traffic passes its proxy: the client dials the addresses
	// of CLUSTER SLOTS through the Dialer.
	for _, k := range keys {
		set(t, c, k, "v")
	}
	if err := getAll(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	for i, p := range proxies {
		if st := p.Stats(); st.ToServer == 0 || st.ToClient == 0 {
			t.Errorf("proxy of node %d (%s): got %+v, want traffic both ways", i, p.Target(), st)
		}
	}
	if got := d.Proxies(); len(got) != len(env.Cluster.Addrs) {
		t.Errorf("Proxies: got %d, want one per node, %d", len(got), len(env.Cluster.Addrs))
	}

	t.Run("one node paused", func(t *testing.T) {
		proxies[0].Pause()
		err := c.Do(withTimeout(t, 200*time.Millisecond), c.B().Get().Key(keys[0]).Build()).Error()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("GET on the paused node: got %v, want context.DeadlineExceeded", err)
		}
		for _, k := range keys[1:] {
			if got := get(t, c, k); got != "v" {
				t.Fatalf("GET %s on another node: got %q, want v", k, got)
			}
		}
		proxies[0].Resume()
		eventually(t, "every node answers", func() error { return getAll(withTimeout(t, time.Second), "v") })
	})
	t.Run("all cut", func(t *testing.T) {
		before := d.Stats().Cut
		d.CutAll()
		if got := d.Stats().Cut - before; got < int64(len(proxies)) {
			t.Errorf("connections cut: got %d, want at least one per node, %d", got, len(proxies))
		}
		// rueidis reconnects on its own.
		eventually(t, "every node answers", func() error { return getAll(withTimeout(t, time.Second), "v") })
	})
	t.Run("all stalled", func(t *testing.T) {
		const stall = 300 * time.Millisecond
		start := time.Now()
		d.Stall(stall)
		if err := getAll(ctx, "v"); err != nil {
			t.Fatal(err)
		}
		if elapsed := time.Since(start); elapsed < stall {
			t.Errorf("GETs through the stall returned after %v, want >= %v", elapsed, stall)
		}
	})
}

func TestDialerClose(t *testing.T) {
	t.Parallel()
	var d Dialer
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{env.Standalone.Addr},
		DisableCache:      true,
		ForceSingleClient: true,
		DialCtxFn:         d.Dial,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	set(t, c, redistest.Prefix(t)+"k", "v")
	proxies := d.Proxies()
	if len(proxies) != 1 || proxies[0].Target() != env.Standalone.Addr {
		t.Fatalf("Proxies: got %v, want one to %s", proxies, env.Standalone.Addr)
	}
	d.Pause() // Close must end held connections too.
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := proxies[0].live.Load(); n != 0 {
		t.Errorf("goroutines of the proxy after Close: got %d, want 0", n)
	}
	if _, err := d.Proxy(env.Standalone.Addr); err == nil {
		t.Errorf("Proxy after Close: got nil error, want one")
	}
	if _, err := d.Dial(t.Context(), env.Standalone.Addr, nil, nil); err == nil {
		t.Errorf("Dial after Close: got nil error, want one")
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

package replication

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

// eventually calls f until it returns nil, failing the test with f's last
// error when it has not within 20 seconds.
func eventually(t *testing.T, what string, f func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after 20s: %v", what, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// set runs SET key value on c, failing the test on error.
func set(t *testing.T, c rueidis.Client, key, value string) {
	t.Helper()
	if err := c.Do(t.Context(), c.B().Set().Key(key).Value(value).Build()).Error(); err != nil {
		t.Fatalf("SET %s: %v", key, err)
	}
}

// get returns the value of key on c, and false when it is missing.
func get(t *testing.T, c rueidis.Client, key string) (string, bool) {
	t.Helper()
	v, err := c.Do(t.Context(), c.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", false
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v, true
}

// config returns the value of the configuration parameter name on c.
func config(t *testing.T, c rueidis.Client, name string) string {
	t.Helper()
	m, err := c.Do(t.Context(), c.B().ConfigGet().Parameter(name).Build()).AsStrMap()
	if err != nil {
		t.Fatalf("CONFIG GET %s: %v", name, err)
	}
	return m[name]
}

// waitSync calls p.WaitSync, failing the test on error.
func waitSync(t *testing.T, p *Pair) {
	t.Helper()
	if err := p.WaitSync(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestStart(t *testing.T) {
	t.Parallel()
	p := Start(t, "--repl-timeout", "30")
	c := p.Client(t)
	master, replica := p.Master.Client(t), p.Replica.Client(t)
	key := redistest.Prefix(t) + "k"

	for name, cl := range map[string]rueidis.Client{"master": master, "replica": replica} {
		if got := config(t, cl, "repl-timeout"); got != "30" {
			t.Errorf("%s: repl-timeout: got %s, want 30 (from Start's args)", name, got)
		}
	}
	info, err := replicationInfo(t.Context(), replica)
	if err != nil {
		t.Fatal(err)
	}
	_, linkPort, _ := net.SplitHostPort(p.Link.Addr())
	if info["role"] != "slave" || info["master_port"] != linkPort {
		t.Errorf("replica: role:%s master_port:%s, want slave of the link's port %s", info["role"], info["master_port"], linkPort)
	}
	if got := config(t, c, "port"); got != strconv.Itoa(p.Master.Port) {
		t.Errorf("Client reaches port %s, want the master's, %d", got, p.Master.Port)
	}

	set(t, c, key, "v")
	waitSync(t, p)
	if got, ok := get(t, replica, key); got != "v" {
		t.Errorf("GET on the replica after WaitSync: got %q, %v, want v", got, ok)
	}
	if st := p.Link.Stats(); st.ToClient == 0 || st.ToServer == 0 {
		t.Errorf("Link.Stats: got %+v, want bytes both ways", st)
	}

	// A cut link comes back by itself, with the writes made meanwhile.
	p.Link.CutAll()
	set(t, c, key, "after the cut")
	waitSync(t, p)
	if got, _ := get(t, replica, key); got != "after the cut" {
		t.Errorf("GET on the replica after a cut and WaitSync: got %q, want \"after the cut\"", got)
	}
	if full, partial := syncs(t, master); full != 1 || partial != 1 {
		t.Errorf("master's full and partial syncs: got %d and %d, want 1 and 1 (the cut healed by a partial resync)", full, partial)
	}
}

func TestWaitSyncFailsWhileTheLinkIsStalled(t *testing.T) {
	t.Parallel()
	p := Start(t)
	c := p.Client(t)
	p.Link.Pause()
	set(t, c, redistest.Prefix(t)+"k", "v")

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := p.WaitSync(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitSync during a stall: got %v, want %v", err, context.DeadlineExceeded)
	}
	if !strings.Contains(err.Error(), "replica at offset") {
		t.Errorf("WaitSync during a stall: got %q, want it to give the offsets", err)
	}

	p.Link.Resume()
	waitSync(t, p)
}

func TestWaitCountsTheReplicaOnlyWhenTheLinkFlows(t *testing.T) {
	t.Parallel()
	p := Start(t)
	c := p.Client(t)
	prefix := redistest.Prefix(t)
	ctx := t.Context()

	err := c.Dedicated(func(d rueidis.DedicatedClient) error {
		wait := func(timeout time.Duration) (int64, error) {
			return d.Do(ctx, d.B().Wait().Numreplicas(1).Timeout(timeout.Milliseconds()).Build()).AsInt64()
		}
		if err := d.Do(ctx, d.B().Set().Key(prefix+"before").Value("v").Build()).Error(); err != nil {
			return err
		}
		if n, err := wait(10 * time.Second); err != nil || n != 1 {
			return fmt.Errorf("WAIT 1 before the stall: got %d, %v, want 1", n, err)
		}

		p.Link.Pause()
		if err := d.Do(ctx, d.B().Set().Key(prefix+"during").Value("v").Build()).Error(); err != nil {
			return err
		}
		start := time.Now()
		if n, err := wait(200 * time.Millisecond); err != nil || n != 0 {
			return fmt.Errorf("WAIT 1 200 during the stall: got %d, %v, want 0", n, err)
		}
		if waited := time.Since(start); waited < 200*time.Millisecond {
			return fmt.Errorf("WAIT 1 200 during the stall returned after %v, want >= 200ms", waited)
		}

		p.Link.Resume()
		if n, err := wait(10 * time.Second); err != nil || n != 1 {
			return fmt.Errorf("WAIT 1 after Resume: got %d, %v, want 1", n, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestWaitCoversTheWritesBeforeTheConnectionsPreviousCommand pins down the
// WAIT semantics that the package documentation describes, and the DoMulti
// that Client's documentation recommends.
func TestWaitCoversTheWritesBeforeTheConnectionsPreviousCommand(t *testing.T) {
	t.Parallel()
	p := Start(t)
	c := p.Client(t)
	prefix := redistest.Prefix(t)
	ctx := t.Context()

	other := p.Client(t)
	err := other.Dedicated(func(d rueidis.DedicatedClient) error {
		wait := func() (int64, error) {
			return d.Do(ctx, d.B().Wait().Numreplicas(1).Timeout(200).Build()).AsInt64()
		}
		if err := d.Do(ctx, d.B().Ping().Build()).Error(); err != nil {
			return err
		}
		p.Link.Pause()
		set(t, c, prefix+"a", "v") // On another connection.
		if n, err := wait(); err != nil || n != 1 {
			return fmt.Errorf("WAIT 1 200 after a PING before the stalled SET: got %d, %v, want 1", n, err)
		}
		if err := d.Do(ctx, d.B().Ping().Build()).Error(); err != nil {
			return err
		}
		if n, err := wait(); err != nil || n != 0 {
			return fmt.Errorf("WAIT 1 200 after a PING after the stalled SET: got %d, %v, want 0", n, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Still stalled.
	res := c.DoMulti(ctx,
		c.B().Set().Key(prefix+"b").Value("v").Build(),
		c.B().Wait().Numreplicas(1).Timeout(200).Build(),
	)
	if n, err := res[1].AsInt64(); err != nil || n != 0 {
		t.Errorf("WAIT 1 200 in a DoMulti with a SET during the stall: got %d, %v, want 0", n, err)
	}
}

func TestAStallLongerThanReplTimeoutDropsTheLinkUntilResume(t *testing.T) {
	t.Parallel()
	p := Start(t, "--repl-timeout", "2")
	c := p.Client(t)
	key := redistest.Prefix(t) + "k"
	start := time.Now()
	p.Link.Pause()
	set(t, c, key, "v")

	eventually(t, "the master drops its replica", func(ctx context.Context) error {
		m, err := replicationInfo(ctx, p.master)
		if err != nil {
			return err
		}
		if m["connected_slaves"] != "0" {
			return fmt.Errorf("master: connected_slaves:%s, want 0", m["connected_slaves"])
		}
		return nil
	})
	t.Logf("the master dropped its replica %v after the stall began", time.Since(start).Round(100*time.Millisecond))
	eventually(t, "the replica drops its link", func(ctx context.Context) error {
		r, err := replicationInfo(ctx, p.replica)
		if err != nil {
			return err
		}
		if r["master_link_status"] != "down" {
			return fmt.Errorf("replica: master_link_status:%s, want down", r["master_link_status"])
		}
		return nil
	})
	t.Logf("the replica dropped its link %v after the stall began", time.Since(start).Round(100*time.Millisecond))

	p.Link.Resume()
	waitSync(t, p)
	if got, _ := get(t, p.replica, key); got != "v" {
		t.Errorf("GET on the replica after Resume: got %q, want v", got)
	}
	if full, partial := syncs(t, p.master); full != 1 || partial != 1 {
		t.Errorf("master's full and partial syncs: got %d and %d, want 1 and 1 (a partial resync after Resume)", full, partial)
	}
}

// syncs returns sync_full and sync_partial_ok from INFO stats on c: how many
// full and partial syncs the master has served.
func syncs(t *testing.T, c rueidis.Client) (full, partial int) {
	t.Helper()
	stats, err := c.Do(t.Context(), c.B().Info().Section("stats").Build()).ToString()
	if err != nil {
		t.Fatalf("INFO stats: %v", err)
	}
	for line := range strings.Lines(stats) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "sync_full":
			full, _ = strconv.Atoi(v)
		case "sync_partial_ok":
			partial, _ = strconv.Atoi(v)
		}
	}
	return full, partial
}

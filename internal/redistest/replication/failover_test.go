package replication

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

func TestFailoverKeepsOnlyReplicatedWrites(t *testing.T) {
	t.Parallel()
	p := Start(t)
	c := p.Client(t)
	prefix := redistest.Prefix(t)

	set(t, c, prefix+"before", "v")
	waitSync(t, p)
	p.Link.Pause()
	set(t, c, prefix+"during", "v") // Acknowledged by the master only.

	promoted, err := p.Failover(t.Context())
	if err != nil {
		t.Fatalf("Failover: %v", err)
	}
	if promoted != p.Replica {
		t.Fatalf("Failover: got %s, want the replica %s", promoted.Addr, p.Replica.Addr)
	}
	if got := p.Front.Target(); got != promoted.Addr {
		t.Errorf("Front.Target after Failover: got %s, want %s", got, promoted.Addr)
	}

	// The client keeps its address and reaches the promoted replica.
	eventually(t, "the client reaches the promoted replica", func(ctx context.Context) error {
		m, err := c.Do(ctx, c.B().ConfigGet().Parameter("port").Build()).AsStrMap()
		if err != nil {
			return err
		}
		if m["port"] != strconv.Itoa(promoted.Port) {
			return fmt.Errorf("port: got %s, want %d", m["port"], promoted.Port)
		}
		return nil
	})
	role, err := c.Do(t.Context(), c.B().Role().Build()).ToArray()
	if err != nil {
		t.Fatalf("ROLE: %v", err)
	}
	if r, _ := role[0].ToString(); r != "master" {
		t.Errorf("ROLE of the promoted replica: got %s, want master", r)
	}
	if got, ok := get(t, c, prefix+"before"); got != "v" {
		t.Errorf("GET of a write replicated before the stall: got %q, %v, want v", got, ok)
	}
	if got, ok := get(t, c, prefix+"during"); ok {
		t.Errorf("GET of a write made during the stall: got %q, want no key", got)
	}
	set(t, c, prefix+"after", "v") // The promoted replica takes writes.

	if _, err := p.Failover(t.Context()); err == nil {
		t.Errorf("second Failover: got nil, want an error")
	}
	if err := p.WaitSync(t.Context()); err == nil {
		t.Errorf("WaitSync after Failover: got nil, want an error")
	}
}

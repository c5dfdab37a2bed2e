package faultproxy

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

func TestSetTarget(t *testing.T) {
	t.Parallel()
	a, b := env.Standalone, redistest.OwnServer(t)
	p := newProxy(t, a.Addr)
	c := newClient(t, p.Addr())
	port := func() (int, error) {
		m, err := c.Do(t.Context(), c.B().ConfigGet().Parameter("port").Build()).AsStrMap()
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(m["port"])
	}
	if got, err := port(); err != nil || got != a.Port {
		t.Fatalf("port before SetTarget: got %d, %v, want %d", got, err, a.Port)
	}

	p.SetTarget(b.Addr)
	if got := p.Target(); got != b.Addr {
		t.Errorf("Target: got %q, want %q", got, b.Addr)
	}
	// The open connection keeps its target.
	if got, err := port(); err != nil || got != a.Port {
		t.Fatalf("port on the open connection after SetTarget: got %d, %v, want %d", got, err, a.Port)
	}
	// A new connection goes to the new target.
	conn, r := rawConn(t, p)
	if got := roundTrip(t, conn, r, "CONFIG GET port"); got != "*2" {
		t.Fatalf("CONFIG GET port on a new connection: got %q, want *2", got)
	}
	for range 3 { // $len, "port", $len
		r.ReadString('\n')
	}
	if got, _ := r.ReadString('\n'); got != strconv.Itoa(b.Port)+"\r\n" {
		t.Fatalf("port on a new connection: got %q, want %d", got, b.Port)
	}

	// After CutAll the client reconnects, to the new target.
	p.CutAll()
	eventually(t, "the client reaches the new target", func() error {
		got, err := port()
		if err != nil {
			return err
		}
		if got != b.Port {
			return fmt.Errorf("port: got %d, want %d", got, b.Port)
		}
		return nil
	})
	if st := p.Stats(); st.DialErrors != 0 {
		t.Errorf("Stats.DialErrors: got %d, want 0", st.DialErrors)
	}
}

package store_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
)

// TestNewTakesAClient: C10. A rebuild inside MULTI or a pipeline is
// impossible by type: New takes a rueidis.Client, and the only handle
// rueidis gives on a connection in a transaction, a DedicatedClient, is not
// one.
func TestNewTakesAClient(t *testing.T) {
	var _ func(rueidis.Client, store.Options) *store.Store = store.New
	client := reflect.TypeFor[rueidis.Client]()
	if reflect.TypeFor[rueidis.DedicatedClient]().Implements(client) {
		t.Error("rueidis.DedicatedClient implements rueidis.Client: a connection inside MULTI could be given to store.New")
	}
}

// TestEveryCommandThroughTheClient: C19. On a server of its own, every
// command the server runs for a rebuild and a sweep (what MONITOR shows, but the commands rueidis sends itself to set up a
// connection and the scripts' own calls) went through the one client given
// to New: a hook on it saw each one.
func TestEveryCommandThroughTheClient(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	ctx := redistest.Ctx(t)
	mon := monitor(t, srv.Addr)

	var mu sync.Mutex
	hooked := map[string]int{}
	see := func(cmds ...rueidis.Completed) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cmds {
			hooked[strings.ToUpper(c.Commands()[0])]++
		}
	}
	c := redistest.Watch(srv.Client(t), see)
	s := store.New(c, store.Options{})
	live := redistest.Prefix(t) + "users:by-email"
	err := s.WithRebuild(ctx, live, store.RebuildOptions{}, func(ctx context.Context, temp string, touch func(context.Context) error) error {
		if err := c.Do(ctx, c.B().Hset().Key(temp).FieldValue().FieldValue("a@example.com", "1").Build()).Error(); err != nil {
			return err
		}
		return touch(ctx)
	})
	if err != nil {
		t.Fatalf("WithRebuild: %v", err)
	}
	if _, err := s.Sweep(ctx, store.SweepOptions{DryRun: true}); err != nil {
		t.Fatalf("Sweep: %v", err)
	}

	ran := mon.until(t, "keyswap-c19-done")
	mu.Lock()
	defer mu.Unlock()
	if len(ran) == 0 {
		t.Fatal("MONITOR showed no command")
	}
	for name, n := range ran {
		if hooked[name] < n {
			t.Errorf("the server ran %s %d times, the client's hook saw it %d times: a command went around the client", name, n, hooked[name])
		}
	}
	t.Logf("server: %v; hook: %v", ran, hooked)
}

// monitored is a MONITOR connection.
type monitored struct {
	conn net.Conn
	r    *bufio.Reader
	addr string
}

// monitor opens a MONITOR connection to addr.
func monitor(t *testing.T, addr string) *monitored {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	m := &monitored{conn: conn, r: bufio.NewReader(conn), addr: addr}
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if l, err := m.line(); err != nil || l != "+OK" {
		t.Fatalf("MONITOR: got %q, %v, want +OK", l, err)
	}
	return m
}

func (m *monitored) line() (string, error) {
	if err := m.conn.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		return "", err
	}
	l, err := m.r.ReadString('\n')
	return strings.TrimRight(l, "\r\n"), err
}

// until sends ECHO mark on a connection of its own and returns how many
// times the server ran each command before it, by name, leaving out what
// scripts ran, and the commands rueidis sends itself to set up a
// connection (HELLO, CLIENT, PING) or its own connections ran.
func (m *monitored) until(t *testing.T, mark string) map[string]int {
	t.Helper()
	echo, err := net.DialTimeout("tcp", m.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	if _, err := fmt.Fprintf(echo, "ECHO %s\r\n", mark); err != nil {
		t.Fatal(err)
	}
	own := map[string]bool{"HELLO": true, "CLIENT": true, "PING": true}
	ran := map[string]int{}
	for {
		l, err := m.line()
		if err != nil {
			t.Fatalf("MONITOR: %v (so far %v)", err, slices.Sorted(maps.Keys(ran)))
		}
		// +1700000000.123456 [0 127.0.0.1:5555] "SET" "k" "v"
		_, rest, ok := strings.Cut(l, " [")
		src, cmd, ok2 := strings.Cut(rest, "] ")
		if !ok || !ok2 {
			t.Fatalf("MONITOR: cannot read %q", l)
		}
		name := strings.ToUpper(strings.Trim(strings.SplitN(cmd, " ", 2)[0], `"`))
		switch {
		case name == "ECHO" && strings.Contains(cmd, mark):
			return ran
		case strings.HasSuffix(src, " lua"), own[name]:
		default:
			ran[name]++
		}
	}
}

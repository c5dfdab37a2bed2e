package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

var env *Env

func TestMain(m *testing.M) { os.Exit(Main(m, &env, true)) }

// eventually calls f until it returns nil, failing the test with f's last
// error when it has not within 10 seconds.
func eventually(t *testing.T, what string, f func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		err := f(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after 10s: %v", what, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func pingCmd(c rueidis.Client) func(ctx context.Context) error {
	return func(ctx context.Context) error { return c.Do(ctx, c.B().Ping().Build()).Error() }
}

// startServer starts a server owned by the test, stopped at cleanup.
func startTestServer(t *testing.T, args ...string) *Server {
	t.Helper()
	s, err := StartServer(args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func TestStandalone(t *testing.T) {
	t.Parallel()
	s := env.Standalone
	if want := fmt.Sprintf("127.0.0.1:%d", s.Port); s.Addr != want {
		t.Errorf("Addr: got %q, want %q", s.Addr, want)
	}
	if s.Port == 6379 {
		t.Errorf("Port: got 6379, the default port, want a free one")
	}
	if s.PID() <= 0 {
		t.Errorf("PID: got %d, want > 0", s.PID())
	}
	if _, err := os.Stat(s.Dir); err != nil {
		t.Errorf("Dir: %v", err)
	}

	c := s.Client(t)
	ctx := t.Context()
	if got, err := c.Do(ctx, c.B().Ping().Build()).ToString(); err != nil || got != "PONG" {
		t.Fatalf("PING: got %q, %v, want PONG", got, err)
	}
	key := Prefix(t) + "k"
	if err := c.Do(ctx, c.B().Set().Key(key).Value("v").Build()).Error(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString(); err != nil || got != "v" {
		t.Fatalf("GET: got %q, %v, want v", got, err)
	}
	// The server is ours: it must not be the one on the default port.
	info, err := c.Do(ctx, c.B().Info().Section("server").Build()).ToString()
	if err != nil {
		t.Fatalf("INFO: %v", err)
	}
	if want := fmt.Sprintf("tcp_port:%d", s.Port); !strings.Contains(info, want) {
		t.Errorf("INFO server: got no %q", want)
	}
}

func TestStartServerArgsAndStop(t *testing.T) {
	t.Parallel()
	s, err := StartServer("--maxmemory", "10mb")
	if err != nil {
		t.Fatal(err)
	}
	c := s.Client(t)
	got, err := c.Do(t.Context(), c.B().ConfigGet().Parameter("maxmemory").Build()).AsStrMap()
	if err != nil {
		t.Fatalf("CONFIG GET: %v", err)
	}
	if got["maxmemory"] != "10485760" {
		t.Errorf("maxmemory: got %q, want 10485760", got["maxmemory"])
	}
	save, err := c.Do(t.Context(), c.B().ConfigGet().Parameter("save").Build()).AsStrMap()
	if err != nil {
		t.Fatalf("CONFIG GET: %v", err)
	}
	if save["save"] != "" {
		t.Errorf("save: got %q, want empty", save["save"])
	}

	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(s.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dir after Stop: got %v, want it removed", err)
	}
	if err := probe(s.Addr, s.PID()); err == nil {
		t.Errorf("PING after Stop: got PONG, want an error")
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: got %v, want nil", err)
	}
	if err := s.Restart(); err == nil {
		t.Errorf("Restart after Stop: got nil, want an error")
	}
}

func TestStartServerFailureQuotesLog(t *testing.T) {
	t.Parallel()
	s, err := StartServer("--no-such-directive", "1")
	if err == nil {
		s.Stop()
		t.Fatal("got a server, want an error")
	}
	if !strings.Contains(err.Error(), "Bad directive") {
		t.Errorf("got %q, want the server's complaint %q", err, "Bad directive")
	}
}

func TestKillRestart(t *testing.T) {
	t.Parallel()
	s := startTestServer(t)
	c := s.Client(t)
	key := Prefix(t) + "k"
	if err := c.Do(t.Context(), c.B().Set().Key(key).Value("v").Build()).Error(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	pid, port := s.PID(), s.Port

	if err := s.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if _, err := os.Stat(s.Dir); err != nil {
		t.Errorf("Dir after Kill: %v, want it kept", err)
	}
	if err := probe(s.Addr, s.PID()); err == nil {
		t.Errorf("PING after Kill: got PONG, want an error")
	}
	if err := s.Kill(); err != nil {
		t.Errorf("second Kill: got %v, want nil", err)
	}

	if err := s.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if s.Port != port {
		t.Errorf("Port after Restart: got %d, want %d", s.Port, port)
	}
	if s.PID() == pid {
		t.Errorf("PID after Restart: got the old PID %d, want a new one", pid)
	}
	// The client made before Kill reconnects.
	eventually(t, "PING after Restart", pingCmd(c))
	if err := c.Do(t.Context(), c.B().Get().Key(key).Build()).Error(); !rueidis.IsRedisNil(err) {
		t.Errorf("GET after Restart: got %v, want nil (no persistence)", err)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := startTestServer(t)
	c := s.Client(t)
	eventually(t, "PING before Pause", pingCmd(c))

	if err := s.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	err := c.Do(ctx, c.B().Ping().Build()).Error()
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("PING while paused: got %v, want %v", err, context.DeadlineExceeded)
	}

	if err := s.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	eventually(t, "PING after Resume", pingCmd(c))
}

func TestCluster(t *testing.T) {
	t.Parallel()
	cl := env.Cluster
	if len(cl.Nodes) != 3 || len(cl.Addrs) != 3 {
		t.Fatalf("got %d nodes and %d addrs, want 3 and 3", len(cl.Nodes), len(cl.Addrs))
	}
	for i, n := range cl.Nodes {
		if cl.Addrs[i] != n.Addr {
			t.Errorf("Addrs[%d]: got %q, want %q", i, cl.Addrs[i], n.Addr)
		}
		c := n.Client(t)
		info, err := c.Do(t.Context(), c.B().ClusterInfo().Build()).ToString()
		if err != nil {
			t.Fatalf("%s: CLUSTER INFO: %v", n.Addr, err)
		}
		for _, want := range []string{"cluster_state:ok", "cluster_known_nodes:3", "cluster_slots_assigned:16384"} {
			if !strings.Contains(info, want) {
				t.Errorf("%s: CLUSTER INFO has no %q", n.Addr, want)
			}
		}
	}

	t.Run("KeySlot", func(t *testing.T) {
		if got := cl.KeySlot(t, "foo"); got != 12182 {
			t.Errorf("KeySlot(foo): got %d, want 12182", got)
		}
	})

	t.Run("HashTag", func(t *testing.T) {
		if a, b := cl.NodeFor(t, "{a}1"), cl.NodeFor(t, "a"); a != b {
			t.Errorf("NodeFor({a}1): got %s, want %s, the node of a", a.Addr, b.Addr)
		}
	})

	// redis-cli gives the masters ascending slot ranges in the order of
	// Nodes: 0-5460, 5461-10922, 10923-16383.
	t.Run("NodeFor", func(t *testing.T) {
		tests := []struct {
			key  string
			slot int64
			node int
		}{
			{"b", 3300, 0},
			{"c", 7365, 1},
			{"a", 15495, 2},
		}
		for _, tt := range tests {
			t.Run(tt.key, func(t *testing.T) {
				if got := cl.KeySlot(t, tt.key); got != tt.slot {
					t.Fatalf("KeySlot(%s): got %d, want %d", tt.key, got, tt.slot)
				}
				n := cl.NodeFor(t, tt.key)
				if n != cl.Nodes[tt.node] {
					t.Errorf("NodeFor(%s): got %s, want Nodes[%d] %s", tt.key, n.Addr, tt.node, cl.Nodes[tt.node].Addr)
				}
				// Only the node NodeFor names serves the key; the others
				// redirect with MOVED.
				key := Prefix(t) + "{" + tt.key + "}"
				for _, other := range cl.Nodes {
					c := other.Client(t)
					err := c.Do(t.Context(), c.B().Set().Key(key).Value("v").Build()).Error()
					if other == n && err != nil {
						t.Errorf("SET on NodeFor's node %s: %v", other.Addr, err)
					}
					if other == n {
						continue
					}
					if re, ok := rueidis.IsRedisErr(err); !ok {
						t.Errorf("SET on %s: got %v, want MOVED", other.Addr, err)
					} else if _, moved := re.IsMoved(); !moved {
						t.Errorf("SET on %s: got %v, want MOVED", other.Addr, err)
					}
				}
			})
		}
	})

	t.Run("Client", func(t *testing.T) {
		c := cl.Client(t)
		for _, tag := range []string{"a", "b", "c"} {
			key := Prefix(t) + "{" + tag + "}"
			if err := c.Do(t.Context(), c.B().Set().Key(key).Value(tag).Build()).Error(); err != nil {
				t.Fatalf("SET %s: %v", key, err)
			}
			if got, err := c.Do(t.Context(), c.B().Get().Key(key).Build()).ToString(); err != nil || got != tag {
				t.Errorf("GET %s: got %q, %v, want %q", key, got, err, tag)
			}
		}
	})
}

func TestMissingBinary(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		start func() error
		want  string
	}{
		{
			name: "server",
			start: func() error {
				s, err := startServer("redistest-no-such-server", false, nil)
				if err == nil {
					s.Stop()
				}
				return err
			},
			want: `redistest: redistest-no-such-server not found in PATH; install it (Debian: apt-get install redistest-no-such-server) or run "make test", which installs it`,
		},
		{
			name: "cluster server",
			start: func() error {
				c, err := startCluster("redistest-no-such-server", "redis-cli", 3)
				if err == nil {
					c.Stop()
				}
				return err
			},
			want: `redistest-no-such-server not found in PATH`,
		},
		{
			name: "cli",
			start: func() error {
				c, err := startCluster("redis-server", "redistest-no-such-cli", 3)
				if err == nil {
					c.Stop()
				}
				return err
			},
			want: `redistest: redistest-no-such-cli not found in PATH`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.start()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
			if !errors.Is(err, exec.ErrNotFound) {
				t.Errorf("got %v, want it to wrap exec.ErrNotFound", err)
			}
		})
	}
}

// TestInstallHint is not parallel: it empties PATH.
func TestInstallHint(t *testing.T) {
	if got, want := lookPathErr(t, "redis-server"), "apt-get install redis-server"; !strings.Contains(got, want) {
		t.Errorf("hint for redis-server: got %q, want it to contain %q", got, want)
	}
	if got, want := lookPathErr(t, "redis-cli"), "apt-get install redis-tools"; !strings.Contains(got, want) {
		t.Errorf("hint for redis-cli: got %q, want it to contain %q", got, want)
	}
}

// lookPathErr returns the error lookPath gives for name when PATH is empty.
func lookPathErr(t *testing.T, name string) string {
	t.Setenv("PATH", "")
	_, err := lookPath(name)
	if err == nil {
		t.Fatalf("lookPath(%s) with empty PATH: got nil error", name)
	}
	return err.Error()
}

func TestStartClusterTooFewMasters(t *testing.T) {
	t.Parallel()
	c, err := StartCluster(2)
	if err == nil {
		c.Stop()
		t.Fatal("StartCluster(2): got a cluster, want an error")
	}
}

// namedTB is a testing.TB with a chosen name.
type namedTB struct {
	testing.TB
	name string
}

func (n namedTB) Name() string { return n.name }

func TestPrefix(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		want string
	}{
		{"TestX", "ks:TestX:"},
		{"TestX/sub_test#01", "ks:TestX/sub_test_01:"},
		{"TestX/a b{c}:d*?[e]", "ks:TestX/a_b_c__d___e_:"},
		{"TestÜ.v-2", "ks:Test_.v-2:"},
	}
	for _, tt := range tests {
		if got := Prefix(namedTB{t, tt.name}); got != tt.want {
			t.Errorf("Prefix(%q): got %q, want %q", tt.name, got, tt.want)
		}
	}
	if got, want := Prefix(t), "ks:TestPrefix:"; got != want {
		t.Errorf("Prefix(t): got %q, want %q", got, want)
	}
}

func TestStopPaused(t *testing.T) {
	t.Parallel()
	s, err := StartServer()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := s.Resume(); err == nil {
		t.Errorf("Resume after Stop: got nil, want an error")
	}
}

// TestPortTaken checks that a start failing on a taken port is recognised,
// since StartServer retries exactly those with a fresh port.
func TestPortTaken(t *testing.T) {
	t.Parallel()
	s := startTestServer(t)
	if err := s.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	other := startTestServer(t)
	// Point s at the port of the running server other.
	s.Port, s.Addr = other.Port, other.Addr
	for i, a := range s.args {
		if a == "--port" {
			s.args[i+1] = fmt.Sprint(other.Port)
		}
	}
	err := s.Restart()
	if !errors.Is(err, errAddrInUse) {
		t.Errorf("Restart on a taken port: got %v, want %v", err, errAddrInUse)
	}
	if !strings.Contains(err.Error(), "redis.log") {
		t.Errorf("Restart on a taken port: got %q, want it to quote redis.log", err)
	}
}

// TestSentinel starts a sentinel that monitors a server, with a line of
// configuration of the test's own, and asks it for the master.
func TestSentinel(t *testing.T) {
	t.Parallel()
	master := startTestServer(t)
	s := OwnSentinel(t, "rt-master", master.Addr, "sentinel down-after-milliseconds rt-master 60000")
	if s.Port == 6379 || s.Port == 26379 || s.Port == master.Port {
		t.Errorf("Port: got %d, want a free one", s.Port)
	}
	c := s.Client(t)
	ctx := t.Context()
	got, err := c.Do(ctx, c.B().SentinelGetMasterAddrByName().Master("rt-master").Build()).AsStrSlice()
	if want := []string{"127.0.0.1", fmt.Sprint(master.Port)}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("SENTINEL GET-MASTER-ADDR-BY-NAME: got %q, %v, want %q", got, err, want)
	}
	m, err := c.Do(ctx, c.B().Arbitrary("SENTINEL", "MASTER").Args("rt-master").Build()).AsStrMap()
	if err != nil {
		t.Fatalf("SENTINEL MASTER: %v", err)
	}
	if m["down-after-milliseconds"] != "60000" {
		t.Errorf("SENTINEL MASTER: down-after-milliseconds %q, want 60000, from the test's configuration line", m["down-after-milliseconds"])
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(s.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dir after Stop: got %v, want it removed", err)
	}
}

func TestClusterWithReplicas(t *testing.T) {
	// Each master has one replica, in Replicas at its index, whose
	// acknowledgement WAIT on the master counts; Stop stops both.
	cl := OwnClusterWithReplicas(t, 3)
	if len(cl.Nodes) != 3 || len(cl.Addrs) != 3 || len(cl.Replicas) != 3 {
		t.Fatalf("got %d nodes, %d addrs and %d replicas, want 3 each", len(cl.Nodes), len(cl.Addrs), len(cl.Replicas))
	}
	for i, m := range cl.Nodes {
		info, err := cl.Replicas[i].info(t.Context(), "replication")
		if err != nil {
			t.Fatal(err)
		}
		if info["role"] != "slave" || info["master_port"] != fmt.Sprint(m.Port) {
			t.Errorf("Replicas[%d]: role %q of master port %q, want slave of %d", i, info["role"], info["master_port"], m.Port)
		}
		c := m.Client(t)
		key := "k0"
		for j := 1; cl.NodeFor(t, key) != m; j++ {
			key = fmt.Sprintf("k%d", j)
		}
		got, err := c.DoMulti(t.Context(), c.B().Set().Key(key).Value("v").Build(), c.B().Wait().Numreplicas(1).Timeout(5000).Build())[1].AsInt64()
		if err != nil || got != 1 {
			t.Errorf("%s: WAIT 1 after a write: %d, %v; want 1", m.Addr, got, err)
		}
	}
}

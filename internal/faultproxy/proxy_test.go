package faultproxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
)

func TestPassThrough(t *testing.T) {
	t.Parallel()
	p := newProxy(t, env.Standalone.Addr)
	c := newClient(t, p.Addr())
	key := redistest.Prefix(t) + "k"

	if got, err := c.Do(t.Context(), c.B().Ping().Build()).ToString(); err != nil || got != "PONG" {
		t.Fatalf("PING: got %q, %v, want PONG", got, err)
	}
	set(t, c, key, "v")
	if got := get(t, c, key); got != "v" {
		t.Fatalf("GET: got %q, want v", got)
	}
	direct := env.Standalone.Client(t)
	if got := get(t, direct, key); got != "v" {
		t.Fatalf("GET without the proxy: got %q, want v", got)
	}

	// A single rueidis client opens one connection per pipeline wire (up to
	// 4, see ClientOption.PipelineMultiplex), on first use of each.
	st := p.Stats()
	if st.Accepted < 1 || st.Open != st.Accepted || st.Cut != 0 || st.Refused != 0 || st.DialErrors != 0 {
		t.Errorf("Stats: got %+v, want every accepted connection open, nothing cut, refused or failed", st)
	}
	if st.ToServer == 0 || st.ToClient == 0 {
		t.Errorf("Stats: got %+v, want bytes both ways", st)
	}
	if p.Target() != env.Standalone.Addr {
		t.Errorf("Target: got %q, want %q", p.Target(), env.Standalone.Addr)
	}
	if !strings.HasPrefix(p.Addr(), "127.0.0.1:") {
		t.Errorf("Addr: got %q, want a loopback address", p.Addr())
	}
}

// rawConn connects to the proxy without a Redis client, to see exactly what
// a client observes.
func rawConn(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(waitTimeout))
	return conn, bufio.NewReader(conn)
}

// connectAndRead connects to p and reads one byte, and returns the error of
// whichever fails. A connection that the proxy resets at once may fail in
// connect already, when the reset arrives before connect returns.
func connectAndRead(p *Proxy) error {
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(waitTimeout))
	_, err = conn.Read(make([]byte, 1))
	return err
}

// roundTrip sends a command in inline form and returns the reply's first
// line.
func roundTrip(t *testing.T, conn net.Conn, r *bufio.Reader, cmd string) string {
	t.Helper()
	if _, err := io.WriteString(conn, cmd+"\r\n"); err != nil {
		t.Fatalf("write %q: %v", cmd, err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read the reply to %q: %v", cmd, err)
	}
	return strings.TrimSpace(line)
}

func TestClientObserves(t *testing.T) {
	t.Parallel()
	t.Run("a cut is a reset", func(t *testing.T) {
		t.Parallel()
		p := newProxy(t, env.Standalone.Addr)
		conn, r := rawConn(t, p)
		if got := roundTrip(t, conn, r, "PING"); got != "+PONG" {
			t.Fatalf("PING: got %q, want +PONG", got)
		}
		p.CutAll()
		if _, err := r.ReadByte(); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read after CutAll: got %v, want ECONNRESET", err)
		}
		if st := p.Stats(); st.Cut != 1 {
			t.Errorf("Stats.Cut: got %d, want 1", st.Cut)
		}
		waitClosed(t, p)
		conn2, r2 := rawConn(t, p)
		if got := roundTrip(t, conn2, r2, "PING"); got != "+PONG" {
			t.Fatalf("PING on a new connection after CutAll: got %q, want +PONG", got)
		}
	})
	t.Run("a refused connection is reset", func(t *testing.T) {
		t.Parallel()
		p := newProxy(t, env.Standalone.Addr)
		p.Refuse(true)
		if err := connectAndRead(p); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("connect and read while refused: got %v, want ECONNRESET", err)
		}
		if st := p.Stats(); st.Refused != 1 || st.Accepted != 1 {
			t.Errorf("Stats: got %+v, want 1 accepted and refused", st)
		}
		p.Refuse(false)
		conn2, r2 := rawConn(t, p)
		if got := roundTrip(t, conn2, r2, "PING"); got != "+PONG" {
			t.Fatalf("PING after Refuse(false): got %q, want +PONG", got)
		}
	})
	t.Run("a server that goes away is an EOF", func(t *testing.T) {
		t.Parallel()
		s := redistest.OwnServer(t)
		p := newProxy(t, s.Addr)
		conn, r := rawConn(t, p)
		if got := roundTrip(t, conn, r, "PING"); got != "+PONG" {
			t.Fatalf("PING: got %q, want +PONG", got)
		}
		if err := s.Kill(); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ReadByte(); err != io.EOF {
			t.Fatalf("read after Kill: got %v, want EOF", err)
		}
		// The proxy cannot reach the target: a new connection is reset.
		if err := connectAndRead(p); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("connect and read with the server down: got %v, want ECONNRESET", err)
		}
		if st := p.Stats(); st.DialErrors != 1 {
			t.Errorf("Stats.DialErrors: got %d, want 1", st.DialErrors)
		}
	})
}

func TestCloseEndsEverything(t *testing.T) {
	// Not parallel: it counts the goroutines of the whole process.
	s := redistest.OwnServer(t)
	before := runtime.NumGoroutine()
	p, err := New(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	// One idle connection, one whose bytes a stall holds, and one cut whose
	// server is paused, so that the proxy is still draining it.
	idle, r := rawConn(t, p)
	if got := roundTrip(t, idle, r, "PING"); got != "+PONG" {
		t.Fatalf("PING: got %q, want +PONG", got)
	}
	draining, r2 := rawConn(t, p)
	if got := roundTrip(t, draining, r2, "PING"); got != "+PONG" {
		t.Fatalf("PING: got %q, want +PONG", got)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	defer s.Resume()
	p.CutAll()
	held, _ := rawConn(t, p)
	p.Stall(time.Hour)
	io.WriteString(held, "PING\r\n")
	waitHeld(t, p, 6)

	closed := async(p.Close)
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("Close has not returned after %v", waitTimeout)
	}
	if n := p.live.Load(); n != 0 {
		t.Errorf("goroutines of the proxy after Close: got %d, want 0", n)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: got %v, want nil", err)
	}
	if _, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Errorf("dial after Close: got a connection, want an error")
	}
	for _, c := range []net.Conn{idle, held} {
		c.SetReadDeadline(time.Now().Add(waitTimeout))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("read after Close: got data, want an error")
		}
	}
	idle.Close()
	draining.Close()
	held.Close()
	eventually(t, "goroutines end", func() error {
		if after := runtime.NumGoroutine(); after > before {
			return fmt.Errorf("goroutines: got %d, want <= %d as before", after, before)
		}
		return nil
	})
}

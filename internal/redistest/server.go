package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

const (
	// startAttempts is how many fresh ports StartServer tries when another
	// process grabs the chosen port between choosing it and binding it.
	startAttempts = 3
	// readyTimeout bounds how long a starting server may take to answer PING.
	readyTimeout = 10 * time.Second
	// stopTimeout is how long Stop waits after SIGTERM before sending SIGKILL.
	stopTimeout = 5 * time.Second
	// pollInterval is the pause between two readiness probes.
	pollInterval = 10 * time.Millisecond
	// logTailLines is how many lines of the server's log a start error quotes.
	logTailLines = 20
)

// Server is one redis-server process started for tests.
type Server struct {
	// Addr is the server's address, "127.0.0.1:port".
	Addr string
	// Port is the server's TCP port.
	Port int
	// Dir is the server's working directory, which holds its log (redis.log)
	// and, for a cluster node, its nodes.conf. Stop removes it.
	Dir string

	bin  string   // absolute path of redis-server
	args []string // full argument list, reused by Restart

	mu      sync.Mutex
	proc    *os.Process
	done    chan struct{} // closed when proc has exited
	stopped bool
}

// StartServer starts a standalone redis-server on a free loopback port and
// waits until it answers PING. The args are appended to the server's command
// line, e.g. "--maxmemory", "10mb".
//
// StartServer returns an error wrapping [exec.ErrNotFound] when redis-server
// is not installed, and an error quoting the server's log when it does not
// come up.
func StartServer(args ...string) (*Server, error) {
	return startServer("redis-server", false, args)
}

// OwnServer starts a redis-server of tb's own, with args, as StartServer
// does, and stops it when tb ends. A server that does not start, or does not
// stop cleanly, fails tb. Tests use it for what would disturb the package's
// shared server: a config change, a flush, millions of keys.
func OwnServer(tb testing.TB, args ...string) *Server {
	tb.Helper()
	srv, err := StartServer(args...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return srv
}

// startServer starts the binary called name, looked up in PATH. A cluster
// node also gets the cluster options and a free cluster bus port. When the
// server fails to bind its ports, which another process may have taken since
// they were chosen, startServer tries again with fresh ports.
func startServer(name string, cluster bool, extra []string) (*Server, error) {
	bin, err := lookPath(name)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	for attempt := 1; ; attempt++ {
		nports := 1
		if cluster {
			nports = 2 // The second is the cluster bus port.
		}
		ports, err := freePorts(nports)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s := &Server{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
			Port: ports[0],
			Dir:  dir,
			bin:  bin,
		}
		s.args = []string{
			"--port", strconv.Itoa(s.Port),
			"--bind", "127.0.0.1",
			"--save", "",
			"--appendonly", "no",
			"--protected-mode", "no",
			"--dir", dir,
			"--logfile", filepath.Join(dir, "redis.log"),
		}
		if cluster {
			s.args = append(s.args,
				"--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "5000",
				"--shutdown-on-sigterm", "now",
				"--cluster-port", strconv.Itoa(ports[1]),
			)
		}
		s.args = append(s.args, extra...)

		err = s.start()
		if err == nil {
			return s, nil
		}
		if attempt == startAttempts || !errors.Is(err, errAddrInUse) {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// errAddrInUse marks a start failure caused by a port taken by another
// process.
var errAddrInUse = errors.New("address already in use")

// lookPath finds the binary called name in PATH.
func lookPath(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		pkg := name
		if name == "redis-cli" {
			pkg = "redis-tools" // Debian ships redis-cli in redis-tools.
		}
		return "", fmt.Errorf("redistest: %s not found in PATH; install it (Debian: apt-get install %s) or run \"make test\", which installs it: %w",
			name, pkg, exec.ErrNotFound)
	}
	return path, nil
}

// freePorts returns n distinct loopback ports that were free a moment ago.
// It holds all n listeners open at once so that the ports differ.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("redistest: choose a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// start runs the server with s.args and waits until it answers PING. When it
// does not, start kills it and returns an error quoting its log.
func (s *Server) start() error {
	out, err := os.OpenFile(filepath.Join(s.Dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	defer out.Close() // The child holds its own copy.
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.Dir
	// Output from before redis-server opens its logfile, such as
	// configuration errors, goes here.
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait() // The exit status of a server we stop is of no interest.
		close(done)
	}()
	s.proc, s.done = cmd.Process, done

	if err := waitReady(s.Addr, s.proc.Pid, done); err != nil {
		s.proc.Kill()
		<-done
		tail := s.logTail()
		if strings.Contains(tail, "Address already in use") {
			err = fmt.Errorf("%w (%w)", err, errAddrInUse)
		}
		return fmt.Errorf("redistest: redis-server on %s did not start: %w\n%s", s.Addr, err, tail)
	}
	return nil
}

// waitReady polls addr until the server with process ID pid answers PING,
// the process exits (done is closed) or readyTimeout passes.
func waitReady(addr string, pid int, done <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	var last error
	for {
		if last = probe(addr, pid); last == nil {
			return nil
		}
		select {
		case <-done:
			return errors.New("process exited")
		case <-time.After(pollInterval):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to PING within %v: %w", readyTimeout, last)
		}
	}
}

// probe sends PING and INFO server over a fresh TCP connection to addr. It
// expects +PONG from the process with ID pid: when another process holds the
// port, the PONG is not ours.
func probe(addr string, pid int) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	if _, err := conn.Write([]byte("PING\r\nINFO server\r\n")); err != nil {
		return err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	if line, err = r.ReadString('\n'); err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "$"))
	if err != nil || !strings.HasPrefix(line, "$") {
		return fmt.Errorf("INFO server answered %q", line)
	}
	info := make([]byte, n)
	if _, err := io.ReadFull(r, info); err != nil {
		return err
	}
	if want := fmt.Sprintf("\r\nprocess_id:%d\r\n", pid); !strings.Contains(string(info), want) {
		return fmt.Errorf("%s is served by another process than %d", addr, pid)
	}
	return nil
}

// logTail returns the last lines of the server's output and log.
func (s *Server) logTail() string {
	var b strings.Builder
	for _, name := range []string{"stdout.log", "redis.log"} {
		data, err := os.ReadFile(filepath.Join(s.Dir, name))
		if err != nil || len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > logTailLines {
			lines = lines[len(lines)-logTailLines:]
		}
		fmt.Fprintf(&b, "--- %s (last %d lines) ---\n%s\n", name, len(lines), strings.Join(lines, "\n"))
	}
	if b.Len() == 0 {
		return "(redis-server wrote no log)"
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// PID returns the process ID of the server's current process, or of its last
// process when it is not running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc.Pid
}

// running reports whether the server's process has not exited yet.
// The caller holds s.mu.
func (s *Server) running() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Stop ends the server with SIGTERM, waits up to 5 seconds for it to exit,
// then sends SIGKILL, and removes s.Dir. Stop is idempotent: calls after the
// first return nil. The Server cannot be restarted after Stop.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	if s.running() {
		s.proc.Signal(syscall.SIGTERM)
		s.proc.Signal(syscall.SIGCONT) // A paused server handles SIGTERM only once continued.
		select {
		case <-s.done:
		case <-time.After(stopTimeout):
			s.proc.Kill()
			<-s.done
		}
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		return fmt.Errorf("redistest: stop %s: %w", s.Addr, err)
	}
	return nil
}

// Kill ends the server with SIGKILL and waits for it to exit. It keeps s.Dir,
// so that Restart can reuse it. Killing a server that is not running does
// nothing.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kill()
}

// kill is Kill with s.mu held.
func (s *Server) kill() error {
	if s.stopped {
		return fmt.Errorf("redistest: kill %s: server stopped", s.Addr)
	}
	if s.running() {
		if err := s.proc.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("redistest: kill %s: %w", s.Addr, err)
		}
		<-s.done
	}
	return nil
}

// Restart starts the server again on the same port, with the same arguments
// and directory, and waits until it answers PING, which it does only once it
// has loaded its data. A running server is killed first. Data survives as far
// as it was persisted in s.Dir: the default arguments (--save "" and
// --appendonly no) write nothing on their own, but a dump.rdb written by SAVE
// before the kill is loaded; a server started with --appendonly yes replays
// its append-only file instead, and ignores dump.rdb. The package
// documentation's Persistence section says what survives a kill. A cluster
// node keeps its nodes.conf and rejoins its cluster. Restart returns an error
// after Stop.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.kill(); err != nil {
		return err
	}
	return s.start()
}

// Pause stops the server's process with SIGSTOP: it keeps its connections
// but answers nothing until Resume.
func (s *Server) Pause() error {
	return s.signal("pause", syscall.SIGSTOP)
}

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() error {
	return s.signal("resume", syscall.SIGCONT)
}

// signal sends sig to the running server.
func (s *Server) signal(op string, sig os.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || !s.running() {
		return fmt.Errorf("redistest: %s %s: server not running", op, s.Addr)
	}
	if err := s.proc.Signal(sig); err != nil {
		return fmt.Errorf("redistest: %s %s: %w", op, s.Addr, err)
	}
	return nil
}

// Client returns a new rueidis client connected to this server only (even when
// it is a cluster node), with client-side caching disabled. The client is
// closed when tb's test ends. Client calls tb.Fatal when it cannot connect.
func (s *Server) Client(tb testing.TB) rueidis.Client {
	tb.Helper()
	c, err := s.newClient()
	if err != nil {
		tb.Fatalf("redistest: connect to %s: %v", s.Addr, err)
	}
	tb.Cleanup(c.Close)
	return c
}

// newClient returns a new single-node rueidis client to s.
func (s *Server) newClient() (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{s.Addr},
		DisableCache:      true,
		ForceSingleClient: true,
	})
}

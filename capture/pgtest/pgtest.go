// Package pgtest starts real PostgreSQL servers for tests (the capture
// module's, its examples', or a program's that tests a relay): each on a
// free loopback port, in a data directory of its own, with
// wal_level=logical. It never touches a server that it did not start.
//
// PostgreSQL refuses to run as root. When the tests run as root, the
// servers run as the OS user [User], which Start creates (useradd) when it
// is missing; otherwise they run as the current user. The binaries are
// found through pg_config --bindir, then /usr/lib/postgresql/*/bin (the
// newest version); when none is installed, Start returns an error that
// says how to install them: tests fail, they never skip.
//
// A test package starts one server for all its tests:
//
//	var srv *pgtest.Server
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(&srv, m.Run)) }
//
// and each test makes a database of its own with [Server.Database], so that
// tests never see each other's tables, slots or publications. A test that
// restarts or crashes the server starts its own with [Own].
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// User is the OS user the servers run as when the tests run as root.
const User = "keyswap-pgtest"

const (
	readyTimeout = 60 * time.Second // a loaded 2-core machine starts slowly
	stopTimeout  = 30 * time.Second
)

// Server is one PostgreSQL server started for tests.
type Server struct {
	// Port is the server's TCP port on 127.0.0.1.
	Port int
	// Dir holds the data directory (data/) and the server's log
	// (postgres.log). Stop removes it.
	Dir string

	bin  string // the directory of the binaries
	cred *syscall.Credential

	mu   sync.Mutex
	proc *os.Process
	done chan struct{}
}

// Main starts a server, stores it in *srv, calls run (m.Run, or a
// function that starts more and calls it), stops the server, and returns
// run's exit code for os.Exit. When the server cannot start, Main prints
// why and returns 1 without calling run.
func Main(srv **Server, run func() int) int {
	s, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*srv = s
	code := run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Own starts a server of tb's own, and stops it when tb ends.
func Own(tb testing.TB, settings ...string) *Server {
	tb.Helper()
	s, err := Start(settings...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// Start runs initdb in a new directory and starts a server on a free port,
// with wal_level=logical and room for replication slots. The settings are
// more "name=value" server settings, which override the defaults.
func Start(settings ...string) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s := &Server{Dir: dir, bin: bin, cred: cred}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	out, err := s.command("initdb", "-D", s.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = ''",
		"wal_level = logical",
		"max_replication_slots = 64",
		"max_wal_senders = 64",
		"max_connections = 200",
		"fsync = off", // a killed server keeps what it wrote; only a crash of the machine would lose it
		"full_page_writes = off",
		"shared_buffers = '32MB'",
		"logging_collector = off",
		"log_min_messages = warning",
	}
	for _, kv := range settings {
		name, value, ok := strings.Cut(kv, "=")
		if !ok {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: setting %q is not name=value", kv)
		}
		conf = append(conf, strings.TrimSpace(name)+" = "+strings.TrimSpace(value))
	}
	for attempt := 1; ; attempt++ {
		if s.Port, err = freePort(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		all := append(slices.Clone(conf), "port = "+strconv.Itoa(s.Port))
		if err := os.WriteFile(filepath.Join(s.data(), "postgresql.auto.conf"), []byte(strings.Join(all, "\n")+"\n"), 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: %w", err)
		}
		if cred != nil {
			if err := os.Chown(filepath.Join(s.data(), "postgresql.auto.conf"), int(cred.Uid), int(cred.Gid)); err != nil {
				os.RemoveAll(dir)
				return nil, fmt.Errorf("pgtest: %w", err)
			}
		}
		err = s.start()
		if err == nil {
			return s, nil
		}
		if attempt == 3 || !strings.Contains(err.Error(), "in use") {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// data is the data directory.
func (s *Server) data() string { return filepath.Join(s.Dir, "data") }

// command returns the command running the binary name as the server's user.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// start starts the server and waits until it accepts connections.
func (s *Server) start() error {
	log, err := os.OpenFile(filepath.Join(s.Dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer log.Close()
	cmd := s.command("postgres", "-D", s.data())
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // the exit status of a server we stop is of no interest
		close(done)
	}()
	s.mu.Lock()
	s.proc, s.done = cmd.Process, done
	s.mu.Unlock()
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err == nil {
			err = c.Ping(ctx)
			c.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("pgtest: postgres on port %d exited at start:\n%s", s.Port, s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("pgtest: postgres on port %d does not accept connections after %v: %v\n%s", s.Port, readyTimeout, err, s.logTail())
		}
	}
}

// logTail returns the last lines of the server's log.
func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "postgres.log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// DSN returns the URL of database db on the server, as the superuser
// postgres.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// signal sends sig to the server and waits until it exits.
func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	proc, done := s.proc, s.done
	s.mu.Unlock()
	if proc == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := proc.Signal(sig); err != nil {
		return fmt.Errorf("pgtest: signal postgres: %w", err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(stopTimeout):
		_ = proc.Kill()
		<-done
		return fmt.Errorf("pgtest: postgres on port %d did not stop within %v of %v", s.Port, stopTimeout, sig)
	}
}

// Crash stops the server as a crash would: an immediate shutdown
// (SIGQUIT), with no checkpoint, so that the next start recovers from the
// WAL.
func (s *Server) Crash() error { return s.signal(syscall.SIGQUIT) }

// Restart starts a stopped or crashed server again, on the same port and
// data directory.
func (s *Server) Restart() error { return s.start() }

// Stop shuts the server down (a fast shutdown) and removes its directory.
func (s *Server) Stop() error {
	err := s.signal(syscall.SIGINT)
	return errors.Join(err, os.RemoveAll(s.Dir))
}

// databases numbers the databases Database creates.
var databases atomic.Int64

// Database creates a database of its own for tb and returns its URL. When
// tb ends, it drops the database's replication slots, then the database.
func (s *Server) Database(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), databases.Add(1))
	s.Exec(tb, "postgres", "CREATE DATABASE "+name)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err != nil {
			return // a test that stopped the server has nothing left to drop
		}
		defer c.Close(ctx)
		// A slot of a relay that a test killed stays active until its
		// walsender notices; wait for that, then drop it.
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, err = c.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
			if err == nil {
				_, err = c.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name)
			}
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			tb.Errorf("pgtest: drop the slots of %s: %v", name, err)
		}
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return s.DSN(name)
}

// Exec runs each SQL statement on database db (a name, or a URL from
// Database), and fails tb on an error.
func (s *Server) Exec(tb testing.TB, db string, sql ...string) {
	tb.Helper()
	dsn := db
	if !strings.Contains(db, "://") {
		dsn = s.DSN(db)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close(ctx)
	for _, q := range sql {
		if _, err := c.Exec(ctx, q); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
}

// binDir finds the directory of the PostgreSQL server binaries.
func binDir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if isServerDir(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, dir := range dirs {
		if isServerDir(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("pgtest: PostgreSQL's initdb and postgres not found (pg_config --bindir, /usr/lib/postgresql/*/bin); install them (Debian: apt-get install postgresql) or run \"make test\", which installs them: %w", exec.ErrNotFound)
}

// version is the major version in a path /usr/lib/postgresql/<major>/bin.
func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// isServerDir reports whether dir holds initdb and postgres.
func isServerDir(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
			return false
		}
	}
	return true
}

// credential returns the credential to run the server with: nil when the
// tests do not run as root, else User's, creating User if it is missing.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	// Test binaries of several packages start servers at once, and two
	// useradd running together can each rewrite /etc/passwd from what they
	// read: one binary then ran initdb as a uid the file no longer had
	// ("could not look up effective user ID"). One lock file, taken by
	// every binary of the machine, orders the lookups and the useradd.
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "keyswap-pgtest-useradd.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pgtest: lock file for creating user %s: %w", User, err)
	}
	defer lock.Close() // releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("pgtest: lock %s: %w", lock.Name(), err)
	}
	u, err := user.Lookup(User)
	if err != nil {
		var unknown user.UnknownUserError
		if !errors.As(err, &unknown) {
			return nil, fmt.Errorf("pgtest: look up user %s: %w", User, err)
		}
		out, addErr := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", User).CombinedOutput()
		if u, err = user.Lookup(User); err != nil {
			return nil, fmt.Errorf("pgtest: PostgreSQL refuses to run as root, and creating the user %s failed: %v\n%s", User, addErr, out)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgtest: user %s: %w", User, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: choose a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

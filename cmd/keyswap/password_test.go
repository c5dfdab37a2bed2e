package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/keyswap/keyswap/internal/redistest"
)

// pty is a pseudo-terminal: the test types on master, and the CLI reads
// the terminal, slave.
type pty struct {
	master, slave *os.File
	mu            sync.Mutex
	echoed        bytes.Buffer // what the terminal wrote back to master
	readDone      chan struct{}
}

// openPTY opens a pseudo-terminal with the Linux ioctls, and closes it
// when the test ends.
func openPTY(t *testing.T) *pty {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open a pseudo-terminal: %v", err)
	}
	var unlock int32
	var n uint32
	if err := ioctl(master, syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		t.Fatalf("unlock the pseudo-terminal: %v", err)
	}
	if err := ioctl(master, syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		t.Fatalf("number the pseudo-terminal: %v", err)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open the pseudo-terminal's slave: %v", err)
	}
	p := &pty{master: master, slave: slave, readDone: make(chan struct{})}
	go p.readEcho()
	t.Cleanup(func() {
		// The master first: Close ends readEcho's Read (master stays in
		// the poller, since nothing calls its Fd), and the hang-up ends a
		// read of the password that the CLI may have left blocked.
		master.Close()
		<-p.readDone
		slave.Close()
	})
	return p
}

// readEcho collects what the terminal writes back, until master is closed.
func (p *pty) readEcho() {
	defer close(p.readDone)
	buf := make([]byte, 256)
	for {
		n, err := p.master.Read(buf)
		p.mu.Lock()
		p.echoed.Write(buf[:n])
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// ioctl runs the ioctl req on f with the argument arg, without taking f
// out of the runtime's poller (as f.Fd would).
func ioctl(f *os.File, req uintptr, arg unsafe.Pointer) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := raw.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(arg))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// echo reports whether the terminal echoes what is typed.
func (p *pty) echo(t *testing.T) bool {
	t.Helper()
	var tios syscall.Termios
	if err := ioctl(p.slave, syscall.TCGETS, unsafe.Pointer(&tios)); err != nil {
		t.Fatalf("TCGETS: %v", err)
	}
	return tios.Lflag&syscall.ECHO != 0
}

// waitNoEcho waits until the terminal stops echoing, as it does once the
// CLI reads a password. It fails the test when the CLI's run, done, ends
// first, or after 30 seconds.
func (p *pty) waitNoEcho(t *testing.T, done <-chan result) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(time.Millisecond) // no event says when echo goes off: poll
	defer tick.Stop()
	for p.echo(t) {
		select {
		case r := <-done:
			t.Fatalf("the CLI ended without reading a password: exit status %d, stderr %q", r.code, r.stderr)
		case <-deadline:
			t.Fatal("the terminal still echoes after 30s: the CLI never read the password")
		case <-tick.C:
		}
	}
}

// typed returns what the terminal echoed of what was typed so far. It types
// a marker line, waits until its echo comes back (echo must be on), and
// returns what came before it.
func (p *pty) typed(t *testing.T) string {
	t.Helper()
	const marker = "end-of-typing"
	if _, err := io.WriteString(p.master, marker+"\n"); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		p.mu.Lock()
		out, _, found := strings.Cut(p.echoed.String(), marker)
		p.mu.Unlock()
		if found {
			return out
		}
		select {
		case <-deadline:
			t.Fatal("the terminal did not echo the marker within 30s")
		case <-tick.C:
		}
	}
}

// runAsync runs the CLI with args in the background, with the terminal as
// its stdin, and returns a channel that yields its result.
func (p *pty) runAsync(t *testing.T, ctx context.Context, environ map[string]string, args ...string) <-chan result {
	done := make(chan result, 1)
	go func() { done <- keyswapWith(t, invocation{env: environ, stdin: p.slave, ctx: ctx}, args...) }()
	return done
}

// TestAskpass types the password on a real (pseudo-)terminal: it is read
// without echo, and it wins over the URL's and the environment's.
func TestAskpass(t *testing.T) {
	user := aclUser(t, "typed-pw", "~*", "&*", "+@all")
	p := openPTY(t)
	addr := env.Standalone.Addr
	done := p.runAsync(t, t.Context(), map[string]string{envPassword: "wrong", envRedisCLIAuth: "wrong"},
		"status", "--askpass", "--no-auth-warning", "-u", "redis://"+user+":wrong@"+addr, redistest.Prefix(t)+"*")
	p.waitNoEcho(t, done)
	if _, err := io.WriteString(p.master, "typed-pw\n"); err != nil {
		t.Fatal(err)
	}
	r := <-done
	r.wantCode(t, exitOK)
	if want := "Password for user " + user + " at " + addr + ": \n"; r.stderr != want {
		t.Errorf("got stderr %q, want %q", r.stderr, want)
	}
	if !p.echo(t) {
		t.Fatalf("the terminal does not echo after the password was read")
	}
	if echoed := p.typed(t); strings.Contains(echoed, "typed-pw") {
		t.Errorf("the terminal echoed the password: %q", echoed)
	}
}

// TestAskpassInterrupted cancels the run (as Ctrl-C does) while the CLI
// waits for the password: it stops, and the terminal echoes again.
func TestAskpassInterrupted(t *testing.T) {
	p := openPTY(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := p.runAsync(t, ctx, nil, "status", "--askpass", "-u", env.Standalone.Addr)
	p.waitNoEcho(t, done)
	cancel()
	r := <-done
	r.wantCode(t, exitError)
	if want := "Password for user default at " + env.Standalone.Addr + ": \nkeyswap: --askpass: context canceled\n"; r.stderr != want {
		t.Errorf("got stderr %q, want %q", r.stderr, want)
	}
	if !p.echo(t) {
		t.Errorf("the terminal does not echo after the interrupted prompt")
	}
}

// TestAskpassPipe gives --askpass a stdin that is not a terminal: it reads
// the password from its first line, without a prompt, as redis-cli does,
// and that password wins over every other.
func TestAskpassPipe(t *testing.T) {
	t.Parallel()
	addr := env.Standalone.Addr
	user := aclUser(t, "pipe-pw", "~*", "&*", "+@all")
	pattern := redistest.Prefix(t) + "*"
	for _, tc := range []struct {
		name, stdin string
		args        []string
		code        int
		stderr      string // its start; "" for none
	}{
		{"a line", "pipe-pw\n", nil, exitOK, ""},
		{"CRLF", "pipe-pw\r\nmore\n", nil, exitOK, ""},
		{"no newline", "pipe-pw", nil, exitOK, ""},
		{"over -a", "pipe-pw\n", []string{"-a", "wrong"}, exitOK, "keyswap: warning: other users of this machine can read a password given with -a"},
		{"over the URL's", "pipe-pw\n", []string{"-redis", "redis://" + user + ":wrong@" + addr, "--no-auth-warning"}, exitOK, ""},
		{"wrong", "wrong\n", nil, exitError, "keyswap: authentication failed for user " + user + " at " + addr + ": " + wrongPass + " (the password came from --askpass)"},
		{"empty", "", nil, exitUsage, "keyswap status: --askpass: stdin is not a terminal, and holds no line to read the password from\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"status", "--askpass", "--user", user, pattern}, tc.args...)
			if !slices.Contains(tc.args, "-redis") {
				args = append(args, "-u", addr)
			}
			r := keyswapWith(t, invocation{stdin: strings.NewReader(tc.stdin)}, args...)
			r.wantCode(t, tc.code)
			if !strings.HasPrefix(r.stderr, tc.stderr) || tc.stderr == "" && r.stderr != "" {
				t.Errorf("got stderr %q, want %q...", r.stderr, tc.stderr)
			}
			if strings.Contains(r.stderr, "Password for") {
				t.Errorf("got a prompt on stderr %q, want none for a pipe", r.stderr)
			}
		})
	}
	// A real pipe, as in: echo pw | keyswap status --askpass.
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if _, err := wr.WriteString("pipe-pw\n"); err != nil {
		t.Fatal(err)
	}
	wr.Close()
	r := keyswapWith(t, invocation{stdin: rd}, "status", "--askpass", "-u", addr, "--user", user, pattern)
	r.wantCode(t, exitOK)
}

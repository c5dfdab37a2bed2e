package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
)

// startSentinel starts a Redis Sentinel of the test's own that monitors
// the master at masterAddr as name, and stops it when the test ends. It
// returns the sentinel's address once the sentinel answers PING.
// (redistest starts servers only: a sentinel needs a config file of its
// own, which it rewrites.)
func startSentinel(t *testing.T, name, masterAddr string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is needed to start a sentinel: %v", err)
	}
	host, port, _ := net.SplitHostPort(masterAddr)
	for attempt := 1; ; attempt++ {
		dir := t.TempDir()
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
		_, sport, _ := net.SplitHostPort(addr)
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %s\nbind 127.0.0.1\ndir %s\nlogfile %s\nsentinel monitor %s %s %s 1\n",
			sport, dir, filepath.Join(dir, "sentinel.log"), name, host, port)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, conf, "--sentinel")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-exited
		})
		err = waitPong(addr, exited)
		if err == nil {
			return addr
		}
		log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
		if attempt == 3 || !strings.Contains(string(log), "Address already in use") {
			t.Fatalf("sentinel on %s did not start: %v\n%s", addr, err, log)
		}
	}
}

// waitPong polls addr until it answers PING with +PONG, the process exits
// (exited is closed), or 10 seconds pass.
func waitPong(addr string, exited <-chan struct{}) error {
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.SetDeadline(time.Now().Add(time.Second))
			_, err = conn.Write([]byte("PING\r\n"))
			var line string
			if err == nil {
				line, err = bufio.NewReader(conn).ReadString('\n')
			}
			conn.Close()
			if err == nil && strings.TrimSpace(line) == "+PONG" {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("process exited")
		case <-deadline:
			return fmt.Errorf("no PONG within 10s: %v", err)
		case <-tick.C:
		}
	}
}

// TestSentinel reaches a master through a Redis Sentinel, with the URL
// parameter master_set, and fails clearly for a master set the sentinel
// does not monitor.
func TestSentinel(t *testing.T) {
	t.Parallel()
	master := redistest.OwnServer(t)
	p := redistest.Prefix(t)
	do(t, master.Client(t), "SET", p+"x:rebuild-lock", "0123456789abcdef", "EX", "600")
	sentinel := startSentinel(t, "keyswap-test", master.Addr)

	r := keyswap(t, "status", "-json", "-u", "redis://"+sentinel+"?master_set=keyswap-test", p+"*")
	r.wantCode(t, exitOK)
	if rep := decodeStatus(t, r.stdout); len(rep.Locks) != 1 || rep.Locks[0].Key != p+"x:rebuild-lock" {
		t.Errorf("got locks %+v, want %sx:rebuild-lock, on the master", rep.Locks, p)
	}

	r = keyswap(t, "status", "-u", "redis://"+sentinel+"?master_set=nobody")
	r.wantCode(t, exitError)
	if want := `keyswap: cannot reach the master "nobody" through the sentinels at ` + sentinel + ": "; !strings.HasPrefix(r.stderr, want) {
		t.Errorf("got stderr %q, want %q...", r.stderr, want)
	}
}

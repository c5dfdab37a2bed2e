package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// StartSentinel starts a Redis Sentinel (redis-server in sentinel mode) on
// a free loopback port, monitoring the master at masterAddr under the name
// masterSet with a quorum of 1, and waits until it answers PING. conf are
// further lines of its configuration file, which a sentinel needs and
// rewrites, such as "sentinel auth-pass <masterSet> <password>" for a
// master that requires a password. The sentinel is a [Server]: clients
// reach it at Addr, and [Server.Stop] ends it and removes its directory.
//
// StartSentinel returns an error wrapping [exec.ErrNotFound] when
// redis-server is not installed, and an error quoting the sentinel's log
// when it does not come up.
func StartSentinel(masterSet, masterAddr string, conf ...string) (*Server, error) {
	bin, err := lookPath("redis-server")
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(masterAddr)
	if err != nil {
		return nil, fmt.Errorf("redistest: master address %q: %w", masterAddr, err)
	}
	dir, err := os.MkdirTemp("", "redistest-sentinel-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	file := filepath.Join(dir, "sentinel.conf")
	lines := append([]string{fmt.Sprintf("sentinel monitor %s %s %s 1", masterSet, host, port)}, conf...)
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redistest: %w", err)
	}
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s := &Server{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
			Port: ports[0],
			Dir:  dir,
			bin:  bin,
			// The configuration file comes first, then --sentinel; the
			// options after it are configuration lines, as for a server.
			args: []string{file, "--sentinel",
				"--port", strconv.Itoa(ports[0]),
				"--bind", "127.0.0.1",
				"--dir", dir,
				"--logfile", filepath.Join(dir, "redis.log"),
			},
		}
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

// OwnSentinel starts a sentinel of tb's own, as StartSentinel does, and
// stops it when tb ends. A sentinel that does not start, or does not stop
// cleanly, fails tb.
func OwnSentinel(tb testing.TB, masterSet, masterAddr string, conf ...string) *Server {
	tb.Helper()
	s, err := StartSentinel(masterSet, masterAddr, conf...)
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

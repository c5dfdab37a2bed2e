package redistest

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// Env is what one test package needs: a standalone server and, optionally, a
// cluster.
type Env struct {
	// Standalone is a standalone server shared by the package's tests.
	Standalone *Server
	// Cluster is a 3-master cluster shared by the package's tests, or nil
	// when Main was called without a cluster.
	Cluster *Cluster
}

// Main starts an Env, with a 3-master cluster when withCluster is true, stores
// it in *env, runs m, stops everything, and returns the exit code for
// os.Exit. When the Env cannot start (for instance because redis-server is
// not installed), Main prints the error to stderr and returns 1 without
// running any test: tests fail, they never skip. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }
//
// If the test binary crashes, the parent-death signal kills the servers but
// their directories stay behind.
func Main(m *testing.M, env **Env, withCluster bool) int {
	e, err := start(withCluster)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*env = e
	code := m.Run()
	if err := e.stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// start starts an Env.
func start(withCluster bool) (*Env, error) {
	s, err := StartServer()
	if err != nil {
		return nil, err
	}
	e := &Env{Standalone: s}
	if withCluster {
		if e.Cluster, err = StartCluster(3); err != nil {
			return nil, errors.Join(err, s.Stop())
		}
	}
	return e, nil
}

// stop stops everything e started.
func (e *Env) stop() error {
	err := e.Standalone.Stop()
	if e.Cluster != nil {
		err = errors.Join(err, e.Cluster.Stop())
	}
	return err
}

// Prefix returns a key prefix unique to the test: "ks:", then tb.Name() with
// every character other than ASCII letters, digits, '_', '-', '.' and '/'
// replaced by '_', then ':'. Braces are replaced too, so the prefix never
// forms a hash tag. The trailing ':' keeps the keys of TestA apart from those
// of TestAB when a test scans for Prefix(tb)+"*". Tests isolate their keys by
// prefix instead of FLUSHDB, so that they can run in parallel.
func Prefix(tb testing.TB) string {
	safe := strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9',
			r == '_', r == '-', r == '.', r == '/':
			return r
		}
		return '_'
	}, tb.Name())
	return "ks:" + safe + ":"
}

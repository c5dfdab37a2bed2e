package rebuild_test

import (
	"os"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

// env holds the package's redis-server processes: one standalone server and
// a 3-master cluster, started by TestMain.
var env *redistest.Env

// TestMain starts the servers; in a copy of the test binary started by an
// online test, it plays that test's other process instead (onlineRole).
func TestMain(m *testing.M) {
	if role := os.Getenv(onlineRoleEnv); role != "" {
		os.Exit(onlineRole(role))
	}
	os.Exit(redistest.Main(m, &env, true))
}

package reliability

import (
	"os"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

// env holds the package's shared redis-server processes: one standalone
// server and a 3-master cluster. Tests that stop, kill, pause or starve a
// server start their own with redistest.StartServer.
var env *redistest.Env

func TestMain(m *testing.M) {
	if os.Getenv(raceHelperEnv) != "" {
		// The race suite's separate rebuilder process: it is given the
		// servers to use, and needs none of its own.
		os.Exit(m.Run())
	}
	os.Exit(redistest.Main(m, &env, true))
}

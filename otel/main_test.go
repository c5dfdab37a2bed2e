package keyswapotel_test

import (
	"os"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

// env holds the package's redis-server: one standalone server, started by
// TestMain. The observer does not depend on the deployment, so there is no
// cluster.
var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, false)) }

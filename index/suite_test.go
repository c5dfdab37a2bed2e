package index_test

import (
	"os"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

// env holds the package's redis-server, started by TestMain.
var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, false)) }

package store_test

import (
	"os"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
)

// env holds the package's redis-server processes: one standalone server and
// a 3-master cluster, started by TestMain.
var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// target is one deployment and live key the store suite runs against.
type target struct {
	name    string
	cluster bool
	// client is what the Store under test sends through.
	client rueidis.Client
	// other is an independent second client: the thief, the reader, the
	// saboteur. It never shares a connection with client.
	other rueidis.Client
	// live is the live key under test, unique to the test.
	live string
}

// targets returns the standalone target and, on the cluster, an untagged
// key, a tagged key and an odd key that needs a synthetic tag (C5+).
func targets(t *testing.T) []target {
	t.Helper()
	p := redistest.Prefix(t)
	return []target{
		{name: "standalone", client: env.Standalone.Client(t), other: env.Standalone.Client(t), live: p + "idx"},
		{name: "cluster/untagged", cluster: true, client: env.Cluster.Client(t), other: env.Cluster.Client(t), live: p + "idx"},
		{name: "cluster/tagged", cluster: true, client: env.Cluster.Client(t), other: env.Cluster.Client(t), live: p + "user{42}:idx"},
		{name: "cluster/odd", cluster: true, client: env.Cluster.Client(t), other: env.Cluster.Client(t), live: p + "a{}b"},
	}
}

// forEachTarget runs f as a parallel subtest per target.
func forEachTarget(t *testing.T, f func(t *testing.T, tg target)) {
	t.Helper()
	for _, tg := range targets(t) {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			f(t, tg)
		})
	}
}

// newStore returns a Store on tg's client.
func (tg target) store(opts store.Options) *store.Store { return store.New(tg.client, opts) }

// isScript reports whether cmd runs keyswap's script name, through
// EVALSHA or the EVAL fallback.
func isScript(cmd rueidis.Completed, name string) bool {
	return redistest.ScriptNamed(name).Is(cmd.Commands())
}

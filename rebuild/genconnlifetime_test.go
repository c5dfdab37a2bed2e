package rebuild_test

import (
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

// A cluster client with ClientOption.ConnLifetime: rueidis answers a
// command that was to go on a connection past its lifetime with an error,
// without sending it, and its cluster client sends it again on a new
// connection; a node client of Client.Nodes does not. A spread run's
// writes, which go by master on node clients, send such a transaction
// again (unsent), and the run succeeds. It failed before with "MULTI:
// connection is expired".
func TestGenerationsSpreadConnLifetime(t *testing.T) {
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: env.Cluster.Addrs, DisableCache: true, ConnLifetime: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	d := deployment{Name: "cluster", Cluster: true, Client: cl, Other: env.Cluster.Client(t), Prefix: "{" + redistest.Prefix(t) + "}", Addrs: env.Cluster.Addrs}
	prefix := genPrefix(d)
	us := genUsers(20000, 400)
	if _, err := genRebuilder(t, d, prefix, rebuild.Options{BatchSize: 50}).Run(redistest.Ctx(t), sources.Slice(us)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
	wantGenClean(t, d, prefix, 1)
}

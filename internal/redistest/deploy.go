package redistest

import (
	"context"
	"log"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"
)

// Deployment is one Redis deployment of an [Env] a test runs against, with a
// key prefix unique to the test. On the cluster the prefix carries a hash
// tag, so that every key of one Rebuilder shares a slot.
type Deployment struct {
	Name    string // "standalone" or "cluster"
	Cluster bool
	Client  rueidis.Client // what the code under test sends through
	Other   rueidis.Client // an independent client: reader, thief, saboteur
	Prefix  string
	// Addrs are the addresses to connect to: the standalone server's, or
	// every cluster master's (for a client in another process).
	Addrs []string
}

// Deployments returns e's standalone server and its cluster, with clients
// closed when tb ends.
func (e *Env) Deployments(tb testing.TB) []Deployment {
	tb.Helper()
	p := Prefix(tb)
	return []Deployment{
		{Name: "standalone", Client: e.Standalone.Client(tb), Other: e.Standalone.Client(tb), Prefix: p, Addrs: []string{e.Standalone.Addr}},
		{Name: "cluster", Cluster: true, Client: e.Cluster.Client(tb), Other: e.Cluster.Client(tb), Prefix: "{" + p + "}", Addrs: e.Cluster.Addrs},
	}
}

// ForEachDeployment runs f as a parallel subtest per deployment of e.
func (e *Env) ForEachDeployment(t *testing.T, f func(t *testing.T, d Deployment)) {
	t.Helper()
	for _, d := range e.Deployments(t) {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f(t, d)
		})
	}
}

// WantClean fails tb if a temp key, a lock or another key of keyswap's own
// is left under prefix.
func WantClean(tb testing.TB, c rueidis.Client, prefix string) {
	tb.Helper()
	if left := Leftovers(tb, c, prefix); len(left) > 0 {
		tb.Errorf("left behind under %q: %v", prefix, left)
	}
}

// WantUnchanged fails tb unless every key under prefix is byte-identical
// (DUMP) to before, a [Snapshot], with the same expiry. An owner stamp
// (IsOwnerStamp) that came since is no change: the acquire of a run in
// Generations mode on a cluster writes it, whatever the run's end, and it
// stays.
func WantUnchanged(tb testing.TB, c rueidis.Client, prefix string, before map[string]KeyState) {
	tb.Helper()
	after := Snapshot(tb, c, prefix)
	for k := range after {
		if _, ok := before[k]; !ok && IsOwnerStamp(tb, c, k) {
			delete(after, k)
		}
	}
	if diff := cmp.Diff(before, after); diff != "" {
		tb.Errorf("keys under %q changed (-before +after):\n%s", prefix, diff)
	}
}

// ExampleDB is the database of the runnable examples on the standalone
// server; the tests use database 0.
const ExampleDB = 9

// ExampleClient returns a client of e's standalone server for a runnable
// example, on database ExampleDB, emptied first so that every example starts
// from nothing. It exits the process when the server cannot be used: an
// example has no testing.TB to fail.
func (e *Env) ExampleClient() rueidis.Client {
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  []string{e.Standalone.Addr},
		SelectDB:     ExampleDB,
		DisableCache: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Do(context.Background(), client.B().Flushdb().Build()).Error(); err != nil {
		log.Fatal(err)
	}
	return client
}

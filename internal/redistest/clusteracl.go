package redistest

import (
	"crypto/rand"
	"testing"

	"github.com/redis/rueidis"
)

// clusterRules are the rules a cluster client needs, on top of a test's
// own, to find the masters of the slots: CLUSTER SLOTS or CLUSTER SHARDS
// (rueidis asks one, depending on the server's version), and PING.
var clusterRules = []string{"+cluster|slots", "+cluster|shards", "+ping"}

// ClientAs creates the ACL user name on every node of c (or resets it), as
// Server.ClientAs does on one server, with rules and the few a cluster
// client needs to find the slots' masters, and returns a new rueidis
// cluster client authenticated as that user, with client-side caching
// disabled. The client is closed, and the user deleted from every node,
// when tb's test ends. ClientAs calls tb.Fatal when a node rejects the
// rules or the client cannot connect.
func (c *Cluster) ClientAs(tb testing.TB, name string, rules ...string) rueidis.Client {
	tb.Helper()
	password := rand.Text()
	all := append(append([]string{}, rules...), clusterRules...)
	for _, n := range c.Nodes {
		if err := n.setUser(name, password, all); err != nil {
			tb.Fatalf("redistest: create ACL user %s on %s: %v", name, n.Addr, err)
		}
		pid := n.PID()
		tb.Cleanup(func() {
			if err := n.deleteUser(name, pid); err != nil {
				tb.Errorf("redistest: delete ACL user %s on %s: %v", name, n.Addr, err)
			}
		})
	}
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs, Username: name, Password: password, DisableCache: true})
	if err != nil {
		tb.Fatalf("redistest: connect to cluster %v as ACL user %s: %v", c.Addrs, name, err)
	}
	tb.Cleanup(cl.Close)
	return cl
}

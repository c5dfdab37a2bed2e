package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

const (
	// slotCount is the number of hash slots in a Redis Cluster.
	slotCount = 16384
	// createTimeout bounds redis-cli --cluster create.
	createTimeout = 30 * time.Second
	// clusterReadyTimeout bounds the wait for cluster_state:ok and an agreed
	// slot map on every node.
	clusterReadyTimeout = 20 * time.Second
	// clusterPollInterval is the pause between two cluster readiness probes.
	clusterPollInterval = 20 * time.Millisecond
	// callTimeout bounds one admin command such as CLUSTER KEYSLOT.
	callTimeout = 10 * time.Second
)

// Cluster is a Redis Cluster of masters, without replicas unless started
// by [OwnClusterWithReplicas], started for tests.
type Cluster struct {
	// Nodes are the cluster's masters, in the order given to redis-cli, which
	// assigns them ascending slot ranges.
	Nodes []*Server
	// Addrs are the addresses of Nodes, in the same order.
	Addrs []string
	// Replicas are the replicas of Nodes, in the same order (Replicas[i]
	// replicates Nodes[i]); nil without replicas.
	Replicas []*Server

	mu    sync.Mutex
	admin rueidis.Client // cluster client for KeySlot and NodeFor; nil once stopped
}

// StartCluster starts masters redis-server processes in cluster mode on free
// loopback ports, joins them with redis-cli --cluster create, and waits until
// every node reports cluster_state:ok and all nodes agree on the slot map, so
// that a new cluster client sees no MOVED redirections. Redis needs at least
// 3 masters; tests use 3.
//
// StartCluster returns an error wrapping [exec.ErrNotFound] when redis-server
// or redis-cli is not installed. On error it stops every node it started.
func StartCluster(masters int) (*Cluster, error) {
	return startCluster("redis-server", "redis-cli", masters)
}

// OwnCluster starts a cluster of tb's own, of masters masters, as
// StartCluster does, and stops it when tb ends. A cluster that does not
// start, or does not stop cleanly, fails tb. Tests use it for what would
// disturb the package's shared cluster: killing or pausing a node,
// keeping one busy.
func OwnCluster(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	return ownCluster(tb, masters, false)
}

// OwnClusterWithReplicas is OwnCluster with one replica per master
// (Cluster.Replicas), each in sync with its master when it returns: for
// tests of WAIT on a cluster, whose masters in OwnCluster have none.
func OwnClusterWithReplicas(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	return ownCluster(tb, masters, true)
}

// ownCluster is OwnCluster, with one replica per master if replicas.
func ownCluster(tb testing.TB, masters int, replicas bool) *Cluster {
	tb.Helper()
	cl, err := startClusterOf("redis-server", "redis-cli", masters, replicas)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := cl.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return cl
}

// startCluster is StartCluster with the names of the binaries to look up.
func startCluster(serverName, cliName string, masters int) (_ *Cluster, err error) {
	return startClusterOf(serverName, cliName, masters, false)
}

// startClusterOf is startCluster, with one replica per master if replicas.
func startClusterOf(serverName, cliName string, masters int, replicas bool) (_ *Cluster, err error) {
	if masters < 3 {
		return nil, fmt.Errorf("redistest: a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	// Look both binaries up first, for one clear error instead of one per node.
	if _, err := lookPath(serverName); err != nil {
		return nil, err
	}
	cli, err := lookPath(cliName)
	if err != nil {
		return nil, err
	}

	n := masters
	if replicas {
		n *= 2
	}
	nodes := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() { nodes[i], errs[i] = startServer(serverName, true, nil) })
	}
	wg.Wait()
	c := &Cluster{}
	for _, n := range nodes {
		if n != nil {
			c.Nodes = append(c.Nodes, n)
			c.Addrs = append(c.Addrs, n.Addr)
		}
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(n/masters-1), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.waitReady(); err != nil {
		return nil, err
	}
	if replicas {
		if err := c.pairReplicas(ctx); err != nil {
			return nil, err
		}
	}
	c.admin, err = rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs, DisableCache: true})
	if err != nil {
		return nil, fmt.Errorf("redistest: connect to cluster: %w", err)
	}
	return c, nil
}

// waitReady polls every node until each reports cluster_state:ok and all
// report the same slot map covering all slots, or clusterReadyTimeout passes.
func (c *Cluster) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	clients := make([]rueidis.Client, len(c.Nodes))
	for i, n := range c.Nodes {
		cl, err := n.newClient()
		if err != nil {
			return fmt.Errorf("redistest: connect to %s: %w", n.Addr, err)
		}
		defer cl.Close()
		clients[i] = cl
	}
	for {
		notReady := c.notReady(ctx, clients)
		if notReady == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: cluster %v not ready within %v: %w", c.Addrs, clusterReadyTimeout, notReady)
		case <-time.After(clusterPollInterval):
		}
	}
}

// pairReplicas splits c.Nodes, every node started, into the masters
// (Nodes, Addrs) and their replicas (Replicas, in the masters' order), and
// waits until each replica is in sync (master_link_status:up, and its
// offset at its master's), or ctx ends.
func (c *Cluster) pairReplicas(ctx context.Context) error {
	var masters []*Server
	masterOf := map[*Server]string{}
	for _, n := range c.Nodes {
		info, err := n.info(ctx, "replication")
		if err != nil {
			return err
		}
		if info["role"] == "master" {
			masters = append(masters, n)
			continue
		}
		masterOf[n] = info["master_port"]
	}
	replicas := make([]*Server, len(masters))
	for r, port := range masterOf {
		for i, m := range masters {
			if strconv.Itoa(m.Port) == port {
				replicas[i] = r
			}
		}
	}
	for i, m := range masters {
		if replicas[i] == nil {
			return fmt.Errorf("redistest: master %s has no replica", m.Addr)
		}
	}
	// Every node is in Nodes or Replicas now, for Stop.
	c.Nodes, c.Addrs, c.Replicas = masters, nil, replicas
	for _, m := range masters {
		c.Addrs = append(c.Addrs, m.Addr)
	}
	for i, m := range c.Nodes {
		r := c.Replicas[i]
		for {
			mi, err1 := m.info(ctx, "replication")
			ri, err2 := r.info(ctx, "replication")
			if err := errors.Join(err1, err2); err != nil {
				return err
			}
			if ri["master_link_status"] == "up" && ri["slave_repl_offset"] == mi["master_repl_offset"] {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("redistest: replica %s of %s not in sync: %w", r.Addr, m.Addr, ctx.Err())
			case <-time.After(clusterPollInterval):
			}
		}
	}
	return nil
}

// info returns the fields of section of INFO on s.
func (s *Server) info(ctx context.Context, section string) (map[string]string, error) {
	cl, err := s.newClient()
	if err != nil {
		return nil, fmt.Errorf("redistest: connect to %s: %w", s.Addr, err)
	}
	defer cl.Close()
	fields, err := Info(ctx, cl, section)
	if err != nil {
		return nil, fmt.Errorf("redistest: on %s: %w", s.Addr, err)
	}
	return fields, nil
}

// Info returns the fields of section of INFO on c, by name.
func Info(ctx context.Context, c rueidis.Client, section string) (map[string]string, error) {
	text, err := c.Do(ctx, c.B().Info().Section(section).Build()).ToString()
	if err != nil {
		return nil, fmt.Errorf("INFO %s: %w", section, err)
	}
	fields := map[string]string{}
	for line := range strings.Lines(text) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	return fields, nil
}

// notReady returns why the cluster is not ready yet, or nil when it is.
func (c *Cluster) notReady(ctx context.Context, clients []rueidis.Client) error {
	var first []slotRange
	for i, cl := range clients {
		info, err := cl.Do(ctx, cl.B().ClusterInfo().Build()).ToString()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", c.Addrs[i], err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state is not ok", c.Addrs[i])
		}
		ranges, err := slotMap(ctx, cl)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Addrs[i], err)
		}
		covered := 0
		for _, r := range ranges {
			covered += int(r.end - r.start + 1)
		}
		if covered != slotCount {
			return fmt.Errorf("%s: CLUSTER SLOTS covers %d of %d slots", c.Addrs[i], covered, slotCount)
		}
		if i == 0 {
			first = ranges
		} else if !slices.Equal(ranges, first) {
			return fmt.Errorf("%s and %s disagree on the slot map", c.Addrs[0], c.Addrs[i])
		}
	}
	return nil
}

// slotRange is one entry of CLUSTER SLOTS: slots start..end (inclusive) are
// served by the master listening on port.
type slotRange struct {
	start, end int64
	port       int64
}

// slotMap returns the slot map as the node behind cl sees it, sorted by start.
func slotMap(ctx context.Context, cl rueidis.Client) ([]slotRange, error) {
	entries, err := cl.Do(ctx, cl.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	ranges := make([]slotRange, 0, len(entries))
	for _, e := range entries {
		// Each entry is [start, end, [ip, port, id, ...], replicas...].
		fields, err := e.ToArray()
		if err != nil || len(fields) < 3 {
			return nil, fmt.Errorf("CLUSTER SLOTS: malformed entry %v", e)
		}
		master, err := fields[2].ToArray()
		if err != nil || len(master) < 2 {
			return nil, fmt.Errorf("CLUSTER SLOTS: malformed master %v", fields[2])
		}
		var r slotRange
		if r.start, err = fields[0].AsInt64(); err != nil {
			return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
		}
		if r.end, err = fields[1].AsInt64(); err != nil {
			return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
		}
		if r.port, err = master[1].AsInt64(); err != nil {
			return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
		}
		ranges = append(ranges, r)
	}
	slices.SortFunc(ranges, func(a, b slotRange) int { return int(a.start - b.start) })
	return ranges, nil
}

// Stop closes the cluster's admin client and stops every node as
// [Server.Stop] does. Stop is idempotent.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.admin != nil {
		c.admin.Close()
		c.admin = nil
	}
	c.mu.Unlock()
	nodes := slices.Concat(c.Nodes, c.Replicas)
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = n.Stop() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Client returns a new rueidis cluster client over all of c.Addrs, with
// client-side caching disabled. The client is closed when tb's test ends.
// Client calls tb.Fatal when it cannot connect.
func (c *Cluster) Client(tb testing.TB) rueidis.Client {
	tb.Helper()
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs, DisableCache: true})
	if err != nil {
		tb.Fatalf("redistest: connect to cluster %v: %v", c.Addrs, err)
	}
	tb.Cleanup(cl.Close)
	return cl
}

// KeySlot returns the hash slot of key, as the server computes it with
// CLUSTER KEYSLOT. It calls tb.Fatal on error.
func (c *Cluster) KeySlot(tb testing.TB, key string) int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), callTimeout)
	defer cancel()
	admin := c.adminClient(tb)
	slot, err := admin.Do(ctx, admin.B().ClusterKeyslot().Key(key).Build()).AsInt64()
	if err != nil {
		tb.Fatalf("redistest: CLUSTER KEYSLOT %q: %v", key, err)
	}
	return slot
}

// NodeFor returns the master that serves key's slot, according to CLUSTER
// KEYSLOT and CLUSTER SLOTS. It calls tb.Fatal on error.
func (c *Cluster) NodeFor(tb testing.TB, key string) *Server {
	tb.Helper()
	slot := c.KeySlot(tb, key)
	ctx, cancel := context.WithTimeout(tb.Context(), callTimeout)
	defer cancel()
	ranges, err := slotMap(ctx, c.adminClient(tb))
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	for _, r := range ranges {
		if slot < r.start || slot > r.end {
			continue
		}
		for _, n := range c.Nodes {
			if int64(n.Port) == r.port {
				return n
			}
		}
		tb.Fatalf("redistest: slot %d of %q is served by port %d, which is not a node of this cluster", slot, key, r.port)
	}
	tb.Fatalf("redistest: no node serves slot %d of %q", slot, key)
	return nil
}

// adminClient returns the cluster's admin client, calling tb.Fatal after
// Stop.
func (c *Cluster) adminClient(tb testing.TB) rueidis.Client {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.admin == nil {
		tb.Fatalf("redistest: cluster %v is stopped", c.Addrs)
	}
	return c.admin
}

// StartMove starts moving slot from the master that serves it to to, as
// redis-cli --cluster reshard does: to is set IMPORTING and the source
// MIGRATING, so that the source answers ASK for a key of the slot it does
// not hold. Finish moves every key of the slot with MIGRATE, gives the slot
// to to on every master, and waits until they all agree. The caller keeps
// the slot's keys still while it runs: a key written on both nodes would
// make MIGRATE fail. Either calls tb.Fatal on error.
func (c *Cluster) StartMove(tb testing.TB, slot int64, to *Server) (finish func()) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), callTimeout)
	defer cancel()
	var from *Server
	ranges, err := slotMap(ctx, c.adminClient(tb))
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	for _, r := range ranges {
		if slot >= r.start && slot <= r.end {
			for _, n := range c.Nodes {
				if int64(n.Port) == r.port {
					from = n
				}
			}
		}
	}
	if from == nil || from == to {
		tb.Fatalf("redistest: slot %d is served by %v, cannot move it to %s", slot, from, to.Addr)
	}
	ids := map[*Server]string{}
	clients := map[*Server]rueidis.Client{}
	for _, n := range c.Nodes {
		cl, err := n.newClient()
		if err != nil {
			tb.Fatalf("redistest: connect to %s: %v", n.Addr, err)
		}
		tb.Cleanup(cl.Close)
		clients[n] = cl
		if ids[n], err = cl.Do(ctx, cl.B().ClusterMyid().Build()).ToString(); err != nil {
			tb.Fatalf("redistest: CLUSTER MYID on %s: %v", n.Addr, err)
		}
	}
	setslot := func(ctx context.Context, n *Server, state ...string) {
		tb.Helper()
		cl := clients[n]
		args := append([]string{"SETSLOT", strconv.FormatInt(slot, 10)}, state...)
		if err := cl.Do(ctx, cl.B().Arbitrary("CLUSTER").Args(args...).Build()).Error(); err != nil {
			tb.Fatalf("redistest: CLUSTER %v on %s: %v", args, n.Addr, err)
		}
	}
	setslot(ctx, to, "IMPORTING", ids[from])
	setslot(ctx, from, "MIGRATING", ids[to])
	return func() {
		tb.Helper()
		ctx, cancel := context.WithTimeout(tb.Context(), callTimeout)
		defer cancel()
		src := clients[from]
		for {
			ks, err := src.Do(ctx, src.B().ClusterGetkeysinslot().Slot(slot).Count(100).Build()).AsStrSlice()
			if err != nil {
				tb.Fatalf("redistest: CLUSTER GETKEYSINSLOT %d on %s: %v", slot, from.Addr, err)
			}
			if len(ks) == 0 {
				break
			}
			args := append([]string{"127.0.0.1", strconv.Itoa(to.Port), "", "0", "10000", "KEYS"}, ks...)
			if err := src.Do(ctx, src.B().Arbitrary("MIGRATE").Args(args...).Build()).Error(); err != nil {
				tb.Fatalf("redistest: MIGRATE %q from %s to %s: %v", ks, from.Addr, to.Addr, err)
			}
		}
		// The new owner first, so that the slot is never without one.
		setslot(ctx, to, "NODE", ids[to])
		setslot(ctx, from, "NODE", ids[to])
		for _, n := range c.Nodes {
			if n != to && n != from {
				setslot(ctx, n, "NODE", ids[to])
			}
		}
		if err := c.waitReady(); err != nil {
			tb.Fatal(err)
		}
	}
}

// MoveSlot moves slot, with every key in it, to the master to: StartMove,
// then its finish.
func (c *Cluster) MoveSlot(tb testing.TB, slot int64, to *Server) {
	tb.Helper()
	c.StartMove(tb, slot, to)()
}

package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
	"golang.org/x/sync/errgroup"
)

// clusterMasters is the size of the cluster section's cluster.
const clusterMasters = 3

// clusterResult is the cluster section: independent Rebuilders, each on its
// own hash, run at once on a Redis Cluster and spread over its masters,
// against one Rebuilder alone on the same cluster.
type clusterResult struct {
	Masters int `json:"masters"`
	// Fields is each Rebuilder's hash size.
	Fields int             `json:"fields"`
	Rounds int             `json:"rounds"`
	Redis  string          `json:"redis_server"`
	Runs   []clusterSeries `json:"runs"`
}

// clusterSeries is one number of concurrent Rebuilders, over rounds.
type clusterSeries struct {
	Rebuilders int `json:"rebuilders"`
	// PerMaster is how many of them each master serves.
	PerMaster []int          `json:"rebuilders_per_master"`
	Samples   []clusterRun   `json:"samples"`
	Summary   clusterSummary `json:"summary"`
}

// clusterRun is one run of every Rebuilder at once.
type clusterRun struct {
	// Elapsed is the wall time from their start to the end of the slowest.
	Elapsed time.Duration `json:"elapsed_ns"`
	// Each is every Rebuilder's own run time.
	Each []time.Duration `json:"each_ns"`
	// ServerCPU is each master's CPU time during the run (INFO cpu:
	// used_cpu_user + used_cpu_sys, every thread).
	ServerCPU []time.Duration `json:"server_cpu_ns"`
	// ClientCPU is the bench process's (getrusage), which also generates
	// every source's items.
	ClientCPU time.Duration `json:"client_cpu_ns"`
}

// clusterSummary holds medians and ranges over rounds. Rates are items per
// second.
type clusterSummary struct {
	// Rate is all items over the wall time of the slowest.
	Rate    float64 `json:"items_per_s_median"`
	RateMin float64 `json:"items_per_s_min"`
	RateMax float64 `json:"items_per_s_max"`
	// Summed is the sum of each Rebuilder's own items/s.
	Summed float64 `json:"summed_items_per_s_median"`
	// Speedup is Rate over the single Rebuilder's, paired by round; zero
	// without a single Rebuilder.
	Speedup    float64 `json:"speedup_median,omitempty"`
	SpeedupMin float64 `json:"speedup_min,omitempty"`
	SpeedupMax float64 `json:"speedup_max,omitempty"`
	// ServerCPU is each master's median CPU time.
	ServerCPU []time.Duration `json:"server_cpu_ns_median"`
	ClientCPU time.Duration   `json:"client_cpu_ns_median"`
	// Cores is the median of all CPU time (masters and client) over wall
	// time: how many cores the run kept busy.
	Cores float64 `json:"cores_busy_median"`
	// ClientPerItem and ServerPerItem are the medians of the client's CPU
	// and of all masters' CPU per item.
	ClientPerItem time.Duration `json:"client_cpu_per_item_ns_median"`
	ServerPerItem time.Duration `json:"server_cpu_per_item_ns_median"`
}

// cluster is the cluster section's Redis Cluster: its masters, each as a
// server of its own for INFO, cleanup and SCAN, and one cluster client
// that every Rebuilder shares.
type cluster struct {
	c       *redistest.Cluster
	nodes   []*server
	client  rueidis.Client
	version string
	// ranges[i] are the slot ranges of nodes[i], [start, end] inclusive.
	ranges [][][2]int64
}

// startCluster starts a Redis Cluster of clusterMasters masters on free
// loopback ports, and waits until every node agrees that it is ready. It
// returns an error wrapping exec.ErrNotFound without redis-server or
// redis-cli.
func startCluster(ctx context.Context) (_ *cluster, err error) {
	// redistest.StartCluster is reused rather than copied, as for the
	// standalone server: it creates the cluster with redis-cli --cluster
	// create, waits with a deadline until every node reports
	// cluster_state:ok and one slot map, and kills the nodes if the bench
	// dies. It needs no testing.TB.
	rc, err := redistest.StartCluster(clusterMasters)
	if err != nil {
		return nil, err
	}
	cl := &cluster{c: rc}
	defer func() {
		if err != nil {
			err = errors.Join(err, cl.close())
		}
	}()
	for _, n := range rc.Nodes {
		s := &server{addr: n.Addr, own: n}
		cl.nodes = append(cl.nodes, s)
		if err := s.connect(ctx); err != nil {
			return nil, err
		}
	}
	cl.version = cl.nodes[0].version
	if cl.client, err = rueidis.NewClient(rueidis.ClientOption{InitAddress: rc.Addrs, DisableCache: true, ClientName: benchClientName}); err != nil {
		return nil, fmt.Errorf("connect to cluster %v: %w", rc.Addrs, err)
	}
	if cl.client.Mode() != rueidis.ClientModeCluster {
		return nil, fmt.Errorf("the client of %v is not in cluster mode", rc.Addrs)
	}
	if cl.ranges, err = cl.slotRanges(ctx); err != nil {
		return nil, err
	}
	return cl, nil
}

// slotRanges returns each node's slot ranges, from CLUSTER SLOTS: entries
// [start, end, [ip, port, id], replicas...].
func (cl *cluster) slotRanges(ctx context.Context) ([][][2]int64, error) {
	c := cl.nodes[0].admin
	entries, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	out := make([][][2]int64, len(cl.nodes))
	for _, e := range entries {
		f, err := e.ToArray()
		if err != nil || len(f) < 3 {
			return nil, fmt.Errorf("CLUSTER SLOTS: malformed entry %v", e)
		}
		master, err := f[2].ToArray()
		if err != nil || len(master) < 2 {
			return nil, fmt.Errorf("CLUSTER SLOTS: malformed master %v", f[2])
		}
		start, err1 := f[0].AsInt64()
		end, err2 := f[1].AsInt64()
		port, err3 := master[1].AsInt64()
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
		}
		i := slices.IndexFunc(cl.nodes, func(s *server) bool { return s.port == fmt.Sprint(port) })
		if i < 0 {
			return nil, fmt.Errorf("CLUSTER SLOTS: port %d is not a node of the bench's cluster", port)
		}
		out[i] = append(out[i], [2]int64{start, end})
	}
	for i, r := range out {
		if len(r) == 0 {
			return nil, fmt.Errorf("CLUSTER SLOTS: %s serves no slot", cl.nodes[i].addr)
		}
	}
	return out, nil
}

// master returns the index of the node that serves key's slot.
func (cl *cluster) master(key string) int {
	slot := int64(keys.Slot(key))
	for i, rs := range cl.ranges {
		for _, r := range rs {
			if r[0] <= slot && slot <= r[1] {
				return i
			}
		}
	}
	return -1
}

// keyOn returns the hash key of Rebuilder i, whose hash tag places it on
// master m.
func (cl *cluster) keyOn(m, i int) string {
	for n := 0; ; n++ {
		key := fmt.Sprintf("%s{r%d-%d}:hash", keyPrefix, i, n)
		if cl.master(key) == m {
			return key
		}
	}
}

// close stops the cluster and closes its clients.
func (cl *cluster) close() error {
	if cl.client != nil {
		cl.client.Close()
	}
	var errs []error
	for _, s := range cl.nodes {
		errs = append(errs, s.close()) // stops the node
	}
	return errors.Join(append(errs, cl.c.Stop())...)
}

// reset empties every node and waits until they have freed it.
func (cl *cluster) reset(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, s := range cl.nodes {
		g.Go(func() error { return s.reset(gctx) })
	}
	return g.Wait()
}

// settle waits until no node frees anything in the background.
func (cl *cluster) settle(ctx context.Context) error {
	for _, s := range cl.nodes {
		if err := s.settle(ctx); err != nil {
			return err
		}
	}
	return nil
}

// cpu returns each node's CPU time so far.
func (cl *cluster) cpu(ctx context.Context) ([]time.Duration, error) {
	out := make([]time.Duration, len(cl.nodes))
	for i, s := range cl.nodes {
		u, err := s.usage(ctx)
		if err != nil {
			return nil, err
		}
		out[i] = u.cpu
	}
	return out, nil
}

// startClusterFor starts the bench's cluster for what, a section or a part
// of one. Without redis-server or redis-cli it notes that what is left
// out, and returns nil and no error.
func (r *runner) startClusterFor(ctx context.Context, what string) (*cluster, error) {
	r.bar.describe("%s: starting %d masters", what, clusterMasters)
	cl, err := startCluster(ctx)
	if errors.Is(err, exec.ErrNotFound) {
		r.note("%s needs redis-server and redis-cli to start a cluster, and is left out: %v", what, err)
		return nil, nil
	}
	return cl, err
}

// clusterSection runs the cluster section: in each round, each number of
// concurrent Rebuilders.
func (r *runner) clusterSection(ctx context.Context) (_ *clusterResult, err error) {
	cl, err := r.startClusterFor(ctx, "the cluster section")
	if cl == nil {
		return nil, err
	}
	defer func() {
		if cerr := cl.close(); err == nil {
			err = cerr
		}
	}()
	cfg := r.cfg
	d := newDataset(cfg.clusterFields, 1)
	res := &clusterResult{Masters: clusterMasters, Fields: d.n, Rounds: cfg.rounds, Redis: cl.version}
	// Rebuilder i rebuilds its own hash on master i mod clusterMasters.
	var ws []workload
	for i := range slices.Max(cfg.clusterRebuilders) {
		key := cl.keyOn(i%clusterMasters, i)
		ws = append(ws, workload{name: "hash", title: "hash", targets: []target{{kindHash, key}}})
	}
	for _, n := range cfg.clusterRebuilders {
		per := make([]int, clusterMasters)
		for i := range n {
			per[i%clusterMasters]++
		}
		res.Runs = append(res.Runs, clusterSeries{Rebuilders: n, PerMaster: per})
	}
	for round := range cfg.rounds {
		for i := range res.Runs {
			cs := &res.Runs[i]
			r.bar.describe("cluster %d/%d: %d Rebuilders of %s fields", round+1, cfg.rounds, cs.Rebuilders, commas(d.n))
			s, err := r.clusterRun(ctx, cl, ws[:cs.Rebuilders], d)
			if err != nil {
				return nil, fmt.Errorf("%d Rebuilders: %w", cs.Rebuilders, err)
			}
			cs.Samples = append(cs.Samples, s)
			r.bar.step()
		}
	}
	var single []clusterRun
	if i := slices.IndexFunc(res.Runs, func(cs clusterSeries) bool { return cs.Rebuilders == 1 }); i >= 0 {
		single = res.Runs[i].Samples
	}
	for i := range res.Runs {
		res.Runs[i].summarize(d.n, single)
	}
	return res, nil
}

// clusterRun rebuilds d onto the live hash of every workload of ws, each
// with a Rebuilder of its own, all at once through the cluster client, and
// verifies the result.
func (r *runner) clusterRun(ctx context.Context, cl *cluster, ws []workload, d dataset) (clusterRun, error) {
	if err := cl.reset(ctx); err != nil {
		return clusterRun{}, err
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, w := range ws {
		g.Go(func() error { return preload(gctx, cl.client, w, d) })
	}
	if err := g.Wait(); err != nil {
		return clusterRun{}, err
	}
	if err := cl.settle(ctx); err != nil {
		return clusterRun{}, err
	}
	rbs := make([]*rebuild.Rebuilder[item], len(ws))
	for i, w := range ws {
		var err error
		if rbs[i], err = rebuilder(cl.client, w, r.cfg.keyswap); err != nil {
			return clusterRun{}, err
		}
	}
	out := clusterRun{Each: make([]time.Duration, len(ws))}
	cpu0, err := cl.cpu(ctx)
	if err != nil {
		return clusterRun{}, err
	}
	ru0 := rusage()
	start := time.Now()
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			errs[i] = runKeyswap(ctx, rbs[i], w, d)
			out.Each[i] = time.Since(start)
		})
	}
	wg.Wait()
	out.Elapsed = time.Since(start)
	out.ClientCPU = rusage() - ru0
	if err := errors.Join(errs...); err != nil {
		return clusterRun{}, err
	}
	cpu1, err := cl.cpu(ctx)
	if err != nil {
		return clusterRun{}, err
	}
	for i := range cpu1 {
		out.ServerCPU = append(out.ServerCPU, cpu1[i]-cpu0[i])
	}
	if err := cl.verify(ctx, ws, d); err != nil {
		return clusterRun{}, fmt.Errorf("wrong result: %w", err)
	}
	return out, nil
}

// verify checks that the cluster holds exactly what ws write for d: every
// hash exact, on its master, and nothing else under keyPrefix but
// generation records: no temp key or lock left behind.
func (cl *cluster) verify(ctx context.Context, ws []workload, d dataset) error {
	want := make([][]string, len(cl.nodes))
	for _, w := range ws {
		t := w.targets[0]
		if err := t.verify(ctx, cl.client, d, []item{d.item(0), d.item(d.n - 1)}, d.previous().item(0)); err != nil {
			return err
		}
		m := cl.master(t.key)
		want[m] = append(want[m], t.key)
	}
	for i, s := range cl.nodes {
		got, err := scanKeys(ctx, s.admin, keyPrefix+"*")
		if err != nil {
			return err
		}
		got = slices.DeleteFunc(got, isGeneration)
		slices.Sort(got)
		slices.Sort(want[i])
		if !slices.Equal(got, want[i]) {
			return fmt.Errorf("%s holds %s under %s*, want %s", s.addr, firstKeys(got), keyPrefix, firstKeys(want[i]))
		}
	}
	return nil
}

// summarize fills cs.Summary from its samples, each Rebuilder writing
// fields items. single holds the single Rebuilder's samples of the same
// rounds, for the speedups.
func (cs *clusterSeries) summarize(fields int, single []clusterRun) {
	if len(cs.Samples) == 0 {
		return
	}
	items := float64(fields * cs.Rebuilders)
	rate := func(x clusterRun) float64 { return items / x.Elapsed.Seconds() }
	var rates, summed, speedups, clientCPU, cores, perItem, serverPerItem []float64
	serverCPU := make([][]float64, len(cs.Samples[0].ServerCPU))
	for i, x := range cs.Samples {
		rates = append(rates, rate(x))
		sum := 0.0
		for _, e := range x.Each {
			sum += float64(fields) / e.Seconds()
		}
		summed = append(summed, sum)
		if i < len(single) {
			speedups = append(speedups, rate(x)/(float64(fields)/single[i].Elapsed.Seconds()))
		}
		var server time.Duration
		for m, c := range x.ServerCPU {
			serverCPU[m] = append(serverCPU[m], float64(c))
			server += c
		}
		clientCPU = append(clientCPU, float64(x.ClientCPU))
		cores = append(cores, (server+x.ClientCPU).Seconds()/x.Elapsed.Seconds())
		perItem = append(perItem, float64(x.ClientCPU)/items)
		serverPerItem = append(serverPerItem, float64(server)/items)
	}
	s := &cs.Summary
	s.Rate, s.RateMin, s.RateMax = median(rates), slices.Min(rates), slices.Max(rates)
	s.Summed = median(summed)
	if len(speedups) > 0 {
		s.Speedup, s.SpeedupMin, s.SpeedupMax = median(speedups), slices.Min(speedups), slices.Max(speedups)
	}
	s.ServerCPU = nil
	for _, c := range serverCPU {
		s.ServerCPU = append(s.ServerCPU, time.Duration(median(c)))
	}
	s.ClientCPU = time.Duration(median(clientCPU))
	s.Cores = median(cores)
	s.ClientPerItem = time.Duration(median(perItem))
	s.ServerPerItem = time.Duration(median(serverPerItem))
}

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// genCPU is the CPU part of the generations section: a family written by
// the limit and raw, and rebuilt in each mode onto a live family, on the
// same data, interleaved in rounds.
type genCPU struct {
	Buckets int         `json:"buckets"`
	Members int         `json:"members_per_bucket"`
	Items   int         `json:"items"`
	Methods []genMethod `json:"methods"`
}

// genMethod is one way of writing the family.
type genMethod struct {
	// Name is limit, raw, rename, generations, "generations, no size
	// check", or a pipe method.
	Name   string `json:"name"`
	Series series `json:"series"`
	// ServerRatio is the median over rounds of its server CPU over the
	// limit's in the same round, ClientRatio of its client CPU over raw's;
	// zero without them.
	ServerRatio    float64 `json:"server_cpu_ratio_to_limit_median,omitempty"`
	ServerRatioMin float64 `json:"server_cpu_ratio_to_limit_min,omitempty"`
	ServerRatioMax float64 `json:"server_cpu_ratio_to_limit_max,omitempty"`
	ClientRatio    float64 `json:"client_cpu_ratio_to_raw_median,omitempty"`
	ClientRatioMin float64 `json:"client_cpu_ratio_to_raw_min,omitempty"`
	ClientRatioMax float64 `json:"client_cpu_ratio_to_raw_max,omitempty"`
	// Phases are, per round, its server usage in the build and in the
	// removal of the previous data (the modes and the pipe methods);
	// Phase their summary.
	Phases []genPhases   `json:"phases,omitempty"`
	Phase  *phaseSummary `json:"phase_summary,omitempty"`
}

// pairedRatio returns the median, minimum and maximum over rounds of f of
// a's sample over f of b's sample of the same round; zeros without pairs.
func pairedRatio(a, b []sample, f func(sample) time.Duration) (med, lo, hi float64) {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if f(b[i]) > 0 {
			rs = append(rs, float64(f(a[i]))/float64(f(b[i])))
		}
	}
	if len(rs) == 0 {
		return 0, 0, 0
	}
	return median(rs), slices.Min(rs), slices.Max(rs)
}

// method returns the method named name, or nil.
func (g *genCPU) method(name string) *genMethod {
	for i := range g.Methods {
		if g.Methods[i].Name == name {
			return &g.Methods[i]
		}
	}
	return nil
}

// summarize fills every method's series summary and ratios from the
// samples of each, by name.
func (g *genCPU) summarize(samples map[string][]sample) {
	serverCPU := func(s sample) time.Duration { return s.ServerCPU }
	clientCPU := func(s sample) time.Duration { return s.ClientCPU }
	for i := range g.Methods {
		m := &g.Methods[i]
		m.Series = newSeries(samples[m.Name], samples[string(methodLimit)])
		if m.Name != string(methodLimit) {
			m.ServerRatio, m.ServerRatioMin, m.ServerRatioMax = pairedRatio(samples[m.Name], samples[string(methodLimit)], serverCPU)
		}
		if m.Name != string(methodRaw) && m.Name != string(methodLimit) {
			m.ClientRatio, m.ClientRatioMin, m.ClientRatioMax = pairedRatio(samples[m.Name], samples[string(methodRaw)], clientCPU)
		}
	}
}

// genCPU runs the CPU part of the generations section.
func (r *runner) genCPU(ctx context.Context) (_ *genCPU, err error) {
	cfg := r.cfg
	members := genMembers(cfg.genCPUBuckets, cfg.genMembers, cfg.genMaxItems)
	d := familyDataset(cfg.genCPUBuckets, members)
	s := r.srv
	f := genFamily{w: workload{name: "family", title: "SetIndex family", targets: []target{{kindIndex, genFamilyKey}}},
		client: s.client, nodes: []*server{s}}
	out := &genCPU{Buckets: cfg.genCPUBuckets, Members: members, Items: d.n}
	var resp respFile
	if r.hasLimit() {
		out.Methods = append(out.Methods, genMethod{Name: string(methodLimit)})
		if resp, err = writeRESP(f.w, d); err != nil {
			return nil, err
		}
		defer os.Remove(resp.path)
	}
	out.Methods = append(out.Methods, genMethod{Name: string(methodRaw)})
	for _, m := range genCPUModes {
		out.Methods = append(out.Methods, genMethod{Name: string(m)})
	}
	files := map[int64]pipeFiles{}
	defer func() {
		for _, p := range files {
			p.remove()
		}
	}()
	if r.hasLimit() {
		out.Methods = append(out.Methods, genMethod{Name: methodPipeUnlink}, genMethod{Name: methodPipeDel})
	}
	samples := map[string][]sample{}
	for round := range cfg.rounds {
		for i := range out.Methods {
			m := &out.Methods[i]
			var smp sample
			var ph genPhases
			switch m.Name {
			case string(methodLimit), string(methodRaw):
				smp, err = r.runOnce(ctx, sectionGenerations, round, fmt.Sprintf("%s, SetIndex of %s buckets", m.Name, commas(d.bucketCount())),
					method(m.Name), f.w, d, resp, cfg.keyswap)
			case methodPipeUnlink, methodPipeDel:
				smp, ph, err = r.genPipe(ctx, f, m.Name, d, round, files)
			default:
				smp, ph, err = r.genMeasure(ctx, f, genMode(m.Name), d, round)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", m.Name, err)
			}
			samples[m.Name] = append(samples[m.Name], smp)
			if ph.BuildCommands != nil {
				m.Phases = append(m.Phases, ph)
			}
		}
	}
	out.summarize(samples)
	out.summarizePhases()
	return out, nil
}

// genMeasure rebuilds d in mode m onto a live family of d.previous()
// published in the same mode, and measures the run, the removal of the
// previous data included in the CPU times; and the server's usage in the
// build and in the removal, split at the publish's reply.
func (r *runner) genMeasure(ctx context.Context, f genFamily, m genMode, d dataset, round int) (_ sample, ph genPhases, _ error) {
	r.bar.describe("%s %d/%d: %s, SetIndex of %s buckets", sectionGenerations, round+1, r.cfg.rounds, m, commas(d.bucketCount()))
	s := r.srv
	opts := r.genOptions(m)
	old, had, err := f.prepare(ctx, m, opts, d)
	if err != nil {
		return sample{}, ph, err
	}
	var start, published time.Time
	var atPublish serverUsage
	var publishErr error
	scripts, err := keyswapScripts(context.Background(), nil, false)
	if err != nil {
		return sample{}, ph, err
	}
	// The server's usage when the publish replied: in Generations mode the
	// removal waits for the grace period after it, so nothing of it ran.
	c := &scriptHook{Client: f.client, scripts: publishScripts(scripts), around: func(do func()) {
		do()
		published = time.Now()
		atPublish, publishErr = s.usage(ctx)
	}}
	rb, err := rebuilder(c, f.w, opts)
	if err != nil {
		return sample{}, ph, err
	}
	first, err := s.usage(ctx)
	if err != nil {
		return sample{}, ph, err
	}
	var stats rebuild.Stats
	smp, err := measure(ctx, s, d.n, "", func() (*child, error) {
		var err error
		start = time.Now()
		stats, err = rb.Run(ctx, sources.Seq(d.all()))
		return nil, err
	})
	if err != nil {
		return sample{}, ph, err
	}
	// The rate is that of the run until its publish: in Generations mode
	// Run then waits for the grace period, whose CPU counts but whose
	// wall time does not.
	if published.IsZero() {
		return sample{}, ph, errors.New("the run sent no publish script")
	}
	smp.Elapsed = published.Sub(start)
	// The removal of the previous data is part of the run's cost: the
	// previous generation's keys, or the frees of the replaced values.
	before, err := s.usage(ctx)
	if err != nil {
		return sample{}, ph, err
	}
	ru := rusage()
	if err := f.waitRemoved(ctx, old, had); err != nil {
		return sample{}, ph, err
	}
	smp.ClientCPU += rusage() - ru
	after, err := s.usage(ctx)
	if err != nil {
		return sample{}, ph, err
	}
	smp.ServerCPU += after.cpu - before.cpu
	if publishErr != nil {
		return sample{}, ph, publishErr
	}
	ph = newPhases(first, atPublish, after)
	if err := checkGenStats(stats, f.w, d); err != nil {
		return sample{}, ph, err
	}
	if err := f.verify(ctx, d); err != nil {
		return sample{}, ph, fmt.Errorf("wrong result: %w", err)
	}
	r.bar.step()
	return smp, ph, nil
}

// genClusterResult is the cluster part of the generations section: one
// family on the bench's own Redis Cluster, its buckets spread over every
// master by Generations mode, against the same family on one master.
type genClusterResult struct {
	Masters int    `json:"masters"`
	Buckets int    `json:"buckets"`
	Members int    `json:"members_per_bucket"`
	Items   int    `json:"items"`
	Redis   string `json:"redis_server"`
	// Runs are the generations run spread over the masters, the
	// generations run on one master (the baseline of the speedups), and
	// the rename run on one master.
	Runs []genClusterSeries `json:"runs"`
}

// genClusterSeries is one way of placing and publishing the family.
type genClusterSeries struct {
	Title  string  `json:"title"`
	Mode   genMode `json:"mode"`
	Spread bool    `json:"spread"`
	// Master is the master that holds a family on one master.
	Master int           `json:"master"`
	Series clusterSeries `json:"series"`
	prefix string
}

// genFamilyOn returns a family prefix whose hash tag puts it on master m.
func (cl *cluster) genFamilyOn(m int) string {
	for n := 0; ; n++ {
		key := fmt.Sprintf("%s{g%d}family", keyPrefix, n)
		if cl.master(key) == m {
			return key
		}
	}
}

// genCluster runs the cluster part of the generations section.
func (r *runner) genCluster(ctx context.Context) (_ *genClusterResult, err error) {
	cl, err := r.startClusterFor(ctx, "the cluster part of the generations section")
	if cl == nil {
		return nil, err
	}
	defer func() {
		if cerr := cl.close(); err == nil {
			err = cerr
		}
	}()
	cfg := r.cfg
	members := genMembers(cfg.genClusterBuckets, cfg.genMembers, cfg.genMaxItems)
	d := familyDataset(cfg.genClusterBuckets, members)
	out := &genClusterResult{Masters: clusterMasters, Buckets: cfg.genClusterBuckets, Members: members, Items: d.n, Redis: cl.version}
	one := cl.genFamilyOn(0)
	out.Runs = []genClusterSeries{
		{Title: fmt.Sprintf("generations, spread over %d masters", clusterMasters), Mode: modeGenerations, Spread: true, Master: -1, prefix: keyPrefix + "gfamily"},
		{Title: "generations, on one master", Mode: modeGenerations, prefix: one},
		{Title: "rename, on one master", Mode: modeRename, prefix: one},
	}
	for round := range cfg.rounds {
		for i := range out.Runs {
			gs := &out.Runs[i]
			r.bar.describe("%s %d/%d: cluster, %s", sectionGenerations, round+1, cfg.rounds, gs.Title)
			f := genFamily{w: workload{name: "family", title: "SetIndex family", targets: []target{{kindIndex, gs.prefix}}},
				cluster: true, client: cl.client, nodes: cl.nodes}
			x, err := r.genClusterRun(ctx, cl, f, gs.Mode, d)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", gs.Title, err)
			}
			gs.Series.Samples = append(gs.Series.Samples, x)
			r.bar.step()
		}
	}
	single := out.Runs[1].Series.Samples
	for i := range out.Runs {
		gs := &out.Runs[i]
		gs.Series.Rebuilders = 1
		gs.Series.PerMaster = make([]int, clusterMasters)
		if gs.Spread {
			for m := range gs.Series.PerMaster {
				gs.Series.PerMaster[m] = 1
			}
		} else {
			gs.Series.PerMaster[gs.Master] = 1
		}
		gs.Series.summarize(d.n, single)
	}
	return out, nil
}

// genClusterRun rebuilds d in mode m onto a live family of d.previous()
// published in the same mode, on the cluster, and measures the run; each
// master's CPU time and the client's include the removal of the previous
// data.
func (r *runner) genClusterRun(ctx context.Context, cl *cluster, f genFamily, m genMode, d dataset) (clusterRun, error) {
	opts := r.genOptions(m)
	old, had, err := f.prepare(ctx, m, opts, d)
	if err != nil {
		return clusterRun{}, err
	}
	var published time.Time
	c, err := timePublish(cl.client, &published)
	if err != nil {
		return clusterRun{}, err
	}
	rb, err := rebuilder(c, f.w, opts)
	if err != nil {
		return clusterRun{}, err
	}
	cpu0, err := cl.cpu(ctx)
	if err != nil {
		return clusterRun{}, err
	}
	ru0 := rusage()
	start := time.Now()
	stats, err := rb.Run(ctx, sources.Seq(d.all()))
	elapsed := published.Sub(start) // the grace period excluded
	if err == nil && published.IsZero() {
		err = errors.New("the run sent no publish script")
	}
	if err == nil {
		err = f.waitRemoved(ctx, old, had)
	}
	out := clusterRun{Elapsed: elapsed, Each: []time.Duration{elapsed}, ClientCPU: rusage() - ru0}
	if err != nil {
		return clusterRun{}, err
	}
	cpu1, err := cl.cpu(ctx)
	if err != nil {
		return clusterRun{}, err
	}
	for i := range cpu1 {
		out.ServerCPU = append(out.ServerCPU, cpu1[i]-cpu0[i])
	}
	if err := checkGenStats(stats, f.w, d); err != nil {
		return clusterRun{}, err
	}
	if err := f.verify(ctx, d); err != nil {
		return clusterRun{}, fmt.Errorf("wrong result: %w", err)
	}
	return out, nil
}

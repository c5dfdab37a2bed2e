package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/keyswap/keyswap/rebuild"
)

// Exit codes.
const (
	exitOK    = 0 // success, or help asked for
	exitError = 1 // a failed run: no server, a wrong count, an error reply
	exitUsage = 2 // a bad command line
)

// Section names, in the order they run.
const (
	sectionThroughput = "throughput"
	sectionSwap       = "swap"
	sectionPublish    = "publish"
	sectionScaling    = "scaling"
	sectionKnobs      = "knobs"
	sectionCluster    = "cluster"
	sectionOnline     = "online"
	sectionImpact     = "impact"
	// sectionGenerations is rename-in-place and Generations mode side by
	// side: the publish, the removal of the previous data, CPU per entry,
	// and a family spread over a cluster's masters.
	sectionGenerations = "generations"
)

var allSections = []string{sectionThroughput, sectionSwap, sectionPublish, sectionScaling, sectionKnobs, sectionCluster, sectionOnline, sectionImpact, sectionGenerations}

const usageHeader = `bench measures keyswap's rebuild throughput against redis-cli --pipe, the
physical limit, with every method interleaved in rounds on the same data.

Usage:

	go run ./bench [flags]

It starts its own redis-server on a free loopback port unless -addr is given
(and, for the cluster section, always its own 3-master Redis Cluster),
writes a Markdown report to stdout and <out>/<date>.md, the same data as JSON
(<date>.json), and a chart (<date>.png, <date>.svg). A wrong cardinality after
any run fails the bench (exit status 1).

Flags:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		os.Exit(exitOK)
	case errors.As(err, new(*usageError)):
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(exitUsage)
	default:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(exitError)
	}
}

// usageError is a bad command line.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// config is the parsed command line.
type config struct {
	args       []string // as given, for the report
	addr       string
	n          int
	rounds     int
	sections   []string
	workloads  []string
	methods    []method
	sizes      []int
	batchSizes []int
	writers    []int
	buckets    int
	out        string
	cli        string
	progress   bool
	cpuProfile string
	serverCPU  int
	render     string
	keyswap    rebuild.Options // the keyswap method's options outside the knobs section

	// publishBuckets are the family sizes of the publish section, and
	// publishMembers the members of each bucket.
	publishBuckets []int
	publishMembers int
	// clusterRebuilders are the numbers of concurrent Rebuilders of the
	// cluster section, and clusterFields the fields of each one's hash.
	clusterRebuilders []int
	clusterFields     int

	onlineN    int     // items of the online section; 0 is n
	onlineRate float64 // changes per second during the online section
	// onlineBacklog is the changes of the online section's run with a
	// backlog; 0 runs none.
	onlineBacklog int

	impactN         int           // items of the impact section; 0 is 2n
	impactBudget    time.Duration // the impact section's Options.LatencyBudget
	impactBatchSize int           // the BatchSize of its paced run; 0 is -keyswap-batch-size

	// genBuckets are the family sizes of the generations section's
	// publish; genMembers the members per bucket, fewer where a family
	// would hold more than genMaxItems items.
	genBuckets  []int
	genMembers  int
	genMaxItems int
	// genRenameMax is the largest family the generations section
	// rebuilds in rename mode.
	genRenameMax int
	// genCPUBuckets and genClusterBuckets are the family sizes of its CPU
	// and cluster parts.
	genCPUBuckets     int
	genClusterBuckets int
	genGrace          time.Duration // rebuild.Options.Grace of its Generations runs
	genSlowlog        time.Duration // its SLOWLOG threshold
}

// impactItems returns the impact section's dataset size.
func (c config) impactItems() int { return cmp.Or(c.impactN, 2*c.n) }

// onlineItems returns the online section's dataset size.
func (c config) onlineItems() int { return cmp.Or(c.onlineN, c.n) }

// has reports whether section s is selected.
func (c config) has(s string) bool { return slices.Contains(c.sections, s) }

// parseFlags parses args. It returns flag.ErrHelp after printing the usage
// for -h, and a *usageError for a bad command line.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	cfg := config{args: args}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHeader)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.addr, "addr", "", "use the Redis at `host:port` instead of starting redis-server; the bench writes and deletes keys under \""+keyPrefix+"\" there, and changes its slowlog settings during the swap and publish sections")
	fs.IntVar(&cfg.n, "n", 1_000_000, "entries per run (hash fields, members) in the throughput, swap and knobs sections")
	fs.IntVar(&cfg.rounds, "rounds", 5, "rounds of interleaved runs; the report gives medians and min–max over them")
	sections := fs.String("sections", strings.Join(allSections, ","), "comma-separated sections to run: "+strings.Join(allSections, ", "))
	workloads := fs.String("workloads", "hash,zset,set,setindex,multi", "comma-separated workloads of the throughput section: hash, zset (sorted set), set, setindex (SetIndex), multi (hash + zset + SetIndex from one source)")
	methods := fs.String("methods", "limit,raw,keyswap,unordered,naive", "comma-separated methods of the throughput section: limit (redis-cli --pipe), raw, keyswap, unordered (keyswap with Options.Unordered), naive")
	sizes := fs.String("sizes", "", "comma-separated entry counts of the scaling section (default -n/10, -n and 5×-n: 100000,1000000,5000000)")
	batchSizes := fs.String("batch-sizes", "100,1000,2000,5000", "comma-separated rebuild.Options.BatchSize values of the knobs section")
	writers := fs.String("writers", "1,2,4,8", "comma-separated rebuild.Options.Writers values of the knobs section")
	fs.IntVar(&cfg.buckets, "buckets", 1000, "buckets of the SetIndex workloads")
	publishBuckets := fs.String("publish-buckets", "1000,10000,100000", "comma-separated bucket counts of the publish section's SetIndex families")
	fs.IntVar(&cfg.publishMembers, "publish-members", 10, "members per bucket in the publish section")
	clusterRebuilders := fs.String("cluster-rebuilders", "1,3,6", "comma-separated numbers of concurrent Rebuilders of the cluster section, spread over its 3 masters; 1 is the baseline of the speedups")
	fs.IntVar(&cfg.clusterFields, "cluster-fields", 300_000, "fields of each Rebuilder's hash in the cluster section")
	fs.StringVar(&cfg.out, "out", defaultOut(), "directory for <date>.md, .json, .png and .svg; empty writes no files")
	fs.StringVar(&cfg.cli, "redis-cli", "redis-cli", "redis-cli binary for the limit method; if it is not found, the limit is left out")
	fs.BoolVar(&cfg.progress, "progress", true, "show a progress bar on stderr")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of each measured in-process run to `dir`/<section>-<workload>-<method>-<round>.pprof (merge them with go tool pprof)")
	fs.IntVar(&cfg.keyswap.BatchSize, "keyswap-batch-size", 0, "rebuild.Options.BatchSize of the keyswap method in the throughput, swap, publish, scaling and cluster sections; 0 is the library's default")
	fs.IntVar(&cfg.keyswap.Writers, "keyswap-writers", 0, "rebuild.Options.Writers of the keyswap method in the throughput, swap, publish, scaling and cluster sections; 0 is the library's default")
	fs.BoolVar(&cfg.keyswap.Unordered, "keyswap-unordered", false, "set rebuild.Options.Unordered for the keyswap method in every section")
	fs.StringVar(&cfg.render, "render", "", "render the report of an earlier run from its JSON `file` (to stdout and -out) instead of running")
	fs.IntVar(&cfg.onlineN, "online-n", 0, "items of the online section; 0 means -n")
	fs.Float64Var(&cfg.onlineRate, "online-rate", 10_000, "changes per second that the online section's writers apply, with rebuild.Rebuilder.Apply")
	fs.IntVar(&cfg.onlineBacklog, "online-backlog", 0, "changes logged before the catch-up of an extra run in each round of the online section, applied as fast as Apply takes them once the source has given its last item, to measure the replay rate of the catch-up (e.g. 200000); 0 runs none")
	fs.IntVar(&cfg.impactN, "impact-n", 0, "items of the impact section's rebuilds, long enough for the paced run to settle; 0 means 2×-n")
	fs.DurationVar(&cfg.impactBudget, "impact-budget", time.Millisecond, "rebuild.Options.LatencyBudget of the impact section's paced rebuild")
	fs.IntVar(&cfg.impactBatchSize, "impact-batch-size", 500, "rebuild.Options.BatchSize of the impact section's paced rebuild (a batch's transaction runs whole: it must fit the budget); 0 means -keyswap-batch-size")
	genBuckets := fs.String("gen-buckets", "1000,10000,100000,1000000", "comma-separated bucket counts of the SetIndex families whose publish the generations section measures in both modes")
	fs.IntVar(&cfg.genMembers, "gen-members", 10, "members per bucket in the generations section, fewer where a family would hold more than -gen-max-items items")
	fs.IntVar(&cfg.genMaxItems, "gen-max-items", 2_000_000, "the most items of one family in the generations section: larger families get fewer members per bucket (at least one)")
	fs.IntVar(&cfg.genRenameMax, "gen-rename-max", 100_000, "the largest family (buckets) the generations section rebuilds in rename mode; larger ones run in Generations mode only, and the report extrapolates their rename publish from the largest family's time per bucket (a rename publish of 1,000,000 buckets blocks the server for 10 s or more, past rueidis' default ConnWriteTimeout of 10 s: its client gives up on its connections and the run fails)")
	fs.IntVar(&cfg.genCPUBuckets, "gen-cpu-buckets", 100_000, "buckets of the family of the generations section's CPU per entry (limit, raw and both modes)")
	fs.IntVar(&cfg.genClusterBuckets, "gen-cluster-buckets", 100_000, "buckets of the family of the generations section's cluster runs")
	fs.DurationVar(&cfg.genGrace, "gen-grace", time.Second, "rebuild.Options.Grace of the generations section's runs in Generations mode: how long the previous generation stays readable before its removal")
	fs.DurationVar(&cfg.genSlowlog, "gen-slowlog", 10*time.Microsecond, "SLOWLOG threshold of the generations section's publish runs (a shorter publish is timed by INFO commandstats)")
	fs.IntVar(&cfg.serverCPU, "server-cpu", -1, "pin the bench's own redis-server to this CPU (Linux), e.g. with the bench itself under taskset -c 0, so that client and server do not share a core; -1 leaves it alone")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, &usageError{err}
	}
	if fs.NArg() > 0 {
		return cfg, &usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	bad := func(format string, a ...any) (config, error) { return cfg, &usageError{fmt.Errorf(format, a...)} }
	if cfg.n < 1 || cfg.rounds < 1 || cfg.buckets < 1 || cfg.publishMembers < 1 || cfg.clusterFields < 1 {
		return bad("-n, -rounds, -buckets, -publish-members and -cluster-fields must be at least 1")
	}
	if cfg.keyswap.BatchSize < 0 || cfg.keyswap.Writers < 0 {
		return bad("-keyswap-batch-size and -keyswap-writers must not be negative")
	}
	if cfg.genMembers < 1 || cfg.genMaxItems < 1 || cfg.genRenameMax < 0 || cfg.genCPUBuckets < 1 || cfg.genClusterBuckets < 1 || cfg.genGrace <= 0 || cfg.genSlowlog < 0 {
		return bad("-gen-members, -gen-max-items, -gen-cpu-buckets and -gen-cluster-buckets must be at least 1, -gen-rename-max and -gen-slowlog not negative, and -gen-grace positive")
	}
	if cfg.impactN < 0 || cfg.impactBudget <= 0 || cfg.impactBatchSize < 0 {
		return bad("-impact-n and -impact-batch-size must not be negative, and -impact-budget must be positive")
	}
	if cfg.onlineN < 0 || cfg.onlineBacklog < 0 || !(cfg.onlineRate > 0) || math.IsInf(cfg.onlineRate, 1) {
		return bad("-online-n and -online-backlog must not be negative, and -online-rate must be positive and finite")
	}
	var err error
	if cfg.sections, err = names(*sections, allSections, "-sections"); err != nil {
		return cfg, err
	}
	var allW []string
	for _, w := range allWorkloads(cfg.buckets) {
		allW = append(allW, w.name)
	}
	if cfg.workloads, err = names(*workloads, allW, "-workloads"); err != nil {
		return cfg, err
	}
	var allM []string
	for _, m := range allMethods {
		allM = append(allM, string(m))
	}
	ms, err := names(*methods, allM, "-methods")
	if err != nil {
		return cfg, err
	}
	for _, m := range ms {
		cfg.methods = append(cfg.methods, method(m))
	}
	if *sizes == "" {
		cfg.sizes = []int{max(cfg.n/10, 1), cfg.n, 5 * cfg.n}
	} else if cfg.sizes, err = ints(*sizes, "-sizes"); err != nil {
		return cfg, err
	}
	if cfg.batchSizes, err = ints(*batchSizes, "-batch-sizes"); err != nil {
		return cfg, err
	}
	if cfg.writers, err = ints(*writers, "-writers"); err != nil {
		return cfg, err
	}
	if cfg.publishBuckets, err = ints(*publishBuckets, "-publish-buckets"); err != nil {
		return cfg, err
	}
	if cfg.clusterRebuilders, err = ints(*clusterRebuilders, "-cluster-rebuilders"); err != nil {
		return cfg, err
	}
	if cfg.genBuckets, err = ints(*genBuckets, "-gen-buckets"); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// defaultOut is bench/results when run from the repository's root (go run
// ./bench), else results.
func defaultOut() string {
	if _, err := os.Stat(filepath.Join("bench", "go.mod")); err == nil {
		return filepath.Join("bench", "results")
	}
	return "results"
}

// names splits a comma-separated list and checks each name against valid,
// keeping valid's order.
func names(list string, valid []string, flagName string) ([]string, error) {
	var out []string
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !slices.Contains(valid, name) {
			return nil, &usageError{fmt.Errorf("%s: unknown %q (valid: %s)", flagName, name, strings.Join(valid, ", "))}
		}
		out = append(out, name)
	}
	if len(out) == 0 {
		return nil, &usageError{fmt.Errorf("%s: empty", flagName)}
	}
	slices.SortStableFunc(out, func(a, b string) int { return slices.Index(valid, a) - slices.Index(valid, b) })
	return slices.Compact(out), nil
}

// ints splits a comma-separated list of positive integers.
func ints(list, flagName string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(strings.ReplaceAll(f, "_", "")))
		if err != nil || n < 1 {
			return nil, &usageError{fmt.Errorf("%s: %q is not a positive integer", flagName, f)}
		}
		out = append(out, n)
	}
	return out, nil
}

// run is the bench: it parses args, runs the selected sections, and writes
// the report to stdout and to files under -out. Progress goes to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if cfg.render != "" {
		return render(cfg.render, stdout, cfg.out)
	}
	r := &runner{cfg: cfg, stderr: stderr}
	if path, err := exec.LookPath(cfg.cli); err == nil {
		r.cli = path
	} else {
		r.note("redis-cli (%s) was not found, so the limit method is left out and there are no ratios; install it (Debian: redis-tools) for a complete report", cfg.cli)
	}
	if r.srv, err = openServer(ctx, cfg.addr, cfg.serverCPU); err != nil {
		return err
	}
	defer func() {
		if cerr := r.srv.close(); err == nil {
			err = cerr
		}
	}()

	rep := newReport(ctx, cfg, r)
	r.bar = newProgress(cfg, r.plannedRuns(), stderr)
	defer r.bar.exit(stderr) // after a failure; finish has ended it otherwise

	if cfg.cpuProfile != "" {
		if err := os.MkdirAll(cfg.cpuProfile, 0o755); err != nil {
			return err
		}
	}
	if cfg.has(sectionThroughput) {
		if rep.Throughput, err = r.throughput(ctx); err != nil {
			return fmt.Errorf("throughput: %w", err)
		}
	}
	if cfg.has(sectionSwap) {
		if rep.Swap, err = r.swap(ctx); err != nil {
			return fmt.Errorf("swap: %w", err)
		}
	}
	if cfg.has(sectionPublish) {
		if rep.Publish, err = r.publishSection(ctx); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	if cfg.has(sectionScaling) {
		if rep.Scaling, err = r.scaling(ctx); err != nil {
			return fmt.Errorf("scaling: %w", err)
		}
	}
	if cfg.has(sectionKnobs) {
		if rep.Knobs, err = r.knobs(ctx); err != nil {
			return fmt.Errorf("knobs: %w", err)
		}
	}
	if cfg.has(sectionCluster) {
		if rep.Cluster, err = r.clusterSection(ctx); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	if cfg.has(sectionOnline) {
		if rep.Online, err = r.online(ctx); err != nil {
			return fmt.Errorf("online: %w", err)
		}
	}
	if cfg.has(sectionImpact) {
		if rep.Impact, err = r.impact(ctx); err != nil {
			return fmt.Errorf("impact: %w", err)
		}
	}
	if cfg.has(sectionGenerations) {
		if rep.Generations, err = r.generations(ctx); err != nil {
			return fmt.Errorf("generations: %w", err)
		}
	}
	r.bar.finish(stderr)
	rep.finish(r)
	return rep.write(stdout, cfg.out)
}

// startProfile starts a CPU profile written to path, and returns the
// function that stops it.
func startProfile(path string) (func() error, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// runner runs the sections against one server.
type runner struct {
	cfg    config
	srv    *server
	cli    string // redis-cli's path; "" leaves the limit out
	bar    *progress
	stderr io.Writer
	notes  []string
}

// note adds a line to the report's notes.
func (r *runner) note(format string, a ...any) { r.notes = append(r.notes, fmt.Sprintf(format, a...)) }

// hasLimit reports whether the limit method can run.
func (r *runner) hasLimit() bool { return r.cli != "" }

// methods returns the throughput section's methods that can run.
func (r *runner) methods() []method {
	var out []method
	for _, m := range r.cfg.methods {
		if m != methodLimit || r.hasLimit() {
			out = append(out, m)
		}
	}
	return out
}

// limitRuns is 1 when the limit can run, for counting runs.
func (r *runner) limitRuns() int {
	if r.hasLimit() {
		return 1
	}
	return 0
}

// plannedRuns counts the measured runs of the selected sections, for the
// progress bar.
func (r *runner) plannedRuns() int {
	c := r.cfg
	n := 0
	if c.has(sectionThroughput) {
		n += c.rounds * len(c.workloads) * len(r.methods())
	}
	if c.has(sectionSwap) {
		n += c.rounds * 2
	}
	if c.has(sectionPublish) {
		n += c.rounds * len(c.publishBuckets)
	}
	if c.has(sectionScaling) {
		n += c.rounds * len(c.sizes) * (1 + r.limitRuns())
	}
	if c.has(sectionKnobs) {
		n += c.rounds * (len(c.batchSizes)*len(c.writers) + r.limitRuns())
	}
	if c.has(sectionCluster) {
		n += c.rounds * len(c.clusterRebuilders)
	}
	if c.has(sectionOnline) {
		n += c.rounds * 2
	}
	if c.has(sectionImpact) {
		n += c.rounds * 2
	}
	if c.has(sectionGenerations) {
		for _, b := range c.genBuckets {
			n += 2 * c.rounds // the raw baseline and Generations mode
			if b <= c.genRenameMax {
				n += c.rounds
			}
		}
		n += c.rounds * (len(genCPUModes) + 1 + 3*r.limitRuns()) // the CPU part: both modes, one without the size check, raw, limit, the two pipe methods
		n += c.rounds * 3                                        // the cluster part
	}
	return n
}

// workloads returns the throughput section's selected workloads.
func (r *runner) workloads() []workload {
	var out []workload
	for _, w := range allWorkloads(r.cfg.buckets) {
		if slices.Contains(r.cfg.workloads, w.name) {
			out = append(out, w)
		}
	}
	return out
}

// runOnce runs method m for w on d from a clean server, measures it, and
// verifies the result. resp is the limit's input; opts the keyswap
// Rebuilder's options. The run is round (from 0) of section, and label
// says what it runs, for the progress bar and the profile's name.
func (r *runner) runOnce(ctx context.Context, section string, round int, label string, m method, w workload, d dataset, resp respFile, opts rebuild.Options) (sample, error) {
	r.bar.describe("%s %d/%d: %s", section, round+1, r.cfg.rounds, label)
	c := r.srv.client
	if err := r.srv.reset(ctx); err != nil {
		return sample{}, err
	}
	var fn func() (*child, error)
	switch m {
	case methodLimit:
		fn = func() (*child, error) { return runLimit(ctx, r.cli, r.srv, resp) }
	case methodRaw:
		fn = func() (*child, error) { return nil, runRaw(ctx, c, w, d) }
	case methodNaive:
		fn = func() (*child, error) { return nil, runNaive(ctx, c, w, d) }
	case methodKeyswap, methodUnordered:
		opts.Unordered = opts.Unordered || m == methodUnordered
		if err := preload(ctx, c, w, d); err != nil {
			return sample{}, err
		}
		if err := r.srv.settle(ctx); err != nil {
			return sample{}, err
		}
		rb, err := rebuilder(c, w, opts)
		if err != nil {
			return sample{}, err
		}
		fn = func() (*child, error) { return nil, runKeyswap(ctx, rb, w, d) }
	}
	profile := ""
	if r.cfg.cpuProfile != "" && m != methodLimit {
		name := fmt.Sprintf("%s-%s-r%d.pprof", section, strings.NewReplacer(" ", "-", ",", "").Replace(label), round+1)
		profile = filepath.Join(r.cfg.cpuProfile, name)
	}
	s, err := measure(ctx, r.srv, d.n, profile, fn)
	if err != nil {
		return sample{}, fmt.Errorf("%s %s, %d entries: %w", w.name, m, d.n, err)
	}
	if err := w.verify(ctx, r.srv.admin, d); err != nil {
		return sample{}, fmt.Errorf("%s %s, %d entries: wrong result: %w", w.name, m, d.n, err)
	}
	r.bar.step()
	return s, nil
}

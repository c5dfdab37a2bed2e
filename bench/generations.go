package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

const (
	// genFamilyKey is the prefix of the generations section's SetIndex
	// family on the bench's own server.
	genFamilyKey = keyPrefix + "gfamily"
	// genWaitTimeout bounds the wait for the removal of a family's previous
	// data after a run.
	genWaitTimeout = 10 * time.Minute
	// genPollEvery is how often that wait looks.
	genPollEvery = 5 * time.Millisecond
)

// publishScriptNames are the scripts that publish a run: the rename
// publish, and the flip of Generations mode.
var publishScriptNames = []string{"publish", "flip"}

// generationsResult is the generations section: rename-in-place and
// Generations mode side by side on the same SetIndex families.
type generationsResult struct {
	Rounds int `json:"rounds"`
	// Grace is the Generations runs' rebuild.Options.Grace.
	Grace time.Duration `json:"grace_ns"`
	// Threshold is the shortest command SLOWLOG logged; a shorter publish
	// is timed by INFO commandstats.
	Threshold time.Duration `json:"slowlog_threshold_ns"`
	// RenameMax is the largest family rebuilt in rename mode.
	RenameMax int       `json:"rename_max_buckets"`
	Sizes     []genSize `json:"sizes"`
	CPU       *genCPU   `json:"cpu,omitempty"`
	// Cluster is nil without a cluster (no redis-server or redis-cli).
	Cluster *genClusterResult `json:"cluster,omitempty"`
}

// genSize is one family size: a run in each mode per round.
type genSize struct {
	Buckets int `json:"buckets"`
	Members int `json:"members_per_bucket"`
	Items   int `json:"items"`
	// Orphans is how many buckets of the live family the new data no
	// longer has.
	Orphans     int       `json:"orphans"`
	Rename      genSeries `json:"rename"` // no runs past RenameMax
	Generations genSeries `json:"generations"`
	// Raw is the baseline of the longest command: the same data written
	// by the raw method (no keyswap) into a server that holds the live
	// family, as the modes' runs do. Its runs have Longest and Published
	// (the write's wall time) only.
	Raw genSeries `json:"raw"`
	// Ratio is the median over rounds of the rename publish's server time
	// over the flip's in the same round; zero without rename runs.
	Ratio    float64 `json:"publish_ratio_median,omitempty"`
	RatioMin float64 `json:"publish_ratio_min,omitempty"`
	RatioMax float64 `json:"publish_ratio_max,omitempty"`
}

// genSeries is one mode's runs of one size.
type genSeries struct {
	Runs    []genRun   `json:"runs"`
	Summary genSummary `json:"summary"`
}

// genRun is one run onto a live family, and the removal of its previous
// data.
type genRun struct {
	// Publish is the publish script's execution time (the rename publish,
	// or the flip), from SLOWLOG; PublishCall its round trip.
	Publish     time.Duration `json:"publish_server_ns"`
	PublishCall time.Duration `json:"publish_call_ns"`
	// Elapsed is rebuild.Rebuilder.Run's, which in Generations mode waits
	// for the grace period and removes the previous generation; Published
	// is from its start to the publish's reply.
	Elapsed   time.Duration `json:"elapsed_ns"`
	Published time.Duration `json:"published_ns"`
	// Cleanup is from the publish's reply until the previous data is gone:
	// in Generations mode the previous generation's keys and its registry
	// field, in rename mode the background frees of the replaced values.
	Cleanup time.Duration `json:"cleanup_ns"`
	// AfterPublish is the longest command of the run's client after the
	// publish (the cleanup, the release), and Longest the longest of the
	// whole run, the publish and the cleanup included, from SLOWLOG:
	// commands shorter than the threshold are not there.
	AfterPublish commandTime `json:"after_publish_longest"`
	Longest      commandTime `json:"longest"`
	// Own is the longest of the run's commands other than its writes of
	// the index's data (slowEntry.Data): keyswap's scripts, transactions'
	// control writes, size reads, the removal's. A raw writer of the same
	// data has none of them.
	Own commandTime `json:"longest_own"`
}

// genSummary holds medians and ranges over rounds. For a command, Longest
// is the median of the rounds' longest calls, Max their maximum, and
// Command the name of that maximum's.
type genSummary struct {
	Publish      time.Duration `json:"publish_server_ns_median"`
	PublishMin   time.Duration `json:"publish_server_ns_min"`
	PublishMax   time.Duration `json:"publish_server_ns_max"`
	PerBucket    time.Duration `json:"publish_per_bucket_ns_median"`
	PublishCall  time.Duration `json:"publish_call_ns_median"`
	Elapsed      time.Duration `json:"elapsed_ns_median"`
	Published    time.Duration `json:"published_ns_median"`
	Cleanup      time.Duration `json:"cleanup_ns_median"`
	AfterPublish commandTime   `json:"after_publish_longest"`
	Longest      commandTime   `json:"longest"`
	Own          commandTime   `json:"longest_own"`
}

// genMembers returns the members per bucket of a family of buckets
// buckets: members, fewer if the family would hold more than maxItems
// items, and at least one.
func genMembers(buckets, members, maxItems int) int {
	return max(1, min(members, maxItems/buckets))
}

// renameEstimate returns, for a family of buckets buckets not rebuilt in
// rename mode, its rename publish's time extrapolated from the largest
// family of sizes that was, at its median time per bucket, and that
// family's size; zeros when none was.
func renameEstimate(sizes []genSize, buckets int) (time.Duration, int) {
	from := -1
	for i, sz := range sizes {
		if len(sz.Rename.Runs) > 0 && (from < 0 || sz.Buckets > sizes[from].Buckets) {
			from = i
		}
	}
	if from < 0 {
		return 0, 0
	}
	return sizes[from].Rename.Summary.PerBucket * time.Duration(buckets), sizes[from].Buckets
}

// genFamily is a SetIndex family of the generations section, on the
// bench's own server or on a cluster.
type genFamily struct {
	w       workload // one SetIndex target: the family
	cluster bool
	client  rueidis.Client // the Rebuilder's
	nodes   []*server      // every master, for SCAN and settle
}

func (f genFamily) prefix() string { return f.w.targets[0].key }

// current returns the family's current generation; ok is false without a
// pointer (the rename-in-place shape).
func (f genFamily) current(ctx context.Context) (gen int64, ok bool, err error) {
	c := f.client
	key := keys.PointerKey(f.prefix(), f.cluster)
	v, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("GET %s: %w", key, err)
	}
	if gen, err = strconv.ParseInt(v, 10, 64); err != nil {
		return 0, false, fmt.Errorf("pointer %s holds %q, not a generation", key, v)
	}
	return gen, true, nil
}

// dataPrefix returns the prefix of the family's buckets in generation gen,
// or in the rename-in-place shape when ok is false.
func (f genFamily) dataPrefix(gen int64, ok bool) string {
	if ok {
		return keys.GenPrefix(f.prefix(), gen)
	}
	return f.prefix() + ":"
}

// settle waits until no node frees anything in the background.
func (f genFamily) settle(ctx context.Context) error {
	for _, s := range f.nodes {
		if err := s.settle(ctx); err != nil {
			return err
		}
	}
	return nil
}

// reset empties every node.
func (f genFamily) reset(ctx context.Context) error {
	for _, s := range f.nodes {
		if err := s.reset(ctx); err != nil {
			return err
		}
	}
	return nil
}

// prepare empties the family's servers and makes d's previous dataset the
// live family, published in mode m with opts, and returns the generation a
// run will flip away from; had is false in the rename-in-place shape.
func (f genFamily) prepare(ctx context.Context, m genMode, opts rebuild.Options, d dataset) (old int64, had bool, err error) {
	if err := f.reset(ctx); err != nil {
		return 0, false, err
	}
	if err := f.preload(ctx, m, opts, d); err != nil {
		return 0, false, err
	}
	if err := f.settle(ctx); err != nil {
		return 0, false, err
	}
	return f.current(ctx)
}

// preload makes d's previous dataset the live family, published in mode m
// with opts: written directly in the rename-in-place shape, or by a run in
// Generations mode, whose generation then is the one flipped away from.
func (f genFamily) preload(ctx context.Context, m genMode, opts rebuild.Options, d dataset) error {
	if m == modeRename {
		return preload(ctx, f.client, f.w, d)
	}
	rb, err := rebuilder(f.client, f.w, opts)
	if err != nil {
		return err
	}
	if err := runKeyswap(ctx, rb, f.w, d.previous()); err != nil {
		return fmt.Errorf("preload: %w", err)
	}
	return f.waitRemoved(ctx, 0, false)
}

// waitRemoved waits until generation old of the family (if had) is
// removed: its registry field gone, which the sweep deletes once no key of
// it remains. Then it waits until no node frees anything in the
// background.
func (f genFamily) waitRemoved(ctx context.Context, old int64, had bool) error {
	if had {
		c := f.client
		reg, field := keys.RegistryKey(f.prefix(), f.cluster), strconv.FormatInt(old, 10)
		deadline := time.Now().Add(genWaitTimeout)
		for {
			there, err := c.Do(ctx, c.B().Hexists().Key(reg).Field(field).Build()).AsBool()
			if err != nil {
				return fmt.Errorf("HEXISTS %s %s: %w", reg, field, err)
			}
			if !there {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("generation %d of %s is still in its registry %v after the run", old, f.prefix(), genWaitTimeout)
			}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(genPollEvery):
			}
		}
	}
	return f.settle(ctx)
}

// allKeys returns every key of the bench on every node: under keyPrefix,
// and the keys a cluster's lock slot gives the family ("{" + prefix ...).
func (f genFamily) allKeys(ctx context.Context) ([]string, error) {
	var out []string
	for _, s := range f.nodes {
		for _, match := range []string{keys.GlobEscape(keyPrefix) + "*", keys.GlobEscape("{"+keyPrefix) + "*"} {
			ks, err := scanKeys(ctx, s.admin, match)
			if err != nil {
				return nil, err
			}
			out = append(out, ks...)
		}
	}
	return out, nil
}

// familyKeys sorts the keys found after a run of the family prefix whose
// current data keys start with data: its buckets, and the keys that should
// not be there (temp keys, locks, another generation's or shape's
// buckets). keyswap's records that outlive a run are neither: generation
// records, the pointer, the registry, the current generation's manifest,
// a cluster run's per-slot write counters, which expire with the run's
// record, and on a cluster the owner stamp of an untagged prefix's base.
func familyKeys(all []string, prefix, data string) (buckets, stray []string) {
	gen := strings.TrimSuffix(strings.TrimPrefix(data, prefix+keys.GenInfix), ":")
	manifest := func(k string) bool {
		for _, cluster := range []bool{false, true} {
			if k == keys.Base(prefix, cluster)+keys.ManifestInfix+gen || k == keys.Base(prefix, cluster)+keys.ManifestListInfix+gen {
				return true
			}
		}
		return false
	}
	// isBucket reports whether name, which follows data, names a bucket:
	// the bench's bucket names have no colon, and a bucket of the plain
	// shape is no key of keyswap's own (a lock, a temp key).
	isBucket := func(name string) bool {
		return name != "" && !strings.Contains(name, ":") && !keys.Reserved(prefix+":"+name)
	}
	for _, k := range all {
		switch {
		case isGeneration(k), strings.HasSuffix(k, keys.PointerSuffix), strings.HasSuffix(k, keys.RegistrySuffix),
			strings.Contains(k, ":rebuild-n:"), manifest(k), k == keys.OwnerKey(prefix, true):
		case strings.HasPrefix(k, data) && isBucket(k[len(data):]):
			buckets = append(buckets, k)
		default:
			stray = append(stray, k)
		}
	}
	return buckets, stray
}

// verify checks that the family holds exactly d in its current shape: the
// dataset's buckets, each with exactly its members, the first item present,
// the previous dataset's first item absent, and nothing else: no temp key,
// lock, or key of another generation or shape.
func (f genFamily) verify(ctx context.Context, d dataset) error {
	gen, ok, err := f.current(ctx)
	if err != nil {
		return err
	}
	data := f.dataPrefix(gen, ok)
	all, err := f.allKeys(ctx)
	if err != nil {
		return err
	}
	buckets, stray := familyKeys(all, f.prefix(), data)
	if len(stray) > 0 {
		slices.Sort(stray)
		return fmt.Errorf("%d keys left besides the family's %s*: %s", len(stray), data, firstKeys(stray))
	}
	want := make(map[string]int, d.bucketCount())
	for j, b := range d.buckets[:d.bucketCount()] {
		want[data+b] = d.bucketSize(j)
	}
	if len(buckets) != len(want) {
		return fmt.Errorf("%d buckets under %s, want %d", len(buckets), data, len(want))
	}
	c := f.client
	for chunk := range slices.Chunk(buckets, 10_000) {
		cmds := make(rueidis.Commands, len(chunk))
		for i, k := range chunk {
			cmds[i] = c.B().Scard().Key(k).Build()
		}
		for i, res := range c.DoMulti(ctx, cmds...) {
			n, err := res.AsInt64()
			if err != nil {
				return fmt.Errorf("SCARD %s: %w", chunk[i], err)
			}
			if w, there := want[chunk[i]]; !there || n != int64(w) {
				return fmt.Errorf("bucket %s holds %d members, want %d", chunk[i], n, w)
			}
		}
	}
	first, gone := d.item(0), d.previous().item(0)
	for _, x := range []struct {
		it   item
		want bool
	}{{first, true}, {gone, false}} {
		key := data + x.it.bucket
		got, err := c.Do(ctx, c.B().Sismember().Key(key).Member(x.it.member).Build()).AsBool()
		if err != nil {
			return fmt.Errorf("SISMEMBER %s: %w", key, err)
		}
		if got != x.want {
			return fmt.Errorf("SISMEMBER %s %s = %v, want %v", key, x.it.member, got, x.want)
		}
	}
	return nil
}

// checkGenStats checks a family run's stats: every item seen and written.
func checkGenStats(stats rebuild.Stats, w workload, d dataset) error {
	key := w.targets[0].key
	if stats.Items != int64(d.n) || stats.Entries[key] != int64(d.n) {
		return fmt.Errorf("keyswap: the run saw %d items and wrote %d entries, want %d", stats.Items, stats.Entries[key], d.n)
	}
	return nil
}

// scriptHook is the client a Rebuilder of the generations section writes
// through: it passes every command on, and runs the publish scripts
// (EVALSHA, or the EVAL fallback) inside around.
type scriptHook struct {
	rueidis.Client
	scripts []redistest.Script
	around  func(do func())
}

// Do runs cmd, inside around when it is one of h's scripts.
func (h *scriptHook) Do(ctx context.Context, cmd rueidis.Completed) (res rueidis.RedisResult) {
	args := cmd.Commands()
	for _, s := range h.scripts {
		if s.Is(args) {
			h.around(func() { res = h.Client.Do(ctx, cmd) })
			return res
		}
	}
	return h.Client.Do(ctx, cmd)
}

// timePublish returns c, through which the publish scripts' replies set
// *at to the time they came.
func timePublish(c rueidis.Client, at *time.Time) (rueidis.Client, error) {
	scripts, err := keyswapScripts(context.Background(), nil, false)
	if err != nil {
		return nil, err
	}
	return &scriptHook{Client: c, scripts: publishScripts(scripts), around: func(do func()) {
		do()
		*at = time.Now()
	}}, nil
}

// publishScripts returns those of scripts that publish a run.
func publishScripts(scripts []script) []redistest.Script {
	var out []redistest.Script
	for _, s := range scripts {
		if slices.Contains(publishScriptNames, s.name) {
			out = append(out, redistest.ScriptNamed(s.name))
		}
	}
	return out
}

// isPublish reports whether a SLOWLOG command name is a publish script's.
func isPublish(command string) bool {
	for _, n := range publishScriptNames {
		if command == "EVALSHA "+n || command == "EVAL "+n {
			return true
		}
	}
	return false
}

// splitAtPublish reads a run's SLOWLOG entries, in the order the server ran
// them, mark being the ID of the newest entry when the publish replied:
// the publish script's time, if it was logged (EVALSHA's NOSCRIPT and then
// EVAL, if any, added); the longest command after the mark, the publish
// excluded; the longest of all; and the longest of those that are not
// writes of the index's data (slowEntry.Data).
func splitAtPublish(entries []slowEntry, mark int64) (publish time.Duration, logged bool, after, longest, own commandTime) {
	var later, owns []slowEntry
	for _, e := range entries {
		if !e.Data {
			owns = append(owns, e)
		}
		switch {
		case isPublish(e.Command):
			publish += e.Duration
			logged = true
		case e.ID > mark:
			later = append(later, e)
		}
	}
	if cts := longestByCommand(later); len(cts) > 0 {
		after = cts[0]
	}
	if cts := longestByCommand(entries); len(cts) > 0 {
		longest = cts[0]
	}
	if cts := longestByCommand(owns); len(cts) > 0 {
		own = cts[0]
	}
	return publish, logged, after, longest, own
}

// newestSlowlogID returns the ID of the newest SLOWLOG entry, or -1.
func (s *server) newestSlowlogID(ctx context.Context) (int64, error) {
	got, err := s.admin.Do(ctx, s.admin.B().SlowlogGet().Count(1).Build()).ToArray()
	if err != nil {
		return 0, fmt.Errorf("SLOWLOG GET 1: %w", err)
	}
	if len(got) == 0 {
		return -1, nil
	}
	id, _, _, _, _, err := parseSlowlogEntry(got[0])
	return id, err
}

// generations runs the generations section: the publish of families of
// each size in both modes, interleaved; the server and client CPU per
// entry of a family in both modes next to the limit and raw; and a family
// on a cluster, spread over its masters and on one.
func (r *runner) generations(ctx context.Context) (_ *generationsResult, err error) {
	cfg := r.cfg
	res := &generationsResult{Rounds: cfg.rounds, Grace: cfg.genGrace, Threshold: cfg.genSlowlog, RenameMax: cfg.genRenameMax}
	for _, n := range cfg.genBuckets {
		members := genMembers(n, cfg.genMembers, cfg.genMaxItems)
		d := familyDataset(n, members)
		res.Sizes = append(res.Sizes, genSize{Buckets: n, Members: members, Items: d.n, Orphans: d.orphans()})
		if n > cfg.genRenameMax {
			r.note("generations: the %s-bucket family was not rebuilt in rename mode (-gen-rename-max %s): its publish, one script renaming every bucket, would block the server for seconds, and past the client's timeout (rueidis' ConnWriteTimeout, 10 s by default) the run fails; the report extrapolates its time from the largest family rebuilt in rename mode", commas(n), commas(cfg.genRenameMax))
		}
	}
	if err := r.genPublish(ctx, res); err != nil {
		return nil, err
	}
	if res.CPU, err = r.genCPU(ctx); err != nil {
		return nil, fmt.Errorf("CPU: %w", err)
	}
	if res.Cluster, err = r.genCluster(ctx); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	return res, nil
}

// genPublish runs the publish part of the generations section into res.
func (r *runner) genPublish(ctx context.Context, res *generationsResult) (err error) {
	s := r.srv
	restore, err := r.saveSlowlog(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := restore(); err == nil {
			err = rerr
		}
	}()
	scripts, err := keyswapScripts(ctx, s.admin, true)
	if err != nil {
		return err
	}
	f := genFamily{w: workload{name: "family", title: "SetIndex family", targets: []target{{kindIndex, genFamilyKey}}},
		client: s.client, nodes: []*server{s}}
	for round := range r.cfg.rounds {
		for i := range res.Sizes {
			sz := &res.Sizes[i]
			d := familyDataset(sz.Buckets, sz.Members)
			r.bar.describe("generations %d/%d: raw, SetIndex of %s buckets", round+1, r.cfg.rounds, commas(sz.Buckets))
			run, err := r.genRawRun(ctx, f, d, scripts)
			if err != nil {
				return fmt.Errorf("raw, %s buckets: %w", commas(sz.Buckets), err)
			}
			sz.Raw.Runs = append(sz.Raw.Runs, run)
			r.bar.step()
			for _, m := range genModes {
				if m == modeRename && sz.Buckets > res.RenameMax {
					continue
				}
				r.bar.describe("generations %d/%d: %s, SetIndex of %s buckets", round+1, r.cfg.rounds, m, commas(sz.Buckets))
				run, err := r.genPublishRun(ctx, f, m, d, scripts)
				if err != nil {
					return fmt.Errorf("%s, %s buckets: %w", m, commas(sz.Buckets), err)
				}
				if m == modeRename {
					sz.Rename.Runs = append(sz.Rename.Runs, run)
				} else {
					sz.Generations.Runs = append(sz.Generations.Runs, run)
				}
				r.bar.step()
			}
		}
	}
	for i := range res.Sizes {
		res.Sizes[i].summarize()
	}
	return nil
}

// rawFamilyKey is the family the raw baseline writes: beside the live
// family, so that the server holds what it holds during a mode's run.
const rawFamilyKey = keyPrefix + "rawfamily"

// genRawRun is the baseline of the longest command for d: onto a server
// holding f's live family of d.previous() (in rename shape), the raw
// method writes d into another family, and SLOWLOG records its longest
// command, at the threshold of the modes' runs. What a raw writer's
// commands take there (a set's growth, the server's hash table resizing,
// the machine's other processes preempting the server) is not keyswap's.
func (r *runner) genRawRun(ctx context.Context, f genFamily, d dataset, scripts []script) (genRun, error) {
	if _, _, err := f.prepare(ctx, modeRename, r.genOptions(modeRename), d); err != nil {
		return genRun{}, err
	}
	w := workload{name: "rawfamily", title: "SetIndex family", targets: []target{{kindIndex, rawFamilyKey}}}
	watch, err := r.watchSlowlogOver(ctx, r.cfg.genSlowlog, scripts, benchClientName)
	if err != nil {
		return genRun{}, err
	}
	start := time.Now()
	err = runRaw(ctx, f.client, w, d)
	elapsed := time.Since(start)
	entries, werr := watch.stop(ctx)
	if err = errors.Join(err, werr); err != nil {
		return genRun{}, err
	}
	out := genRun{Elapsed: elapsed, Published: elapsed}
	if cts := longestByCommand(entries); len(cts) > 0 {
		out.Longest = cts[0]
	}
	return out, nil
}

// genOptions returns the options of the section's runs in mode m: the
// keyswap method's, with -gen-grace, and MaxKeys -1: the largest families
// are past the default bound on one publish's keys, which binds only the
// rename mode.
func (r *runner) genOptions(m genMode) rebuild.Options {
	opts := m.options(r.cfg.keyswap, r.cfg.genGrace)
	opts.MaxKeys = -1
	return opts
}

// genPublishRun rebuilds d in mode m onto a live family of d.previous()
// published in the same mode, waits until the previous data is removed,
// and measures the run's commands and the removal's from SLOWLOG.
func (r *runner) genPublishRun(ctx context.Context, f genFamily, m genMode, d dataset, scripts []script) (genRun, error) {
	s := r.srv
	opts := r.genOptions(m)
	old, had, err := f.prepare(ctx, m, opts, d)
	if err != nil {
		return genRun{}, err
	}
	var out genRun
	var published time.Time
	var herr error
	var script commandStat // the publish's INFO commandstats
	mark := int64(-1)
	calls := 0
	hooked := &scriptHook{Client: s.client, scripts: publishScripts(scripts), around: func(do func()) {
		// SLOWLOG has the publish when it takes the threshold or more;
		// INFO commandstats has it whatever its time, unless another
		// script ran at the same time. Logging every command during the
		// publish would log every command the script runs, and slow it.
		calls++
		before, err := s.commandStats(ctx)
		t := time.Now()
		do()
		published = time.Now()
		out.PublishCall += published.Sub(t)
		after, aerr := s.commandStats(ctx)
		id, ierr := s.newestSlowlogID(ctx)
		if herr = errors.Join(herr, err, aerr, ierr); herr == nil {
			d := statsSince(after, before)
			script = commandStat{Calls: d["evalsha"].Calls + d["eval"].Calls, Usec: d["evalsha"].Usec + d["eval"].Usec}
			mark = id
		}
	}}
	rb, err := rebuilder(hooked, f.w, opts)
	if err != nil {
		return genRun{}, err
	}
	watch, err := r.watchSlowlogOver(ctx, r.cfg.genSlowlog, scripts, benchClientName)
	if err != nil {
		return genRun{}, err
	}
	start := time.Now()
	stats, err := rb.Run(ctx, sources.Seq(d.all()))
	out.Elapsed = time.Since(start)
	out.Published = published.Sub(start)
	if err == nil {
		err = f.waitRemoved(ctx, old, had)
		out.Cleanup = time.Since(published)
	}
	entries, werr := watch.stop(ctx)
	switch {
	case err != nil:
		return genRun{}, err
	case herr != nil:
		return genRun{}, herr
	case werr != nil:
		return genRun{}, werr
	case calls != 1:
		return genRun{}, fmt.Errorf("the publish script was sent %d times, want once", calls)
	}
	if err := checkGenStats(stats, f.w, d); err != nil {
		return genRun{}, err
	}
	if err := f.verify(ctx, d); err != nil {
		return genRun{}, fmt.Errorf("wrong result: %w", err)
	}
	var logged bool
	out.Publish, logged, out.AfterPublish, out.Longest, out.Own = splitAtPublish(entries, mark)
	if !logged {
		// Shorter than the threshold: INFO commandstats timed it, alone.
		if script.Calls != 1 {
			return genRun{}, fmt.Errorf("the publish took less than the slowlog threshold, and INFO commandstats counts %d scripts during it, want 1: another script ran", script.Calls)
		}
		out.Publish = time.Duration(script.Usec) * time.Microsecond
		if out.Publish > out.Longest.Longest {
			out.Longest = commandTime{Command: "EVALSHA publish", Longest: out.Publish, Calls: 1}
		}
		if out.Publish > out.Own.Longest {
			out.Own = commandTime{Command: "EVALSHA publish", Longest: out.Publish, Calls: 1}
		}
	}
	return out, nil
}

// summarize fills the summaries and ratios of sz from its runs.
func (sz *genSize) summarize() {
	sz.Rename.summarize(sz.Buckets)
	sz.Generations.summarize(sz.Buckets)
	sz.Raw.summarize(sz.Buckets)
	var ratios []float64
	for i, rn := range sz.Rename.Runs {
		if i < len(sz.Generations.Runs) && sz.Generations.Runs[i].Publish > 0 {
			ratios = append(ratios, float64(rn.Publish)/float64(sz.Generations.Runs[i].Publish))
		}
	}
	if len(ratios) > 0 {
		sz.Ratio, sz.RatioMin, sz.RatioMax = median(ratios), slices.Min(ratios), slices.Max(ratios)
	}
}

// summarize fills gs.Summary from its runs, of a family of buckets buckets.
func (gs *genSeries) summarize(buckets int) {
	if len(gs.Runs) == 0 {
		return
	}
	var pub, call, elapsed, published, cleanup []time.Duration
	var after, longest, own []commandTime
	for _, x := range gs.Runs {
		pub, call = append(pub, x.Publish), append(call, x.PublishCall)
		elapsed, cleanup = append(elapsed, x.Elapsed), append(cleanup, x.Cleanup)
		published = append(published, x.Published)
		after, longest = append(after, x.AfterPublish), append(longest, x.Longest)
		own = append(own, x.Own)
	}
	s := &gs.Summary
	s.Publish, s.PublishMin, s.PublishMax = medianDuration(pub), slices.Min(pub), slices.Max(pub)
	s.PerBucket = s.Publish / time.Duration(buckets)
	s.PublishCall, s.Elapsed, s.Cleanup = medianDuration(call), medianDuration(elapsed), medianDuration(cleanup)
	s.Published = medianDuration(published)
	s.AfterPublish, s.Longest, s.Own = medianCommand(after), medianCommand(longest), medianCommand(own)
}

// medianCommand summarizes the rounds' longest calls cts: the median of
// their times, and the maximum, with its command's name and arguments. A
// round without any command logged counts as zero.
func medianCommand(cts []commandTime) commandTime {
	var out commandTime
	var ds []time.Duration
	for _, ct := range cts {
		ds = append(ds, ct.Longest)
		if ct.Command != "" && (out.Command == "" || ct.Longest > out.Max) {
			out.Command, out.Max, out.Args = ct.Command, ct.Longest, ct.Args
		}
		out.Calls = max(out.Calls, ct.Calls)
	}
	out.Longest = medianDuration(ds)
	return out
}

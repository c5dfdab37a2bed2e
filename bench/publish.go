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
	ksrun "github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/keyswap/keyswap/store"
)

// familyKey is the prefix of the publish section's SetIndex family.
const familyKey = keyPrefix + "family"

// publishResult is the publish section: how long the publish of a SetIndex
// family keeps the server from serving anyone else, at several family
// sizes, and the longest of the run's other commands.
type publishResult struct {
	Rounds    int `json:"rounds"`
	PerBucket int `json:"members_per_bucket"`
	// TTL is the runs' lease (rebuild.Options.TTL).
	TTL time.Duration `json:"ttl_ns"`
	// Threshold is the shortest command SLOWLOG logged.
	Threshold time.Duration `json:"slowlog_threshold_ns"`
	// RefreshChunk is the most temp keys one refresh script renews
	// (internal/protocol.RefreshChunk).
	RefreshChunk int `json:"refresh_chunk"`
	// BusyThreshold is the server's busy-reply-threshold (lua-time-limit
	// before Redis 7): past it, the server answers every other command
	// with BUSY while a script runs. Zero is unknown.
	BusyThreshold time.Duration `json:"busy_reply_threshold_ns,omitempty"`
	Sizes         []publishSize `json:"sizes"`
}

// publishSize is one family size's runs.
type publishSize struct {
	Buckets int `json:"buckets"`
	Items   int `json:"items"`
	// Orphans is how many buckets of the live family the new data no
	// longer has, which the publish deletes.
	Orphans int            `json:"orphans"`
	Runs    []publishRun   `json:"runs"`
	Summary publishSummary `json:"summary"`
}

// publishRun is one keyswap run onto a live family.
type publishRun struct {
	// Publish is the publish script's execution time, from SLOWLOG.
	Publish time.Duration `json:"publish_server_ns"`
	// PublishCall is its round trip as the Rebuilder saw it.
	PublishCall time.Duration `json:"publish_call_ns"`
	// PublishKeys is how many keys the script was given.
	PublishKeys int `json:"publish_keys"`
	// Elapsed is the whole run, rebuild.Rebuilder.Run, the bench's
	// renewal excluded; Build its part before the publish was sent.
	Elapsed time.Duration `json:"elapsed_ns"`
	Build   time.Duration `json:"build_ns"`
	// Longest is the longest call of each of the run's commands other than
	// the publish, longest first, from SLOWLOG: commands shorter than
	// slowlogThreshold are not there.
	Longest []commandTime `json:"longest"`
	// Commands is the server's INFO commandstats during the run, the
	// bench's renewal excluded. It counts the commands that scripts run.
	Commands map[string]commandStat `json:"server_commands"`
	// Renewal is a renewal of the whole family, sent by the bench just
	// before the publish.
	Renewal renewal `json:"renewal"`
}

// renewal is what the lease's renewals cost once every bucket's temp key
// exists: the refresh of every temp key, in chunks of
// internal/protocol.RefreshChunk keys, one script each, then one heartbeat.
// Each script's time is the growth of INFO commandstats' EVALSHA time
// while it alone ran.
type renewal struct {
	Keys           int           `json:"keys"`
	Scripts        int           `json:"refresh_scripts"`
	RefreshLongest time.Duration `json:"refresh_longest_ns"`
	RefreshTotal   time.Duration `json:"refresh_total_ns"`
	Heartbeat      time.Duration `json:"heartbeat_ns"`
}

// publishSummary holds medians and ranges over rounds.
type publishSummary struct {
	Publish    time.Duration `json:"publish_server_ns_median"`
	PublishMin time.Duration `json:"publish_server_ns_min"`
	PublishMax time.Duration `json:"publish_server_ns_max"`
	// PerBucket is the median publish time per bucket of the new family.
	PerBucket   time.Duration `json:"publish_per_bucket_ns_median"`
	PublishCall time.Duration `json:"publish_call_ns_median"`
	PublishKeys int           `json:"publish_keys"`
	Elapsed     time.Duration `json:"elapsed_ns_median"`
	// BuildRate is items per second of the build, before the publish.
	BuildRate    float64 `json:"build_items_per_s_median"`
	BuildRateMin float64 `json:"build_items_per_s_min"`
	BuildRateMax float64 `json:"build_items_per_s_max"`
	// Longest is, for each command, the median over rounds of its longest
	// call in the round (over the rounds it ran in), with their maximum
	// and its most calls in one run; longest first. A shared machine that
	// deschedules the server stretches some calls: the median resists it.
	Longest []commandTime `json:"longest"`
	// Exec is the runs' MULTI/EXEC transactions: the median of their
	// calls, and of their mean time.
	ExecCalls int           `json:"exec_calls_median"`
	ExecMean  time.Duration `json:"exec_mean_ns_median"`
	// Renewal holds the medians of the rounds' renewals, RenewalMax their
	// maxima.
	Renewal    renewal `json:"renewal_median"`
	RenewalMax renewal `json:"renewal_max"`
}

// publishSection runs the publish section: in each round, a keyswap run
// onto a live family of each size.
func (r *runner) publishSection(ctx context.Context) (_ *publishResult, err error) {
	s := r.srv
	restore, err := r.saveSlowlog(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if rerr := restore(); err == nil {
			err = rerr
		}
	}()
	scripts, err := keyswapScripts(ctx, s.admin, true)
	if err != nil {
		return nil, err
	}
	renewer, err := s.newClient(renewalClientName)
	if err != nil {
		return nil, err
	}
	defer renewer.Close()

	cfg := r.cfg
	res := &publishResult{Rounds: cfg.rounds, PerBucket: cfg.publishMembers, TTL: ksrun.OrDefault(cfg.keyswap.TTL, rebuild.Defaults().TTL),
		Threshold: slowlogThreshold, RefreshChunk: ksrun.RefreshChunk}
	for _, name := range []string{"busy-reply-threshold", "lua-time-limit"} {
		if v, err := s.configGet(ctx, name); err == nil {
			ms, _ := strconv.ParseInt(v, 10, 64)
			res.BusyThreshold = time.Duration(ms) * time.Millisecond
			break
		}
	}
	for _, n := range cfg.publishBuckets {
		d := familyDataset(n, cfg.publishMembers)
		res.Sizes = append(res.Sizes, publishSize{Buckets: n, Items: d.n, Orphans: d.orphans()})
	}
	w := workload{name: "family", title: "SetIndex family", targets: []target{{kindIndex, familyKey}}}
	for round := range cfg.rounds {
		for i := range res.Sizes {
			sz := &res.Sizes[i]
			r.bar.describe("publish %d/%d: SetIndex of %s buckets", round+1, cfg.rounds, commas(sz.Buckets))
			pr, err := r.publishRun(ctx, w, familyDataset(sz.Buckets, cfg.publishMembers), scripts, ksrun.New(renewer, nil), res.TTL)
			if err != nil {
				return nil, fmt.Errorf("%s buckets: %w", commas(sz.Buckets), err)
			}
			sz.Runs = append(sz.Runs, pr)
			r.bar.step()
		}
	}
	for i := range res.Sizes {
		res.Sizes[i].summarize()
	}
	return res, nil
}

// publishRun rebuilds d onto a live family of d.previous() and measures
// the run's commands. renewer sends the renewal of the whole family, with
// lease ttl, before the publish.
func (r *runner) publishRun(ctx context.Context, w workload, d dataset, scripts []script, renewer *ksrun.Redis, ttl time.Duration) (publishRun, error) {
	s := r.srv
	if err := s.reset(ctx); err != nil {
		return publishRun{}, err
	}
	if err := preload(ctx, s.client, w, d); err != nil {
		return publishRun{}, err
	}
	if err := s.settle(ctx); err != nil {
		return publishRun{}, err
	}
	var out publishRun
	var sent time.Time
	var renewed map[string]commandStat // the renewal's commandstats
	var renewTime time.Duration
	var herr error
	calls := 0
	hooked := &publishHook{Client: s.client, around: func(args []string, do func()) {
		calls++
		if calls == 1 {
			sent = time.Now()
			out.Renewal, renewed, herr = r.renew(ctx, renewer, args, ttl)
			out.PublishKeys, _ = strconv.Atoi(args[2])
			renewTime = time.Since(sent)
		}
		t := time.Now()
		do()
		out.PublishCall += time.Since(t)
	}}
	opts := r.cfg.keyswap
	// The largest family (100,000 buckets and 10,000 stale ones) is past
	// the default bound on one publish's keys, which is what this section
	// measures.
	opts.MaxKeys = -1
	rb, err := rebuilder(hooked, w, opts)
	if err != nil {
		return publishRun{}, err
	}
	before, err := s.commandStats(ctx)
	if err != nil {
		return publishRun{}, err
	}
	watch, err := r.watchSlowlog(ctx, scripts, benchClientName)
	if err != nil {
		return publishRun{}, err
	}
	start := time.Now()
	stats, err := rb.Run(ctx, sources.Seq(d.all()))
	out.Elapsed = time.Since(start) - renewTime
	entries, werr := watch.stop(ctx)
	switch {
	case err != nil:
		return publishRun{}, err
	case herr != nil:
		return publishRun{}, fmt.Errorf("renewal before the publish: %w", herr)
	case werr != nil:
		return publishRun{}, werr
	case calls != 1:
		return publishRun{}, fmt.Errorf("the publish script was sent %d times, want once", calls)
	}
	after, err := s.commandStats(ctx)
	if err != nil {
		return publishRun{}, err
	}
	out.Commands = statsSince(statsSince(after, before), renewed)
	for name := range out.Commands {
		if strings.HasPrefix(name, "info") || strings.HasPrefix(name, "slowlog") || strings.HasPrefix(name, "config") {
			delete(out.Commands, name) // the bench's own
		}
	}
	out.Build = sent.Sub(start)
	if err := checkFamilyStats(stats, w, d); err != nil {
		return publishRun{}, err
	}
	if err := w.verify(ctx, s.admin, d); err != nil {
		return publishRun{}, fmt.Errorf("wrong result: %w", err)
	}
	if err := out.account(entries); err != nil {
		return publishRun{}, err
	}
	return out, nil
}

// checkFamilyStats checks a family run's stats: every item seen and
// written, every bucket of d swapped, every orphan emptied.
func checkFamilyStats(stats rebuild.Stats, w workload, d dataset) error {
	key := w.targets[0].key
	if stats.Items != int64(d.n) || stats.Entries[key] != int64(d.n) {
		return fmt.Errorf("keyswap: the run saw %d items and wrote %d entries, want %d", stats.Items, stats.Entries[key], d.n)
	}
	swapped, emptied := 0, 0
	for _, o := range stats.Outcomes {
		switch o {
		case store.Swapped:
			swapped++
		case store.Emptied:
			emptied++
		}
	}
	if swapped != d.bucketCount() || emptied != d.orphans() {
		return fmt.Errorf("keyswap: %d buckets swapped and %d emptied, want %d and %d orphans", swapped, emptied, d.bucketCount(), d.orphans())
	}
	return nil
}

// account fills p from the run's SLOWLOG entries.
func (p *publishRun) account(entries []slowEntry) error {
	var others []slowEntry
	published := 0
	for _, e := range entries {
		if e.Command == "EVALSHA publish" || e.Command == "EVAL publish" {
			p.Publish += e.Duration // EVALSHA's NOSCRIPT, if any, then EVAL
			published++
			continue
		}
		others = append(others, e)
	}
	if published == 0 {
		return errors.New("the publish script is not in SLOWLOG")
	}
	p.Longest = longestByCommand(others)
	return nil
}

// renew renews the lease of the run whose publish has the arguments args
// (EVALSHA sha numkeys keys... args...), as its lease does: the refresh of
// every temp key, then a heartbeat, each script alone, timed by INFO
// commandstats. It checks that every temp key exists with a TTL, and
// returns the commandstats of the whole renewal.
//
// A run's lease refreshes its temp keys every TTL/3, which the bench's runs
// are too short to see with every bucket written: this is that refresh,
// just before the publish, when the family is complete.
func (r *runner) renew(ctx context.Context, rr *ksrun.Redis, args []string, ttl time.Duration) (renewal, map[string]commandStat, error) {
	lock, temps, err := publishLock(args, ttl)
	if err != nil {
		return renewal{}, nil, err
	}
	first, err := r.srv.commandStats(ctx)
	if err != nil {
		return renewal{}, nil, err
	}
	before := first
	// timed runs f, one script, and returns its execution time.
	timed := func(f func() error) (time.Duration, error) {
		if err := f(); err != nil {
			return 0, err
		}
		after, err := r.srv.commandStats(ctx)
		if err != nil {
			return 0, err
		}
		d := statsSince(after, before)
		before = after
		if n := d["evalsha"].Calls + d["eval"].Calls; n != 1 {
			return 0, fmt.Errorf("INFO commandstats counts %d scripts, want 1: another client runs scripts", n)
		}
		return time.Duration(d["evalsha"].Usec+d["eval"].Usec) * time.Microsecond, nil
	}
	out := renewal{Keys: len(temps)}
	for chunk := range slices.Chunk(temps, ksrun.RefreshChunk) {
		t, err := timed(func() error {
			states, err := rr.Lease.Refresh(ctx, lock, chunk, 2*ttl, nil)
			if err != nil {
				return err
			}
			for i, st := range states {
				if st != ksrun.TempAlive {
					return fmt.Errorf("refresh: temp key %s is %v, want %v", chunk[i], st, ksrun.TempAlive)
				}
			}
			return nil
		})
		if err != nil {
			return renewal{}, nil, err
		}
		out.Scripts++
		out.RefreshTotal += t
		out.RefreshLongest = max(out.RefreshLongest, t)
	}
	if out.Heartbeat, err = timed(func() error {
		_, err := rr.Lease.Beat(ctx, ksrun.Heartbeat{Locks: []*ksrun.Lock{lock}})
		return err
	}); err != nil {
		return renewal{}, nil, err
	}
	return out, statsSince(before, first), nil
}

// publishLock reads, from the arguments of a single-lock publish, its lock
// and its temp keys. The keys come in sections whose sizes are ARGV[2..5]:
// locks, records, receipts, temp keys (see internal/protocol's publish.lua).
func publishLock(args []string, ttl time.Duration) (*ksrun.Lock, []string, error) {
	bad := func(why string) (*ksrun.Lock, []string, error) {
		return nil, nil, fmt.Errorf("unexpected publish arguments (%s): the bench does not know this layout of internal/protocol's publish", why)
	}
	if len(args) < 3 {
		return bad("no key count")
	}
	numkeys, err := strconv.Atoi(args[2])
	if err != nil || numkeys < 0 || len(args) < 3+numkeys+5 {
		return bad("key count")
	}
	ks, argv := args[3:3+numkeys], args[3+numkeys:]
	var size [4]int // L, R, C, T
	for i := range size {
		if size[i], err = strconv.Atoi(argv[1+i]); err != nil || size[i] < 0 {
			return bad("section sizes")
		}
	}
	first := size[0] + size[1] + size[2]
	if size[0] != 1 || first+2*size[3] > numkeys {
		return bad("section sizes")
	}
	lockKey, temps := ks[0], ks[first:first+size[3]]
	live, ok := strings.CutSuffix(lockKey, keys.LockSuffix)
	if !ok || keys.LockKey(live, false) != lockKey {
		return bad("lock key " + lockKey)
	}
	for _, t := range temps {
		// A temp key's base is its live key: the lock's, or a bucket of it.
		if base, _, ok := keys.ParseCurrentTempKey(t); !ok || base != live && !strings.HasPrefix(base, live+":") {
			return bad("temp key " + t)
		}
	}
	return &ksrun.Lock{Live: live, Key: lockKey, Token: argv[0], TTL: ttl}, slices.Clone(temps), nil
}

// summarize fills sz.Summary from its runs.
func (sz *publishSize) summarize() {
	if len(sz.Runs) == 0 {
		return
	}
	var pub, call, elapsed, perBucket, execMean []time.Duration
	var rates, execCalls []float64
	var refresh, total, beat []time.Duration
	longest := map[string][]commandTime{}
	s := &sz.Summary
	for _, p := range sz.Runs {
		pub = append(pub, p.Publish)
		call = append(call, p.PublishCall)
		elapsed = append(elapsed, p.Elapsed)
		perBucket = append(perBucket, p.Publish/time.Duration(sz.Buckets))
		rates = append(rates, float64(sz.Items)/p.Build.Seconds())
		exec := p.Commands["exec"]
		execCalls = append(execCalls, float64(exec.Calls))
		execMean = append(execMean, time.Duration(exec.Usec)*time.Microsecond/time.Duration(max(exec.Calls, 1)))
		for _, ct := range p.Longest {
			longest[ct.Command] = append(longest[ct.Command], ct)
		}
		rn := p.Renewal
		refresh, total, beat = append(refresh, rn.RefreshLongest), append(total, rn.RefreshTotal), append(beat, rn.Heartbeat)
		s.Renewal.Keys, s.Renewal.Scripts = max(s.Renewal.Keys, rn.Keys), max(s.Renewal.Scripts, rn.Scripts)
		s.PublishKeys = max(s.PublishKeys, p.PublishKeys)
	}
	s.Publish, s.PublishMin, s.PublishMax = medianDuration(pub), slices.Min(pub), slices.Max(pub)
	s.PerBucket = medianDuration(perBucket)
	s.PublishCall = medianDuration(call)
	s.Elapsed = medianDuration(elapsed)
	s.BuildRate, s.BuildRateMin, s.BuildRateMax = median(rates), slices.Min(rates), slices.Max(rates)
	s.ExecCalls, s.ExecMean = int(median(execCalls)), medianDuration(execMean)
	s.RenewalMax = s.Renewal
	s.Renewal.RefreshLongest, s.RenewalMax.RefreshLongest = medianDuration(refresh), slices.Max(refresh)
	s.Renewal.RefreshTotal, s.RenewalMax.RefreshTotal = medianDuration(total), slices.Max(total)
	s.Renewal.Heartbeat, s.RenewalMax.Heartbeat = medianDuration(beat), slices.Max(beat)
	s.Longest = nil
	for _, cts := range longest {
		var ds []time.Duration
		m := commandTime{Command: cts[0].Command}
		for _, ct := range cts {
			ds = append(ds, ct.Longest)
			if ct.Longest >= m.Max {
				m.Max, m.Args = ct.Longest, ct.Args
			}
			m.Calls = max(m.Calls, ct.Calls)
		}
		m.Longest = medianDuration(ds)
		s.Longest = append(s.Longest, m)
	}
	sortCommandTimes(s.Longest)
}

package reliability

// The race suite (issue item 3): rebuilders, in goroutines and in a separate
// OS process, hammer the same keys while independent readers poll them.
// It checks the guarantees 1-3 and C43 (one rebuild at a time), C44 (a
// rebuild that lost its lock never publishes), C45 and C53+ (no partial or
// mixed publish), C35 and guarantee 5 (nothing leaks).
//
// # The generation model
//
// Each run that gets past its locks takes a generation number g from a
// counter (INCR, at the start of its source, so after its locks are taken)
// and rebuilds three keys under one hash tag, so that the same test runs on
// the cluster: a Hash, a SortedSet and a SetIndex family. Every entry of
// every key encodes g (hash values and set members "g<g>:<i>", scores
// g×10⁶+i, and a sentinel hash field "gen" = g), and the size of every key
// and the number of buckets of the family depend on g. So a reader that sees
// one generation complete knows it, and any gap, half-built key or mixture
// of two generations shows.
//
// Readers read every key in one read-only script (raceReadScript), so an
// observation is one instant of the server, and check that:
//   - every key is there (no gap, guarantee 1);
//   - every entry is of the generation of the hash's sentinel, and no
//     bucket of another generation's shape is left (no mixture, C53+);
//   - every key has exactly the size of that generation (no lost data, C45);
//   - g never decreases from one observation to the next (no stale publish,
//     guarantee 3), and every g seen is one whose run reported success (a
//     run that failed never published, C44, C45).
//
// # One lock holder at a time
//
// Each run marks, on the server, the interval in which it believes it holds
// the locks: it INCRs a "running" counter at the start of its source (after
// its locks were taken) and DECRs it just before its release script is sent
// (after its publish), seen by a rueidishook on its client. The INCR must
// return 1 and the DECR 0: a run that finds another inside its interval is
// an overlap. Redis serialises the counter, so the check needs no shared
// clock and holds across processes. It is sound: each marked interval lies
// inside the interval in which the server held that run's lock (from its
// SET NX to its compare-and-delete), so two marked intervals can overlap
// only if two runs held the lock at once, or one kept going after its lock
// expired, which the generous TTL here rules out and which the run would
// report as ErrLockLost anyway. Since runs enter one at a time, generations
// are published in increasing order, and the last live generation must be
// the highest one published.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"iter"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// soakFor is how long TestSoak (and, under -tags soak, TestSoakLong) runs.
// It is registered here, in a file without the build tag, so that
// `go test -run Soak -soak 10m ./reliability` works without -tags.
var soakFor = flag.Duration("soak", 0, "run TestSoak (and TestSoakLong under -tags soak) for this long; 0 means 20s (10m for TestSoakLong)")

// raceHelperEnv is the environment variable that makes the test binary,
// re-executed by the race suite, run TestHelperRebuilder as a rebuilder
// process. It holds the process's raceHelperConfig as JSON.
const raceHelperEnv = "KEYSWAP_RACE_HELPER"

// TestRaceHammer: eight rebuilders (seven goroutines and one separate OS
// process) hammer the same keys for 30 s on the standalone server, and for
// 10 s on the 3-master cluster (shorter, to bound CI time), while two
// readers poll them (C43, C44, C45, C53+, guarantees 1-3 and 5). The two
// deployments run at the same time. The test is not parallel with the rest
// of the package, so that its load does not skew the fault tests' timing.
func TestRaceHammer(t *testing.T) {
	for _, s := range []raceSetup{
		{deployment: "standalone", dur: 30 * time.Second},
		{deployment: "cluster", dur: 10 * time.Second},
	} {
		t.Run(s.deployment, func(t *testing.T) {
			t.Parallel()
			s.goroutines, s.processes, s.readers, s.scale = 7, 1, 2, 1
			s.opts = rebuild.Options{BatchSize: 50, Writers: 2, TTL: 10 * time.Second}
			f := raceRun(t, s, raceNewKeys(raceTag(t)))[0]
			t.Logf("%s\n%s\nof which the helper process: %d runs, %d published", raceFiguresHeader, f, f.helperRuns, f.helperPublished)
			if f.helperPublished == 0 {
				t.Errorf("the helper process published %d times in %d runs, want at least once: it did not take part", f.helperPublished, f.helperRuns)
			}
		})
	}
}

// TestRaceChecksCatchABrokenLock is the control of TestRaceHammer: with the
// lock broken on purpose (a hook deletes the locks before each acquire
// script, so every run takes them), the same checks must see overlapping
// lock holders. Without
// it, a hammer that reports zero overlaps would not show that the check can
// fail.
func TestRaceChecksCatchABrokenLock(t *testing.T) {
	t.Parallel()
	s := raceSetup{deployment: "standalone", dur: 3 * time.Second, goroutines: 4, readers: 1, scale: 1, breakLock: true,
		opts: rebuild.Options{BatchSize: 50, Writers: 2, TTL: 10 * time.Second}}
	f := raceHammer(t, s, raceNewKeys(raceTag(t)))[0]
	if f.overlaps == 0 {
		t.Errorf("overlaps with a broken lock: got 0 in %d runs, want some: the check cannot see two holders", f.runs)
	}
	t.Logf("with the lock broken: %d runs, %d published, %d failed, %d overlaps, %d stale, %d mixed, %d partial, %d leaked keys, %d wrong generation records",
		f.runs, f.published, f.failed, f.overlaps, f.stale, f.mixed, f.partial, f.leaked, f.wrongGenerations)
	for _, p := range f.problems[:min(len(f.problems), 8)] {
		t.Logf("for instance: %s", p)
	}
}

// TestRaceReaderSeesBadStates is the control of the readers' checks: states
// that a broken publish would leave (a missing key or bucket, entries of
// two generations, an orphan bucket, a missing entry) are written by hand,
// and the reader's verdict must name each.
func TestRaceReaderSeesBadStates(t *testing.T) {
	t.Parallel()
	c := env.Standalone.Client(t)
	ctx := t.Context()
	const g = 7 // 3 buckets
	for _, tc := range []struct {
		name string
		edit func(k raceKeys) rueidis.Completed // spoils generation g
		want string
	}{
		{"complete", nil, ""},
		{"no hash", func(k raceKeys) rueidis.Completed { return c.B().Del().Key(k.Hash).Build() }, "gap"},
		{"no sorted set", func(k raceKeys) rueidis.Completed { return c.B().Del().Key(k.Zset).Build() }, "gap"},
		{"no bucket", func(k raceKeys) rueidis.Completed { return c.B().Del().Key(k.bucket(1)).Build() }, "gap"},
		{"old hash value", func(k raceKeys) rueidis.Completed {
			return c.B().Hset().Key(k.Hash).FieldValue().FieldValue("f3", "g6:3").Build()
		}, "mixed"},
		{"old score", func(k raceKeys) rueidis.Completed {
			return c.B().Zadd().Key(k.Zset).ScoreMember().ScoreMember(6*raceScoreBase+3, "m3").Build()
		}, "mixed"},
		{"old member", func(k raceKeys) rueidis.Completed { return c.B().Sadd().Key(k.bucket(0)).Member("g6:0").Build() }, "mixed"},
		{"orphan bucket", func(k raceKeys) rueidis.Completed { return c.B().Sadd().Key(k.bucket(3)).Member("g7:3").Build() }, "mixed"},
		{"missing field", func(k raceKeys) rueidis.Completed { return c.B().Hdel().Key(k.Hash).Field("f0").Build() }, "partial"},
		{"missing member", func(k raceKeys) rueidis.Completed { return c.B().Srem().Key(k.bucket(2)).Member("g7:2").Build() }, "partial"},
		{"no sentinel", func(k raceKeys) rueidis.Completed { return c.B().Hdel().Key(k.Hash).Field("gen").Build() }, "partial"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Generation g, complete, by a real rebuild; then the edit.
			k := raceNewKeys(raceTag(t))
			raceFresh(t, c, k.Prefix)
			items := []raceItem{{G: g, I: -1}}
			for i := range k.size(g) {
				items = append(items, raceItem{G: g, I: i})
			}
			if _, err := redistest.Rebuilder(t, c, rebuild.Options{}, k.builders()...).Run(ctx, sources.Slice(items)); err != nil {
				t.Fatal(err)
			}
			if tc.edit != nil {
				if err := c.Do(ctx, tc.edit(k)).Error(); err != nil {
					t.Fatal(err)
				}
			}
			o, err := k.observe(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if kind, what := k.verdict(o); kind != tc.want {
				t.Errorf("verdict: got %q (%s), want %q", kind, what, tc.want)
			}
		})
	}
}

// TestRacePausedRebuilder: a rebuilder whose connection the proxy pauses,
// after it has written some batches, for longer than its TTL (2 s) loses its
// lease. A successor takes the lock and publishes. When the proxy lets the
// paused rebuilder's traffic through again, it fails with ErrLockLost and
// never publishes: the live keys stay the successor's generation, readers
// never see them go back, and its temp keys do not outlive their TTL (C15,
// C16+, C44, C34).
//
// This once failed now and then on a loaded machine (2 of 60 subtests of
// -race -count=15 with two test processes at once): the paused rebuilder
// returned the held batch's "MULTI: context deadline exceeded" alone,
// without ErrLockLost. The lease's watchdog is due a TTL after the last
// renewal was sent, the held write's deadline a TTL after the write was
// sent, milliseconds later, and a scheduling delay let the write's deadline
// fire first. The run now decides from the lease's own state: a write that
// fails once no heartbeat has reached Redis for a whole TTL reports the
// lost lease.
func TestRacePausedRebuilder(t *testing.T) {
	t.Parallel()
	for _, d := range raceDeployments() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			racePaused(t, d)
		})
	}
}

// TestSoak is the short soak (issue item 4) that CI runs: for 20 s, or as
// long as -soak says, two independent groups of three rebuilders and two
// readers per deployment rebuild bigger generations (1,000 to 4,000 items a
// key) on the standalone server and the cluster at once, and the figures
// are printed at the end (run with -v). TestSoakLong in soak_test.go, under
// -tags soak, is the long run.
func TestSoak(t *testing.T) {
	raceSoak(t, *soakFor, 20*time.Second)
}

// TestHelperRebuilder is not a test: it is the rebuilder process that the
// race suite starts by re-executing the test binary with raceHelperEnv set.
// It hammers the keys it is given for the given duration and writes its
// tally, as JSON, to the given file.
func TestHelperRebuilder(t *testing.T) {
	js := os.Getenv(raceHelperEnv)
	if js == "" {
		return // run as a test, it has nothing to do: it is a process's entry point
	}
	var cfg raceHelperConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		t.Fatalf("helper: %s: %v", raceHelperEnv, err)
	}
	client, err := raceClient(cfg.Addrs, cfg.Cluster)
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	defer client.Close()
	rb, err := newRaceRebuilder(client, cfg.Keys, rebuild.Options{BatchSize: cfg.BatchSize, Writers: cfg.Writers, TTL: cfg.TTL})
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	ctx := t.Context()
	if err := client.Do(ctx, client.B().Incr().Key(cfg.Keys.Ready).Build()).Error(); err != nil {
		t.Fatalf("helper: INCR %s: %v", cfg.Keys.Ready, err)
	}
	rb.hammer(ctx, time.Now().Add(cfg.Duration))
	js2, err := json.Marshal(&rb.tally)
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	if err := os.WriteFile(cfg.Out, js2, 0o600); err != nil {
		t.Fatalf("helper: %v", err)
	}
}

// raceHelperConfig is what the race suite passes to a helper process.
type raceHelperConfig struct {
	Addrs     []string
	Cluster   bool
	Keys      raceKeys
	Duration  time.Duration
	BatchSize int
	Writers   int
	TTL       time.Duration
	Out       string // the file the helper writes its raceTally to
}

// raceDeployment is a deployment of the package's env, by address, so that
// a helper process can connect to it too.
type raceDeployment struct {
	name    string
	cluster bool
	addrs   []string
}

func raceDeployments() []raceDeployment {
	return []raceDeployment{
		{name: "standalone", addrs: []string{env.Standalone.Addr}},
		{name: "cluster", cluster: true, addrs: env.Cluster.Addrs},
	}
}

func raceDeploymentNamed(name string) raceDeployment {
	for _, d := range raceDeployments() {
		if d.name == name {
			return d
		}
	}
	panic("keyswap: no deployment " + name)
}

// raceClient returns a new client of the deployment at addrs.
func raceClient(addrs []string, cluster bool) (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true, ForceSingleClient: !cluster})
}

// raceTestClient is raceClient for a test: it fails the test on error and
// closes the client when the test ends.
func raceTestClient(t *testing.T, d raceDeployment) rueidis.Client {
	t.Helper()
	c, err := raceClient(d.addrs, d.cluster)
	if err != nil {
		t.Fatalf("connect to %s: %v", d.name, err)
	}
	t.Cleanup(c.Close)
	return c
}

// raceTag returns the test's key prefix as a hash tag, so that every key of
// a race test shares one slot on the cluster.
func raceTag(t *testing.T) string {
	return "{" + strings.TrimSuffix(redistest.Prefix(t), ":") + "}:"
}

// raceFresh deletes every key under prefix, now and when the test ends, so
// that a test starts from nothing even when -count reruns it with the same
// prefix, and leaves nothing in the shared servers.
func raceFresh(t *testing.T, c rueidis.Client, prefix string) {
	t.Helper()
	del := func() {
		for _, k := range redistest.Keys(t, c, prefix) {
			if err := c.Do(context.Background(), c.B().Del().Key(k).Build()).Error(); err != nil {
				t.Errorf("DEL %s: %v", k, err)
			}
		}
	}
	del()
	t.Cleanup(del)
}

// --- The generation model ---

// raceItem is one source item of generation G: entry I, or the hash's
// sentinel field "gen" when I is -1.
type raceItem struct {
	G int64
	I int
}

const (
	// raceMaxBuckets is the most buckets a generation's family has.
	raceMaxBuckets = 4
	// raceScoreBase separates the generations' scores: entry i of
	// generation g scores g×raceScoreBase+i.
	raceScoreBase = 1_000_000
)

// raceKeys are the keys one group of race rebuilders rebuilds, all under
// one hash tag.
type raceKeys struct {
	Prefix  string // the hash-tagged prefix of every key below
	Hash    string // builders.Hash
	Zset    string // builders.SortedSet
	Index   string // builders.SetIndex prefix; buckets are Index+":b<j>"
	Gen     string // the generation counter
	Running string // the lock-holder counter (see the file comment)
	Ready   string // counts the helper processes ready to hammer
	Scale   int    // entries per generation are Scale × 100..399
}

func raceNewKeys(prefix string) raceKeys {
	return raceKeys{
		Prefix: prefix, Hash: prefix + "h", Zset: prefix + "z", Index: prefix + "idx",
		Gen: prefix + "gen", Running: prefix + "running", Ready: prefix + "ready", Scale: 1,
	}
}

// size is the number of entries of generation g: every key's size depends
// on g, so that a partial or mixed state cannot pass for a complete one.
func (k raceKeys) size(g int64) int { return k.Scale * (100 + int(g*37%300)) }

// buckets is the number of buckets of generation g's family: it changes
// with g, so that publishes also delete orphan buckets (C53+).
func raceBuckets(g int64) int { return 2 + int(g%3) }

// bucketSize is the size of bucket j of generation g.
func (k raceKeys) bucketSize(g int64, j int) int64 {
	n, nb := k.size(g), raceBuckets(g)
	return int64((n - j + nb - 1) / nb)
}

func (k raceKeys) bucket(j int) string { return k.Index + ":b" + strconv.Itoa(j) }

// builders returns the three builders of one generation.
func (k raceKeys) builders() []index.Builder[raceItem] {
	value := func(it raceItem) string { return "g" + strconv.FormatInt(it.G, 10) + ":" + strconv.Itoa(it.I) }
	return []index.Builder[raceItem]{
		builders.Hash(k.Hash, func(it raceItem) (string, string, bool) {
			if it.I < 0 {
				return "gen", strconv.FormatInt(it.G, 10), true
			}
			return "f" + strconv.Itoa(it.I), value(it), true
		}),
		builders.SortedSet(k.Zset, func(it raceItem) (string, float64, bool) {
			return "m" + strconv.Itoa(it.I), float64(it.G*raceScoreBase + int64(it.I)), it.I >= 0
		}),
		builders.SetIndex(k.Index, func(it raceItem) (string, string, bool) {
			if it.I < 0 {
				return "", "", false
			}
			return "b" + strconv.Itoa(it.I%raceBuckets(it.G)), value(it), true
		}),
	}
}

// raceReadScript reads every key of a generation in one atomic step, and
// checks every entry on the server, so that a reply stays small.
//
// KEYS[1] hash, KEYS[2] sorted set, KEYS[3..] every possible bucket.
// Returns {gen, hlen, hbad, zcard, zbad, scard_1, sbad_1, ...}: gen is the
// hash's sentinel field ("" when absent), and each *bad counts the entries
// that are not of that generation.
var raceReadScript = rueidis.NewLuaScriptReadOnly(`
local gen = redis.call('HGET', KEYS[1], 'gen') or ''
local g = tonumber(gen) or -1
local pfx = 'g' .. gen .. ':'
local function foreign(v)
  if string.sub(v, 1, #pfx) ~= pfx then return 1 end
  return 0
end
local h = redis.call('HGETALL', KEYS[1])
local hbad = 0
for i = 1, #h, 2 do
  if h[i] ~= 'gen' then hbad = hbad + foreign(h[i + 1]) end
end
local z = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local zbad = 0
for i = 2, #z, 2 do
  if math.floor(tonumber(z[i]) / 1000000) ~= g then zbad = zbad + 1 end
end
local out = {gen, #h / 2, hbad, #z / 2, zbad}
for k = 3, #KEYS do
  local m = redis.call('SMEMBERS', KEYS[k])
  local bad = 0
  for _, v in ipairs(m) do bad = bad + foreign(v) end
  out[#out + 1] = #m
  out[#out + 1] = bad
end
return out
`)

// raceObservation is one atomic read of a generation's keys.
type raceObservation struct {
	gen         int64 // the hash's sentinel, -1 when absent
	hlen, hbad  int64
	zcard, zbad int64
	scard, sbad [raceMaxBuckets]int64
}

// observe reads the keys of k in one script.
func (k raceKeys) observe(ctx context.Context, c rueidis.Client) (raceObservation, error) {
	ks := []string{k.Hash, k.Zset}
	for j := range raceMaxBuckets {
		ks = append(ks, k.bucket(j))
	}
	arr, err := raceReadScript.Exec(ctx, c, ks, nil).ToArray()
	if err != nil {
		return raceObservation{}, err
	}
	if len(arr) != 5+2*raceMaxBuckets {
		return raceObservation{}, fmt.Errorf("read script: got %d replies, want %d", len(arr), 5+2*raceMaxBuckets)
	}
	var o raceObservation
	gen, err := arr[0].ToString()
	if err != nil {
		return o, err
	}
	o.gen = -1
	if gen != "" {
		if o.gen, err = strconv.ParseInt(gen, 10, 64); err != nil {
			return o, fmt.Errorf("sentinel field gen %q: %w", gen, err)
		}
	}
	ints := make([]int64, len(arr)-1)
	for i, m := range arr[1:] {
		if ints[i], err = m.AsInt64(); err != nil {
			return o, err
		}
	}
	o.hlen, o.hbad, o.zcard, o.zbad = ints[0], ints[1], ints[2], ints[3]
	for j := range raceMaxBuckets {
		o.scard[j], o.sbad[j] = ints[4+2*j], ints[5+2*j]
	}
	return o, nil
}

// verdict classifies o: "" when it is one complete generation, otherwise
// "gap", "mixed" or "partial", with what is wrong.
func (k raceKeys) verdict(o raceObservation) (kind, what string) {
	g := o.gen
	switch {
	case o.hlen == 0:
		return "gap", "the hash is missing"
	case g < 0:
		return "partial", fmt.Sprintf("the hash has %d fields but no sentinel", o.hlen)
	case o.zcard == 0:
		return "gap", fmt.Sprintf("generation %d: the sorted set is missing", g)
	}
	nb := raceBuckets(g)
	for j := range nb {
		if o.scard[j] == 0 {
			return "gap", fmt.Sprintf("generation %d: bucket %s is missing", g, k.bucket(j))
		}
	}
	if o.hbad > 0 || o.zbad > 0 {
		return "mixed", fmt.Sprintf("generation %d: %d hash values and %d scores of another generation", g, o.hbad, o.zbad)
	}
	for j := range raceMaxBuckets {
		if o.sbad[j] > 0 {
			return "mixed", fmt.Sprintf("generation %d: %d members of another generation in %s", g, o.sbad[j], k.bucket(j))
		}
		if j >= nb && o.scard[j] > 0 {
			return "mixed", fmt.Sprintf("generation %d has %d buckets, but %s (an orphan) is live", g, nb, k.bucket(j))
		}
	}
	n := int64(k.size(g))
	if o.hlen != n+1 || o.zcard != n {
		return "partial", fmt.Sprintf("generation %d: HLEN %d, ZCARD %d, want %d and %d", g, o.hlen, o.zcard, n+1, n)
	}
	for j := range nb {
		if want := k.bucketSize(g, j); o.scard[j] != want {
			return "partial", fmt.Sprintf("generation %d: SCARD %s %d, want %d", g, k.bucket(j), o.scard[j], want)
		}
	}
	return "", ""
}

// --- Rebuilders ---

// raceTally is what one rebuilder did. It is JSON, so that a helper process
// can report it.
type raceTally struct {
	Runs       int64    // Run calls
	Published  int64    // successful runs
	Conflicts  int64    // runs refused with ErrInProgress
	Failed     int64    // runs that failed otherwise
	Overlaps   int64    // lock-holding intervals that overlapped another
	Gens       []int64  // the generations of the successful runs
	FailedGens []int64  // the generations of runs that failed after taking their locks
	Problems   []string // the first few failures and overlaps
	Durations  raceHist // of successful runs
}

func (t *raceTally) problem(format string, args ...any) {
	if len(t.Problems) < 10 {
		t.Problems = append(t.Problems, fmt.Sprintf(format, args...))
	}
}

func (t *raceTally) merge(o *raceTally) {
	t.Runs += o.Runs
	t.Published += o.Published
	t.Conflicts += o.Conflicts
	t.Failed += o.Failed
	t.Overlaps += o.Overlaps
	t.Gens = append(t.Gens, o.Gens...)
	t.FailedGens = append(t.FailedGens, o.FailedGens...)
	for _, p := range o.Problems {
		t.problem("%s", p)
	}
	t.Durations.merge(&o.Durations)
}

// raceRebuilder is one contender: its own client, wrapped in a hook that
// marks the end of its lock-holding interval, and its tally. Its runs are
// sequential.
type raceRebuilder struct {
	keys   raceKeys
	client rueidis.Client // hooked
	r      *rebuild.Rebuilder[raceItem]

	inside atomic.Bool // between the INCR and the DECR of keys.Running
	mu     sync.Mutex  // guards tally against the hook's goroutine
	tally  raceTally
	gen    int64 // the generation of the current run, 0 before it has one
}

func newRaceRebuilder(client rueidis.Client, keys raceKeys, opts rebuild.Options) (*raceRebuilder, error) {
	// The release script's sending marks the end of a run's lock-holding
	// interval.
	release := redistest.ScriptNamed("release")
	rb := &raceRebuilder{keys: keys}
	isRelease := func(cmd rueidis.Completed) bool { return release.Is(cmd.Commands()) }
	rb.client = rueidishook.WithHook(client, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			if isRelease(cmd) {
				rb.leave(ctx, c)
			}
			return c.Do(ctx, cmd)
		},
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			if slices.ContainsFunc(multi, isRelease) {
				rb.leave(ctx, c)
			}
			return c.DoMulti(ctx, multi...)
		},
	})
	r, err := rebuild.New(rb.client, opts, keys.builders()...)
	if err != nil {
		return nil, err
	}
	rb.r = r
	return rb, nil
}

// leave ends the run's lock-holding interval, if it is inside one: the DECR
// must find no other run inside.
func (rb *raceRebuilder) leave(ctx context.Context, c rueidis.Client) {
	if !rb.inside.Swap(false) {
		return // a release after a failed acquire: the run never entered
	}
	n, err := c.Do(context.WithoutCancel(ctx), c.B().Decr().Key(rb.keys.Running).Build()).AsInt64()
	rb.mu.Lock()
	defer rb.mu.Unlock()
	switch {
	case err != nil:
		rb.tally.Overlaps++ // unknown: count it, so that it is seen
		rb.tally.problem("generation %d: DECR %s: %v", rb.gen, rb.keys.Running, err)
	case n != 0:
		rb.tally.Overlaps++
		rb.tally.problem("generation %d: DECR %s at the end of the run: got %d, want 0: another run was inside", rb.gen, rb.keys.Running, n)
	}
}

// source is a run's source: it enters the lock-holding interval, takes a
// generation, and yields that generation's items.
func (rb *raceRebuilder) source(ctx context.Context) iter.Seq2[raceItem, error] {
	return func(yield func(raceItem, error) bool) {
		c := rb.client
		res := c.DoMulti(ctx, c.B().Incr().Key(rb.keys.Running).Build(), c.B().Incr().Key(rb.keys.Gen).Build())
		running, err := res[0].AsInt64()
		if err != nil {
			yield(raceItem{}, fmt.Errorf("INCR %s: %w", rb.keys.Running, err))
			return
		}
		rb.inside.Store(true)
		g, err := res[1].AsInt64()
		if err != nil {
			yield(raceItem{}, fmt.Errorf("INCR %s: %w", rb.keys.Gen, err))
			return
		}
		rb.gen = g
		if running != 1 {
			rb.mu.Lock()
			rb.tally.Overlaps++
			rb.tally.problem("generation %d: INCR %s at the start of the run: got %d, want 1: another run was inside", g, rb.keys.Running, running)
			rb.mu.Unlock()
		}
		if !yield(raceItem{G: g, I: -1}, nil) {
			return
		}
		for i := range rb.keys.size(g) {
			if !yield(raceItem{G: g, I: i}, nil) {
				return
			}
		}
	}
}

// run runs one rebuild and tallies it. It reports whether it published.
func (rb *raceRebuilder) run(ctx context.Context) (bool, error) {
	rb.gen = 0
	start := time.Now()
	_, err := rb.r.Run(ctx, sources.Seq2(rb.source(ctx)))
	took := time.Since(start)
	if rb.inside.Load() {
		// The hook never saw the release: the interval is still open.
		rb.leave(ctx, rb.client)
		rb.mu.Lock()
		rb.tally.problem("generation %d: the run ended without the hook seeing its release script; did the release script change how it is sent?", rb.gen)
		rb.mu.Unlock()
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	t := &rb.tally
	t.Runs++
	switch {
	case err == nil:
		t.Published++
		t.Gens = append(t.Gens, rb.gen)
		t.Durations.add(took)
		return true, nil
	case errors.Is(err, rebuild.ErrInProgress) && !errors.Is(err, rebuild.ErrLockLost) && rb.gen == 0:
		t.Conflicts++
	default:
		t.Failed++
		if rb.gen != 0 {
			t.FailedGens = append(t.FailedGens, rb.gen)
		}
		t.problem("generation %d: %v", rb.gen, err)
	}
	return false, err
}

// hammer runs rebuilds back to back until until.
func (rb *raceRebuilder) hammer(ctx context.Context, until time.Time) {
	for ctx.Err() == nil && time.Now().Before(until) {
		_, _ = rb.run(ctx) // tallied
	}
}

// --- Readers ---

// raceReader polls the keys and records what it saw.
type raceReader struct {
	keys   raceKeys
	client rueidis.Client

	n, gaps, mixed, partial, stale, errs int64
	last                                 int64 // the highest generation seen
	seen                                 map[int64]bool
	problems                             []string
	latency                              raceHist
}

func (r *raceReader) problem(format string, args ...any) {
	if len(r.problems) < 10 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

// poll reads until ctx is done.
func (r *raceReader) poll(ctx context.Context) {
	r.seen = map[int64]bool{}
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		start := time.Now()
		o, err := r.keys.observe(rctx, r.client)
		took := time.Since(start)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.errs++
				r.problem("read: %v", err)
			}
			continue
		}
		r.n++
		r.latency.add(took)
		kind, what := r.keys.verdict(o)
		switch kind {
		case "gap":
			r.gaps++
		case "mixed":
			r.mixed++
		case "partial":
			r.partial++
		}
		if kind != "" {
			r.problem("observation %d: %s: %s", r.n, kind, what)
			continue
		}
		if o.gen < r.last {
			r.stale++
			r.problem("observation %d: generation %d after %d: a stale publish", r.n, o.gen, r.last)
			continue
		}
		r.last = o.gen
		r.seen[o.gen] = true
	}
}

// --- The hammer ---

// raceSetup is one hammer: who rebuilds which keys, for how long.
type raceSetup struct {
	deployment string
	dur        time.Duration
	goroutines int // rebuilders in this process
	processes  int // rebuilder processes
	readers    int
	scale      int
	opts       rebuild.Options
	breakLock  bool // for the control test only: see raceBreakLock
}

// raceFigures is what a hammer measured.
type raceFigures struct {
	deployment, keys                   string
	dur                                time.Duration
	rebuilders, processes, readers     int
	runs, published, conflicts, failed int64
	helperRuns, helperPublished        int64
	observations, gaps, mixed, partial int64
	stale, phantom, overlaps, leaked   int64
	readErrors, wrongGenerations       int64
	runP50, runP99, readP50, readP99   time.Duration
	finalGen, maxGen                   int64
	runDurations, readLatency          raceHist
	helperOutput                       string
	problems                           []string // every violation found
}

func (f *raceFigures) problem(format string, args ...any) {
	f.problems = append(f.problems, fmt.Sprintf(format, args...))
}

const raceFiguresHeader = "deployment | keys | duration | rebuilders (processes) | readers | runs | published | conflicts | failed | observations | gaps | mixed | lost data | stale | leaked | lock overlaps | run p50/p99 | read p50/p99"

func (f raceFigures) String() string {
	return fmt.Sprintf("%s | %s | %v | %d (%d) | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %v / %v | %v / %v",
		f.deployment, f.keys, f.dur.Round(time.Second), f.rebuilders, f.processes, f.readers, f.runs, f.published, f.conflicts, f.failed,
		f.observations, f.gaps, f.mixed, f.partial, f.stale+f.phantom, f.leaked, f.overlaps,
		f.runP50.Round(10*time.Microsecond), f.runP99.Round(10*time.Microsecond),
		f.readP50.Round(time.Microsecond), f.readP99.Round(time.Microsecond))
}

// check reports every count that must be zero and is not.
func (f raceFigures) check(t *testing.T) {
	t.Helper()
	for _, c := range []struct {
		what string
		n    int64
	}{
		{"failed runs (errors other than ErrInProgress)", f.failed},
		{"lock-holding overlaps", f.overlaps},
		{"gaps", f.gaps},
		{"mixed states", f.mixed},
		{"partial states (lost data)", f.partial},
		{"stale publishes", f.stale},
		{"generations seen that no successful run published", f.phantom},
		{"leaked keys", f.leaked},
		{"wrong generation records", f.wrongGenerations},
		{"read errors", f.readErrors},
	} {
		if c.n != 0 {
			t.Errorf("%s: %s: got %d, want 0", f.deployment, c.what, c.n)
		}
	}
	for i, p := range f.problems {
		if i == 20 {
			t.Errorf("%s: and %d more problems", f.deployment, len(f.problems)-i)
			break
		}
		t.Errorf("%s: %s", f.deployment, p)
	}
	if f.published == 0 || f.observations == 0 {
		t.Errorf("%s: got %d publishes and %d observations, want some of each", f.deployment, f.published, f.observations)
	}
}

// raceRun runs one hammer on each group of keys at once, checks
// everything, and returns the figures of each group. Failures are reported
// on t.
func raceRun(t *testing.T, s raceSetup, groups ...raceKeys) []raceFigures {
	t.Helper()
	fs := raceHammer(t, s, groups...)
	for _, f := range fs {
		f.check(t)
		if t.Failed() && f.helperOutput != "" {
			t.Logf("helper process output:\n%s", f.helperOutput)
		}
	}
	return fs
}

// raceGroup is one group of rebuilders and readers on one set of keys.
type raceGroup struct {
	keys       raceKeys
	rebuilders []*raceRebuilder
	helpers    []*raceHelper
	readers    []*raceReader
}

// raceHammer runs s on each group of keys at once: it seeds each group's
// keys with a first generation, starts the helper processes and waits until
// they are ready, then runs the goroutine rebuilders and readers for s.dur,
// and gathers the figures of each group. It reports only setup failures on
// t; the figures carry every violation.
func raceHammer(t *testing.T, s raceSetup, keys ...raceKeys) []raceFigures {
	t.Helper()
	d := raceDeploymentNamed(s.deployment)
	ctx, cancel := context.WithTimeout(t.Context(), s.dur+2*time.Minute)
	defer cancel()
	admin := raceTestClient(t, d)
	begin := time.Now() // before the seed runs: every publish is later

	groups := make([]*raceGroup, len(keys))
	for gi, k := range keys {
		raceFresh(t, admin, k.Prefix)
		k.Scale = s.scale
		g := &raceGroup{keys: k, rebuilders: make([]*raceRebuilder, s.goroutines), helpers: make([]*raceHelper, s.processes)}
		for i := range g.rebuilders {
			c := raceTestClient(t, d)
			if s.breakLock {
				c = raceBreakLock(c)
			}
			rb, err := newRaceRebuilder(c, k, s.opts)
			if err != nil {
				t.Fatal(err)
			}
			g.rebuilders[i] = rb
		}
		// The first generation, so that readers have something from the
		// start.
		if ok, err := g.rebuilders[0].run(ctx); !ok {
			t.Fatalf("seed run of %s: %v", k.Prefix, err)
		}
		for i := range g.helpers {
			g.helpers[i] = raceStartHelper(t, d, k, s, fmt.Sprintf("%d-%d", gi, i))
		}
		for range s.readers {
			g.readers = append(g.readers, &raceReader{keys: k, client: raceTestClient(t, d)})
		}
		groups[gi] = g
	}
	for _, g := range groups {
		raceWaitReady(t, ctx, admin, g.keys, g.helpers)
	}

	rctx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()
	var rwg, wg sync.WaitGroup
	until := time.Now().Add(s.dur)
	for _, g := range groups {
		for _, r := range g.readers {
			rwg.Go(func() { r.poll(rctx) })
		}
		for _, rb := range g.rebuilders {
			wg.Go(func() { rb.hammer(ctx, until) })
		}
	}
	wg.Wait()
	var helperTallies [][]*raceTally
	for _, g := range groups {
		var ts []*raceTally
		for _, h := range g.helpers {
			ts = append(ts, h.wait(t, s.dur+time.Minute))
		}
		helperTallies = append(helperTallies, ts)
	}
	stopReaders()
	rwg.Wait()

	fs := make([]raceFigures, len(groups))
	for i, g := range groups {
		fs[i] = raceGather(t, ctx, admin, s, g, helperTallies[i], genWindow{from: begin, to: time.Now()})
	}
	return fs
}

// raceGather checks the outcome of one group's hammer, whose publishes all
// ran within w, and returns its figures.
func raceGather(t *testing.T, ctx context.Context, admin rueidis.Client, s raceSetup, g *raceGroup, helpers []*raceTally, w genWindow) raceFigures {
	t.Helper()
	keys := g.keys
	f := raceFigures{deployment: s.deployment, keys: keys.Prefix, dur: s.dur, rebuilders: s.goroutines + s.processes,
		processes: s.processes, readers: s.readers}
	var all raceTally
	for _, rb := range g.rebuilders {
		all.merge(&rb.tally)
	}
	for i, ht := range helpers {
		f.helperRuns += ht.Runs
		f.helperPublished += ht.Published
		all.merge(ht)
		f.helperOutput += g.helpers[i].output.String()
	}

	f.runs, f.published, f.conflicts, f.failed, f.overlaps = all.Runs, all.Published, all.Conflicts, all.Failed, all.Overlaps
	f.runDurations = all.Durations
	f.runP50, f.runP99 = all.Durations.quantile(0.5), all.Durations.quantile(0.99)
	for _, p := range all.Problems {
		f.problem("rebuilder: %s", p)
	}
	published := map[int64]bool{}
	for _, gen := range all.Gens {
		if published[gen] {
			f.problem("generation %d published twice", gen)
		}
		published[gen] = true
		f.maxGen = max(f.maxGen, gen)
	}
	for _, r := range g.readers {
		f.observations += r.n
		f.gaps += r.gaps
		f.mixed += r.mixed
		f.partial += r.partial
		f.stale += r.stale
		f.readErrors += r.errs
		f.readLatency.merge(&r.latency)
		for gen := range r.seen {
			if !published[gen] {
				f.phantom++
				f.problem("a reader saw generation %d, which no successful run published (failed runs: %v)", gen, all.FailedGens)
			}
		}
		for _, p := range r.problems {
			f.problem("reader: %s", p)
		}
	}
	f.readP50, f.readP99 = f.readLatency.quantile(0.5), f.readLatency.quantile(0.99)

	// The last publish is the highest generation: runs enter one at a time,
	// so they publish in generation order.
	live, err := keys.observe(ctx, admin)
	switch kind, what := keys.verdict(live); {
	case err != nil:
		f.problem("live state: %v", err)
	case kind != "":
		f.problem("live state: %s: %s", kind, what)
		f.partial++
	case live.gen != f.maxGen:
		f.problem("live state: live generation %d, want %d, the last one published", live.gen, f.maxGen)
		f.stale++
	}
	f.finalGen = live.gen

	// Nothing leaks: no lock, no temp key, nothing but the live keys of the
	// live generation, their generation records and the suite's counters.
	want := map[string]bool{keys.Hash: true, keys.Zset: true, keys.Gen: true, keys.Running: true, keys.Ready: s.processes > 0}
	for j := range raceBuckets(live.gen) {
		want[keys.bucket(j)] = true
	}
	// Every publish advanced the generation record of each builder's key,
	// and no other run touched it: its seq and gen are the number of
	// successful runs, the seed run and the helper processes' included
	// (a failed run that published anyway would show here too).
	cluster := raceDeploymentNamed(s.deployment).cluster
	for _, live := range []string{keys.Hash, keys.Zset, keys.Index} {
		want[metaKey(live, cluster)] = true
		if err := checkGeneration(ctx, admin, live, cluster, all.Published, w); err != nil {
			f.wrongGenerations++
			f.problem("generation record after %d successful runs: %v", all.Published, err)
		}
	}
	var leaked []string
	for _, k := range redistest.Keys(t, admin, keys.Prefix) {
		if !want[k] {
			leaked = append(leaked, k)
		}
	}
	f.leaked = int64(len(leaked))
	if len(leaked) > 0 {
		f.problem("leaked keys: %q", leaked)
	}
	if n, err := admin.Do(ctx, admin.B().Get().Key(keys.Running).Build()).AsInt64(); err != nil || n != 0 {
		f.problem("%s after the hammer: got %d (%v), want 0", keys.Running, n, err)
	}
	return f
}

// raceBreakLock returns c with the lock broken: before each acquire script
// is sent, the locks it is about to take are deleted, so that every acquire
// succeeds, taking the locks over from any run that holds them (as a SET
// without NX would). Only TestRaceChecksCatchABrokenLock uses it.
//
// The locks are taken by one script (acquire.lua), which checks that none
// exists and sets them all: the hook cannot drop an NX from it, so it
// clears the way instead. Its KEYS are the n locks, then their n records
// and n logs.
func raceBreakLock(c rueidis.Client) rueidis.Client {
	acquire := redistest.ScriptNamed("acquire")
	locks := func(cmd rueidis.Completed) []string {
		args := cmd.Commands()
		if !acquire.Is(args) || len(args) < 3 {
			return nil
		}
		// KEYS: n locks, their records, their logs, and the first's
		// requests.
		numkeys, err := strconv.Atoi(args[2])
		if err != nil || numkeys%3 != 1 || 3+numkeys > len(args) {
			return nil
		}
		return slices.Clone(args[3 : 3+numkeys/3])
	}
	steal := func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) {
		if ls := locks(cmd); len(ls) > 0 {
			// An error here only leaves the lock unbroken for this run.
			_ = c.Do(ctx, c.B().Del().Key(ls...).Build()).Error()
		}
	}
	return rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			steal(c, ctx, cmd)
			return c.Do(ctx, cmd)
		},
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			for _, cmd := range multi {
				steal(c, ctx, cmd)
			}
			return c.DoMulti(ctx, multi...)
		},
	})
}

// raceHelper is a rebuilder process: the test binary, re-executed.
type raceHelper struct {
	cmd    *exec.Cmd
	out    string       // its tally file
	output lockedBuffer // exec's copying goroutines write it while the test may read it
	done   chan error
}

// raceStartHelper starts a rebuilder process on keys.
func raceStartHelper(t *testing.T, d raceDeployment, keys raceKeys, s raceSetup, id string) *raceHelper {
	t.Helper()
	h := &raceHelper{out: filepath.Join(t.TempDir(), "helper"+id+".json"), done: make(chan error, 1)}
	js, err := json.Marshal(raceHelperConfig{
		Addrs: d.addrs, Cluster: d.cluster, Keys: keys, Duration: s.dur,
		BatchSize: s.opts.BatchSize, Writers: s.opts.Writers, TTL: s.opts.TTL, Out: h.out,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperRebuilder$", "-test.count=1", "-test.v")
	h.cmd.Env = append(os.Environ(), raceHelperEnv+"="+string(js))
	h.cmd.Stdout = &h.output
	h.cmd.Stderr = &h.output
	if err := h.cmd.Start(); err != nil {
		t.Fatalf("start helper process: %v", err)
	}
	go func() { h.done <- h.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-h.done:
		default:
			_ = h.cmd.Process.Kill() // only the process this test started
			<-h.done
		}
	})
	return h
}

// raceWaitReady polls until every helper process is connected and about to
// hammer (each INCRs keys.Ready), or one exits.
func raceWaitReady(t *testing.T, ctx context.Context, c rueidis.Client, keys raceKeys, helpers []*raceHelper) {
	t.Helper()
	if len(helpers) == 0 {
		return
	}
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := c.Do(ctx, c.B().Get().Key(keys.Ready).Build()).AsInt64()
		if err == nil && n == int64(len(helpers)) {
			return
		}
		if err != nil && !rueidis.IsRedisNil(err) {
			t.Fatalf("GET %s: %v", keys.Ready, err)
		}
		for _, h := range helpers {
			select {
			case err := <-h.done:
				h.done <- err
				t.Fatalf("helper process exited before it was ready: %v\n%s", err, h.output.String())
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("helper processes ready: got %d, want %d within a minute", n, len(helpers))
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(20 * time.Millisecond): // polling interval, not synchronisation
		}
	}
}

// wait waits for the helper to exit and returns its tally.
func (h *raceHelper) wait(t *testing.T, timeout time.Duration) *raceTally {
	t.Helper()
	select {
	case err := <-h.done:
		h.done <- err
		if err != nil {
			t.Errorf("helper process: %v\n%s", err, h.output.String())
		}
	case <-time.After(timeout):
		t.Fatalf("helper process still running after %v\n%s", timeout, h.output.String())
	}
	var tally raceTally
	js, err := os.ReadFile(h.out)
	if err == nil {
		err = json.Unmarshal(js, &tally)
	}
	if err != nil {
		t.Errorf("helper process tally: %v\n%s", err, h.output.String())
	}
	return &tally
}

// --- The paused rebuilder ---

// racePaused runs TestRacePausedRebuilder on d.
func racePaused(t *testing.T, d raceDeployment) {
	const ttl = 2 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	keys := raceNewKeys(raceTag(t))
	admin := raceTestClient(t, d)
	raceFresh(t, admin, keys.Prefix)
	opts := rebuild.Options{BatchSize: 20, Writers: 2, TTL: ttl}

	successor, err := newRaceRebuilder(raceTestClient(t, d), keys, opts)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := successor.run(ctx); !ok {
		t.Fatalf("seed run: %v", err)
	}

	// The paused rebuilder's every connection passes a proxy.
	var dialer faultproxy.Dialer
	t.Cleanup(func() { _ = dialer.Close() })
	pc, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: d.addrs, DisableCache: true, ForceSingleClient: !d.cluster, DialCtxFn: dialer.Dial,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pc.Close)
	// Its own lock-holder counter: that the successor enters while the
	// paused rebuilder believes it still holds the lock is this test's
	// point, not an overlap to report.
	pkeys := keys
	pkeys.Running = keys.Prefix + "running-paused"
	pausedNow := make(chan struct{})
	paused, err := newRaceRebuilder(pc, pkeys, rebuild.Options{
		BatchSize: opts.BatchSize, Writers: opts.Writers, TTL: ttl,
		Progress: func(p rebuild.Progress) {
			if p.Batches == 2 { // once: Progress counts never repeat
				// After two batches: the next write, renewal or publish
				// is held.
				dialer.Pause()
				close(pausedNow)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}

	rctx, stopReader := context.WithCancel(ctx)
	defer stopReader()
	reader := &raceReader{keys: keys, client: raceTestClient(t, d)}
	var rwg sync.WaitGroup
	rwg.Go(func() { reader.poll(rctx) })

	pausedErr := make(chan error, 1)
	go func() {
		_, err := paused.run(ctx)
		pausedErr <- err
	}()

	// Wait until the proxy pauses the rebuilder, then until its lease has
	// lapsed in Redis.
	select {
	case <-pausedNow:
	case err := <-pausedErr:
		t.Fatalf("the rebuilder to pause returned %v before its second batch", err)
	case <-time.After(time.Minute):
		t.Fatal("the rebuilder to pause did not complete two batches within a minute")
	}
	lockKey := keys.Hash + ":rebuild-lock"
	raceEventually(t, ctx, "the paused rebuilder's lock expires", 15*time.Second, func() (bool, error) {
		n, err := admin.Do(ctx, admin.B().Exists().Key(lockKey).Build()).AsInt64()
		return n == 0, err
	})
	// The paused rebuilder normally returns only once the proxy resumes;
	// on a very slow machine it may give up before (rueidis's write
	// timeout), which changes nothing to what must hold.
	var perr error
	returned := false
	select {
	case perr = <-pausedErr:
		returned = true
		t.Logf("the paused rebuilder returned before the resume: %v", perr)
	default:
	}

	// The successor takes over and publishes.
	var published bool
	raceEventually(t, ctx, "the successor publishes", 30*time.Second, func() (bool, error) {
		ok, err := successor.run(ctx)
		if err != nil && errors.Is(err, rebuild.ErrInProgress) && !errors.Is(err, rebuild.ErrLockLost) {
			return false, nil
		}
		published = ok
		return true, err
	})
	if !published {
		t.Fatal("the successor did not publish")
	}
	gS := successor.tally.Gens[len(successor.tally.Gens)-1]

	dialer.Resume()
	if !returned {
		select {
		case perr = <-pausedErr:
		case <-time.After(time.Minute):
			t.Fatal("the paused rebuilder did not return within a minute of the resume")
		}
	}
	gP := paused.gen
	if gP == 0 || gP >= gS {
		t.Errorf("paused generation %d, successor's %d: want 0 < paused < successor", gP, gS)
	}
	if !errors.Is(perr, rebuild.ErrLockLost) && !errors.Is(perr, rebuild.ErrTempKeyLost) {
		// Fails now and then on the known bug in the test's comment.
		t.Errorf("paused rebuilder: got %v, want an error matching ErrLockLost or ErrTempKeyLost", perr)
	}

	// Let every byte the proxy held reach the server and run, then check.
	pc.Close()
	open := func() error {
		if n := dialer.Stats().Open; n > 0 {
			return fmt.Errorf("%d connections still open through the proxy", n)
		}
		return nil
	}
	if err := pollFor(closeGrace, open); err != nil {
		// A connection rueidis was dialing when Close ran survives it (see
		// TestRueidisCloseLeaksDialingConnection). The paused rebuilder
		// has returned: none of its commands is on it.
		t.Logf("%v after the client closed: cutting them", err)
		dialer.CutAll()
	}
	raceEventually(t, ctx, "the proxy's connections close", 15*time.Second, func() (bool, error) {
		return open() == nil, nil
	})
	stopReader()
	rwg.Wait()
	o, err := keys.observe(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	if kind, what := keys.verdict(o); kind != "" || o.gen != gS {
		t.Errorf("live keys: got generation %d (%s %s), want the successor's %d, complete", o.gen, kind, what, gS)
	}
	for _, c := range []struct {
		what string
		n    int64
	}{{"gaps", reader.gaps}, {"mixed", reader.mixed}, {"partial", reader.partial}, {"stale", reader.stale}, {"read errors", reader.errs}} {
		if c.n != 0 {
			t.Errorf("reader: %s: got %d, want 0: %q", c.what, c.n, reader.problems)
		}
	}
	if reader.seen[gP] {
		t.Errorf("a reader saw the paused rebuilder's generation %d", gP)
	}
	if len(successor.tally.Problems) > 0 {
		t.Errorf("successor: %q", successor.tally.Problems)
	}

	// A temp key the held writes re-created has a TTL (EXPIRE NX rode with
	// them), so it goes within the TTL: wait for it, and check that none is
	// without a TTL meanwhile.
	raceEventually(t, ctx, "no temp key or lock is left", ttl+10*time.Second, func() (bool, error) {
		left := redistest.Leftovers(t, admin, keys.Prefix)
		for _, k := range left {
			pttl, err := admin.Do(ctx, admin.B().Pttl().Key(k).Build()).AsInt64()
			if err == nil && pttl == -1 {
				return false, fmt.Errorf("%s has no TTL: it would leak", k)
			}
		}
		return len(left) == 0, nil
	})
	t.Logf("%s: paused generation %d failed with %v; successor's generation %d stayed live; reader: %d observations, 0 gaps, 0 mixed, 0 stale",
		d.name, gP, perr, gS, reader.n)
}

// raceEventually polls cond until it reports true, fails the test when it
// returns an error or when timeout passes.
func raceEventually(t *testing.T, ctx context.Context, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		case <-time.After(10 * time.Millisecond): // polling interval, not synchronisation
		}
	}
}

// --- The soak ---

// raceSoak runs the soak for dur, or def when dur is zero: two groups of
// keys per deployment, both deployments at once.
func raceSoak(t *testing.T, dur, def time.Duration) {
	if dur == 0 {
		dur = def
	}
	var mu sync.Mutex
	var figures []raceFigures
	t.Run("deployment", func(t *testing.T) {
		for _, d := range []string{"standalone", "cluster"} {
			t.Run(d, func(t *testing.T) {
				t.Parallel()
				s := raceSetup{deployment: d, dur: dur, goroutines: 3, readers: 2, scale: 10,
					opts: rebuild.Options{BatchSize: 500, Writers: 4, TTL: 10 * time.Second}}
				tag := raceTag(t)
				fs := raceRun(t, s, raceNewKeys(tag[:len(tag)-2]+"/0}:"), raceNewKeys(tag[:len(tag)-2]+"/1}:"))
				mu.Lock()
				figures = append(figures, fs...)
				mu.Unlock()
			})
		}
	})
	slices.SortFunc(figures, func(a, b raceFigures) int { return strings.Compare(a.keys, b.keys) })
	var b strings.Builder
	fmt.Fprintf(&b, "soak of %v:\n%s\n", dur, raceFiguresHeader)
	for _, d := range []string{"standalone", "cluster"} {
		var sum raceFigures
		for _, f := range figures {
			if f.deployment != d {
				continue
			}
			fmt.Fprintln(&b, f)
			sum.add(f)
		}
		sum.deployment, sum.keys, sum.dur = d, "total", dur
		fmt.Fprintln(&b, sum)
	}
	t.Log(b.String())
}

// add adds o's counts and histograms to f.
func (f *raceFigures) add(o raceFigures) {
	f.rebuilders += o.rebuilders
	f.processes += o.processes
	f.readers += o.readers
	f.runs += o.runs
	f.published += o.published
	f.conflicts += o.conflicts
	f.failed += o.failed
	f.observations += o.observations
	f.gaps += o.gaps
	f.mixed += o.mixed
	f.partial += o.partial
	f.stale += o.stale
	f.phantom += o.phantom
	f.leaked += o.leaked
	f.wrongGenerations += o.wrongGenerations
	f.overlaps += o.overlaps
	f.runDurations.merge(&o.runDurations)
	f.readLatency.merge(&o.readLatency)
	f.runP50, f.runP99 = f.runDurations.quantile(0.5), f.runDurations.quantile(0.99)
	f.readP50, f.readP99 = f.readLatency.quantile(0.5), f.readLatency.quantile(0.99)
}

// --- Percentiles ---

// raceHist is a histogram of durations in buckets 5% wide, from 1 µs, so
// that a long soak has percentiles without keeping every sample.
type raceHist struct {
	Counts []int64
	N      int64
}

const raceHistGrowth = 1.05

func (h *raceHist) add(d time.Duration) {
	b := 0
	if d > time.Microsecond {
		b = 1 + int(math.Log(float64(d)/float64(time.Microsecond))/math.Log(raceHistGrowth))
	}
	if b >= len(h.Counts) {
		h.Counts = append(h.Counts, make([]int64, b+1-len(h.Counts))...)
	}
	h.Counts[b]++
	h.N++
}

func (h *raceHist) merge(o *raceHist) {
	if len(o.Counts) > len(h.Counts) {
		h.Counts = append(h.Counts, make([]int64, len(o.Counts)-len(h.Counts))...)
	}
	for i, n := range o.Counts {
		h.Counts[i] += n
	}
	h.N += o.N
}

// quantile returns the upper bound of the bucket that holds quantile q.
func (h *raceHist) quantile(q float64) time.Duration {
	if h.N == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.N)))
	var seen int64
	for b, n := range h.Counts {
		if seen += n; seen >= max(rank, 1) {
			return time.Duration(float64(time.Microsecond) * math.Pow(raceHistGrowth, float64(b)))
		}
	}
	return 0
}

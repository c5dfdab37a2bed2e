package gens_test

import (
	"context"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/redis/rueidis"
)

var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// shape is one way an index can be laid out.
type shape struct {
	name string
	// cluster runs it on the package's cluster, else on its standalone
	// server.
	cluster bool
	family  bool
	// tagged gives a family's prefix a hash tag: on a cluster its keys then
	// share the registry's slot.
	tagged bool
}

// shapes returns the layouts every sweep test covers: a family and a plain
// key, on a standalone server and on a cluster, where a family is tagged
// (its keys in one slot) or not (its keys spread over every master).
func shapes() []shape {
	return []shape{
		{name: "standalone/family", family: true},
		{name: "standalone/plain"},
		{name: "cluster/tagged-family", cluster: true, family: true, tagged: true},
		{name: "cluster/untagged-family", cluster: true, family: true},
		{name: "cluster/tagged-plain", cluster: true, tagged: true},
		{name: "cluster/plain", cluster: true},
	}
}

// fixture is an index built by hand, as runs would have built it with the
// keys functions, and a model of every key the test expects to find.
type fixture struct {
	t       *testing.T
	c       rueidis.Client
	cluster bool
	idx     gens.Index
	root    string // every key of the test contains it
	// want holds every key the test expects, with its contents: a set's
	// sorted members, a string's value as its only element.
	want map[string][]string
}

// newFixture returns an empty index of shape sh, with keys unique to t.
func newFixture(t *testing.T, sh shape) *fixture {
	f := &fixture{t: t, cluster: sh.cluster, root: redistest.Prefix(t), want: map[string][]string{}}
	if sh.cluster {
		f.c = env.Cluster.Client(t)
	} else {
		f.c = env.Standalone.Client(t)
	}
	live := f.root + "idx"
	if sh.tagged {
		live = "{" + f.root + "}idx"
	}
	f.idx = gens.Index{Live: live, Family: sh.family, Type: "set"}
	// The tests' keys are few: delete whatever an earlier run of the test
	// left (go test -count=N), and what this one leaves.
	redistest.ClearContaining(t, f.c, f.root)
	t.Cleanup(func() {
		ctx := context.Background()
		for _, k := range f.keys() {
			_ = f.c.Do(ctx, f.c.B().Del().Key(k).Build()).Error()
		}
	})
	return f
}

func (f *fixture) registryKey() string { return keys.RegistryKey(f.idx.Live, f.cluster) }
func (f *fixture) pointerKey() string  { return keys.PointerKey(f.idx.Live, f.cluster) }
func (f *fixture) lockKey() string     { return keys.LockKey(f.idx.Live, f.cluster) }

// sadd writes the set key with members, and expects it.
func (f *fixture) sadd(key string, members ...string) {
	f.t.Helper()
	redistest.Cmd(f.t, f.c, append([]string{"SADD", key}, members...)...)
	f.want[key] = slices.Sorted(slices.Values(append(f.want[key], members...)))
}

// set writes the string key, and expects it.
func (f *fixture) set(key, value string) {
	f.t.Helper()
	redistest.Cmd(f.t, f.c, "SET", key, value)
	f.want[key] = []string{value}
}

// dataKeys returns the data keys of generation g: buckets b0..b<n-1> of a
// family, or the one key of a plain index.
func (f *fixture) dataKeys(g int64, n int) []string {
	if !f.idx.Family {
		return []string{keys.GenKey(f.idx.Live, g)}
	}
	ks := make([]string, n)
	for i := range ks {
		ks[i] = keys.GenBucketKey(f.idx.Live, g, "b"+strconv.Itoa(i))
	}
	return ks
}

// gen writes generation g's data keys (n buckets for a family), each a set
// naming its generation, and expects them. On a cluster they are written
// one command per key (their slots differ), all at once.
func (f *fixture) gen(g int64, n int) []string {
	f.t.Helper()
	ks := f.dataKeys(g, n)
	cmds := make(rueidis.Commands, len(ks))
	for i, k := range ks {
		cmds[i] = f.c.B().Sadd().Key(k).Member("g"+strconv.FormatInt(g, 10), "x").Build()
		f.want[k] = []string{"g" + strconv.FormatInt(g, 10), "x"}
	}
	for _, r := range f.c.DoMulti(context.Background(), cmds...) {
		if err := r.Error(); err != nil {
			f.t.Fatal(err)
		}
	}
	return ks
}

// registry writes the registry's fields (field, value pairs), and expects
// them.
func (f *fixture) registry(pairs ...string) {
	f.t.Helper()
	redistest.Cmd(f.t, f.c, append([]string{"HSET", f.registryKey()}, pairs...)...)
}

// forget stops expecting ks: the sweep must have deleted them.
func (f *fixture) forget(ks ...string) {
	for _, k := range ks {
		delete(f.want, k)
	}
}

// keys returns every key of the test, sorted.
func (f *fixture) keys() []string {
	var out []string
	for page, err := range scan.Pages(context.Background(), f.c, scan.Options{Match: "*" + keys.GlobEscape(f.root) + "*"}) {
		if err != nil {
			f.t.Fatal(err)
		}
		out = append(out, page...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// check fails the test unless the keys of the test are exactly those it
// expects, the sets and strings with their contents, the registry with
// exactly fields, no key but the lock with a TTL.
func (f *fixture) check(fields map[string]string) {
	f.t.Helper()
	got := f.keys()
	want := slices.Sorted(maps.Keys(f.want))
	if len(fields) > 0 {
		want = append(want, f.registryKey())
		slices.Sort(want)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		f.t.Errorf("keys (-want +got):\n%s", diff)
	}
	for _, k := range slices.Sorted(maps.Keys(f.want)) {
		typ, _ := redistest.Cmd(f.t, f.c, "TYPE", k).ToString()
		var have []string
		switch typ {
		case "set":
			have = redistest.SMembers(f.t, f.c, k)
		case "list":
			have, _ = redistest.Cmd(f.t, f.c, "LRANGE", k, "0", "-1").AsStrSlice()
			slices.Sort(have)
		case "string":
			v, _ := redistest.Get(f.t, f.c, k)
			have = []string{v}
		}
		if diff := cmp.Diff(f.want[k], have); diff != "" {
			f.t.Errorf("%s (%s) (-want +got):\n%s", k, typ, diff)
		}
		if ttl := redistest.PTTL(f.t, f.c, k); k != f.lockKey() && ttl != -1 {
			f.t.Errorf("%s: PTTL %v, want none", k, ttl)
		}
	}
	if len(fields) == 0 {
		redistest.WantAbsent(f.t, f.c, f.registryKey())
	} else {
		redistest.WantHash(f.t, f.c, f.registryKey(), fields)
	}
}

// lock makes the index's lock hold token, as a run's would, and expects
// it.
func (f *fixture) lock(token string) {
	f.t.Helper()
	redistest.Cmd(f.t, f.c, "SET", f.lockKey(), token, "EX", "600")
	f.want[f.lockKey()] = []string{token}
}

// retired returns the state of a generation retired at t.
func retired(t time.Time) string { return keys.RegRetired + strconv.FormatInt(t.UnixMilli(), 10) }

// wantResult fails t unless res kept exactly the generations of skipped,
// for those reasons, and removed exactly those of removed.
func wantResult(t *testing.T, res gens.Result, removed []int64, skipped map[int64]gens.Reason) {
	t.Helper()
	var gotRemoved []int64
	for _, r := range res.Removed {
		gotRemoved = append(gotRemoved, r.Gen)
	}
	gotSkipped := map[int64]gens.Reason{}
	for _, s := range res.Skipped {
		gotSkipped[s.Gen] = s.Reason
	}
	if diff := cmp.Diff(removed, gotRemoved, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(skipped, gotSkipped, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("skipped (-want +got):\n%s", diff)
	}
}

// contains reports whether s contains every one of subs.
func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// The tokens of the runs of everyStates: one holds the lock, one is gone.
const running, gone = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"

// everyState writes a registry with a generation in every state, relative
// to now, the pointer naming generation 4 and the lock held by running,
// and returns the registry's fields: 1 retired an hour ago, 2 a second
// ago, 3 previous, 4 current, 5 building by running, 6 building by gone,
// 7 retired a minute ago. It writes no data key.
func (f *fixture) everyState(now time.Time) map[string]string {
	f.t.Helper()
	fields := map[string]string{
		keys.RegNext: "7",
		"1":          retired(now.Add(-time.Hour)),
		"2":          retired(now.Add(-time.Second)),
		"3":          keys.RegPrevious,
		"4":          keys.RegCurrent,
		"5":          keys.RegBuilding + running,
		"6":          keys.RegBuilding + gone,
		"7":          retired(now.Add(-time.Minute)), // no key at all
	}
	for k, v := range fields {
		f.registry(k, v)
	}
	f.set(f.pointerKey(), "4")
	f.lock(running)
	return fields
}

// forShapes runs test in parallel on a fresh fixture of each shape.
func forShapes(t *testing.T, test func(t *testing.T, f *fixture)) {
	t.Parallel()
	for _, sh := range shapes() {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			test(t, newFixture(t, sh))
		})
	}
}

// everyGeneration writes everyState's registry relative to now and the
// data keys of its generations 1 to 6, sizes[g-1] buckets each for a
// family (3 where sizes has none), and returns the registry's fields and
// the keys of each generation.
func (f *fixture) everyGeneration(now time.Time, sizes ...int) (map[string]string, map[int64][]string) {
	f.t.Helper()
	fields := f.everyState(now)
	data := map[int64][]string{}
	for g := int64(1); g <= 6; g++ {
		n := 3
		if int(g) <= len(sizes) {
			n = sizes[g-1]
		}
		data[g] = f.gen(g, n)
	}
	return fields, data
}

// manifest lists ks in generation g's manifest list, and
// keys.ManifestListed in its set when listed, as the writes of a run would
// have, and expects them.
func (f *fixture) manifest(g int64, listed bool, ks ...string) {
	f.t.Helper()
	if len(ks) > 0 {
		l := keys.ManifestListKey(f.idx.Live, f.cluster, g)
		redistest.Cmd(f.t, f.c, append([]string{"RPUSH", l}, ks...)...)
		f.want[l] = slices.Sorted(slices.Values(append(f.want[l], ks...)))
	}
	if listed {
		f.sadd(keys.ManifestKey(f.idx.Live, f.cluster, g), keys.ManifestListed)
	}
}

// forgetManifest stops expecting generation g's manifest.
func (f *fixture) forgetManifest(g int64) {
	f.forget(keys.ManifestKey(f.idx.Live, f.cluster, g), keys.ManifestListKey(f.idx.Live, f.cluster, g))
}

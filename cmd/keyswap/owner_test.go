package main

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/scan"
	krebuild "github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// ownedIndex is an index of the tests of shared bases: a plain key (a
// hash of emails) or a family (sets of ids by country), run alone.
type ownedIndex struct {
	live   string
	family bool
}

// publish runs o from ps with opts (genOpts: in Generations mode, leaving
// the generation it retires to a sweep).
func (o ownedIndex) publish(t *testing.T, d deployment, opts krebuild.Options, ps []person) {
	t.Helper()
	var r *krebuild.Rebuilder[person]
	if o.family {
		r = redistest.Rebuilder(t, d.client, opts, builders.SetIndex(o.live, func(p person) (string, string, bool) { return p.Country, p.ID, true }))
	} else {
		r = redistest.Rebuilder(t, d.client, opts, builders.Hash(o.live, func(p person) (string, string, bool) { return p.Email, p.ID, true }))
	}
	if _, err := r.Run(t.Context(), sources.Slice(ps)); err != nil {
		t.Fatalf("Run of %s: %v", o.live, err)
	}
}

// genKeys returns the data keys of generation g of o: its key, or its
// buckets.
func (o ownedIndex) genKeys(t *testing.T, d deployment, g int64) []string {
	t.Helper()
	if o.family {
		return redistest.Keys(t, d.client, keys.GenPrefix(o.live, g))
	}
	if exists(t, d.client, keys.GenKey(o.live, g)) {
		return []string{keys.GenKey(o.live, g)}
	}
	return nil
}

// retire marks generation g of o retired at 1000 ms after the epoch:
// long past any grace.
func (o ownedIndex) retire(t *testing.T, d deployment, g int64) {
	t.Helper()
	do(t, d.client, "HSET", keys.RegistryKey(o.live, d.cluster), strconv.FormatInt(g, 10), keys.RegRetired+"1000")
}

// sweepGens runs 'sweep -json --delete' over the test's keys on d, wants
// it to exit with code, and returns its generations by index.
func sweepGens(t *testing.T, d deployment, code int) (map[string]genSweepJSON, result) {
	t.Helper()
	r := keyswap(t, d.args("sweep", "-json", "--delete", "--pattern", testSweepPattern(t))...)
	r.wantCode(t, code)
	var doc sweepJSON
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	out := map[string]genSweepJSON{}
	for _, s := range doc.Generations {
		out[s.name()] = s
	}
	return out, r
}

// untrustedStamp is an owner stamp that says whose base it is of
// neither of its two live keys.
type untrustedStamp struct {
	name  string
	stamp []string // the command that leaves it so
	why   string   // how the CLI says so
}

// untrustedStamps returns the stamps, at stamp, that are not trusted:
// absent, of another type (a hash naming owner), and naming other.
func untrustedStamps(stamp, owner, other string) []untrustedStamp {
	return []untrustedStamp{
		{"absent", []string{"DEL", stamp}, "it has no owner stamp"},
		{"another type", []string{"HSET", stamp, "live", owner}, "its owner stamp is not a string"},
		{"neither", []string{"SET", stamp, other}, "its owner stamp names " + other + ", neither of them"},
	}
}

// TestSweepSharedBase (SPEC C104): on a cluster the tagged key "{T}" has
// the base of the untagged T, and "{rbN}a}b" that of a}b, but the data keys
// of their generations hang off their own names ({T}:rebuild-g:G). The
// sweep and status find such an index by its registry, named after the
// base, and take the live key from the base's owner stamp: the sweep
// removes exactly the retired generation's keys, and status names the
// index as it is. Before, both took "{T}" for T: the sweep found none of
// the generation's keys, removed its registry field and manifest, and
// leaked the keys. Untagged keys keep working.
func TestSweepSharedBase(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			ixs := []ownedIndex{
				{live: "{" + p + "plain}"},
				{live: "{" + p + "fam}", family: true},
				{live: keys.Base(p+"a}b", true)}, // "{rbN}...a}b", the base of ...a}b on a cluster
				{live: p + "untagged"},
				{live: p + "untagged-fam", family: true},
			}
			for _, ix := range ixs {
				ix.publish(t, d, genOpts(false), people(0, 4))
				ix.publish(t, d, genOpts(false), people(4, 3))
				ix.retire(t, d, 1)
				if len(ix.genKeys(t, d, 1)) == 0 || len(ix.genKeys(t, d, 2)) == 0 {
					t.Fatalf("%s: want data keys in generations 1 and 2, got %q and %q", ix.live, ix.genKeys(t, d, 1), ix.genKeys(t, d, 2))
				}
			}
			lives := make([]string, len(ixs))
			for i, ix := range ixs {
				lives[i] = ix.live
			}
			slices.Sort(lives)

			// Status names each index as it is.
			got := statusIndexes(t, d, exitOrphans, "*"+scan.EscapeGlob(p)+"*")
			if names := slices.Sorted(maps.Keys(got)); !slices.Equal(names, lives) {
				t.Errorf("status: got indexes %q, want %q", names, lives)
			}
			for k, ix := range got {
				if ix.Ambiguous != "" {
					t.Errorf("status: %s: got ambiguous %q, want its owner stamp read", k, ix.Ambiguous)
				}
			}

			// The sweep removes exactly the retired generation of each.
			swept, _ := sweepGens(t, d, exitOK)
			if names := slices.Sorted(maps.Keys(swept)); !slices.Equal(names, lives) {
				t.Errorf("sweep: got indexes %q, want %q", names, lives)
			}
			for _, ix := range ixs {
				s := swept[ix.live]
				if len(s.Removed) != 1 || s.Removed[0].Gen != 1 || s.Family != ix.family || s.Error != "" {
					t.Errorf("sweep of %s: got %+v, want generation 1 removed", ix.live, s)
				}
				if left := ix.genKeys(t, d, 1); len(left) > 0 {
					t.Errorf("%s: data keys of generation 1 left: %q", ix.live, left)
				}
				if n, want := len(ix.genKeys(t, d, 2)), map[bool]int{false: 1, true: 3}[ix.family]; n != want {
					t.Errorf("%s: generation 2 has %d data keys, want %d", ix.live, n, want)
				}
				if reg := registry(t, d, ix.live); !maps.Equal(reg, map[string]string{"next": "2", "2": "current"}) {
					t.Errorf("registry of %s: got %v, want only generation 2, current", ix.live, reg)
				}
			}
		})
	}
}

// TestSweepSharedBaseUnstamped (SPEC C104): on a cluster, a base that two
// live keys share, whose owner stamp is absent (written by an older
// keyswap), of another type or names neither key, does not say whose
// generations it holds: the sweep leaves them all, exits 1 and says which
// base, both keys and how to settle it; status marks the index ambiguous.
// Once the stamp names the index, the sweep removes them. On a standalone
// server a base is the key's alone: no stamp is read.
func TestSweepSharedBaseUnstamped(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			ix := ownedIndex{live: "{" + p + "plain}"}
			ix.publish(t, d, genOpts(false), people(0, 4))
			ix.publish(t, d, genOpts(false), people(4, 3))
			ix.retire(t, d, 1)
			stamp := keys.OwnerKey(ix.live, d.cluster)
			if !d.cluster {
				if exists(t, d.client, stamp) {
					t.Errorf("%s exists on a standalone server", stamp)
				}
				swept, _ := sweepGens(t, d, exitOK)
				if s := swept[ix.live]; len(s.Removed) != 1 {
					t.Errorf("sweep of %s: got %+v, want generation 1 removed", ix.live, s)
				}
				return
			}
			redistest.WantString(t, d.client, stamp, ix.live)
			untagged := strings.Trim(ix.live, "{}")
			// An index that only ever rebuilt in place keeps no stamp, and
			// has no generation: status names it as before, untagged.
			inPlace := p + "in-place"
			ownedIndex{live: inPlace}.publish(t, d, krebuild.Options{}, people(0, 2))
			for _, tc := range untrustedStamps(stamp, ix.live, p+"other") {
				do(t, d.client, "DEL", stamp)
				do(t, d.client, tc.stamp...)
				before := registry(t, d, ix.live)
				swept, r := sweepGens(t, d, exitError)
				s, ok := swept[ix.live]
				if !ok || len(s.Removed) != 0 || !strings.Contains(s.Error, tc.why) {
					t.Errorf("%s: sweep: got %+v, want %s skipped: %s", tc.name, swept, ix.live, tc.why)
				}
				for _, want := range []string{"generations of " + ix.live + ": base " + ix.live + " is that of index " + ix.live + " and of index " + untagged,
					tc.why, "nothing removed", "Run that index once in Generations mode", "SET " + stamp + " to its key"} {
					if !strings.Contains(r.stderr, want) {
						t.Errorf("%s: sweep: stderr %q, want %q in it", tc.name, r.stderr, want)
					}
				}
				if reg := registry(t, d, ix.live); !maps.Equal(reg, before) {
					t.Errorf("%s: registry: got %v, want it unchanged, %v", tc.name, reg, before)
				}
				if len(ix.genKeys(t, d, 1)) != 1 || len(ix.genKeys(t, d, 2)) != 1 {
					t.Errorf("%s: data keys: got %q and %q, want both generations whole", tc.name, ix.genKeys(t, d, 1), ix.genKeys(t, d, 2))
				}
				got := statusIndexes(t, d, exitOrphans, "*"+scan.EscapeGlob(p)+"*")
				if st, ok := got[inPlace]; !ok || st.Ambiguous != "" || len(got) != 2 {
					t.Errorf("%s: status: got %d indexes, want %s (not ambiguous) and one of %s", tc.name, len(got), inPlace, ix.live)
				}
				for k, st := range got {
					if k == inPlace {
						continue
					}
					if want := "ambiguous: " + ix.live + " or " + untagged + ", " + tc.why; !strings.HasPrefix(st.Ambiguous, want) {
						t.Errorf("%s: status: %s: got ambiguous %q, want %q", tc.name, k, st.Ambiguous, want)
					}
				}
			}

			// Settled by hand, as the error says: the sweep goes on.
			do(t, d.client, "DEL", stamp)
			do(t, d.client, "SET", stamp, ix.live)
			swept, _ := sweepGens(t, d, exitOK)
			if s := swept[ix.live]; len(s.Removed) != 1 || s.Removed[0].Gen != 1 {
				t.Errorf("sweep once stamped: got %+v, want generation 1 of %s removed", swept, ix.live)
			}
			if left := ix.genKeys(t, d, 1); len(left) > 0 {
				t.Errorf("data keys of generation 1 left: %q", left)
			}
		})
	}
}

package main

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/scan"
	krebuild "github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// genOpts returns the Options of a run in Generations mode that leaves the
// generations its flip retires to a sweep, keeping the previous generation
// for a rollback when keep is set.
func genOpts(keep bool) krebuild.Options {
	o := krebuild.Options{Publish: krebuild.Generations, Grace: -1}
	if keep {
		o.KeepPrevious = time.Minute
	}
	return o
}

// The generations of genSetup: gV1 published in rename-in-place, then gV2,
// gV3 and gV4 in Generations mode with KeepPrevious, as generations 1, 2
// and 3 of each index.
var (
	gV1 = people(0, 6)
	gV2 = people(0, 4) // fr, de, us, fr
	gV3 = people(2, 5)
	gV4 = people(4, 3)
)

// genSetup publishes ix on d in rename-in-place (gV1), then three times in
// Generations mode, keeping the previous generation: each index of ix ends
// with generation 3 current, 2 previous and 1 retired (left to a sweep),
// and its plain keys from gV1 left beside the pointer.
func genSetup(t *testing.T, d deployment, ix index) {
	t.Helper()
	ix.publish(t, d, krebuild.Options{}, gV1)
	for _, v := range [][]person{gV2, gV3, gV4} {
		ix.publish(t, d, genOpts(true), v)
	}
	for _, k := range []string{ix.email, ix.country} {
		reg := registry(t, d, k)
		if reg["3"] != "current" || reg["2"] != "previous" || !strings.HasPrefix(reg["1"], "retired:") || reg["next"] != "3" {
			t.Fatalf("registry of %s: got %v, want 3 current, 2 previous, 1 retired", k, reg)
		}
	}
}

// registry returns the registry of generations of the index live.
func registry(t *testing.T, d deployment, live string) map[string]string {
	t.Helper()
	return redistest.HGetAll(t, d.client, keys.RegistryKey(live, d.cluster))
}

// retiredAt returns when generation g of live was retired, from its
// registry.
func retiredAt(t *testing.T, d deployment, live string, g int) time.Time {
	t.Helper()
	v, ok := strings.CutPrefix(registry(t, d, live)[strconv.Itoa(g)], keys.RegRetired)
	if !ok {
		t.Fatalf("generation %d of %s is not retired: %v", g, live, registry(t, d, live))
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.UnixMilli(ms).UTC()
}

// abandon adds to the registry of live a generation built by a run that is
// gone (its token is not the lock's), with a data key, as a run that
// crashed leaves it, and returns the generation.
func abandon(t *testing.T, d deployment, live, token string) int64 {
	t.Helper()
	reg := keys.RegistryKey(live, d.cluster)
	g := do(t, d.client, "HINCRBY", reg, keys.RegNext, "1")
	n, err := g.AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	do(t, d.client, "HSET", reg, strconv.FormatInt(n, 10), keys.RegBuilding+token)
	do(t, d.client, "HSET", keys.GenKey(live, n), "half", "built")
	return n
}

// wantGenData fails unless generation gen of ix holds exactly what ps
// builds: the hash, and a set per country, no other bucket.
func (ix index) wantGenData(t *testing.T, d deployment, gen int64, ps []person) {
	t.Helper()
	hash := map[string]string{}
	sets := map[string][]string{}
	for _, p := range ps {
		hash[p.Email] = p.ID
		sets[p.Country] = append(sets[p.Country], p.ID)
	}
	redistest.WantHash(t, d.client, keys.GenKey(ix.email, gen), hash)
	prefix := keys.GenPrefix(ix.country, gen)
	var buckets []string
	for _, k := range redistest.Keys(t, d.client, prefix) {
		buckets = append(buckets, strings.TrimPrefix(k, prefix))
	}
	slices.Sort(buckets)
	if want := slices.Sorted(maps.Keys(sets)); !slices.Equal(buckets, want) {
		t.Errorf("buckets of %s in generation %d: got %q, want %q", ix.country, gen, buckets, want)
	}
	for b, ids := range sets {
		slices.Sort(ids)
		if got := redistest.SMembers(t, d.client, prefix+b); !slices.Equal(got, ids) {
			t.Errorf("%s: got %q, want %q", prefix+b, got, ids)
		}
	}
}

// wantGenGone fails unless no data key of generation gen of ix is left.
func (ix index) wantGenGone(t *testing.T, d deployment, gen int64) {
	t.Helper()
	if exists(t, d.client, keys.GenKey(ix.email, gen)) {
		t.Errorf("%s is left", keys.GenKey(ix.email, gen))
	}
	if left := redistest.Keys(t, d.client, keys.GenPrefix(ix.country, gen)); len(left) > 0 {
		t.Errorf("buckets of generation %d of %s left: %q", gen, ix.country, left)
	}
}

// wantNoRunLeftovers fails if a lock, record, log or temp key of ix's is
// left: keyswap's own keys but its metas, kept values, registries,
// pointers and generations' data and manifests.
func (ix index) wantNoRunLeftovers(t *testing.T, d deployment) {
	t.Helper()
	var left []string
	for _, k := range redistest.Leftovers(t, d.client, ix.tag) {
		if !keys.IsGenKey(k) && !keys.IsManifestKey(k) && !strings.HasSuffix(k, keys.RegistrySuffix) && !strings.HasSuffix(k, keys.PointerSuffix) {
			left = append(left, k)
		}
	}
	if len(left) > 0 {
		t.Errorf("left behind under %q: %v", ix.tag, left)
	}
}

// genRunInProgress starts a run of ix in Generations mode that pulls an
// endless source, waits until it builds, and returns a function that
// cancels it from the CLI and waits for it to end with ErrAborted.
func (ix index) genRunInProgress(t *testing.T, d deployment) (cancel func()) {
	t.Helper()
	src := newEndless()
	run := startRun(t, ix.rebuilder(t, d, krebuild.Options{Publish: krebuild.Generations, MaxRate: 200}), src.source)
	ix.waitRecord(t, d, "the run", func(rec map[string]string) bool { return rec["phase"] == "building" })
	// The record shows the phase from the acquire on; the run allocates
	// its generations just after (one script for every index): wait for
	// it, so that what a caller reads of the registry is the run's.
	deadline := time.Now().Add(30 * time.Second)
	for !slices.ContainsFunc(slices.Collect(maps.Values(registry(t, d, ix.email))), func(v string) bool { return strings.HasPrefix(v, "building:") }) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting 30s for the run to allocate a generation of %s: the registry is %v", ix.email, registry(t, d, ix.email))
		}
		time.Sleep(10 * time.Millisecond)
	}
	return func() {
		t.Helper()
		keyswap(t, d.args("cancel", ix.email)...).wantCode(t, exitOK)
		if _, err := run.wait(t); !errors.Is(err, krebuild.ErrAborted) {
			t.Errorf("Run: got %v, want ErrAborted", err)
		}
	}
}

// TestStatusGenerations: status shows an index in Generations mode with
// its mode, current and previous generations, the retired one (since when,
// and whether a sweep removes it, by --grace), a build abandoned by its
// run, and, for the plain key left from rename-in-place, that it is
// switching; in JSON, in the table, and for one key without a scan. A
// generation a sweep would remove makes status exit 3 and suggest the
// sweep.
func TestStatusGenerations(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			genSetup(t, d, ix)
			pattern := scan.EscapeGlob(ix.tag) + "*"

			// Nothing to sweep yet: exit 0, by a long grace.
			got := statusIndexes(t, d, exitOK, "--grace", "1h", pattern)
			since := retiredAt(t, d, ix.email, 1)
			want := &genStatusJSON{Current: ptr[int64](3), Previous: ptr[int64](2),
				Retired: []retiredJSON{{Gen: 1, Since: since, Removable: false}}, Building: []buildJSON{}, PlainLeft: ptr(true)}
			wantGenIndex(t, got, ix.email, want, rollbackStateJSON{Possible: true})
			wantCountry := &genStatusJSON{Current: ptr[int64](3), Previous: ptr[int64](2),
				Retired: []retiredJSON{{Gen: 1, Since: retiredAt(t, d, ix.country, 1)}}, Building: []buildJSON{}}
			wantGenIndex(t, got, ix.country, wantCountry, rollbackStateJSON{Possible: true})
			if !got[ix.country].Family || got[ix.email].Family {
				t.Errorf("family: got %v for %s and %v for %s, want true and false", got[ix.country].Family, ix.country, got[ix.email].Family, ix.email)
			}

			// A build abandoned by its run is a sweep candidate: exit 3.
			token := "deadbeef0123456789abcdef"
			g := abandon(t, d, ix.email, token)
			got = statusIndexes(t, d, exitOrphans, "--grace", "1h", pattern)
			want.Building = []buildJSON{{Gen: g, TokenPrefix: "deadbeef", Abandoned: true}}
			wantGenIndex(t, got, ix.email, want, rollbackStateJSON{Possible: true})

			// The table, its summary, and the sweep it suggests.
			r := keyswap(t, d.args("status", "--grace", "1h", pattern)...)
			r.wantCode(t, exitOrphans)
			rows := section(t, r.stdout, "GENERATIONS")
			row := tableRow(t, rows, ix.email)
			if strings.Join(row[1:5], " ") != "generations 3 2 1" || strings.Contains(rows, ", removable") ||
				!strings.Contains(rows, "4 (abandoned by deadbeef)  switching: the plain key is left from rename-in-place") {
				t.Errorf("GENERATIONS: got\n%s", rows)
			}
			if row := tableRow(t, rows, ix.country); row[1] != "generations" || row[len(row)-1] != "-" {
				t.Errorf("GENERATIONS row of %s: got %q", ix.country, row)
			}
			sweepPat, _ := sweepPattern(pattern, keys.Base(ix.email, d.cluster), d.cluster)
			for _, line := range []string{
				"\n1 generation to remove (retired more than 1h0m0s ago, or abandoned by their run).\n",
				"\n  keyswap sweep --older-than 1h0m0s --grace 1h0m0s --pattern " + shellQuote(sweepPat) + " ",
			} {
				if !strings.Contains(r.stdout, line) {
					t.Errorf("status: no line %q in\n%s", line, r.stdout)
				}
			}

			// The retired generation past the grace is a candidate too.
			do(t, d.client, "HSET", keys.RegistryKey(ix.email, d.cluster), "1", keys.RegRetired+"1000")
			got = statusIndexes(t, d, exitOrphans, pattern)
			want.Retired = []retiredJSON{{Gen: 1, Since: time.UnixMilli(1000).UTC(), Removable: true}}
			wantGenIndex(t, got, ix.email, want, rollbackStateJSON{Possible: true})

			// Status of one key reads the same, without a scan; once the
			// plain key is gone, the index is no longer switching.
			do(t, d.client, "DEL", ix.email)
			want.PlainLeft = ptr(false)
			for _, args := range [][]string{{ix.email}, {"--index", ix.email}} {
				got = statusIndexes(t, d, exitOrphans, args...)
				if len(got) != 1 {
					t.Errorf("status %q: got %d indexes, want 1", args, len(got))
				}
				wantGenIndex(t, got, ix.email, want, rollbackStateJSON{Possible: true})
			}

			// A rebuild in progress builds a generation of its own: status
			// names its run, and a rollback is not possible meanwhile.
			cancel := ix.genRunInProgress(t, d)
			got = statusIndexes(t, d, exitOrphans, ix.email)
			want.Building = append(want.Building, buildJSON{Gen: g + 1, TokenPrefix: ix.token(t, d)[:tokenPrefixLen]})
			wantGenIndex(t, got, ix.email, want, rollbackStateJSON{WhyNot: rollbackLocked})
			if !got[ix.email].Locked {
				t.Errorf("status %s: not locked during the run", ix.email)
			}
			cancel()
			want.Building = want.Building[:1]
			wantGenIndex(t, statusIndexes(t, d, exitOrphans, ix.email), ix.email, want, rollbackStateJSON{Possible: true})

			// A corrupt registry is named in its row; status goes on.
			do(t, d.client, "HSET", keys.RegistryKey(ix.country, d.cluster), "07", "current")
			got = statusIndexes(t, d, exitOrphans, pattern)
			if c := got[ix.country].Generations; c == nil || !strings.Contains(c.Error, gens.ErrCorrupt.Error()) || !strings.Contains(c.Error, `"07"`) {
				t.Errorf("status of a corrupt registry: got %+v", c)
			}
			wantGenIndex(t, got, ix.email, want, rollbackStateJSON{Possible: true})
			ix.wantNoRunLeftovers(t, d)
		})
	}
}

// wantGenIndex fails unless got holds the index key in Generations mode,
// with the generations want and the rollback verdict rb.
func wantGenIndex(t *testing.T, got map[string]indexStatusJSON, key string, want *genStatusJSON, rb rollbackStateJSON) {
	t.Helper()
	ix, ok := got[key]
	switch {
	case !ok:
		t.Errorf("no index %s among %d", key, len(got))
	case ix.Mode != modeGenerations || !reflect.DeepEqual(ix.Generations, want) || ix.Rollback != rb:
		g, _ := json.Marshal(ix)
		w, _ := json.Marshal(want)
		t.Errorf("index %s: got\n%s\nwant mode generations, generations\n%s\nrollback %+v", key, g, w, rb)
	}
}

// TestRollbackGenerations: rollback of indexes in Generations mode flips
// their pointers back to the previous generation, whose data is then
// current, and a second rollback flips forward, with the rollback's output
// and JSON; one without a previous generation exits 6, one during a run 5,
// and one that mixes modes 1, each changing nothing.
func TestRollbackGenerations(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			ix := newIndex(p)
			genSetup(t, d, ix)
			wantPointers := func(cur string) {
				t.Helper()
				for _, k := range []string{ix.email, ix.country} {
					if v, _ := redistest.Get(t, d.client, keys.PointerKey(k, d.cluster)); v != cur {
						t.Errorf("pointer of %s: got %q, want %q", k, v, cur)
					}
				}
			}

			r := keyswap(t, d.args("rollback", ix.email, ix.country)...)
			r.wantCode(t, exitOK)
			wantPointers("2")
			rows := [][]string{{"KEY", "CURRENT", "PREVIOUS", "LIVE SINCE"}}
			for _, k := range []string{ix.email, ix.country} {
				reg := registry(t, d, k)
				if reg["2"] != "current" || reg["3"] != "previous" {
					t.Errorf("registry of %s: got %v, want 2 current, 3 previous", k, reg)
				}
				m := redistest.HGetAll(t, d.client, keys.MetaKey(k, d.cluster))
				rows = append(rows, []string{k, "2", "3", fromMillis(m["at"]).Format(time.RFC3339)})
			}
			if want := "rolled back 2 indexes to the previous generation; 'keyswap rollback' again rolls forward\n\n" + table(rows...); r.stdout != want || r.stderr != "" {
				t.Errorf("got stdout\n%s\nstderr %q\nwant\n%s", r.stdout, r.stderr, want)
			}
			ix.wantGenData(t, d, 2, gV3)
			ix.wantGenData(t, d, 3, gV4)

			r = keyswap(t, d.args("rollback", "-json", ix.email, ix.country)...)
			r.wantCode(t, exitOK)
			wantPointers("3")
			var got rollbackJSON
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("%v\n%s", err, r.stdout)
			}
			want := rollbackJSON{Server: d.server().json()}
			for i, k := range []string{ix.email, ix.country} {
				m := redistest.HGetAll(t, d.client, keys.MetaKey(k, d.cluster))
				g, _ := parseMeta(m)
				want.Keys = append(want.Keys, indexJSON{jsonKey: newJSONKey(k), Family: i == 1, Generation: g.json(), Mode: modeGenerations,
					Generations: &genStatusJSON{Current: ptr[int64](3), Previous: ptr[int64](2),
						Retired: []retiredJSON{{Gen: 1, Since: retiredAt(t, d, k, 1)}}, Building: []buildJSON{}}})
			}
			if !reflect.DeepEqual(got, want) {
				w, _ := json.Marshal(want)
				t.Errorf("got\n%s\nwant\n%s", r.stdout, w)
			}
			ix.wantNoRunLeftovers(t, d)

			// No previous generation: exit 6, nothing changed.
			once := newIndex(p + "once")
			once.publish(t, d, genOpts(false), gV2)
			before := once.liveState(t, d)
			r = keyswap(t, d.args("rollback", once.email)...)
			r.wantCode(t, exitNoPrev)
			if want := "keyswap: rollback " + once.email + ": no previous generation is kept: the index has no previous generation (publish in Generations mode with KeepPrevious to keep one); nothing changed\n"; r.stderr != want || r.stdout != "" {
				t.Errorf("got stdout %q, stderr %q; want stderr %q", r.stdout, r.stderr, want)
			}
			once.wantLiveState(t, d, before)

			// Indexes of both modes at once: exit 1, nothing changed.
			plain := newIndex(p + "plain")
			plain.publish(t, d, krebuild.Options{KeepPrevious: time.Minute}, gV1)
			plain.publish(t, d, krebuild.Options{KeepPrevious: time.Minute}, gV2)
			beforePlain := plain.liveState(t, d)
			before = ix.liveState(t, d)
			r = keyswap(t, d.args("rollback", ix.email, plain.email)...)
			r.wantCode(t, exitError)
			if !strings.Contains(r.stderr, plain.email+" is in the rename-in-place shape (no pointer, "+keys.PointerKey(plain.email, d.cluster)+")") {
				t.Errorf("mixed rollback: got stderr %q", r.stderr)
			}
			ix.wantLiveState(t, d, before)
			plain.wantLiveState(t, d, beforePlain)

			// During a run: exit 5, nothing changed.
			cancel := ix.genRunInProgress(t, d)
			regBefore := registry(t, d, ix.email)
			r = keyswap(t, d.args("rollback", ix.email, ix.country)...)
			r.wantCode(t, exitConflict)
			if want := "keyswap: rollback " + ix.email + ": rebuild already in progress; nothing changed: roll back once it has ended, or end it ('keyswap cancel', 'keyswap discard')\n"; r.stderr != want {
				t.Errorf("got stderr %q, want %q", r.stderr, want)
			}
			if reg := registry(t, d, ix.email); !maps.Equal(reg, regBefore) {
				t.Errorf("registry changed by a refused rollback: got %v, want %v", reg, regBefore)
			}
			cancel()
			wantPointers("3")
			ix.wantNoRunLeftovers(t, d)
		})
	}
}

// TestSweepGenerations: sweep removes, of the indexes in Generations mode
// its --pattern selects, the generations retired longer than --grace ago
// and those abandoned by their run, keys and registry field, and keeps the
// current and previous ones and those within the grace, saying why; a dry
// run changes nothing and exits 3; a corrupt registry fails the sweep of
// its index, which keeps everything, and the sweep exits 1.
func TestSweepGenerations(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			ix := newIndex(p)
			genSetup(t, d, ix)
			token := "deadbeef0123456789abcdef"
			abandoned := abandon(t, d, ix.email, token)
			do(t, d.client, "HSET", keys.RegistryKey(ix.email, d.cluster), "1", keys.RegRetired+"1000")
			// An index only ever in Generations mode: whether it is a family
			// is not in its meta.
			only := newIndex(p + "only")
			only.publish(t, d, genOpts(false), gV3)
			only.publish(t, d, genOpts(false), gV4)
			pat := testSweepPattern(t)
			snapshot := func() map[string]string {
				out := ix.liveState(t, d)
				maps.Copy(out, only.liveState(t, d))
				return out
			}
			countryRetired := keys.RegRetired + strconv.FormatInt(retiredAt(t, d, ix.country, 1).UnixMilli(), 10)
			kept := func(g int64, state string, reason gens.Reason) genKeptJSON {
				return genKeptJSON{Gen: g, State: state, Reason: string(reason)}
			}
			one := ptr[int64](1)
			emailDone := []genKeptJSON{kept(2, "previous", gens.SkipPrevious), kept(3, "current", gens.SkipCurrent)}
			countryKept := append([]genKeptJSON{kept(1, countryRetired, gens.SkipGrace)}, emailDone...)
			emailRemoved := []genRemovedJSON{{Gen: 1, State: keys.RegRetired + "1000", Keys: one}, {Gen: abandoned, State: keys.RegBuilding + token, Keys: one}}

			// The dry run: what it would remove, exit 3, nothing changed.
			before := snapshot()
			r := keyswap(t, d.args("sweep", "-json", "--pattern", pat, "--grace", "1h")...)
			r.wantCode(t, exitOrphans)
			var doc sweepJSON
			if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
				t.Fatalf("%v\n%s", err, r.stdout)
			}
			onlyKept := func() []genKeptJSON {
				return []genKeptJSON{kept(1, keys.RegRetired+strconv.FormatInt(retiredAt(t, d, only.email, 1).UnixMilli(), 10), gens.SkipGrace), kept(2, "current", gens.SkipCurrent)}
			}
			wantSweep := []genSweepJSON{
				{jsonKey: newJSONKey(ix.country), Family: true, Removed: []genRemovedJSON{}, Kept: countryKept},
				{jsonKey: newJSONKey(ix.email), Removed: emailRemoved, Kept: emailDone},
				{jsonKey: newJSONKey(only.country), Family: true, Removed: []genRemovedJSON{}, Kept: onlyKept()},
				{jsonKey: newJSONKey(only.email), Removed: []genRemovedJSON{}, Kept: onlyKept()},
			}
			slices.SortFunc(wantSweep, func(a, b genSweepJSON) int { return strings.Compare(a.name(), b.name()) })
			if !doc.DryRun || doc.GraceMillis != 3_600_000 || !reflect.DeepEqual(doc.Generations, wantSweep) || doc.GenerationCount != 2 ||
				doc.GenerationKeys != 2 || doc.Error != "" {
				w, _ := json.Marshal(wantSweep)
				t.Errorf("sweep -json: got\n%s\nwant generations\n%s", r.stdout, w)
			}
			if after := snapshot(); !maps.Equal(after, before) {
				t.Errorf("a dry run changed keys")
			}

			// The same dry run as lines.
			r = keyswap(t, d.args("sweep", "--dry-run", "--pattern", pat, "--grace", "1h")...)
			r.wantCode(t, exitOrphans)
			if want := "would remove generation 1 of " + ix.email + " (retired:1000, 1 key)\n" +
				"would remove generation " + strconv.FormatInt(abandoned, 10) + " of " + ix.email + " (building:" + token + ", 1 key)\n"; !strings.Contains(r.stdout, want) ||
				!strings.HasSuffix(r.stdout, "\nwould remove 2 generations of 4 indexes in Generations mode (dry run; pass --delete to remove)\n") {
				t.Errorf("sweep --dry-run: got\n%s", r.stdout)
			}
			if after := snapshot(); !maps.Equal(after, before) {
				t.Errorf("a dry run changed keys")
			}

			// The sweep: exactly those two generations go.
			r = keyswap(t, d.args("sweep", "--delete", "--pattern", pat, "--grace", "1h")...)
			r.wantCode(t, exitOK)
			var want strings.Builder
			want.WriteString("deleted 0 keys of " + d.server().String() + "\n")
			for _, s := range wantSweep {
				for _, r := range s.Removed {
					want.WriteString("removed generation " + strconv.FormatInt(r.Gen, 10) + " of " + s.name() + " (" + r.State + ", 1 key)\n")
				}
				for _, k := range s.Kept {
					want.WriteString("kept generation " + strconv.FormatInt(k.Gen, 10) + " of " + s.name() + " (" + k.State + "): " + k.Reason + "\n")
				}
			}
			want.WriteString("removed 2 generations (2 keys) of 4 indexes in Generations mode\n")
			if r.stdout != want.String() || r.stderr != "" {
				t.Errorf("sweep --delete: got stdout\n%s\nstderr %q\nwant\n%s", r.stdout, r.stderr, want.String())
			}
			if reg := registry(t, d, ix.email); !maps.Equal(reg, map[string]string{"next": strconv.FormatInt(abandoned, 10), "2": "previous", "3": "current"}) {
				t.Errorf("registry of %s: got %v", ix.email, reg)
			}
			for _, g := range []int64{1, abandoned} {
				if exists(t, d.client, keys.GenKey(ix.email, g)) {
					t.Errorf("%s is left", keys.GenKey(ix.email, g))
				}
			}
			ix.wantGenData(t, d, 2, gV3)
			ix.wantGenData(t, d, 3, gV4)

			// Past the grace, the retired generations of the families go
			// too, their buckets found by a scan, whether the meta says
			// they are families (ix's) or not (only's).
			for _, k := range []string{ix.country, only.email, only.country} {
				do(t, d.client, "HSET", keys.RegistryKey(k, d.cluster), "1", keys.RegRetired+"1000")
			}
			r = keyswap(t, d.args("sweep", "-json", "--delete", "--pattern", pat)...)
			r.wantCode(t, exitOK)
			doc = sweepJSON{}
			if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
				t.Fatalf("%v\n%s", err, r.stdout)
			}
			removed := map[string][]genRemovedJSON{}
			for _, s := range doc.Generations {
				removed[s.name()] = s.Removed
			}
			buckets := func(ps []person) *int64 {
				n := int64(len(slices.Compact(slices.Sorted(func(yield func(string) bool) {
					for _, p := range ps {
						if !yield(p.Country) {
							return
						}
					}
				}))))
				return &n
			}
			wantRemoved := map[string][]genRemovedJSON{
				ix.country:   {{Gen: 1, State: "retired:1000", Keys: buckets(gV2)}},
				ix.email:     {},
				only.country: {{Gen: 1, State: "retired:1000", Keys: buckets(gV3)}},
				only.email:   {{Gen: 1, State: "retired:1000", Keys: one}},
			}
			if !reflect.DeepEqual(removed, wantRemoved) || doc.GraceMillis != gens.DefaultGrace.Milliseconds() || doc.GenerationCount != 3 {
				t.Errorf("sweep -json --delete: got\n%s\nwant removed %+v", r.stdout, wantRemoved)
			}
			ix.wantGenGone(t, d, 1)
			only.wantGenGone(t, d, 1)
			ix.wantGenData(t, d, 2, gV3)
			only.wantGenData(t, d, 2, gV4)

			// --plain: the keys left from rename-in-place go too, those of
			// the family's type under its prefix and none of keyswap's.
			plainOf := func(out string) map[string]*plainDropJSON {
				t.Helper()
				var doc sweepJSON
				if err := json.Unmarshal([]byte(out), &doc); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
				m := map[string]*plainDropJSON{}
				for _, s := range doc.Generations {
					m[s.name()] = s.Plain
				}
				return m
			}
			noPlain := &plainDropJSON{Note: "no plain shape recorded in its meta: nothing of it to delete"}
			do(t, d.client, "SET", ix.country+":not-a-set", "x") // under the prefix, of another type
			before = snapshot()
			r = keyswap(t, d.args("sweep", "-json", "--plain", "--pattern", pat)...)
			r.wantCode(t, exitOrphans)
			if got, want := plainOf(r.stdout), map[string]*plainDropJSON{ix.email: {Keys: one}, ix.country: {}, only.email: {Keys: ptr[int64](0)}, only.country: noPlain}; !reflect.DeepEqual(got, want) {
				t.Errorf("sweep --plain, a dry run: got\n%s", r.stdout)
			}
			if after := snapshot(); !maps.Equal(after, before) {
				t.Errorf("a dry run changed keys")
			}
			r = keyswap(t, d.args("sweep", "-json", "--delete", "--plain", "--pattern", pat)...)
			r.wantCode(t, exitOK)
			if got, want := plainOf(r.stdout), map[string]*plainDropJSON{ix.email: {Keys: one}, ix.country: {Keys: buckets(gV1)}, only.email: {Keys: ptr[int64](0)}, only.country: noPlain}; !reflect.DeepEqual(got, want) {
				t.Errorf("sweep --plain --delete: got\n%s", r.stdout)
			}
			if left := redistest.LiveKeys(t, d.client, ix.tag); !slices.Equal(left, []string{ix.country + ":not-a-set"}) {
				t.Errorf("plain keys left: got %q, want only %s:not-a-set", left, ix.country)
			}
			ix.wantGenData(t, d, 2, gV3)
			ix.wantGenData(t, d, 3, gV4)

			// A corrupt registry: its index keeps everything, exit 1.
			abandon(t, d, only.email, token)
			do(t, d.client, "HSET", keys.RegistryKey(only.email, d.cluster), "07", "x")
			before = snapshot()
			r = keyswap(t, d.args("sweep", "-json", "--delete", "--pattern", pat)...)
			r.wantCode(t, exitError)
			if !strings.Contains(r.stderr, "generations of "+only.email+": ") || !strings.Contains(r.stderr, gens.ErrCorrupt.Error()) {
				t.Errorf("sweep of a corrupt registry: got stderr %q", r.stderr)
			}
			if after := snapshot(); !maps.Equal(after, before) {
				t.Errorf("a sweep of a corrupt registry changed keys")
			}
			ix.wantNoRunLeftovers(t, d)
			only.wantNoRunLeftovers(t, d)
		})
	}
}

// TestSweepGenerationsSpread: a family without a hash tag, published in
// Generations mode, spreads its buckets over every slot of a cluster:
// status finds it by its registry (in the slot keyswap gives the prefix),
// and the sweep removes its retired generation's buckets on every master,
// leaving the current one whole.
func TestSweepGenerationsSpread(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			family := p + "spread"
			var ps []person
			for i := range 40 {
				ps = append(ps, person{ID: strconv.Itoa(i), Country: "c" + strconv.Itoa(i)})
			}
			publish := func(ps []person) {
				t.Helper()
				r := redistest.Rebuilder(t, d.client, genOpts(false),
					builders.SetIndex(family, func(p person) (string, string, bool) { return p.Country, p.ID, true }))
				if _, err := r.Run(t.Context(), sources.Slice(ps)); err != nil {
					t.Fatalf("Run: %v", err)
				}
			}
			publish(ps[:30])
			publish(ps[10:])
			if d.cluster {
				slots := map[uint16]bool{}
				for _, k := range redistest.Keys(t, d.client, keys.GenPrefix(family, 1)) {
					slots[keys.Slot(k)] = true
				}
				if len(slots) < 2 {
					t.Fatalf("the buckets of generation 1 are in %d slot(s), want them spread", len(slots))
				}
			}
			do(t, d.client, "HSET", keys.RegistryKey(family, d.cluster), "1", keys.RegRetired+"1000")

			got := statusIndexes(t, d, exitOrphans, scan.EscapeGlob(family))
			wantGenIndex(t, got, family, &genStatusJSON{Current: ptr[int64](2),
				Retired: []retiredJSON{{Gen: 1, Since: time.UnixMilli(1000).UTC(), Removable: true}}, Building: []buildJSON{}},
				rollbackStateJSON{WhyNot: rollbackNoneKept})

			r := keyswap(t, d.args("sweep", "-json", "--delete", "--pattern", testSweepPattern(t))...)
			r.wantCode(t, exitOK)
			var doc sweepJSON
			if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
				t.Fatalf("%v\n%s", err, r.stdout)
			}
			want := []genSweepJSON{{jsonKey: newJSONKey(family), Family: true,
				Removed: []genRemovedJSON{{Gen: 1, State: keys.RegRetired + "1000", Keys: ptr[int64](30)}},
				Kept:    []genKeptJSON{{Gen: 2, State: "current", Reason: string(gens.SkipCurrent)}}}}
			if !reflect.DeepEqual(doc.Generations, want) {
				w, _ := json.Marshal(want)
				t.Errorf("sweep -json --delete: got\n%s\nwant generations\n%s", r.stdout, w)
			}
			if left := redistest.Keys(t, d.client, keys.GenPrefix(family, 1)); len(left) > 0 {
				t.Errorf("buckets of generation 1 left: %q", left)
			}
			if n := len(redistest.Keys(t, d.client, keys.GenPrefix(family, 2))); n != 30 {
				t.Errorf("generation 2 has %d buckets, want 30", n)
			}
			if reg := registry(t, d, family); !maps.Equal(reg, map[string]string{"next": "2", "2": "current"}) {
				t.Errorf("registry: got %v", reg)
			}
		})
	}
}

func TestCutGenSuffix(t *testing.T) {
	for _, tc := range []struct {
		key, base string
		ok        bool
	}{
		{"{users:by-email}:rebuild-gens", "{users:by-email}", true},
		{"users:by-email:rebuild-ptr", "users:by-email", true},
		{"users:by-email:rebuild-gen", "", false},
		// A bucket's data key is no registry, whatever the bucket's name.
		{"users:by-country:rebuild-g:5:x:rebuild-gens", "", false},
		{"users:by-country:rebuild-g:5:x:rebuild-ptr", "", false},
	} {
		if base, ok := cutGenSuffix(tc.key); ok != tc.ok || ok && base != tc.base {
			t.Errorf("cutGenSuffix(%q): got %q, %v; want %q, %v", tc.key, base, ok, tc.base, tc.ok)
		}
	}
}

func TestSelectRegistry(t *testing.T) {
	for _, tc := range []struct {
		pattern, base string
		want          bool
	}{
		{"*:rebuild:*", "{users:by-email}", true},
		{"users:*:rebuild:*", "users:by-email", true},
		{"users:*:rebuild:*", "{users:by-email}", false},
		{"{users:*}:rebuild:*", "{users:by-email}", true},
		{"*ks:T*:rebuild:*", "{ks:T/x}:by-email", true},
		{"orders:*:rebuild:*", "users:by-email", false},
	} {
		if got := selectRegistry(tc.pattern, tc.base); got != tc.want {
			t.Errorf("selectRegistry(%q, %q): got %v, want %v", tc.pattern, tc.base, got, tc.want)
		}
		if want := strings.TrimSuffix(tc.pattern, ":rebuild:*") + ":rebuild-gens"; registryPattern(tc.pattern) != want {
			t.Errorf("registryPattern(%q): got %q, want %q", tc.pattern, registryPattern(tc.pattern), want)
		}
	}
	if got := registryPattern("*"); got != "*:rebuild-gens" {
		t.Errorf(`registryPattern("*"): got %q`, got)
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/keyswap/keyswap/internal/diff"
	"github.com/keyswap/keyswap/internal/keys"
	krebuild "github.com/keyswap/keyswap/rebuild"
)

// table formats rows as the commands' tables do: tab-separated cells,
// aligned with two spaces between columns.
func table(rows ...[]string) string {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		tw.Write([]byte(strings.Join(r, "\t") + "\n"))
	}
	tw.Flush()
	return b.String()
}

// The diff tests' generations: v2 keeps a, gives b another id and moves it
// from fr to de, drops c (and with it the bucket us), and adds d in a new
// bucket, it.
var (
	diffV1 = []person{{"1", "a@x", "fr"}, {"2", "b@x", "fr"}, {"3", "c@x", "us"}}
	diffV2 = []person{{"1", "a@x", "fr"}, {"9", "b@x", "de"}, {"4", "d@x", "it"}}
)

// TestDiff compares a held run's hash and family with the live ones: the
// table, the samples and the JSON are exact, --max-keys bounds the
// buckets compared, and diff changes nothing; the run is then discarded.
func TestDiff(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			ix.publish(t, d, krebuild.Options{}, diffV1)
			held := ix.startHeld(t, d, krebuild.Options{}, diffV2)
			rec := ix.record(t, d)
			before := ix.liveState(t, d)
			b := func(c string) string { return ix.country + ":" + c }

			r := keyswap(t, d.args("diff", ix.country)...)
			r.wantCode(t, exitOK)
			want := "diff of the held " + ix.describeRun(rec["token"]) + "\n\n" + table(
				[]string{"KEY", "TYPE", "LIVE", "NEW", "ADDED", "REMOVED", "CHANGED", "EXACT"},
				[]string{ix.email, "hash", "3", "3", "1", "1", "1", "yes"},
				[]string{b("de"), "set", "0", "1", "1", "0", "0", "yes"},
				[]string{b("fr"), "set", "2", "1", "0", "1", "0", "yes"},
				[]string{b("it"), "set", "0", "1", "1", "0", "0", "yes"},
				[]string{b("us"), "set", "1", "0", "0", "1", "0", "yes"},
				[]string{""},
				[]string{"SAMPLES"},
				[]string{"KEY", "KIND", "ENTRY", "OLD", "NEW"},
				[]string{ix.email, "changed", "b@x", "2", "9"},
				[]string{ix.email, "added", "d@x", "-", "4"},
				[]string{ix.email, "removed", "c@x", "3", "-"},
				[]string{b("de"), "added", "9", "-", "-"},
				[]string{b("fr"), "removed", "2", "-", "-"},
				[]string{b("it"), "added", "4", "-", "-"},
				[]string{b("us"), "removed", "3", "-", "-"},
			) + "\n" +
				ix.email + ": 1 added, 1 removed, 1 changed\n" +
				ix.country + " (family): 4 buckets, 2 added, 1 removed, 4 compared; 2 added, 2 removed, 0 changed\n"
			if r.stdout != want {
				t.Errorf("got\n%s\nwant\n%s", r.stdout, want)
			}

			r = keyswap(t, d.args("diff", "-json", ix.email)...)
			r.wantCode(t, exitOK)
			var got diffJSON
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("%v\n%s", err, r.stdout)
			}
			suffix := rec["suffix"]
			str := func(s string) *string { return &s }
			num := func(n int) *int { return &n }
			set := func(bucket, typ, liveType string, live, nw, added, removed int64, samples ...sampleJSON) keyDiffJSON {
				return keyDiffJSON{Live: str(b(bucket)), Temp: str(b(bucket) + suffix), Type: typ, LiveType: liveType,
					LiveSize: live, NewSize: nw, Added: added, Removed: removed, Exact: true, Samples: samples}
			}
			lock := ix.lock(d)
			wantJSON := diffJSON{Server: d.server().json(), LockKey: &lock, TokenPrefix: rec["token"][:8], Keys: []indexDiffJSON{
				{jsonKey: newJSONKey(ix.email), Added: 1, Removed: 1, Changed: 1, Exact: true, Diffs: []keyDiffJSON{{
					Live: str(ix.email), Temp: str(keys.Base(ix.email, d.cluster) + suffix), Type: "hash", LiveType: "hash",
					LiveSize: 3, NewSize: 3, Added: 1, Removed: 1, Changed: 1, Exact: true, Samples: []sampleJSON{
						{Kind: "changed", Entry: str("b@x"), Old: str("2"), New: str("9")},
						{Kind: "added", Entry: str("d@x"), New: str("4")},
						{Kind: "removed", Entry: str("c@x"), Old: str("3")},
					}}}},
				{jsonKey: newJSONKey(ix.country), Family: true, Added: 2, Removed: 2, Exact: true,
					Buckets: num(4), Compared: num(4), BucketsAdded: num(2), BucketsRemoved: num(1), Diffs: []keyDiffJSON{
						set("de", "set", "none", 0, 1, 1, 0, sampleJSON{Kind: "added", Entry: str("9")}),
						set("fr", "set", "set", 2, 1, 0, 1, sampleJSON{Kind: "removed", Entry: str("2")}),
						set("it", "set", "none", 0, 1, 1, 0, sampleJSON{Kind: "added", Entry: str("4")}),
						set("us", "none", "set", 1, 0, 0, 1, sampleJSON{Kind: "removed", Entry: str("3")}),
					}},
			}}
			if !reflect.DeepEqual(got, wantJSON) {
				w, _ := json.MarshalIndent(wantJSON, "", "  ")
				t.Errorf("got\n%s\nwant\n%s", r.stdout, w)
			}

			// --max-keys 2 compares the first two buckets, and says the
			// family's counts are not exact; --samples 1 shows one sample.
			r = keyswap(t, d.args("diff", "-json", "--max-keys", "2", "--samples", "1", ix.email)...)
			r.wantCode(t, exitOK)
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatal(err)
			}
			fam := got.Keys[1]
			if *fam.Buckets != 4 || *fam.Compared != 2 || fam.Exact || len(fam.Diffs) != 2 || fam.Added != 1 || fam.Removed != 1 ||
				len(got.Keys[0].Diffs[0].Samples) != 1 {
				t.Errorf("--max-keys 2 --samples 1: got %s", r.stdout)
			}
			r = keyswap(t, d.args("diff", "--max-keys", "2", ix.email)...)
			if want := ix.country + " (family): 4 buckets, 2 added, 1 removed, 2 compared; 1 added, 1 removed, 0 changed (not exact: 2 of 4 buckets compared)\n"; !strings.HasSuffix(r.stdout, want) {
				t.Errorf("--max-keys 2: got\n%s\nwant it to end with\n%s", r.stdout, want)
			}

			ix.wantLiveState(t, d, before)
			if err := held.held.Discard(t.Context()); err != nil {
				t.Fatalf("Discard: %v", err)
			}
			if _, err := held.wait(t); !errors.Is(err, krebuild.ErrDiscarded) {
				t.Errorf("Await: got %v, want ErrDiscarded", err)
			}
			ix.wantLive(t, d, diffV1)
			ix.wantNoLeftovers(t, d)
		})
	}
}

// TestNotHeld: diff, publish and discard refuse a run that is not held,
// with exit status 5, and record nothing; the run goes on and publishes.
func TestNotHeld(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			src := newEndless()
			run := startRun(t, ix.rebuilder(t, d, krebuild.Options{MaxRate: 200}), src.source)
			ix.waitRecord(t, d, "the building phase", func(rec map[string]string) bool { return rec["phase"] == "building" })
			for _, cmd := range []string{"diff", "publish", "discard"} {
				r := keyswap(t, d.args(cmd, ix.country)...)
				r.wantCode(t, exitConflict)
				want := "keyswap: " + cmd + " " + ix.country + `: the rebuild is not held: its phase is "building"; ` + cmd +
					` acts on a run that rebuild.Rebuilder.Build holds before its publish (phase "held")` + "\n"
				if r.stderr != want || r.stdout != "" {
					t.Errorf("%s: got stdout %q, stderr %q; want stderr %q", cmd, r.stdout, r.stderr, want)
				}
			}
			if a, ok := ix.record(t, d)["action"]; ok {
				t.Errorf("the record holds action %q, want none", a)
			}
			src.finish()
			if _, err := run.wait(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			ix.wantLive(t, d, people(0, src.n()))
		})
	}
}

// TestWriteDiffSampled pins how diff shows estimates: each with its 95%
// confidence interval, a family's total with the sums of its buckets'
// bounds (an exact bucket counting as its own), and why it is not exact.
func TestWriteDiffSampled(t *testing.T) {
	d := indexDiff{Key: "tags", Family: true, Exact: true, Buckets: 3, Compared: 2}
	d.add(diff.Key{Live: "tags:go", Temp: "tags:go:rebuild:1:0123456789abcdef", Type: "set", LiveType: "set",
		LiveSize: 200000, NewSize: 210000, Added: 12000, Removed: 2000, Changed: 0, Sampled: true,
		AddedRange: diff.Interval{Low: 10500, High: 13600}, RemovedRange: diff.Interval{Low: 1300, High: 2900}})
	d.add(diff.Key{Live: "tags:rust", Temp: "tags:rust:rebuild:1:0123456789abcdef", Type: "set", LiveType: "set",
		LiveSize: 10, NewSize: 11, Added: 1, Exact: true})
	d.Exact = false // a bucket not compared
	var out bytes.Buffer
	if err := writeDiff(&out, runRecord{Lock: "tags:rebuild-lock", Token: "0123456789abcdef", Keys: []string{"tags"},
		Host: "h", PID: 1}, []indexDiff{d}); err != nil {
		t.Fatal(err)
	}
	want := table(
		[]string{"KEY", "TYPE", "LIVE", "NEW", "ADDED", "REMOVED", "CHANGED", "EXACT"},
		[]string{"tags:go", "set", "200000", "210000", "~12000 [10500,13600]", "~2000 [1300,2900]", "~0 [0,0]", "no"},
		[]string{"tags:rust", "set", "10", "11", "1", "0", "0", "yes"},
	) + "\ntags (family): 3 buckets, 0 added, 0 removed, 2 compared; ~12001 [10501,13601] added, ~2000 [1300,2900] removed, ~0 [0,0] changed" +
		" (not exact: estimated from random samples, with 95% confidence intervals in brackets; 2 of 3 buckets compared)\n"
	if got := out.String(); !strings.HasSuffix(got, want) {
		t.Errorf("got\n%s\nwant it to end with\n%s", got, want)
	}
	j := diffReportJSON(runRecord{Lock: "tags:rebuild-lock", Token: "0123456789abcdef"}, []indexDiff{d})
	k := j.Keys[0]
	if !k.Sampled || *k.AddedRange != (rangeJSON{10501, 13601}) || !k.Diffs[0].Sampled || *k.Diffs[0].RemovedRange != (rangeJSON{1300, 2900}) ||
		k.Diffs[1].Sampled || k.Diffs[1].AddedRange != nil {
		b, _ := json.Marshal(j)
		t.Errorf("JSON: got %s", b)
	}
}

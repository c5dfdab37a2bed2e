package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/keyswap/keyswap/internal/diff"
	"github.com/keyswap/keyswap/internal/keys"
	krun "github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/redis/rueidis"
)

const diffUsage = `Usage: keyswap diff [flags] <key>

Diff compares what a held rebuild built with what is live, and changes
nothing. A held rebuild is one that rebuild.Rebuilder.Build stopped short of
its publish (phase "held" in 'keyswap status'): decide it afterwards with
'keyswap publish' or 'keyswap discard'. <key> is any key of the run (a
family's prefix for a family).

For each of the run's keys, diff counts the entries (hash fields, sorted-set
members, set members) only in the new key (added), only in the live one
(removed), and in both with another value or score (changed), and shows a
few of them. For a family it compares each bucket, "<prefix>:<bucket>",
with its new version: the run's temp buckets are found by SCAN, in the
family's slot, of "<prefix>:*" ending with the run's temp suffix, and the
live buckets by the same SCAN, without keyswap's own keys; the family owns
every key under "<prefix>:". A bucket only in the new family is added
whole, one only in the live family removed whole.

Diff never blocks Redis: sizes come from O(1) commands, and a comparison
reads at most --limit entries of each key, with SCAN cursors and batched
lookups (HSCAN, ZSCAN, SSCAN; HMGET, ZMSCORE, SMISMEMBER). The counts are
exact when one of the two keys has at most --limit entries: diff reads it
whole and looks its entries up in the other. When both have more, it
estimates the counts from random samples of both (HRANDFIELD, ZRANDMEMBER,
SRANDMEMBER) and says so: EXACT is "no", and each estimate is shown as
~N [LOW,HIGH], with its 95% confidence interval (a family's total sums
its buckets' bounds). Strings, lists and streams are compared by size only
(EXACT "no"). A family compares at most --max-keys buckets, in name order;
the others are only counted.

The run goes on while diff reads: changes applied meanwhile may show. Diff
fails if the run was decided or ended before it finished.

Entries that are not printable text are Go-quoted in the tables. -json
prints one object instead, with the names exact:

  {
    "server": {"mode": "standalone", "addrs": ["10.0.0.5:6379"], "db": 0},
    "lock_key": "users:by-email:rebuild-lock",
    "token_prefix": "3f9a1c2e",
    "keys": [{
      "key": "users:by-email",        a family's prefix for a family
      "family": false,
      "added": 1,                     over every key compared
      "removed": 1,
      "changed": 1,
      "exact": true,                  false: estimates, or keys not compared
      "sampled": false,               true: some counts are estimates, and
      "added_range": {"low": 1, "high": 1},    these bound them (sums of the
      "removed_range": {"low": 1, "high": 1},  keys' 95% intervals); left out
      "changed_range": {"low": 1, "high": 1},  when sampled is false
      "buckets": 3,                   families only: buckets new or live,
      "compared": 3,                  of which compared (--max-keys),
      "buckets_added": 1,             only in the new family,
      "buckets_removed": 1,           only in the live family
      "diffs": [{
        "live": "users:by-email",
        "temp": "users:by-email:rebuild:1735830245:0123456789abcdef",
        "type": "hash",               the new key's type; "none": empty
        "live_type": "hash",
        "live_size": 1000,
        "new_size": 1000,
        "added": 1,
        "removed": 1,
        "changed": 1,
        "exact": true,
        "sampled": false,             true: estimates from random samples,
                                      with "added_range", "removed_range" and
                                      "changed_range", their 95% intervals
        "samples": [
          {"kind": "added", "entry": "x@example.com", "new": "42"},
          {"kind": "changed", "entry": "y@example.com", "old": "7", "new": "8"}
        ]
      }]
    }]
  }

"old" and "new" are values (hash) or scores (sorted set), left out where
there is none. Redis names and values are bytes: one that is valid UTF-8 is
a JSON string; any other is given instead as the standard base64 of its
bytes, in a field named with "_base64" appended ("lock_key_base64",
"key_base64", "live_base64", "temp_base64", "entry_base64", "old_base64",
"new_base64"), and the plain field is left out.

Exit status: 0 when the comparison is printed; 4 when no rebuild is in
progress for <key>; 5 when the rebuild is not held; 1 on an error; 2 on a
usage error.`

// indexDiff is the comparison of one of a held run's keys, or families,
// with what is live.
type indexDiff struct {
	Key    string
	Family bool
	// Diffs are the keys compared: the key, or up to --max-keys buckets.
	Diffs []diff.Key
	// Buckets, Compared, BucketsAdded and BucketsRemoved count a family's
	// buckets: new or live, compared, only new, only live.
	Buckets, Compared, BucketsAdded, BucketsRemoved int
	// Added, Removed and Changed sum the counts of Diffs.
	Added, Removed, Changed int64
	// Exact is false when a count is an estimate, or buckets or entries
	// were not compared.
	Exact bool
	// Sampled is true when some counts are estimates; the ranges are then
	// the sums of the keys' 95% confidence intervals (an exact count
	// counts as its own interval).
	Sampled                                bool
	AddedRange, RemovedRange, ChangedRange diff.Interval
}

// diffFlags are the flags of 'keyswap diff'.
type diffFlags struct {
	conn                    *connFlags
	limit, samples, maxKeys int
	asJSON                  bool
}

// diff is the 'keyswap diff' command.
func (c *cli) diff(ctx context.Context, args []string) error {
	fs := newFlagSet("diff")
	f := diffFlags{conn: addConnFlags(fs)}
	fs.IntVar(&f.limit, "limit", diff.DefaultLimit, "the most `entries` read from each key of a comparison; past it, counts are estimated from random samples")
	fs.IntVar(&f.samples, "samples", diff.DefaultSamples, "the most differing entries shown per key")
	fs.IntVar(&f.maxKeys, "max-keys", 100, "the most buckets of a family compared one by one; the others are only counted")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object (described above) instead of tables")
	positional, err := c.parse(fs, args, diffUsage)
	if err != nil {
		return err
	}
	switch {
	case len(positional) != 1:
		return usagef("want one key, got %s: %q", plural(len(positional), "argument"), positional)
	case f.limit < 1:
		return usagef("--limit %d: must be at least 1", f.limit)
	case f.samples < 1:
		return usagef("--samples %d: must be at least 1", f.samples)
	case f.maxKeys < 1:
		return usagef("--max-keys %d: must be at least 1", f.maxKeys)
	}
	key := positional[0]
	client, err := c.connect(ctx, f.conn)
	if err != nil {
		return err
	}
	defer client.Close()
	rr := krun.New(client, nil)
	info, rec, err := findRun(ctx, rr, key)
	if err != nil {
		return err
	}
	if err := requireHeld("diff", key, rec); err != nil {
		return err
	}
	out, err := diffRun(ctx, client, rec, f)
	if err != nil {
		return fmt.Errorf("diff %s: %w", displayKey(key), err)
	}
	// What was read is the held run's only if it is still held.
	if after, err := rr.Operator.FindRun(ctx, key); err != nil || after.Token != info.Token || after.Record["phase"] != phaseHeld {
		return fmt.Errorf("diff %s: the %s was decided, or ended, while diff read it: run diff again", displayKey(key), rec.describe())
	}
	if f.asJSON {
		j := diffReportJSON(rec, out)
		j.Server = serverOf(client, f.conn.used).json()
		return writeJSON(c.stdout, j)
	}
	return writeDiff(c.stdout, rec, out)
}

// diffRun compares each key of the held run rec with its live key.
func diffRun(ctx context.Context, client rueidis.Client, rec runRecord, f diffFlags) ([]indexDiff, error) {
	cluster := client.Mode() == rueidis.ClientModeCluster
	opts := diff.Options{Limit: f.limit, Samples: f.samples}
	var out []indexDiff
	for i, k := range rec.Keys {
		d := indexDiff{Key: k, Family: rec.Families[i], Exact: true}
		pairs := [][2]string{{k, keys.Base(k, cluster) + rec.Suffix}} // live, temp
		if d.Family {
			var err error
			if pairs, err = familyPairs(ctx, client, k, rec.Suffix, f.maxKeys, &d); err != nil {
				return nil, err
			}
		}
		for _, p := range pairs {
			kd, err := diff.Compare(ctx, client, p[0], p[1], opts)
			if err != nil {
				return nil, fmt.Errorf("comparing %s with %s: %w", displayKey(p[1]), displayKey(p[0]), err)
			}
			d.add(kd)
		}
		out = append(out, d)
	}
	return out, nil
}

// add adds the comparison of a key to d.
func (d *indexDiff) add(kd diff.Key) {
	d.Diffs = append(d.Diffs, kd)
	d.Added, d.Removed, d.Changed = d.Added+kd.Added, d.Removed+kd.Removed, d.Changed+kd.Changed
	d.Exact = d.Exact && kd.Exact
	d.Sampled = d.Sampled || kd.Sampled
	for _, r := range []struct {
		sum   *diff.Interval
		count int64
		iv    diff.Interval
	}{{&d.AddedRange, kd.Added, kd.AddedRange}, {&d.RemovedRange, kd.Removed, kd.RemovedRange}, {&d.ChangedRange, kd.Changed, kd.ChangedRange}} {
		if !kd.Sampled {
			r.iv = diff.Interval{Low: r.count, High: r.count}
		}
		r.sum.Low, r.sum.High = r.sum.Low+r.iv.Low, r.sum.High+r.iv.High
	}
}

// familyPairs returns the buckets of the family prefix to compare, as
// (live, temp) pairs, and counts them in d: one SCAN of "<prefix>:*" in the
// prefix's slot finds both the run's temp buckets (ending in suffix) and
// the live ones (the keys that are not keyswap's own). Only the first
// maxKeys buckets, in name order, are compared.
func familyPairs(ctx context.Context, client rueidis.Client, prefix, suffix string, maxKeys int, d *indexDiff) ([][2]string, error) {
	live, temps := map[string]bool{}, map[string]string{} // bucket -> temp key
	opts := scan.Options{Match: scan.EscapeGlob(prefix+":") + "*", InSlot: true, Slot: keys.Slot(prefix)}
	for page, err := range scan.Pages(ctx, client, opts) {
		if err != nil {
			return nil, fmt.Errorf("SCAN %s: %w", opts.Match, err)
		}
		for _, k := range page {
			if bucket, ok := strings.CutSuffix(k, suffix); ok {
				temps[bucket] = k
			} else if !keys.Reserved(k) {
				live[k] = true
			}
		}
	}
	all := maps.Clone(live)
	for b := range temps {
		if !live[b] {
			d.BucketsAdded++
		}
		all[b] = true
	}
	for b := range live {
		if temps[b] == "" {
			d.BucketsRemoved++
		}
	}
	buckets := slices.Sorted(maps.Keys(all))
	d.Buckets = len(buckets)
	if len(buckets) > maxKeys {
		buckets, d.Exact = buckets[:maxKeys], false
	}
	d.Compared = len(buckets)
	pairs := make([][2]string, len(buckets))
	for i, b := range buckets {
		// A bucket the run did not write compares with a temp key that
		// does not exist: empty, every entry removed.
		pairs[i] = [2]string{b, b + suffix}
		if t := temps[b]; t != "" {
			pairs[i][1] = t
		}
	}
	return pairs, nil
}

// writeDiff prints a diff as tables: the keys compared, the samples, then
// a summary line per key of the run.
func writeDiff(w io.Writer, rec runRecord, out []indexDiff) error {
	fmt.Fprintf(w, "diff of the held %s\n\n", rec.describe())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tTYPE\tLIVE\tNEW\tADDED\tREMOVED\tCHANGED\tEXACT")
	samples := 0
	for _, d := range out {
		for _, k := range d.Diffs {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", displayKey(k.Live), diffType(k), k.LiveSize, k.NewSize,
				fmtCount(k.Added, k.AddedRange, k.Sampled), fmtCount(k.Removed, k.RemovedRange, k.Sampled),
				fmtCount(k.Changed, k.ChangedRange, k.Sampled), yesNo(k.Exact))
			samples += len(k.Samples)
		}
	}
	if samples > 0 {
		fmt.Fprintln(tw, "\nSAMPLES")
		fmt.Fprintln(tw, "KEY\tKIND\tENTRY\tOLD\tNEW")
		for _, d := range out {
			for _, k := range d.Diffs {
				for _, s := range k.Samples {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", displayKey(k.Live), s.Kind, displayKey(s.Entry), displayValue(s.Old), displayValue(s.New))
				}
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, d := range out {
		counts := fmt.Sprintf("%s added, %s removed, %s changed", fmtCount(d.Added, d.AddedRange, d.Sampled),
			fmtCount(d.Removed, d.RemovedRange, d.Sampled), fmtCount(d.Changed, d.ChangedRange, d.Sampled))
		if why := d.inexact(); why != "" {
			counts += " (not exact: " + why + ")"
		}
		if d.Family {
			fmt.Fprintf(w, "%s (family): %s, %d added, %d removed, %d compared; %s\n", displayKey(d.Key),
				plural(d.Buckets, "bucket"), d.BucketsAdded, d.BucketsRemoved, d.Compared, counts)
		} else {
			fmt.Fprintf(w, "%s: %s\n", displayKey(d.Key), counts)
		}
	}
	return nil
}

// fmtCount formats a count: as is when exact, else "~N [LOW,HIGH]" with its
// confidence interval.
func fmtCount(n int64, iv diff.Interval, sampled bool) string {
	if !sampled {
		return strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("~%d [%d,%d]", n, iv.Low, iv.High)
}

// inexact says why d's counts are not exact, "" when they are.
func (d indexDiff) inexact() string {
	var why []string
	if d.Sampled {
		why = append(why, "estimated from random samples, with 95% confidence intervals in brackets")
	}
	if d.Family && d.Compared < d.Buckets {
		why = append(why, fmt.Sprintf("%d of %d buckets compared", d.Compared, d.Buckets))
	}
	for _, k := range d.Diffs {
		if !k.Exact && !k.Sampled {
			why = append(why, "keys of a type compared only by size")
			break
		}
	}
	if len(why) == 0 && !d.Exact {
		why = append(why, "keys not compared")
	}
	return strings.Join(why, "; ")
}

// diffType is a comparison's TYPE column: the keys' type, or "live->new"
// when they differ.
func diffType(k diff.Key) string {
	switch {
	case k.Type == "none":
		return k.LiveType
	case k.LiveType != "none" && k.LiveType != k.Type:
		return k.LiveType + "->" + k.Type
	}
	return k.Type
}

// displayValue is displayKey for a value or score, "-" for none.
func displayValue(v string) string {
	if v == "" {
		return "-"
	}
	return displayKey(v)
}

// diffJSON is the -json document of 'keyswap diff' (see diffUsage).
type diffJSON struct {
	Server        serverJSON      `json:"server"`
	LockKey       *string         `json:"lock_key,omitempty"`
	LockKeyBase64 []byte          `json:"lock_key_base64,omitempty"`
	TokenPrefix   string          `json:"token_prefix"`
	Keys          []indexDiffJSON `json:"keys"`
}

// indexDiffJSON is an indexDiff in diffJSON.
type indexDiffJSON struct {
	jsonKey
	Family         bool          `json:"family"`
	Added          int64         `json:"added"`
	Removed        int64         `json:"removed"`
	Changed        int64         `json:"changed"`
	Exact          bool          `json:"exact"`
	Sampled        bool          `json:"sampled"`
	AddedRange     *rangeJSON    `json:"added_range,omitempty"`
	RemovedRange   *rangeJSON    `json:"removed_range,omitempty"`
	ChangedRange   *rangeJSON    `json:"changed_range,omitempty"`
	Buckets        *int          `json:"buckets,omitempty"`
	Compared       *int          `json:"compared,omitempty"`
	BucketsAdded   *int          `json:"buckets_added,omitempty"`
	BucketsRemoved *int          `json:"buckets_removed,omitempty"`
	Diffs          []keyDiffJSON `json:"diffs"`
}

// keyDiffJSON is a diff.Key in diffJSON.
type keyDiffJSON struct {
	Live         *string      `json:"live,omitempty"`
	LiveBase64   []byte       `json:"live_base64,omitempty"`
	Temp         *string      `json:"temp,omitempty"`
	TempBase64   []byte       `json:"temp_base64,omitempty"`
	Type         string       `json:"type"`
	LiveType     string       `json:"live_type"`
	LiveSize     int64        `json:"live_size"`
	NewSize      int64        `json:"new_size"`
	Added        int64        `json:"added"`
	Removed      int64        `json:"removed"`
	Changed      int64        `json:"changed"`
	Exact        bool         `json:"exact"`
	Sampled      bool         `json:"sampled"`
	AddedRange   *rangeJSON   `json:"added_range,omitempty"`
	RemovedRange *rangeJSON   `json:"removed_range,omitempty"`
	ChangedRange *rangeJSON   `json:"changed_range,omitempty"`
	Samples      []sampleJSON `json:"samples"`
}

// rangeJSON is an estimate's confidence interval in diffJSON.
type rangeJSON struct {
	Low  int64 `json:"low"`
	High int64 `json:"high"`
}

// ranges returns the three intervals in JSON, nil unless sampled.
func ranges(sampled bool, ivs ...diff.Interval) []*rangeJSON {
	out := make([]*rangeJSON, len(ivs))
	if sampled {
		for i, iv := range ivs {
			out[i] = &rangeJSON{Low: iv.Low, High: iv.High}
		}
	}
	return out
}

// sampleJSON is a diff.Entry in diffJSON.
type sampleJSON struct {
	Kind        string  `json:"kind"`
	Entry       *string `json:"entry,omitempty"`
	EntryBase64 []byte  `json:"entry_base64,omitempty"`
	Old         *string `json:"old,omitempty"`
	OldBase64   []byte  `json:"old_base64,omitempty"`
	New         *string `json:"new,omitempty"`
	NewBase64   []byte  `json:"new_base64,omitempty"`
}

// diffReportJSON returns the -json document of the diff of rec.
func diffReportJSON(rec runRecord, out []indexDiff) diffJSON {
	j := diffJSON{TokenPrefix: prefix(rec.Token, tokenPrefixLen), Keys: make([]indexDiffJSON, 0, len(out))}
	j.LockKey, j.LockKeyBase64 = jsonName(rec.Lock)
	for _, d := range out {
		dj := indexDiffJSON{jsonKey: newJSONKey(d.Key), Family: d.Family, Added: d.Added, Removed: d.Removed,
			Changed: d.Changed, Exact: d.Exact, Sampled: d.Sampled, Diffs: make([]keyDiffJSON, 0, len(d.Diffs))}
		rs := ranges(d.Sampled, d.AddedRange, d.RemovedRange, d.ChangedRange)
		dj.AddedRange, dj.RemovedRange, dj.ChangedRange = rs[0], rs[1], rs[2]
		if d.Family {
			dj.Buckets, dj.Compared, dj.BucketsAdded, dj.BucketsRemoved = &d.Buckets, &d.Compared, &d.BucketsAdded, &d.BucketsRemoved
		}
		for _, k := range d.Diffs {
			kj := keyDiffJSON{Type: k.Type, LiveType: k.LiveType, LiveSize: k.LiveSize, NewSize: k.NewSize,
				Added: k.Added, Removed: k.Removed, Changed: k.Changed, Exact: k.Exact, Sampled: k.Sampled,
				Samples: make([]sampleJSON, 0, len(k.Samples))}
			rs := ranges(k.Sampled, k.AddedRange, k.RemovedRange, k.ChangedRange)
			kj.AddedRange, kj.RemovedRange, kj.ChangedRange = rs[0], rs[1], rs[2]
			kj.Live, kj.LiveBase64 = jsonName(k.Live)
			kj.Temp, kj.TempBase64 = jsonName(k.Temp)
			for _, s := range k.Samples {
				sj := sampleJSON{Kind: s.Kind}
				sj.Entry, sj.EntryBase64 = jsonName(s.Entry)
				sj.Old, sj.OldBase64 = jsonValue(s.Old)
				sj.New, sj.NewBase64 = jsonValue(s.New)
				kj.Samples = append(kj.Samples, sj)
			}
			dj.Diffs = append(dj.Diffs, kj)
		}
		j.Keys = append(j.Keys, dj)
	}
	return j
}

// jsonValue is jsonName for a value that may be absent (""): then both
// fields are left out.
func jsonValue(v string) (*string, []byte) {
	if v == "" {
		return nil, nil
	}
	return jsonName(v)
}

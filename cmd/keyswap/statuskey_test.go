package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	krebuild "github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// decodeStatusJSON decodes the output of 'status -json'.
func decodeStatusJSON(t *testing.T, out string) statusJSON {
	t.Helper()
	var doc statusJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("status -json: %v\n%s", err, out)
	}
	return doc
}

// TestStatusOfOneKey runs 'status <key>' (and --index) against a rebuild
// in progress of a hash and a family, asking for its second key: it shows
// the run, found through that key's lock, with both its locks, the hash's
// temp key (a family's buckets take a scan), and the key's index, locked;
// once the run has published, the key's new generation and that a rollback
// is possible; for a key never published, that it never was. An argument
// with a glob character is a pattern, and --index takes any key.
func TestStatusOfOneKey(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			ix := newIndex(p)
			keep := krebuild.Options{KeepPrevious: time.Hour}
			ix.publish(t, d, keep, people(0, 3))
			ix.publish(t, d, keep, people(0, 4))
			release := make(chan struct{})
			run := startRun(t, ix.rebuilder(t, d, krebuild.Options{KeepPrevious: time.Hour, Expected: 10}), gated(people(0, 5), release))
			rec := ix.waitRecord(t, d, "the first batch", func(rec map[string]string) bool { return rec["acked"] == "1" })
			token := rec["token"]
			emailLock, countryLock := keys.LockKey(ix.email, d.cluster), keys.LockKey(ix.country, d.cluster)
			temp := keys.Base(ix.email, d.cluster) + rec["suffix"]

			for _, args := range [][]string{{ix.country}, {"--index", ix.country}} {
				r := keyswap(t, d.args("status", append([]string{"-json"}, args...)...)...)
				r.wantCode(t, exitOK)
				doc := decodeStatusJSON(t, r.stdout)
				if doc.Key == nil || *doc.Key != ix.country || doc.Pattern != nil || doc.Scanned {
					t.Errorf("%q: key %v, pattern %v, scanned %v; want the key, no pattern, not scanned", args, doc.Key, doc.Pattern, doc.Scanned)
				}
				var locks []string
				for _, l := range doc.Locks {
					locks = append(locks, *l.Key)
					if l.TokenPrefix != token[:8] {
						t.Errorf("%q: lock %s has token %s, want %s", args, *l.Key, l.TokenPrefix, token[:8])
					}
				}
				if want := []string{countryLock, emailLock}; strings.Join(locks, ",") != strings.Join(sortedCopy(want), ",") {
					t.Errorf("%q: locks %q, want %q", args, locks, want)
				}
				if len(doc.Runs) != 1 || doc.Runs[0].LockKey == nil || *doc.Runs[0].LockKey != emailLock || doc.Runs[0].Items != 5 ||
					len(doc.Runs[0].Keys) != 2 {
					t.Errorf("%q: runs %+v, want the run, through its first lock %s, with 5 items and 2 keys", args, doc.Runs, emailLock)
				}
				if len(doc.TempKeys) != 1 || doc.TempKeys[0].Key == nil || *doc.TempKeys[0].Key != temp || !doc.TempKeys[0].Locked ||
					doc.TempKeys[0].Type != "hash" || doc.TempKeys[0].SweepCandidate {
					t.Errorf("%q: temp keys %+v, want the hash's %s, locked", args, doc.TempKeys, temp)
				}
				got := map[string]indexStatusJSON{}
				for _, i := range doc.Indexes {
					got[*i.Key] = i
				}
				if len(got) != 1 {
					t.Errorf("%q: indexes %v, want %s's alone", args, got, ix.country)
				}
				wantIndex(t, d, got, ix.country, true, 2, 1, rollbackLocked, true)
			}

			// The table, and its summary, which says what a scan would add.
			r := keyswap(t, d.args("status", ix.email)...)
			r.wantCode(t, exitOK)
			tableRow(t, section(t, r.stdout, "RUNS"), emailLock)
			tableRow(t, section(t, r.stdout, "TEMP KEYS"), temp)
			row := tableRow(t, section(t, r.stdout, "INDEXES"), ix.email)
			if got := strings.Join(row[6:], " "); got != "no: rebuild in progress" {
				t.Errorf("index row %q: want rollback 'no: rebuild in progress'", row)
			}
			var urls []string
			for i := 1; i < len(d.redis); i += 2 {
				urls = append(urls, d.redis[i])
			}
			wantSummary := fmt.Sprintf("\n1 rebuild in progress for %s; 1 temp key; read without a scan, so orphaned temp keys are not looked for: keyswap status --pattern %s -u %s finds them.\n",
				ix.email, shellQuote(ix.email), strings.Join(urls, ","))
			if !strings.HasSuffix(r.stdout, wantSummary) {
				t.Errorf("got\n%s\nwant it to end with\n%s", r.stdout, wantSummary)
			}

			close(release)
			if _, err := run.wait(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			r = keyswap(t, d.args("status", ix.email)...)
			r.wantCode(t, exitOK)
			if !strings.HasPrefix(r.stdout, d.server().String()+"\n\nNo rebuild of "+ix.email+" in progress.\n\nINDEXES\n") {
				t.Errorf("after the run: got\n%s", r.stdout)
			}
			got := statusIndexes(t, d, exitOK, ix.email)
			wantIndex(t, d, got, ix.email, false, 3, 2, "", false)

			// Never published; and a key with a glob character, which only
			// --index takes for a key.
			for _, key := range []string{p + "never", p + "never*"} {
				got := statusIndexes(t, d, exitOK, "--index", key)
				if ix, ok := got[key]; !ok || ix.Generation != nil || ix.Rollback.WhyNot != rollbackNeverPublished || ix.Locked {
					t.Errorf("--index %s: indexes %+v, want it never published", key, got)
				}
			}
			r = keyswap(t, d.args("status", "-json", p+"never*")...)
			r.wantCode(t, exitOK)
			if doc := decodeStatusJSON(t, r.stdout); doc.Pattern == nil || *doc.Pattern != p+"never*" || doc.Key != nil || !doc.Scanned {
				t.Errorf("status %s: got pattern %v, key %v, scanned %v; want a scan for the pattern", p+"never*", doc.Pattern, doc.Key, doc.Scanned)
			}
			ix.wantNoLeftovers(t, d)
		})
	}
}

// sortedCopy returns ss sorted, leaving ss as is.
func sortedCopy(ss []string) []string {
	out := append([]string(nil), ss...)
	slices.Sort(out)
	return out
}

// scanCalls returns the SCAN calls each master of c served since the last
// CONFIG RESETSTAT, summed.
func scanCalls(t *testing.T, c rueidis.Client) int {
	t.Helper()
	calls := 0
	for addr, node := range c.Nodes() {
		info, err := node.Do(context.Background(), node.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			t.Fatalf("INFO on %s: %v", addr, err)
		}
		for line := range strings.Lines(info) {
			if rest, ok := strings.CutPrefix(line, "cmdstat_scan:calls="); ok {
				n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
				calls += n
			}
		}
	}
	return calls
}

// TestStatusOfOneKeyScansNothing: on servers of the test's own (a
// standalone one and a 3-master cluster, whose command counts no other
// test moves), 'status <key>' and 'status --index <key>' send no SCAN to
// any node, while 'status <pattern>' does, which shows the count works.
func TestStatusOfOneKeyScansNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	cl := redistest.OwnCluster(t, 3)
	for _, d := range []deployment{
		{name: "standalone", redis: []string{"-u", srv.Addr}, client: srv.Client(t)},
		{name: "cluster", cluster: true, redis: []string{"-u", "redis://" + cl.Addrs[0]}, client: cl.Client(t)},
	} {
		t.Run(d.name, func(t *testing.T) {
			ix := newIndex("scans")
			ix.publish(t, d, krebuild.Options{}, people(0, 3))
			for i := range 200 {
				do(t, d.client, "SET", fmt.Sprintf("filler:%d", i), "x")
			}
			for addr, node := range d.client.Nodes() {
				if err := node.Do(context.Background(), node.B().ConfigResetstat().Build()).Error(); err != nil {
					t.Fatalf("CONFIG RESETSTAT on %s: %v", addr, err)
				}
			}
			keyswap(t, d.args("status", ix.email)...).wantCode(t, exitOK)
			keyswap(t, d.args("status", "--index", ix.country, "-json")...).wantCode(t, exitOK)
			if n := scanCalls(t, d.client); n != 0 {
				t.Errorf("status of one key: %d SCAN calls, want none", n)
			}
			keyswap(t, d.args("status", ix.tag+"*")...).wantCode(t, exitOK)
			if n := scanCalls(t, d.client); n == 0 {
				t.Errorf("status of a pattern: no SCAN call counted")
			}
		})
	}
}

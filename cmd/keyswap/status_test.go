package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	krebuild "github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/store"
)

// tableRow returns the fields of the line of table output that starts with
// key, or fails the test.
func tableRow(t *testing.T, out, key string) []string {
	t.Helper()
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == key {
			return f
		}
	}
	t.Fatalf("no row for %s in:\n%s", key, out)
	return nil
}

// TestStatusShowsRebuildInProgress starts a rebuild and, while its callback
// waits, checks that status shows its lock and its temp key, in the table
// and in JSON, beside an orphan that is a sweep candidate.
func TestStatusShowsRebuildInProgress(t *testing.T) {
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			rb := startRebuild(t, d.client, p+"users:by-email", store.Options{}, true)
			token, err := do(t, d.client, "GET", rb.lockKey).ToString()
			if err != nil {
				t.Fatalf("GET %s: %v", rb.lockKey, err)
			}
			// A crashed rebuild's temp key: two hours old, no TTL, no lock.
			orphan := keys.TempKey(p+"crashed", d.cluster, time.Now().Add(-2*time.Hour).Unix(), 0xfeed)
			do(t, d.client, "SADD", orphan, "x", "y")

			// Table. The flag after the pattern is parsed too.
			r := keyswap(t, d.args("status", p+"*", "-older-than", "1h")...)
			r.wantCode(t, exitOrphans)
			if !strings.Contains(r.stdout, "REBUILDS IN PROGRESS\nLOCK ") {
				t.Errorf("no REBUILDS IN PROGRESS table in:\n%s", r.stdout)
			}
			lock := tableRow(t, r.stdout, rb.lockKey)
			if want := []string{rb.lockKey, lock[1], token[:8]}; !slices.Equal(lock, want) || lock[1] == "none" {
				t.Errorf("lock row: got %q, want %q with a TTL", lock, want)
			}
			// KEY AGE TTL TYPE SIZE MEMORY(2 fields) LOCKED SWEEP
			temp := tableRow(t, r.stdout, rb.temp)
			if len(temp) != 9 || temp[2] == "none" || temp[3] != "hash" || temp[4] != "3" || temp[7] != "yes" || temp[8] != "no" {
				t.Errorf("temp key row: got %q, want a TTL, hash, size 3, locked yes, sweep no", temp)
			}
			row := tableRow(t, r.stdout, orphan)
			if len(row) != 9 || !strings.HasPrefix(row[1], "2h") || row[2] != "none" || row[3] != "set" || row[4] != "2" || row[7] != "no" || row[8] != "yes" {
				t.Errorf("orphan row: got %q, want age 2h, TTL none, set, size 2, locked no, sweep yes", row)
			}
			if !strings.Contains(r.stdout, "\n1 rebuild in progress; 2 temp keys, 1 without a TTL; 1 sweep candidate (no TTL, no lock, older than 1h0m0s).\n") {
				t.Errorf("no summary line in:\n%s", r.stdout)
			}

			// JSON.
			r = keyswap(t, d.args("status", "-json", p+"*")...)
			r.wantCode(t, exitOrphans)
			rep := decodeStatus(t, r.stdout)
			if rep.Pattern != p+"*" || rep.Cluster != d.cluster || rep.OlderThanSeconds != 3600 || time.Since(rep.Time) > time.Minute {
				t.Errorf("got pattern %q, cluster %v, older_than_seconds %d, time %v", rep.Pattern, rep.Cluster, rep.OlderThanSeconds, rep.Time)
			}
			if len(rep.Locks) != 1 {
				t.Fatalf("locks: got %+v, want the rebuild's lock only", rep.Locks)
			}
			if l := rep.Locks[0]; l.Key != rb.lockKey || l.TTLSeconds <= 0 || l.TTLSeconds > 300 || l.TokenPrefix != token[:8] ||
				l.Base != strings.TrimSuffix(rb.lockKey, ":rebuild-lock") {
				t.Errorf("lock: got %+v, want key %s, TTL in (0, 300], token prefix %s", l, rb.lockKey, token[:8])
			}
			if len(rep.TempKeys) != 2 {
				t.Fatalf("temp keys: got %+v, want the rebuild's and the orphan", rep.TempKeys)
			}
			byKey := map[string]tempStatus{}
			for _, tk := range rep.TempKeys {
				byKey[tk.Key] = tk
			}
			live := byKey[rb.temp]
			if live.TTLSeconds <= 0 || live.Type != "hash" || live.Size == nil || *live.Size != 3 ||
				live.MemoryBytes == nil || *live.MemoryBytes <= 0 || !live.Locked || live.LockKey != rb.lockKey ||
				live.SweepCandidate || live.AgeSeconds < 0 || live.AgeSeconds > 60 {
				t.Errorf("rebuild's temp key: got %+v", live)
			}
			o := byKey[orphan]
			if o.TTLSeconds != -1 || o.Type != "set" || o.Size == nil || *o.Size != 2 || o.Locked || o.LockKey != "" ||
				!o.SweepCandidate || o.AgeSeconds < 7200 || o.Base != keys.Base(p+"crashed", d.cluster) {
				t.Errorf("orphan: got %+v", o)
			}

			// The status of the key: its lock, held by a store's rebuild,
			// which keeps no record (no run, no temp key found), and no
			// index yet.
			r = keyswap(t, d.args("status", rb.final)...)
			r.wantCode(t, exitOK)
			if row := tableRow(t, r.stdout, rb.lockKey); row[2] != token[:8] {
				t.Errorf("status %s: lock row %q, want the token %s", rb.final, row, token[:8])
			}
			if row := tableRow(t, section(t, r.stdout, "INDEXES"), rb.final); strings.Join(row[1:], " ") != "- - - - - no: never published" {
				t.Errorf("status %s: index row %q, want never published", rb.final, row)
			}
			if want := "\n1 rebuild in progress for " + rb.final + "; 0 temp keys; read without a scan"; !strings.Contains(r.stdout, want) || strings.Contains(r.stdout, "\nRUNS\n") {
				t.Errorf("status %s: got\n%s\nwant no run, and %q", rb.final, r.stdout, want)
			}

			// The pattern applies to the live key, with or without the hash
			// tag a cluster adds.
			r = keyswap(t, d.args("status", "-json", p+"users:*")...)
			r.wantCode(t, exitOK)
			rep = decodeStatus(t, r.stdout)
			if len(rep.Locks) != 1 || len(rep.TempKeys) != 1 || rep.TempKeys[0].Key != rb.temp {
				t.Errorf("status %s*: got %+v, want only the rebuild's lock and temp key", p+"users:", rep)
			}

			// Once the rebuild has swapped, status shows nothing left of it
			// but the index it published, its first generation, which keeps
			// no previous one.
			if err := rb.finish(); err != nil {
				t.Fatalf("rebuild: %v", err)
			}
			r = keyswap(t, d.args("status", p+"users:*")...)
			r.wantCode(t, exitOK)
			meta := redistest.HGetAll(t, d.client, keys.MetaKey(rb.final, d.cluster))
			at := time.UnixMilli(atoi(meta["at"])).UTC().Format(time.RFC3339)
			wantStart := d.server().String() + "\n\nNo rebuild in progress.\n\nINDEXES\n"
			wantEnd := "\n\nNo temp keys.\n\n0 rebuilds in progress; 0 temp keys, 0 without a TTL; 0 sweep candidates (no TTL, no lock, older than 1h0m0s).\n"
			if !strings.HasPrefix(r.stdout, wantStart) || !strings.HasSuffix(r.stdout, wantEnd) || strings.Count(r.stdout, "\n") != 11 {
				t.Errorf("status after the rebuild: got\n%s\nwant it to start with\n%s\nand end with\n%s", r.stdout, wantStart, wantEnd)
			}
			row = tableRow(t, section(t, r.stdout, "INDEXES"), rb.final)
			if want := []string{rb.final, "no", "1", at, "-", "-", "no:", "none", "kept"}; !slices.Equal(row, want) {
				t.Errorf("index row: got %q, want %q", row, want)
			}
		})
	}
}

// TestWriteStatus pins the table format on a fixed report.
func TestWriteStatus(t *testing.T) {
	size, mem := int64(1000), int64(72088)
	rep := &statusReport{
		OlderThanSeconds: 3600,
		Locks: []lockStatus{
			{Key: "users:by-email:rebuild-lock", Base: "users:by-email", TTLSeconds: 298, TokenPrefix: "3f9a1c2e"},
		},
		TempKeys: []tempStatus{
			{Key: "users:by-email:rebuild:1700000000:0123456789abcdef", AgeSeconds: 12, TTLSeconds: -1, Type: "hash",
				Size: &size, MemoryBytes: &mem, Locked: true},
			{Key: "tags:rebuild:1699990000:fedcba9876543210", AgeSeconds: 10012, TTLSeconds: -1, Type: "zset",
				Size: &size, MemoryBytes: &mem, SweepCandidate: true},
			{Key: "odd key\t:rebuild:1700000000", AgeSeconds: -5, TTLSeconds: 3599, Type: "ReJSON-RL"},
		},
	}
	var out bytes.Buffer
	if err := writeStatus(&out, rep); err != nil {
		t.Fatal(err)
	}
	want := `REBUILDS IN PROGRESS
LOCK                         TTL    TOKEN
users:by-email:rebuild-lock  4m58s  3f9a1c2e

No index published.

TEMP KEYS
KEY                                                 AGE     TTL     TYPE       SIZE  MEMORY    LOCKED  SWEEP
users:by-email:rebuild:1700000000:0123456789abcdef  12s     none    hash       1000  70.4 KiB  yes     no
tags:rebuild:1699990000:fedcba9876543210            2h46m   none    zset       1000  70.4 KiB  no      yes
"odd key\t:rebuild:1700000000"                      future  59m59s  ReJSON-RL  -     -         no      no

1 rebuild in progress; 3 temp keys, 2 without a TTL; 1 sweep candidate (no TTL, no lock, older than 1h0m0s).
List them with the following, and add --delete to delete them:
  keyswap sweep --older-than 1h0m0s
`
	if got := out.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestWriteStatusSuggestion pins the sweep commands that status suggests
// for a pattern: limited to the pattern's live keys, one command per shape
// of base on a cluster.
func TestWriteStatusSuggestion(t *testing.T) {
	odd := keys.Base("it's{}odd", true) // "{rbN}it's{}odd"
	tag := strings.TrimSuffix(odd, "it's{}odd")
	rep := &statusReport{
		Pattern:          "it's*",
		Cluster:          true,
		OlderThanSeconds: 7200,
		TempKeys: []tempStatus{
			{Key: "{it's:a}:rebuild:1:0123456789abcdef", Base: "{it's:a}", TTLSeconds: -1, Type: "set", SweepCandidate: true},
			{Key: "{it's:b}:rebuild:1:0123456789abcdef", Base: "{it's:b}", TTLSeconds: -1, Type: "set", SweepCandidate: true},
			{Key: "it's{x}:rebuild:1:0123456789abcdef", Base: "it's{x}", TTLSeconds: -1, Type: "set", SweepCandidate: true},
			{Key: odd + ":rebuild:1:0123456789abcdef", Base: odd, TTLSeconds: -1, Type: "set", SweepCandidate: true},
			{Key: "{it's:c}:rebuild:1:0123456789abcdef", Base: "{it's:c}", TTLSeconds: 60, Type: "set"},
		},
	}
	var out bytes.Buffer
	if err := writeStatus(&out, rep); err != nil {
		t.Fatal(err)
	}
	want := `
0 rebuilds in progress; 5 temp keys, 4 without a TTL; 4 sweep candidates (no TTL, no lock, older than 2h0m0s).
List them with the following, and add --delete to delete them:
  keyswap sweep --older-than 2h0m0s --pattern 'it'\''s*:rebuild:*'
  keyswap sweep --older-than 2h0m0s --pattern '{it'\''s*}:rebuild:*'
  keyswap sweep --older-than 2h0m0s --pattern '` + tag + `it'\''s*:rebuild:*'
`
	if got := out.String(); !strings.HasSuffix(got, want) {
		t.Errorf("got\n%s\nwant it to end with\n%s", got, want)
	}
}

// TestStatusSuggestsLimitedSweep runs status with a pattern, then the sweep
// commands it suggests: they list exactly the candidates status showed, not
// the orphans of other keys, and delete only them.
func TestStatusSuggestsLimitedSweep(t *testing.T) {
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			old := time.Now().Add(-2 * time.Hour).Unix()
			var mine []string // orphans of live keys that p+"users*" selects
			for i, live := range []string{p + "users:a", p + "users{x}:b", p + "users:c}d"} {
				k := keys.TempKey(live, d.cluster, old, uint64(i))
				do(t, d.client, "SET", k, "x")
				mine = append(mine, k)
			}
			slices.Sort(mine)
			other := keys.TempKey(p+"orders:users:a", d.cluster, old, 9)
			do(t, d.client, "SET", other, "x")

			r := keyswap(t, d.args("status", p+"users*")...)
			r.wantCode(t, exitOrphans)
			_, cmds, ok := strings.Cut(r.stdout, "List them with the following, and add --delete to delete them:\n")
			if !ok {
				t.Fatalf("no sweep command in:\n%s", r.stdout)
			}
			// The patterns that the commands carry, and the commands.
			patterns := map[string]bool{}
			for _, k := range mine {
				base, _, _ := keys.ParseTempKey(k)
				pat, ok := sweepPattern(p+"users*", base, d.cluster)
				if !ok {
					t.Fatalf("sweepPattern(%q, %q): no pattern", p+"users*", base)
				}
				patterns[pat] = true
			}
			// The connection flags follow: the deployment's URLs.
			var urls []string
			for i := 1; i < len(d.redis); i += 2 {
				urls = append(urls, d.redis[i])
			}
			var want string
			for _, pat := range slices.Sorted(maps.Keys(patterns)) {
				want += "  keyswap sweep --older-than 1h0m0s --pattern " + shellQuote(pat) + " -u " + strings.Join(urls, ",") + "\n"
			}
			if cmds != want {
				t.Errorf("got sweep commands\n%s\nwant\n%s", cmds, want)
			}

			var listed []string
			for pat := range patterns {
				r := keyswap(t, d.args("sweep", "-json", "--older-than", "1h", "--pattern", pat)...)
				r.wantCode(t, exitOrphans)
				listed = append(listed, decodeSweep(t, r.stdout).Keys...)
			}
			slices.Sort(listed)
			if !slices.Equal(listed, mine) {
				t.Errorf("the suggested sweeps list %q, want %q", listed, mine)
			}
			for pat := range patterns {
				keyswap(t, d.args("sweep", "--delete", "--older-than", "1h", "--pattern", pat)...).wantCode(t, exitOK)
			}
			wantKeys(t, d, mine, false)
			wantKeys(t, d, []string{other}, true)
		})
	}
}

// TestStatusScansOnce counts the SCAN calls status makes on a server of the
// test's own: every one is logged (slowlog-log-slower-than 0), and exactly
// one starts a pass over the keyspace (cursor 0), although the keyspace
// takes several calls.
func TestStatusScansOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t, "--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000")
	c := srv.Client(t)
	ctx := t.Context()
	old := time.Now().Add(-2 * time.Hour).Unix()
	for chunk := range 10 {
		cmd := c.B().Mset().KeyValue()
		for i := range 500 {
			n := chunk*500 + i
			k := fmt.Sprintf("filler:%d", n)
			if n%100 == 0 {
				k = keys.TempKey(k, false, old, uint64(n)) // orphans: sweep candidates
			}
			cmd = cmd.KeyValue(k, "x")
		}
		if err := c.Do(ctx, cmd.Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	do(t, c, "CONFIG", "RESETSTAT")
	do(t, c, "SLOWLOG", "RESET")

	r := keyswap(t, "status", "-u", srv.Addr)
	r.wantCode(t, exitOrphans)
	if !strings.Contains(r.stdout, "; 50 sweep candidates") {
		t.Errorf("status: want 50 sweep candidates in:\n%s", r.stdout)
	}

	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_scan:calls="); ok {
			calls, _ = strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		}
	}
	entries, err := c.Do(ctx, c.B().SlowlogGet().Count(100000).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	var scans, passes int
	for _, e := range entries {
		fields, _ := e.ToArray()
		if len(fields) < 4 {
			continue
		}
		args, _ := fields[3].AsStrSlice()
		if len(args) >= 2 && strings.EqualFold(args[0], "SCAN") {
			scans++
			if args[1] == "0" {
				passes++
			}
		}
	}
	if calls < 2 || scans != calls || passes != 1 {
		t.Errorf("status made %d SCAN calls (slowlog: %d, %d from cursor 0), want several calls and 1 pass over the keyspace", calls, scans, passes)
	}
}

// section returns the lines of out from the one that is header up to the
// next blank line, without them, or fails the test.
func section(t *testing.T, out, header string) string {
	t.Helper()
	_, rest, ok := strings.Cut(out, "\n"+header+"\n")
	if !ok {
		t.Fatalf("no %s section in:\n%s", header, out)
	}
	rows, _, _ := strings.Cut(rest, "\n\n")
	return rows + "\n"
}

// TestStatusShowsRuns runs status against a rebuild in progress of a hash
// and a family, published twice before with KeepPrevious, paused and
// throttled from the CLI while its source waits: the table and the JSON
// show the run once (both its locks lead to it) with its owner, start,
// phase, counts, limit, no ETA (paused) and requests, exactly as its record holds them,
// and each key's generation as its meta holds it.
func TestStatusShowsRuns(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			keep := krebuild.Options{KeepPrevious: time.Minute}
			ix.publish(t, d, keep, people(0, 3))
			ix.publish(t, d, keep, people(0, 4))
			release := make(chan struct{})
			run := startRun(t, ix.rebuilder(t, d, krebuild.Options{Expected: 10}), gated(people(0, 5), release))
			ix.waitRecord(t, d, "the first batch", func(rec map[string]string) bool {
				return rec["items"] == "5" && rec["acked"] == "1" && rec["entries"] != "0"
			})
			keyswap(t, d.args("pause", ix.email)...).wantCode(t, exitOK)
			keyswap(t, d.args("throttle", ix.country, "50")...).wantCode(t, exitOK)
			rec := ix.waitRecord(t, d, "limit 50", func(rec map[string]string) bool { return rec["limit"] == "50" })
			host, _ := os.Hostname()
			metas := map[string]map[string]string{}
			for _, k := range []string{ix.email, ix.country} {
				metas[k] = redistest.HGetAll(t, d.client, keys.MetaKey(k, d.cluster))
				if metas[k]["gen"] != "2" || metas[k]["prev"] != "1" {
					t.Fatalf("meta of %s: got %v, want gen 2, prev 1", k, metas[k])
				}
			}
			ms := func(v string) time.Time { return time.UnixMilli(atoi(v)).UTC() }

			// JSON: exact field names, and exact values but for the rate,
			// ETA and times of the last heartbeat and item, which move.
			r := keyswap(t, d.args("status", "-json", ix.tag+"*")...)
			r.wantCode(t, exitOK)
			var doc struct {
				Locks []json.RawMessage `json:"locks"`
				Runs  []map[string]json.RawMessage
			}
			if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
				t.Fatal(err)
			}
			if len(doc.Locks) != 2 || len(doc.Runs) != 1 {
				t.Fatalf("got %d locks and %d runs, want 2 locks and 1 run:\n%s", len(doc.Locks), len(doc.Runs), r.stdout)
			}
			wantFields := []string{"acked", "beat_at", "changes", "entries", "eta_seconds", "expected", "host", "items", "keys",
				"latency_us", "lease_seconds", "limit", "lock_key", "phase", "pid", "progress_at", "rate", "rate_now", "replayed", "requests", "started",
				"temp_suffix", "token_prefix"}
			if got := slices.Sorted(maps.Keys(doc.Runs[0])); !slices.Equal(got, wantFields) {
				t.Errorf("run fields: got %q, want %q", got, wantFields)
			}
			var got runJSON
			raw, _ := json.Marshal(doc.Runs[0])
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			// A paused run has no ETA: the heartbeat that wrote the limit
			// was sent after the one that read the pause, requested first.
			if got.Rate <= 0 || got.RateNow == nil || *got.RateNow < 0 || got.ETASeconds != nil || got.BeatAt == nil || got.ProgressAt == nil {
				t.Errorf("rate %v, rate_now %v, eta %v, beat_at %v, progress_at %v: want a rate, a current rate, no ETA (paused), and both times",
					got.Rate, got.RateNow, got.ETASeconds, got.BeatAt, got.ProgressAt)
			}
			got.Rate, got.RateNow, got.ETASeconds, got.BeatAt, got.ProgressAt = 0, nil, nil, nil, nil
			lock, started := ix.lock(d), ms(rec["started"])
			gen := func(k string) *generationJSON {
				at, until := ms(metas[k]["at"]), ms(metas[k]["prev_until"])
				prev := int64(1)
				return &generationJSON{Gen: 2, At: &at, Prev: &prev, PrevUntil: &until}
			}
			email, country := ix.email, ix.country
			want := runJSON{LockKey: &lock, TokenPrefix: rec["token"][:8], Host: host, PID: int64(os.Getpid()), Started: &started,
				LeaseSeconds: 300, Phase: "building", Items: 5, Entries: atoi(rec["entries"]), Acked: 1, Expected: 10, Limit: 50,
				Requests: requestsJSON{MaxRate: 50, Paused: true}, TempSuffix: rec["suffix"],
				Keys: []indexJSON{
					{jsonKey: jsonKey{Key: &email}, Generation: gen(ix.email)},
					{jsonKey: jsonKey{Key: &country}, Family: true, Generation: gen(ix.country)},
				}}
			if !reflect.DeepEqual(got, want) {
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(want)
				t.Errorf("run:\ngot  %s\nwant %s", g, w)
			}

			// Table.
			r = keyswap(t, d.args("status", ix.tag+"*")...)
			r.wantCode(t, exitOK)
			row := tableRow(t, section(t, r.stdout, "RUNS"), lock)
			wantRow := []string{lock, "building", fmt.Sprintf("%s:%d", host, os.Getpid()), row[3], "5", rec["entries"], row[6],
				row[7], "50/s", "-", row[10], row[11], "0/0", "paused,max_rate=50"}
			if !slices.Equal(row, wantRow) || !strings.HasSuffix(row[6], "/s") || !strings.HasSuffix(row[7], "/s") {
				t.Errorf("run row: got %q, want %q with a current and an average rate", row, wantRow)
			}
			keysRows := section(t, r.stdout, "KEYS OF THE RUNS")
			for _, k := range []struct {
				key, family string
			}{{ix.email, "no"}, {ix.country, "yes"}} {
				want := []string{k.key, lock, k.family, "2", ms(metas[k.key]["at"]).Format(time.RFC3339), "1",
					ms(metas[k.key]["prev_until"]).Format(time.RFC3339)}
				if got := tableRow(t, keysRows, k.key); !slices.Equal(got, want) {
					t.Errorf("key row: got %q, want %q", got, want)
				}
			}
			if !strings.Contains(r.stdout, "\n2 rebuilds in progress; ") {
				t.Errorf("no summary of 2 locks in:\n%s", r.stdout)
			}

			close(release)
			if _, err := run.wait(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			ix.wantLive(t, d, people(0, 5))
		})
	}
}

// TestWriteStatusRuns pins the tables of runs on a fixed report.
func TestWriteStatusRuns(t *testing.T) {
	now := time.Date(2025, 1, 2, 15, 4, 5, 0, time.UTC)
	eta := int64(190)
	prev := int64(6)
	rep := &statusReport{
		Time:             now,
		OlderThanSeconds: 3600,
		Locks: []lockStatus{
			{Key: "users:by-email:rebuild-lock", Base: "users:by-email", TTLSeconds: 298, TokenPrefix: "3f9a1c2e"},
			{Key: "users:by-country:rebuild-lock", Base: "users:by-country", TTLSeconds: 298, TokenPrefix: "3f9a1c2e"},
			{Key: "tags:rebuild-lock", Base: "tags", TTLSeconds: 60, TokenPrefix: "77aa0011"},
		},
		Runs: []runStatus{
			{runRecord: runRecord{Lock: "tags:rebuild-lock", Token: "77aa0011ffff", Keys: []string{"tags"}, Families: []bool{false},
				Host: "app-2", PID: 7, Started: now.Add(-3 * time.Second), Phase: "held", Items: 10, Entries: 10, Acked: 1,
				Rate: 3.3, RateNow: ptr(0.0), BeatAt: now, ProgressAt: now.Add(-2 * time.Second),
				Requests: runRequests{Cancel: true, Action: "publish"}},
				Generations: []keyGeneration{{Key: "tags"}}},
			{runRecord: runRecord{Lock: "users:by-email:rebuild-lock", Token: "3f9a1c2e0000", Keys: []string{"users:by-email", "users:by-country"},
				Families: []bool{false, true}, Host: "app-1", PID: 4242, Started: now.Add(-125 * time.Second), Phase: "building",
				Items: 120000, Entries: 240000, Acked: 60, Expected: 500000, Rate: 960.5, RateNow: ptr(1000.0), Limit: 1000, ETASeconds: &eta,
				BeatAt: now.Add(-time.Second), ProgressAt: now, Changes: 12, Replayed: 3,
				Requests: runRequests{MaxRate: 1000}},
				Generations: []keyGeneration{
					{Key: "users:by-email", Generation: &generation{Gen: 7, At: now.Add(-time.Hour), Prev: &prev, PrevUntil: now.Add(time.Hour)}},
					{Key: "users:by-country", Family: true, Generation: &generation{Gen: 3, At: now.Add(-time.Hour)}},
				}},
		},
	}
	// The indexes: locked by a run, published without a kept generation,
	// kept past its time, and one that a rollback would roll back.
	prev1, prev2 := int64(1), int64(2)
	for _, ix := range []struct {
		key  string
		g    *generation
		lock string
	}{
		{"orders", &generation{Gen: 2, At: now.Add(-2 * time.Hour), Prev: &prev1, PrevUntil: now.Add(-time.Hour)}, ""},
		{"tags", &generation{Gen: 3, At: now.Add(-time.Hour)}, "tags:rebuild-lock"},
		{"users:by-country", &generation{Gen: 3, At: now.Add(-time.Hour), Prev: &prev2, PrevUntil: now.Add(time.Hour), Family: true, FamilyType: "set"}, ""},
		{"users:by-email", &generation{Gen: 7, At: now.Add(-time.Hour), Prev: &prev, PrevUntil: now.Add(time.Hour)}, "users:by-email:rebuild-lock"},
	} {
		rep.Indexes = append(rep.Indexes, indexStatus{Key: ix.key, MetaKey: ix.key + ":rebuild-gen", Generation: ix.g, LockKey: ix.lock,
			Rollback: rollbackOf(ix.g, ix.lock, now)})
	}
	var out bytes.Buffer
	if err := writeStatus(&out, rep); err != nil {
		t.Fatal(err)
	}
	want := `REBUILDS IN PROGRESS
LOCK                           TTL    TOKEN
users:by-email:rebuild-lock    4m58s  3f9a1c2e
users:by-country:rebuild-lock  4m58s  3f9a1c2e
tags:rebuild-lock              1m0s   77aa0011

RUNS
LOCK                         PHASE     OWNER       AGE   ITEMS   ENTRIES  RATE    AVG      LIMIT   ETA    BEAT  PROGRESS  CHANGES  REQUESTS
tags:rebuild-lock            held      app-2:7     3s    10      10       0/s     3.3/s    none    -      0s    2s        0/0      cancel,action=publish
users:by-email:rebuild-lock  building  app-1:4242  2m5s  120000  240000   1000/s  960.5/s  1000/s  3m10s  1s    0s        12/3     max_rate=1000

KEYS OF THE RUNS
KEY               LOCK                         FAMILY  GEN  LIVE SINCE            PREV  PREV KEPT UNTIL
tags              tags:rebuild-lock            no      -    -                     -     -
users:by-email    users:by-email:rebuild-lock  no      7    2025-01-02T14:04:05Z  6     2025-01-02T16:04:05Z
users:by-country  users:by-email:rebuild-lock  yes     3    2025-01-02T14:04:05Z  -     -

INDEXES
INDEX             FAMILY  GEN  LIVE SINCE            PREV  PREV KEPT UNTIL       ROLLBACK
orders            no      2    2025-01-02T13:04:05Z  1     2025-01-02T14:04:05Z  no: expired
tags              no      3    2025-01-02T14:04:05Z  -     -                     no: none kept
users:by-country  yes     3    2025-01-02T14:04:05Z  2     2025-01-02T16:04:05Z  yes
users:by-email    no      7    2025-01-02T14:04:05Z  6     2025-01-02T16:04:05Z  no: rebuild in progress

No temp keys.

3 rebuilds in progress; 0 temp keys, 0 without a TTL; 0 sweep candidates (no TTL, no lock, older than 1h0m0s).
`
	if got := out.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// ptr returns a pointer to v.
func ptr[T any](v T) *T { return &v }

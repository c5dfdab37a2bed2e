package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/scan"
	krebuild "github.com/keyswap/keyswap/rebuild"
)

// statusIndexes runs 'status -json' with args on d and returns its
// indexes by key, failing the test unless it exits with code.
func statusIndexes(t *testing.T, d deployment, code int, args ...string) map[string]indexStatusJSON {
	t.Helper()
	r := keyswap(t, d.args("status", append([]string{"-json"}, args...)...)...)
	r.wantCode(t, code)
	var doc statusJSON
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("status -json: %v\n%s", err, r.stdout)
	}
	out := map[string]indexStatusJSON{}
	for _, ix := range doc.Indexes {
		wantOneField(t, "indexes[].key", ix.Key, ix.KeyBase64)
		out[fieldName(ix.Key, ix.KeyBase64)] = ix
	}
	return out
}

// wantIndex fails the test unless got is the index key on d at generation
// gen, keeping prev (0: none), as its meta holds it, with rollback's
// verdict possible or whyNot, and locked as given.
func wantIndex(t *testing.T, d deployment, got map[string]indexStatusJSON, key string, family bool, gen, prev int64, whyNot string, locked bool) {
	t.Helper()
	ix, ok := got[key]
	if !ok {
		t.Errorf("no index %s among %d", key, len(got))
		return
	}
	meta := keys.MetaKey(key, d.cluster)
	m := redistest.HGetAll(t, d.client, meta)
	ms := func(v string) *time.Time {
		if v == "" {
			return nil
		}
		tm := time.UnixMilli(atoi(v)).UTC()
		return &tm
	}
	want := indexStatusJSON{jsonKey: newJSONKey(key), Family: family, Locked: locked, Mode: modeRename,
		Generation: &generationJSON{Gen: gen, At: ms(m["at"]), RolledBack: ms(m["rolled_back"])},
		Rollback:   rollbackStateJSON{Possible: whyNot == "", WhyNot: whyNot}}
	want.MetaKey, want.MetaKeyBase64 = jsonName(meta)
	if prev > 0 {
		want.Generation.Prev, want.Generation.PrevUntil = &prev, ms(m["prev_until"])
		if whyNot == "" {
			want.Rollback.Until = ms(m["prev_until"])
		}
	}
	g, _ := json.Marshal(ix)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("index %s:\ngot  %s\nwant %s", key, g, w)
	}
}

// TestStatusIndexes publishes three pairs of indexes (a hash and a
// family): one twice keeping the previous generation, one once without, and
// one whose kept generation is past its time (its meta says so). Status
// lists the six, each with its generation and whether a rollback is
// possible, and 'keyswap rollback' agrees with it every time: it refuses
// what status says it cannot roll back, with the reason status gives
// (exit 6: none kept, expired; exit 5: a rebuild in progress), and rolls
// back what status says it can.
func TestStatusIndexes(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			kept, none, expired := newIndex(p+"kept:"), newIndex(p+"none:"), newIndex(p+"expired:")
			keep := krebuild.Options{KeepPrevious: time.Hour}
			kept.publish(t, d, keep, people(0, 3))
			kept.publish(t, d, keep, people(0, 4))
			none.publish(t, d, krebuild.Options{}, people(0, 3))
			expired.publish(t, d, keep, people(0, 3))
			expired.publish(t, d, keep, people(0, 4))
			past := strconv.FormatInt(time.Now().Add(-time.Minute).UnixMilli(), 10)
			for _, k := range []string{expired.email, expired.country} {
				do(t, d.client, "HSET", keys.MetaKey(k, d.cluster), "prev_until", past)
			}
			pattern := "{" + scan.EscapeGlob(p) + "*"

			got := statusIndexes(t, d, exitOK, pattern)
			if len(got) != 6 {
				t.Errorf("got %d indexes, want 6: %v", len(got), got)
			}
			wantIndex(t, d, got, kept.email, false, 2, 1, "", false)
			wantIndex(t, d, got, kept.country, true, 2, 1, "", false)
			wantIndex(t, d, got, none.email, false, 1, 0, rollbackNoneKept, false)
			wantIndex(t, d, got, none.country, true, 1, 0, rollbackNoneKept, false)
			wantIndex(t, d, got, expired.email, false, 2, 1, rollbackExpired, false)
			wantIndex(t, d, got, expired.country, true, 2, 1, rollbackExpired, false)

			// The table says the same.
			r := keyswap(t, d.args("status", pattern)...)
			r.wantCode(t, exitOK)
			rows := section(t, r.stdout, "INDEXES")
			if n := strings.Count(rows, "\n"); n != 7 {
				t.Errorf("INDEXES: got %d lines, want a header and 6 rows:\n%s", n, rows)
			}
			for _, want := range []struct {
				key, family, rollback string
			}{
				{kept.email, "no", "yes"}, {kept.country, "yes", "yes"},
				{none.email, "no", "no: none kept"}, {expired.country, "yes", "no: expired"},
			} {
				row := tableRow(t, rows, want.key)
				if row[1] != want.family || strings.Join(row[6:], " ") != want.rollback {
					t.Errorf("row %q: want family %s, rollback %q", row, want.family, want.rollback)
				}
			}

			// What status says cannot be rolled back, rollback refuses.
			before := none.liveState(t, d)
			keyswap(t, d.args("rollback", none.email, none.country)...).wantCode(t, exitNoPrev)
			none.wantLiveState(t, d, before)
			before = expired.liveState(t, d)
			keyswap(t, d.args("rollback", expired.email, expired.country)...).wantCode(t, exitNoPrev)
			expired.wantLiveState(t, d, before)

			// A rebuild in progress: status says so, and rollback refuses.
			release := make(chan struct{})
			run := startRun(t, kept.rebuilder(t, d, keep), gated(people(0, 5), release))
			kept.waitRecord(t, d, "the first batch", func(rec map[string]string) bool { return rec["acked"] == "1" })
			got = statusIndexes(t, d, exitOK, kept.tag+"*")
			wantIndex(t, d, got, kept.email, false, 2, 1, rollbackLocked, true)
			wantIndex(t, d, got, kept.country, true, 2, 1, rollbackLocked, true)
			keyswap(t, d.args("rollback", kept.email, kept.country)...).wantCode(t, exitConflict)
			close(release)
			if _, err := run.wait(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			kept.wantLive(t, d, people(0, 5))

			// Published again: generation 3 keeps 2, and rollback takes it
			// back; then generation 2 keeps 3, to roll forward.
			got = statusIndexes(t, d, exitOK, kept.tag+"*")
			wantIndex(t, d, got, kept.email, false, 3, 2, "", false)
			wantIndex(t, d, got, kept.country, true, 3, 2, "", false)
			keyswap(t, d.args("rollback", kept.email, kept.country)...).wantCode(t, exitOK)
			kept.wantLive(t, d, people(0, 4))
			got = statusIndexes(t, d, exitOK, kept.tag+"*")
			wantIndex(t, d, got, kept.email, false, 2, 3, "", false)
			wantIndex(t, d, got, kept.country, true, 2, 3, "", false)
			if g := got[kept.email].Generation; g == nil || g.RolledBack == nil {
				t.Errorf("after the rollback: generation %+v, want its time", g)
			}
			for _, ix := range []index{kept, none, expired} {
				ix.wantNoLeftovers(t, d)
			}
		})
	}
}

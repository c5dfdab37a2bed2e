package main

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	krebuild "github.com/keyswap/keyswap/rebuild"
)

// wantPrev fails the test unless the kept previous values of ix are
// exactly those built from ps, each with a TTL of at most keep: the hash's,
// and one per bucket of ps, and none for the other buckets of every.
func (ix index) wantPrev(t *testing.T, d deployment, ps []person, keep time.Duration, every []string) {
	t.Helper()
	hash := map[string]string{}
	sets := map[string][]string{}
	for _, p := range ps {
		hash[p.Email] = p.ID
		sets[p.Country] = append(sets[p.Country], p.ID)
	}
	prev := keys.PrevKey(ix.email, d.cluster)
	if got := redistest.HGetAll(t, d.client, prev); !maps.Equal(got, hash) {
		t.Errorf("%s: got %v, want %v", prev, got, hash)
	}
	redistest.WantPTTL(t, d.client, prev, time.Millisecond, keep)
	for _, c := range every {
		prev := keys.PrevKey(ix.country+":"+c, d.cluster)
		ids, ok := sets[c]
		if !ok {
			redistest.WantAbsent(t, d.client, prev)
			continue
		}
		slices.Sort(ids)
		if got := redistest.SMembers(t, d.client, prev); !slices.Equal(got, ids) {
			t.Errorf("%s: got %q, want %q", prev, got, ids)
		}
		redistest.WantPTTL(t, d.client, prev, time.Millisecond, keep)
	}
}

// wantMetas fails unless both keys of ix are at generation gen, with prev
// kept.
func (ix index) wantMetas(t *testing.T, d deployment, gen, prev string) {
	t.Helper()
	for _, k := range []string{ix.email, ix.country} {
		m := redistest.HGetAll(t, d.client, keys.MetaKey(k, d.cluster))
		if m["gen"] != gen || m["prev"] != prev || m["rolled_back"] == "" {
			t.Errorf("meta of %s: got %v, want gen %s, prev %s, rolled back", k, m, gen, prev)
		}
	}
}

// TestRollback publishes v1, then v2 keeping the previous generation for a
// minute, and rolls back from the CLI: the live keys are exactly v1 again
// (the bucket v2 added is gone, the one it removed is back), the metas are
// back at generation 1, and the prev keys hold v2, expiring within the
// minute. A second rollback rolls forward.
func TestRollback(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			v1 := people(0, 6) // fr, de, us
			v2 := people(3, 4) // fr, de, it, fr
			v2[2].Country = "it"
			every := []string{"de", "fr", "it", "us"}
			keep := time.Minute
			ix.publish(t, d, krebuild.Options{}, v1)
			ix.publish(t, d, krebuild.Options{KeepPrevious: keep}, v2)

			r := keyswap(t, d.args("rollback", ix.email, ix.country)...)
			r.wantCode(t, exitOK)
			ix.wantLive(t, d, v1)
			ix.wantMetas(t, d, "1", "2")
			ix.wantPrev(t, d, v2, keep, every)
			if want := "rolled back 2 indexes; 'keyswap rollback' again rolls forward while PREV is kept\n\n" + table(ix.genRows(t, d)...); r.stdout != want || r.stderr != "" {
				t.Errorf("got stdout\n%s\nstderr %q\nwant\n%s", r.stdout, r.stderr, want)
			}
			ix.wantNoLeftovers(t, d)

			r = keyswap(t, d.args("rollback", "-json", ix.email, ix.country)...)
			r.wantCode(t, exitOK)
			ix.wantLive(t, d, v2)
			ix.wantMetas(t, d, "2", "1")
			ix.wantPrev(t, d, v1, keep, every)
			var got rollbackJSON
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("%v\n%s", err, r.stdout)
			}
			if want := (rollbackJSON{Server: d.server().json(), Keys: ix.indexes(t, d)}); !reflect.DeepEqual(got, want) {
				w, _ := json.Marshal(want)
				t.Errorf("got\n%s\nwant\n%s", r.stdout, w)
			}
			ix.wantNoLeftovers(t, d)
		})
	}
}

// TestRollbackRefused: a rollback while a run holds one of the locks exits
// 5 and changes nothing; one of an index that keeps no previous
// generation, or that keyswap never published, exits 6 and changes
// nothing.
func TestRollbackRefused(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			ix := newIndex(p)
			ix.publish(t, d, krebuild.Options{}, people(0, 3))
			ix.publish(t, d, krebuild.Options{KeepPrevious: time.Minute}, people(0, 5))
			before := ix.liveState(t, d)

			src := newEndless()
			run := startRun(t, ix.rebuilder(t, d, krebuild.Options{MaxRate: 200}), src.source)
			ix.waitRecord(t, d, "the run", func(rec map[string]string) bool { return rec["phase"] == "building" })
			r := keyswap(t, d.args("rollback", ix.email, ix.country)...)
			r.wantCode(t, exitConflict)
			if want := "keyswap: rollback " + ix.email + ": rebuild already in progress; nothing changed: roll back once it has ended, or end it ('keyswap cancel', 'keyswap discard')\n"; r.stderr != want || r.stdout != "" {
				t.Errorf("got stdout %q, stderr %q; want stderr %q", r.stdout, r.stderr, want)
			}
			ix.wantLiveState(t, d, before)
			keyswap(t, d.args("cancel", ix.email)...).wantCode(t, exitOK)
			if _, err := run.wait(t); !errors.Is(err, krebuild.ErrAborted) {
				t.Errorf("Run: got %v, want ErrAborted", err)
			}
			ix.wantLiveState(t, d, before)

			other := newIndex(p + "once")
			other.publish(t, d, krebuild.Options{}, people(0, 2))
			never := ix.tag + ":never"
			for _, tc := range []struct {
				keys []string
				want string
			}{
				{[]string{other.email}, "keyswap: rollback " + other.email + ": no previous generation is kept: publish with KeepPrevious to keep one, for as long as a rollback may be needed; nothing changed\n"},
				{[]string{ix.email, never}, "keyswap: rollback " + never + ": no previous generation is kept: keyswap never published it (it has no meta, " + keys.MetaKey(never, d.cluster) + "); nothing changed\n"},
			} {
				r := keyswap(t, d.args("rollback", tc.keys...)...)
				r.wantCode(t, exitNoPrev)
				if r.stderr != tc.want || r.stdout != "" {
					t.Errorf("rollback %q: got stdout %q, stderr %q; want stderr %q", tc.keys, r.stdout, r.stderr, tc.want)
				}
			}
			ix.wantLiveState(t, d, before)
			ix.wantNoLeftovers(t, d)
			other.wantNoLeftovers(t, d)
		})
	}
}

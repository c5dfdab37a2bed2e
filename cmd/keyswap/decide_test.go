package main

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	krebuild "github.com/keyswap/keyswap/rebuild"
)

// genRows returns the rows of a table of generations of ix as its metas
// hold them now.
func (ix index) genRows(t *testing.T, d deployment) [][]string {
	t.Helper()
	rows := [][]string{{"KEY", "FAMILY", "GEN", "LIVE SINCE", "PREV", "PREV KEPT UNTIL"}}
	for _, k := range []struct{ key, family string }{{ix.email, "no"}, {ix.country, "yes"}} {
		m := redistest.HGetAll(t, d.client, keys.MetaKey(k.key, d.cluster))
		prev, until := "-", "-"
		if m["prev"] != "" {
			prev, until = m["prev"], fromMillis(m["prev_until"]).Format(time.RFC3339)
		}
		rows = append(rows, []string{k.key, k.family, m["gen"], fromMillis(m["at"]).Format(time.RFC3339), prev, until})
	}
	return rows
}

// wantGenerations fails unless the run's Stats say it published gen for
// both keys of ix.
func (ix index) wantGenerations(t *testing.T, stats krebuild.Stats, gen int64) {
	t.Helper()
	if want := map[string]int64{ix.email: gen, ix.country: gen}; !maps.Equal(stats.Generations, want) {
		t.Errorf("Await: generations %v, want %v", stats.Generations, want)
	}
}

// TestPublish decides held runs with 'keyswap publish': Await returns the
// run's success, the live keys are exactly the new ones, nothing is left,
// and the output (a table, then JSON with a kept previous generation)
// gives the new generations.
func TestPublish(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			ix.publish(t, d, krebuild.Options{}, people(0, 3))

			v2 := people(10, 7)
			held := ix.startHeld(t, d, krebuild.Options{}, v2)
			token := ix.token(t, d)
			r := keyswap(t, d.args("publish", ix.email)...)
			r.wantCode(t, exitOK)
			stats, err := held.wait(t)
			if err != nil {
				t.Fatalf("Await: %v", err)
			}
			ix.wantGenerations(t, stats, 2)
			if want := "published the held " + ix.describeRun(token) + "\n\n" + table(ix.genRows(t, d)...); r.stdout != want || r.stderr != "" {
				t.Errorf("got stdout\n%s\nstderr %q\nwant\n%s", r.stdout, r.stderr, want)
			}
			ix.wantLive(t, d, v2)
			ix.wantNoLeftovers(t, d)

			// JSON, through the family's prefix, of a publish that keeps the
			// previous generation for a rollback.
			v3 := people(20, 4)
			held = ix.startHeld(t, d, krebuild.Options{KeepPrevious: time.Minute}, v3)
			token = ix.token(t, d)
			r = keyswap(t, d.args("publish", "-json", ix.country)...)
			r.wantCode(t, exitOK)
			if stats, err = held.wait(t); err != nil {
				t.Fatalf("Await: %v", err)
			}
			ix.wantGenerations(t, stats, 3)
			var got decideJSON
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("%v\n%s", err, r.stdout)
			}
			lock := ix.lock(d)
			want := decideJSON{Server: d.server().json(), LockKey: &lock, TokenPrefix: token[:8], Decision: "publish", Outcome: "published",
				Keys: ix.indexes(t, d)}
			if !reflect.DeepEqual(got, want) {
				w, _ := json.Marshal(want)
				t.Errorf("got\n%s\nwant\n%s", r.stdout, w)
			}
			if g := got.Keys[0].Generation; g.Gen != 3 || g.Prev == nil || *g.Prev != 2 || g.PrevUntil == nil {
				t.Errorf("generation: got %+v, want 3 with 2 kept", g)
			}
			ix.wantLive(t, d, v3)
			ix.wantNoLeftovers(t, d)
		})
	}
}

// indexes returns ix's keys with their generations as their metas hold
// them, in JSON.
func (ix index) indexes(t *testing.T, d deployment) []indexJSON {
	t.Helper()
	var out []indexJSON
	for _, k := range []string{ix.email, ix.country} {
		g, ok := parseMeta(redistest.HGetAll(t, d.client, keys.MetaKey(k, d.cluster)))
		var gj *generationJSON
		if ok {
			gj = (&g).json()
		}
		out = append(out, indexJSON{jsonKey: newJSONKey(k), Family: k == ix.country, Generation: gj})
	}
	return out
}

// TestDiscard decides held runs with 'keyswap discard': Await returns
// ErrDiscarded, the live keys, their generations included, are
// byte-identical, and nothing is left.
func TestDiscard(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			v1 := people(0, 5)
			ix.publish(t, d, krebuild.Options{}, v1)
			before := ix.liveState(t, d)

			held := ix.startHeld(t, d, krebuild.Options{}, people(100, 9))
			token := ix.token(t, d)
			r := keyswap(t, d.args("discard", ix.email)...)
			r.wantCode(t, exitOK)
			if _, err := held.wait(t); !errors.Is(err, krebuild.ErrDiscarded) {
				t.Fatalf("Await: got %v, want ErrDiscarded", err)
			}
			if want := "discarded the held " + ix.describeRun(token) + ": the live keys are unchanged\n"; r.stdout != want || r.stderr != "" {
				t.Errorf("got stdout %q, stderr %q; want stdout %q", r.stdout, r.stderr, want)
			}
			ix.wantLiveState(t, d, before)
			ix.wantLive(t, d, v1)
			ix.wantNoLeftovers(t, d)

			held = ix.startHeld(t, d, krebuild.Options{}, people(200, 2))
			token = ix.token(t, d)
			r = keyswap(t, d.args("discard", "-json", ix.country)...)
			r.wantCode(t, exitOK)
			if _, err := held.wait(t); !errors.Is(err, krebuild.ErrDiscarded) {
				t.Fatalf("Await: got %v, want ErrDiscarded", err)
			}
			var got decideJSON
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("%v\n%s", err, r.stdout)
			}
			lock := ix.lock(d)
			want := decideJSON{Server: d.server().json(), LockKey: &lock, TokenPrefix: token[:8], Decision: "discard", Outcome: "discarded", Keys: ix.indexes(t, d)}
			if !reflect.DeepEqual(got, want) || got.Keys[0].Generation.Gen != 1 {
				w, _ := json.Marshal(want)
				t.Errorf("got\n%s\nwant\n%s, generation 1", r.stdout, w)
			}
			ix.wantLiveState(t, d, before)
			ix.wantNoLeftovers(t, d)
		})
	}
}

// TestDecideWait: --wait 0 records the decision and returns at once; a
// --wait too short for the run exits 7 and the decision stands: the run
// acts on it anyway.
func TestDecideWait(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			v1 := people(0, 2)
			held := ix.startHeld(t, d, krebuild.Options{}, v1)
			token := ix.token(t, d)
			r := keyswap(t, d.args("publish", "--wait", "0", ix.email)...)
			r.wantCode(t, exitOK)
			if want := "publish requested for the held " + ix.describeRun(token) + "; it acts on it at its next heartbeat, within a second\n"; r.stdout != want {
				t.Errorf("--wait 0: got stdout %q, want %q", r.stdout, want)
			}
			stats, err := held.wait(t)
			if err != nil {
				t.Fatalf("Await: %v", err)
			}
			ix.wantGenerations(t, stats, 1)
			ix.wantLive(t, d, v1)

			before := ix.liveState(t, d)
			held = ix.startHeld(t, d, krebuild.Options{}, people(50, 3))
			r = keyswap(t, d.args("discard", "--wait", "1ms", ix.email)...)
			r.wantCode(t, exitTimeout)
			if want := "keyswap: discard " + ix.email + ": the run had not ended within --wait 1ms; the decision stands: the run acts on it when it reads it ('keyswap status' shows it)\n"; r.stderr != want || r.stdout != "" {
				t.Errorf("--wait 1ms: got stdout %q, stderr %q; want stderr %q", r.stdout, r.stderr, want)
			}
			if _, err := held.wait(t); !errors.Is(err, krebuild.ErrDiscarded) {
				t.Fatalf("Await: got %v, want ErrDiscarded", err)
			}
			ix.wantLiveState(t, d, before)
			ix.wantNoLeftovers(t, d)
		})
	}
}

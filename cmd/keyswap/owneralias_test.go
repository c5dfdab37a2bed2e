package main

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	krebuild "github.com/keyswap/keyswap/rebuild"
)

// TestControlOfAlias (SPEC C104): on a cluster the untagged T has the base
// of the tagged {T}, and so its lock. A request for T while {T}'s run holds
// that lock is for no run of T: it must find none (exit 4) and record
// nothing, rather than cancel, pause or throttle the run of {T}, or
// discard or publish its held run.
func TestControlOfAlias(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			untagged := testPrefix(t, d) + "t"
			tagged := "{" + untagged + "}"
			ix := index{tag: tagged, email: tagged, country: tagged + ":by-country"}

			src := newEndless()
			run := startRun(t, ix.rebuilder(t, d, krebuild.Options{MaxRate: 200}), src.source)
			ix.waitRecord(t, d, "items pulled", func(rec map[string]string) bool { return atoi(rec["items"]) > 0 })
			before := ix.ctl(t, d)
			for _, args := range [][]string{{"cancel", untagged}, {"pause", untagged}, {"throttle", untagged, "1"}} {
				r := keyswap(t, d.args(args[0], args[1:]...)...)
				if want := untagged + ": no rebuild in progress: its lock is held by the rebuild of " + tagged + ", "; d.cluster && r.code == exitNoRun && !strings.Contains(r.stderr, want) {
					t.Errorf("keyswap %q: stderr %q, want it to say %q", args, r.stderr, want)
				}
				if r.code != exitNoRun {
					t.Errorf("keyswap %q while the run of %s holds the shared lock: exit %d, stdout %q, stderr %q; want exit %d (no run of %s)",
						args, tagged, r.code, r.stdout, r.stderr, exitNoRun, untagged)
				}
				if after := ix.ctl(t, d); !maps.Equal(after, before) {
					t.Errorf("keyswap %q recorded a request for the run of %s: its requests are %v, were %v", args, tagged, after, before)
				}
			}
			src.finish()
			if _, err := run.wait(t); err != nil {
				t.Errorf("Run of %s: %v", tagged, err)
			}

			ix.startHeld(t, d, krebuild.Options{}, people(0, 4))
			before = ix.ctl(t, d)
			for _, args := range [][]string{{"discard", "--wait", "0", untagged}, {"publish", "--wait", "0", untagged}} {
				r := keyswap(t, d.args(args[0], args[1:]...)...)
				if r.code != exitNoRun {
					t.Errorf("keyswap %q while the held run of %s holds the shared lock: exit %d, stdout %q, stderr %q; want exit %d (no run of %s)",
						args, tagged, r.code, r.stdout, r.stderr, exitNoRun, untagged)
				}
				if after := ix.ctl(t, d); !maps.Equal(after, before) {
					t.Errorf("keyswap %q recorded a decision for the held run of %s: its requests are %v, were %v", args, tagged, after, before)
				}
			}
		})
	}
}

// TestStatusKeyOfAlias (SPEC C104): on a cluster the pointer, registry and
// meta of the base "{T}" are the tagged {T}'s once its Generations run
// stamped the base with its name. 'keyswap status T', by key, must not
// report them as T's: T has no generation, and its data is its plain key.
func TestStatusKeyOfAlias(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			untagged := testPrefix(t, d) + "t"
			tagged := ownedIndex{live: "{" + untagged + "}"}
			tagged.publish(t, d, genOpts(true), people(0, 4))
			tagged.publish(t, d, genOpts(true), people(4, 3))

			r := keyswap(t, d.args("status", "-json", untagged)...)
			var doc statusJSON
			if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
				t.Fatalf("status -json %s: exit %d, %v\n%s%s", untagged, r.code, err, r.stdout, r.stderr)
			}
			for _, ix := range doc.Indexes {
				if ix.Mode == modeGenerations || ix.Generations != nil {
					g, _ := json.Marshal(ix.Generations)
					t.Errorf("status %s: index %s in mode %q with generations %s, which are %s's (its stamp names it)",
						untagged, fieldName(ix.Key, ix.KeyBase64), ix.Mode, g, tagged.live)
				}
			}
		})
	}
}

// TestRollbackBesideGroupClaim (SPEC C104, C102): on a cluster group a's
// claim of the untagged T is in the pointer of the base "{T}", which the
// tagged {T} shares, and the base's stamp names T. {T} is in the
// rename-in-place shape: the claim is T's, not {T}'s, and 'keyswap
// rollback {T}' must not be refused as in group a. It is refused all the
// same, changing nothing, for the base is T's: the rollback would take
// the lock the two share, as a run of {T} would. On a standalone server
// the two have bases of their own, and the rollback rolls {T} back.
func TestRollbackBesideGroupClaim(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			untagged, group := p+"t", p+"a"
			tagged := "{" + untagged + "}"
			ix := index{tag: tagged, email: tagged, country: tagged + ":by-country"}
			v1, v2 := people(0, 3), people(3, 4)
			ix.publish(t, d, krebuild.Options{}, v1)
			ix.publish(t, d, krebuild.Options{KeepPrevious: time.Minute}, v2)
			opts := genOpts(true)
			opts.Group = group
			ownedIndex{live: untagged}.publish(t, d, opts, people(0, 2))
			claim := keys.PointerKey(untagged, d.cluster)
			if v, _ := redistest.Get(t, d.client, claim); v != keys.GroupMarker(group) {
				t.Fatalf("pointer %s: got %q, want the claim of group %s", claim, v, group)
			}
			before := redistest.Snapshot(t, d.client, "{"+p)

			r := keyswap(t, d.args("rollback", ix.email, ix.country)...)
			if strings.Contains(r.stderr, "in group") {
				t.Errorf("rollback %s beside group %s's claim of %s: stderr %q, want no refusal as in the group", tagged, group, untagged, r.stderr)
			}
			if !d.cluster {
				r.wantCode(t, exitOK)
				ix.wantLive(t, d, v1)
				return
			}
			if want := "have the same base " + tagged + ", which is " + untagged + "'s"; r.code != exitError || !strings.Contains(r.stderr, want) {
				t.Errorf("rollback %s beside group %s's claim of %s: exit %d, stdout %q, stderr %q; want exit %d saying %q",
					tagged, group, untagged, r.code, r.stdout, r.stderr, exitError, want)
			}
			redistest.WantUnchanged(t, d.client, "{"+p, before)
		})
	}
}

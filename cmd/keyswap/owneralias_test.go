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
// report them as T's: T has no generation, and its data is its plain key;
// it names {T} as the base's owner, and status {T} is as before. Nor may
// it tell the user to pass --group for T when {T} is in a group and the
// base's pointer holds the group's claim. A stamp that is absent, of
// another type or names neither key marks T ambiguous, as a scan does.
// On a standalone server T and {T} are two keys: T has nothing.
func TestStatusKeyOfAlias(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			untagged := p + "t"
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
			ix := statusIndexes(t, d, exitOK, untagged)[untagged]
			if owner := fieldName(ix.BaseOwner, ix.BaseOwnerBase64); d.cluster && (owner != tagged.live || ix.Rollback.WhyNot != rollbackBaseOwned || ix.Generation != nil || ix.Ambiguous != "") {
				t.Errorf("status %s: got base_owner %q, rollback %+v, generation %v, ambiguous %q; want base_owner %s, why_not %q, no generation, not ambiguous",
					untagged, owner, ix.Rollback, ix.Generation, ix.Ambiguous, tagged.live, rollbackBaseOwned)
			} else if !d.cluster && (owner != "" || ix.Rollback.WhyNot != rollbackNeverPublished) {
				t.Errorf("status %s: got base_owner %q, rollback %+v; want none, never published", untagged, owner, ix.Rollback)
			}
			human := keyswap(t, d.args("status", untagged)...)
			if want := untagged + " (rebuilt in place: its base is that of " + tagged.live + ", whose stamp it holds)"; d.cluster != strings.Contains(human.stdout, want) {
				t.Errorf("status %s: stdout %q; want %q in it: %v", untagged, human.stdout, want, d.cluster)
			}
			if own := statusIndexes(t, d, exitOK, tagged.live)[tagged.live]; own.Mode != modeGenerations || own.BaseOwner != nil || own.Ambiguous != "" {
				t.Errorf("status %s: got mode %q, base_owner %v, ambiguous %q; want its generations, as before", tagged.live, own.Mode, own.BaseOwner, own.Ambiguous)
			}

			// {T} in a group: the base's pointer holds the group's claim.
			grouped := ownedIndex{live: "{" + p + "g}"}
			opts := genOpts(false)
			opts.Group = p + "grp"
			grouped.publish(t, d, opts, people(0, 2))
			gix := statusIndexes(t, d, exitOK, p+"g")[p+"g"]
			if owner := fieldName(gix.BaseOwner, gix.BaseOwnerBase64); d.cluster && owner != grouped.live || gix.Mode != modeRename {
				t.Errorf("status %s: got base_owner %q, mode %q; want base_owner %s (cluster: %v), mode %q", p+"g", owner, gix.Mode, grouped.live, d.cluster, modeRename)
			}
			if r := keyswap(t, d.args("status", grouped.live)...); r.code == exitOK || !strings.Contains(r.stderr, "pass --group "+opts.Group) {
				t.Errorf("status %s without --group: exit %d, stderr %q; want a failure naming its group", grouped.live, r.code, r.stderr)
			}

			if !d.cluster {
				return
			}
			stamp := keys.OwnerKey(untagged, d.cluster)
			for _, tc := range untrustedStamps(stamp, tagged.live, p+"other") {
				do(t, d.client, "DEL", stamp)
				do(t, d.client, tc.stamp...)
				ix := statusIndexes(t, d, exitOK, untagged)[untagged]
				if want := "ambiguous: " + tagged.live + " or " + untagged + ", " + tc.why; !strings.HasPrefix(ix.Ambiguous, want) || ix.BaseOwner != nil {
					t.Errorf("%s: status %s: got ambiguous %q, base_owner %v; want %q, none", tc.name, untagged, ix.Ambiguous, ix.BaseOwner, want)
				}
			}
			// Without a stamp, a group's claim in the pointer is of either
			// key: ambiguous, and no "pass --group" for a guess.
			do(t, d.client, "DEL", keys.OwnerKey(grouped.live, d.cluster))
			gix = statusIndexes(t, d, exitOK, p+"g")[p+"g"]
			if want := "ambiguous: " + grouped.live + " or " + p + "g, it has no owner stamp"; !strings.HasPrefix(gix.Ambiguous, want) || gix.Mode != modeGroup {
				t.Errorf("status %s, no stamp: got ambiguous %q, mode %q; want %q, mode %q", p+"g", gix.Ambiguous, gix.Mode, want, modeGroup)
			}
			// Without a stamp, a base without a pointer or a registry is
			// of an index that only ever rebuilt in place: not ambiguous.
			inPlace := p + "in-place"
			ownedIndex{live: inPlace}.publish(t, d, krebuild.Options{}, people(0, 2))
			if ix := statusIndexes(t, d, exitOK, inPlace)[inPlace]; ix.Ambiguous != "" || ix.BaseOwner != nil || ix.Generation == nil {
				t.Errorf("status %s: got ambiguous %q, base_owner %v, generation %v; want its meta's generation, not ambiguous", inPlace, ix.Ambiguous, ix.BaseOwner, ix.Generation)
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

			// A stamp naming neither key (written by hand) is not trusted.
			stamp := keys.OwnerKey(tagged, d.cluster)
			do(t, d.client, "SET", stamp, "stray")
			before = redistest.Snapshot(t, d.client, "{"+p)
			r = keyswap(t, d.args("rollback", ix.email, ix.country)...)
			if want := `holds "stray", which is neither`; r.code != exitError || !strings.Contains(r.stderr, want) {
				t.Errorf("rollback %s under a stamp naming neither key: exit %d, stderr %q; want exit %d saying %q", tagged, r.code, r.stderr, exitError, want)
			}
			redistest.WantUnchanged(t, d.client, "{"+p, before)
		})
	}
}

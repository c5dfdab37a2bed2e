package main

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
)

// TestGroup: indexes of a group (C100), without a hash tag: 'rollback
// --group' flips them back and forth; without --group it finds the
// group's claim and fails naming the group, changing nothing, and so do
// 'status --index' without --group and 'rollback --group' of another group
// (C102); 'status --index --group' and a
// status scan show their generations, the scan the claims in mode
// "group"; a sweep finds the group in the registry's name and removes
// their retired generation, and passes over the claims.
func TestGroup(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			group := p
			ix := index{tag: p, email: p + ":by-email", country: p + ":by-country"}
			names := keys.Names{Cluster: d.cluster, Group: group}
			opts := genOpts(true)
			opts.Group = group
			for _, v := range [][]person{gV2, gV3, gV4} {
				ix.publish(t, d, opts, v)
			}
			wantPointers := func(cur string) {
				t.Helper()
				for _, k := range []string{ix.email, ix.country} {
					if v, _ := redistest.Get(t, d.client, keys.PointerKey(k, names)); v != cur {
						t.Errorf("pointer of %s: got %q, want %q", k, v, cur)
					}
				}
			}
			wantPointers("3")

			// Without the group: the group's claim (C102); nothing changed.
			r := keyswap(t, d.args("rollback", ix.email, ix.country)...)
			if r.code == exitOK || !strings.Contains(r.stderr, "in group "+group+"; pass --group "+group) {
				t.Errorf("rollback without --group: exit %d, stderr %q; want a failure naming the group", r.code, r.stderr)
			}
			wantPointers("3")
			for _, k := range []string{ix.email, ix.country} {
				if v, _ := redistest.Get(t, d.client, keys.PointerKey(k, d.cluster)); v != keys.GroupMarker(group) {
					t.Errorf("pointer of %s without the group: got %q, want the claim %q", k, v, keys.GroupMarker(group))
				}
			}
			r = keyswap(t, d.args("status", "--index", ix.country)...)
			if r.code == exitOK || !strings.Contains(r.stderr, "in group "+group+"; pass --group "+group) {
				t.Errorf("status --index without --group: exit %d, stderr %q; want a failure naming the group", r.code, r.stderr)
			}
			// In another group: no pointer of that group, and the claim
			// names this one; nothing changed (the plain keys are nobody's).
			before := redistest.Snapshot(t, d.client, p)
			r = keyswap(t, d.args("rollback", "--group", group+"x", ix.email, ix.country)...)
			if r.code == exitOK || !strings.Contains(r.stderr, "in group "+group+", not "+group+"x; pass --group "+group) {
				t.Errorf("rollback --group %sx: exit %d, stderr %q; want a failure naming the group", group, r.code, r.stderr)
			}
			redistest.WantUnchanged(t, d.client, p, before)
			wantPointers("3")

			r = keyswap(t, d.args("rollback", "--group", group, ix.email, ix.country)...)
			r.wantCode(t, exitOK)
			wantPointers("2")
			ix.wantGenData(t, d, 2, gV3)
			r = keyswap(t, d.args("rollback", "--group", group, ix.email, ix.country)...)
			r.wantCode(t, exitOK)
			wantPointers("3")

			// status of one index, and a scan.
			r = keyswap(t, d.args("status", "-json", "--group", group, "--index", ix.country)...)
			var one statusJSON
			if err := json.Unmarshal([]byte(r.stdout), &one); err != nil {
				t.Fatalf("status --index: %v\n%s%s", err, r.stdout, r.stderr)
			}
			if len(one.Indexes) != 1 || one.Indexes[0].Group != group || one.Indexes[0].Generations == nil ||
				*one.Indexes[0].Generations.Current != 3 || *one.Indexes[0].Generations.Previous != 2 {
				t.Errorf("status --index --group: got %s", r.stdout)
			}
			r = keyswap(t, d.args("status", "-json", "*"+p+"*")...)
			var scanned statusJSON
			if err := json.Unmarshal([]byte(r.stdout), &scanned); err != nil {
				t.Fatalf("status: %v\n%s%s", err, r.stdout, r.stderr)
			}
			found, claimed := map[string]string{}, map[string]string{}
			for _, x := range scanned.Indexes {
				if x.Generations != nil && x.Generations.Current != nil {
					found[*x.Key+" "+x.Group] = *x.MetaKey
				}
				if x.Generations != nil && x.Mode == "group" && x.Group == "" {
					claimed[*x.Key] = x.Generations.InGroup
				}
			}
			if want := map[string]string{ix.email: group, ix.country: group}; !maps.Equal(claimed, want) {
				t.Errorf("status scan: claims %v, want %v", claimed, want)
			}
			for _, k := range []string{ix.email, ix.country} {
				if found[k+" "+group] != keys.MetaKey(k, names) {
					t.Errorf("status scan: %s of group %s not found with its meta %s: %v", k, group, keys.MetaKey(k, names), found)
				}
			}
			r = keyswap(t, d.args("status", "--group", "a{b", "--index", ix.country)...)
			r.wantCode(t, exitUsage)

			// The sweep finds the group in the registries' names: the
			// retired generation 1 goes, 2 and 3 stay.
			r = keyswap(t, d.args("sweep", "--delete", "--grace", "1ms", "--pattern", testSweepPattern(t))...)
			r.wantCode(t, exitOK)
			if !strings.Contains(r.stdout, "generation 1 of "+ix.country+" (group "+group+")") {
				t.Errorf("sweep: got stdout %q", r.stdout)
			}
			for _, k := range []string{ix.email, ix.country} {
				reg := redistest.HGetAll(t, d.client, keys.RegistryKey(k, names))
				if reg["1"] != "" || reg["2"] != "previous" || reg["3"] != "current" {
					t.Errorf("registry of %s after the sweep: %v", k, reg)
				}
			}
			if left := redistest.Keys(t, d.client, keys.GenPrefix(ix.country, 1)); len(left) > 0 {
				t.Errorf("sweep left %v", left)
			}
			ix.wantGenData(t, d, 3, gV4)

			// --plain: on the cluster the plain key of the hash is outside
			// the group's slot, and the sweep says so rather than fail.
			r = keyswap(t, d.args("sweep", "--delete", "--plain", "--pattern", testSweepPattern(t))...)
			r.wantCode(t, exitOK)
			if note := "kept the plain keys of " + ix.email + " (group " + group + "): its plain keys are outside its group's slot"; d.cluster && !strings.Contains(r.stdout, note) {
				t.Errorf("sweep --plain: got stdout %q, want %q", r.stdout, note)
			}
		})
	}
}

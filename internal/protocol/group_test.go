package protocol_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
)

func TestClaimGroup(t *testing.T) {
	// C102: every branch of claim.lua, through Generations.ClaimGroup of
	// two indexes at once (on the cluster in different slots, one
	// DoMulti): the pointer outside the group absent (set to the marker,
	// no TTL), holding the marker (unchanged), another group's marker, a
	// generation, a value no run writes, another type; the registry
	// outside the group holding only next (claimed), a generation, another
	// type. A refusal names what it found and writes nothing, for the
	// other index either: the claim checks every index before it claims
	// any.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		const group = "g"
		for _, tc := range []struct {
			name  string
			setup []string // a command on the first index's keys: {cmd, "ptr"|"reg", args...}
			says  string   // "" for a claim
		}{
			{"absent", nil, ""},
			{"claimed", []string{"SET", "ptr", keys.GroupMarker(group)}, ""},
			{"next only", []string{"HSET", "reg", keys.RegNext, "4"}, ""},
			{"other group", []string{"SET", "ptr", keys.GroupMarker("h")}, `in group "h"`},
			{"generation", []string{"SET", "ptr", "3"}, `holds "3"`},
			{"junk", []string{"SET", "ptr", "x y"}, `holds "x y"`},
			{"pointer type", []string{"HSET", "ptr", "a", "b"}, "is a hash"},
			{"retired", []string{"HSET", "reg", keys.RegNext, "2", "2", "retired:1"}, `holds generation "2" ("retired:1")`},
			{"registry type", []string{"SET", "reg", "x"}, "is a string"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				lives := []string{d.Prefix + tc.name + ":a", d.Prefix + tc.name + ":b"}
				ptr, reg := keys.PointerKey(lives[0], d.Cluster), keys.RegistryKey(lives[0], d.Cluster)
				redistest.Clean(t, d.Other, ptr, reg, keys.PointerKey(lives[1], d.Cluster), keys.RegistryKey(lives[1], d.Cluster))
				if tc.setup != nil {
					k := map[string]string{"ptr": ptr, "reg": reg}[tc.setup[1]]
					redistest.Cmd(t, d.Other, append([]string{tc.setup[0], k}, tc.setup[2:]...)...)
				}
				before := map[string]map[string]redistest.KeyState{}
				for _, l := range lives {
					before[l] = redistest.Snapshot(t, d.Other, keys.Base(l, d.Cluster)+":rebuild-")
				}
				err := protocol.NewInGroup(d.Client, group, nil).Generations.ClaimGroup(ctx, "acquire", lives)
				if tc.says == "" {
					if err != nil {
						t.Fatalf("ClaimGroup: %v", err)
					}
					for _, l := range lives {
						redistest.WantString(t, d.Other, keys.PointerKey(l, d.Cluster), keys.GroupMarker(group))
						if ttl := redistest.PTTL(t, d.Other, keys.PointerKey(l, d.Cluster)); ttl != -1 {
							t.Errorf("the claim of %s has a TTL: %v", l, ttl)
						}
					}
					return
				}
				if !errors.Is(err, keys.ErrGroupConflict) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "nothing written") {
					t.Fatalf("ClaimGroup: got %v, want ErrGroupConflict saying %q", err, tc.says)
				}
				for _, l := range lives {
					redistest.WantUnchanged(t, d.Other, keys.Base(l, d.Cluster)+":rebuild-", before[l])
				}
			})
		}
		// Without a group there is nothing to claim.
		if err := protocol.New(d.Client, nil).Generations.ClaimGroup(ctx, "acquire", []string{d.Prefix + "none"}); err != nil {
			t.Errorf("ClaimGroup without a group: %v", err)
		}
		redistest.WantAbsent(t, d.Other, keys.PointerKey(d.Prefix+"none", d.Cluster))
	})
}

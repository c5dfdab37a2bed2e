package protocol_test

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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
	// type, a next not digits (ErrTampered naming the registry: the floor
	// is unknown). A claim returns each index's floor, the larger of the
	// next of its registry outside the group and the group's registry's
	// (read under the group's locks), and reserves the generation above it
	// there: next is the floor plus one. A refusal names what it found and
	// writes nothing, for the other index either: the claim checks every
	// index before it claims any.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		const group = "g"
		for _, tc := range []struct {
			name  string
			setup []string // a command on the first index's keys: {cmd, "ptr"|"reg"|"greg", args...}
			says  string   // "" for a claim
			floor int64    // the first index's floor, for a claim
			err   error    // the refusal's sentinel: nil for ErrGroupConflict
		}{
			{"absent", nil, "", 0, nil},
			{"claimed", []string{"SET", "ptr", keys.GroupMarker(group)}, "", 0, nil},
			{"next only", []string{"HSET", "reg", keys.RegNext, "4"}, "", 4, nil},
			{"group's next", []string{"HSET", "greg", keys.RegNext, "7"}, "", 7, nil},
			{"claimed, group's next", []string{"EVAL", "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('HSET', KEYS[2], 'next', '3')", "2", "ptr", "reg", keys.GroupMarker(group)}, "", 3, nil},
			{"next zero", []string{"HSET", "reg", keys.RegNext, "0"}, "", 0, nil},
			{"next junk", []string{"HSET", "reg", keys.RegNext, "x"}, `its field next holds "x"`, 0, protocol.ErrTampered},
			{"next leading zero", []string{"HSET", "reg", keys.RegNext, "04"}, `its field next holds "04"`, 0, protocol.ErrTampered},
			{"next negative", []string{"HSET", "reg", keys.RegNext, "-1"}, `its field next holds "-1"`, 0, protocol.ErrTampered},
			{"other group", []string{"SET", "ptr", keys.GroupMarker("h")}, `in group "h"`, 0, nil},
			{"generation", []string{"SET", "ptr", "3"}, `holds "3"`, 0, nil},
			{"junk", []string{"SET", "ptr", "x y"}, `holds "x y"`, 0, nil},
			{"pointer type", []string{"HSET", "ptr", "a", "b"}, "is a hash", 0, nil},
			{"retired", []string{"HSET", "reg", keys.RegNext, "2", "2", "retired:1"}, `holds generation "2" ("retired:1")`, 0, nil},
			{"registry type", []string{"SET", "reg", "x"}, "is a string", 0, nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				lives := []string{d.Prefix + tc.name + ":a", d.Prefix + tc.name + ":b"}
				ptr, reg := keys.PointerKey(lives[0], d.Cluster), keys.RegistryKey(lives[0], d.Cluster)
				core := protocol.NewInGroup(d.Client, group, nil)
				in := keys.Names{Cluster: d.Cluster, Group: group}
				greg := keys.RegistryKey(lives[0], in)
				redistest.Clean(t, d.Other, ptr, reg, greg, keys.PointerKey(lives[1], d.Cluster), keys.RegistryKey(lives[1], d.Cluster))
				for _, l := range lives {
					lock := core.LockKey(l)
					redistest.Clean(t, d.Other, lock, keys.RecordKey(lock), keys.LogKey(lock))
				}
				locks, err := core.Locks.Acquire(ctx, protocol.AcquireOptions{Op: "acquire", Key: lives[0], Lives: lives, TTL: 60 * time.Second, Mode: protocol.ModeRebuild})
				if err != nil {
					t.Fatal(err)
				}
				if tc.setup != nil {
					k := map[string]string{"ptr": ptr, "reg": reg, "greg": greg}
					setup := slices.Clone(tc.setup)
					for i, a := range setup[1:] {
						if v, ok := k[a]; ok {
							setup[1+i] = v
						}
					}
					redistest.Cmd(t, d.Other, setup...)
				}
				before := map[string]map[string]redistest.KeyState{}
				for _, l := range lives {
					before[l] = redistest.Snapshot(t, d.Other, keys.Base(l, d.Cluster)+":rebuild-")
				}
				floors, err := core.Generations.ClaimGroup(ctx, "acquire", lives[0], locks, lives)
				if tc.says == "" {
					if err != nil {
						t.Fatalf("ClaimGroup: %v", err)
					}
					want := []int64{tc.floor, 0}
					if !slices.Equal(floors, want) {
						t.Errorf("floors: got %v, want %v", floors, want)
					}
					for i, l := range lives {
						redistest.WantHash(t, d.Other, keys.RegistryKey(l, d.Cluster), map[string]string{keys.RegNext: strconv.FormatInt(want[i]+1, 10)})
						redistest.WantString(t, d.Other, keys.PointerKey(l, d.Cluster), keys.GroupMarker(group))
						if ttl := redistest.PTTL(t, d.Other, keys.PointerKey(l, d.Cluster)); ttl != -1 {
							t.Errorf("the claim of %s has a TTL: %v", l, ttl)
						}
					}
					return
				}
				want := tc.err
				if want == nil {
					want = keys.ErrGroupConflict
				}
				if !errors.Is(err, want) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "nothing written") {
					t.Fatalf("ClaimGroup: got %v, want %v saying %q", err, want, tc.says)
				}
				if tc.err != nil && !strings.Contains(err.Error(), reg) {
					t.Errorf("ClaimGroup: got %v, want it to name %s", err, reg)
				}
				for _, l := range lives {
					redistest.WantUnchanged(t, d.Other, keys.Base(l, d.Cluster)+":rebuild-", before[l])
				}
			})
		}
		// Without a group there is nothing to claim.
		if _, err := protocol.New(d.Client, nil).Generations.ClaimGroup(ctx, "acquire", d.Prefix+"none", nil, []string{d.Prefix + "none"}); err != nil {
			t.Errorf("ClaimGroup without a group: %v", err)
		}
		redistest.WantAbsent(t, d.Other, keys.PointerKey(d.Prefix+"none", d.Cluster))
	})
}

func TestClaimGroupExact(t *testing.T) {
	// C102: the allocation of a run in a group hands out exactly the
	// generation its claim reserved in the registry outside the group
	// (next 4 there: generation 5), and refuses with ErrTampered, nothing
	// written, a registry of the group whose next moved past it by hand
	// while the run held the lock.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		const group = "g"
		core := protocol.NewInGroup(d.Client, group, nil)
		in := keys.Names{Cluster: d.Cluster, Group: group}
		for _, moved := range []bool{false, true} {
			live := d.Prefix + "exact:" + strconv.FormatBool(moved)
			lock := core.LockKey(live)
			greg, gptr := keys.RegistryKey(live, in), keys.PointerKey(live, in)
			reg := keys.RegistryKey(live, d.Cluster)
			redistest.Clean(t, d.Other, lock, keys.RecordKey(lock), keys.LogKey(lock), greg, gptr, reg, keys.PointerKey(live, d.Cluster))
			redistest.Cmd(t, d.Other, "HSET", reg, keys.RegNext, "4")
			locks, err := core.Locks.Acquire(ctx, protocol.AcquireOptions{Op: "acquire", Key: live, Lives: []string{live}, TTL: 60 * time.Second, Mode: protocol.ModeRebuild})
			if err != nil {
				t.Fatal(err)
			}
			floors, err := core.Generations.ClaimGroup(ctx, "acquire", live, locks, []string{live})
			if err != nil || !slices.Equal(floors, []int64{4}) {
				t.Fatalf("ClaimGroup: %v, %v; want [4]", floors, err)
			}
			redistest.WantHash(t, d.Other, reg, map[string]string{keys.RegNext: "5"})
			if moved {
				redistest.Cmd(t, d.Other, "HSET", greg, keys.RegNext, "6")
			}
			gens, _, err := core.Generations.AllocateGenerations(ctx, "acquire", live, locks, []string{live}, floors)
			if !moved {
				if err != nil || !slices.Equal(gens, []int64{5}) {
					t.Errorf("AllocateGenerations: %v, %v; want [5]", gens, err)
				}
				redistest.WantHash(t, d.Other, greg, map[string]string{keys.RegNext: "5", "5": "building:" + locks[0].Token})
				continue
			}
			if !errors.Is(err, protocol.ErrTampered) || !strings.Contains(err.Error(), "past generation 5 the run reserved") ||
				!strings.Contains(err.Error(), "a generation was allocated there meanwhile") || !strings.Contains(err.Error(), "Run again") ||
				strings.Contains(err.Error(), "HSET") {
				t.Errorf("AllocateGenerations after next moved: %v, want ErrTampered naming generation 5, saying it was allocated meanwhile and to run again, without the advice for a lost registry", err)
			}
			redistest.WantHash(t, d.Other, greg, map[string]string{keys.RegNext: "6"})
		}
	})
}

package protocol

import (
	"context"
	"fmt"
	"strconv"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// claimScript claims an index for a group (claim.lua). It is retried: a
// rerun finds its own marker and replies OK.
var claimScript = newScript("claim", true)

// ClaimGroup claims each index of lives for the group of r's names
// (claim.lua) before a run in the group allocates a generation of any
// (SPEC C102): the pointer of each index without a group then holds
// keys.GroupMarker(group), and a run or a reader without the group, or in
// another, refuses the index. It returns an error matching
// keys.ErrGroupConflict, naming the index and what it found, when an index
// is in another group or has generations of runs without a group, and
// one matching ErrTampered, naming the registry, when the field next of
// the index's registry without a group is not digits. With no group it
// does nothing and returns no floors.
//
// It returns each index's floor: the field next of its registry without a
// group (0 when absent), the last generation a run without the group
// allocated. The run passes them to AllocateGenerations, which allocates
// above them: a run without the group that allocated before the claim and
// then lost its lock (its registry field removed by a sweep) writes, or
// removes, data keys no generation of the group shares.
//
// It checks every index first (one claim.lua per index, checking only, in
// one round trip: on a cluster the indexes' own bases are in different
// slots), so that a refusal of one leaves the others unclaimed, then
// claims those not yet claimed (a second round trip, none when all were):
// each claim checks again in its own step, so a change in between is
// refused there, never overwritten.
func (r Generations) ClaimGroup(ctx context.Context, op string, lives []string) ([]int64, error) {
	if r.cluster.Group == "" {
		return nil, nil
	}
	claimed, floors, err := r.claim(ctx, op, lives, true)
	if err != nil {
		return nil, err
	}
	var rest []string
	for i, l := range lives {
		if !claimed[i] {
			rest = append(rest, l)
		}
	}
	if len(rest) == 0 {
		return floors, nil
	}
	// The floor of an index claimed now is the one read in the claim's
	// step: after it, no run without the group allocates.
	_, after, err := r.claim(ctx, op, rest, false)
	if err != nil {
		return nil, err
	}
	j := 0
	for i := range lives {
		if !claimed[i] {
			floors[i], j = after[j], j+1
		}
	}
	return floors, nil
}

// claim runs claim.lua for each index of lives, checking only when check
// is set, and returns whether each was claimed already and its floor.
func (r Generations) claim(ctx context.Context, op string, lives []string, check bool) ([]bool, []int64, error) {
	own := keys.Names{Cluster: r.cluster.Cluster}
	args := []string{keys.GroupMarker(r.cluster.Group), "0"}
	if check {
		args[1] = "1"
	}
	ks := func(l string) []string { return []string{keys.PointerKey(l, own), keys.RegistryKey(l, own)} }
	cb := r.client.B()
	cmds := make(rueidis.Commands, len(lives))
	for i, l := range lives {
		cmds[i] = claimScript.command(cb, ks(l), args)
	}
	results := r.client.DoMulti(ctx, cmds...)
	for i, res := range results {
		if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
			results[i] = claimScript.Exec(ctx, r.client, ks(lives[i]), args)
		}
	}
	claimed := make([]bool, len(lives))
	floors := make([]int64, len(lives))
	for i, res := range results {
		was, floor, err := r.claimed(ctx, op, lives[i], res)
		if err != nil {
			return nil, nil, err
		}
		claimed[i], floors[i] = was, floor
	}
	return claimed, floors, nil
}

// claimed returns whether the claim of live whose reply is res found it
// claimed already and the floor it read, or its error.
func (r Generations) claimed(ctx context.Context, op, live string, res rueidis.RedisResult) (bool, int64, error) {
	own := keys.Names{Cluster: r.cluster.Cluster}
	ptr := keys.PointerKey(live, own)
	rep, err := parseReply(res)
	if err != nil {
		return false, 0, Fail(ctx, op, live, fmt.Errorf("the claim of %s for group %q: %w", ptr, r.cluster.Group, err))
	}
	switch code, err := rep.code(); {
	case err != nil:
		return false, 0, &Error{Op: op, Key: live, Err: fmt.Errorf("unexpected claim script reply: %w", err)}
	case code == codeOK && len(rep) == 3:
		was, _ := rep.int(1)
		// claim.lua checked the floor; a reply not digits is no floor.
		floor, err := strconv.ParseInt(rep.str(2), 10, 64)
		if err != nil || floor < 0 {
			return false, 0, &Error{Op: op, Key: live, Err: fmt.Errorf("unexpected claim script reply %v: the floor is not a generation", rep)}
		}
		return was == 1, floor, nil
	case code == codeBadRegistry:
		return false, 0, &Error{Op: op, Key: live, Err: fmt.Errorf("%w: %s: %s, a state no run leaves (written by hand); nothing written. It holds the last generation a run without a group allocated, which group %q's generations start above: set it to that generation (HSET %s next <G>), or delete it if no run without a group ever ran on index %s",
			ErrTampered, rep.str(1), rep.str(2), r.cluster.Group, rep.str(1), live)}
	case code == codeInGroup:
		return false, 0, &Error{Op: op, Key: live, Err: fmt.Errorf("%w; nothing written", keys.GroupConflict(live, ptr, rep.str(2), r.cluster.Group))}
	case code == codeUngrouped:
		return false, 0, &Error{Op: op, Key: live, Err: fmt.Errorf("%w: index %s has generations of runs without a group (%s %s), whose data keys have the names group %q's would; nothing written. Go on without the group, or build the index in group %q under a new key and move readers to it. Retired generations of runs without the group go with a sweep (keyswap sweep) once their grace is over and the group can claim the index then, but a current or previous one stays while the index is in Generations mode: only a run without the group in RenameInPlace mode moves it out, possible on a standalone server or for an index with a hash tag of its own",
			keys.ErrGroupConflict, live, rep.str(1), rep.str(2), r.cluster.Group, r.cluster.Group)}
	}
	return false, 0, &Error{Op: op, Key: live, Err: fmt.Errorf("unexpected claim script reply %v", rep)}
}

// inGroup returns the error of a script that found the pointer of live
// (in r's names) holding the claim of group: nothing was written.
func (r *Core) inGroup(op, live, group string) error {
	return &Error{Op: op, Key: live, Err: fmt.Errorf("%w; nothing written", keys.GroupConflict(live, keys.PointerKey(live, r.cluster), group, r.cluster.Group))}
}

// otherClaims returns an error matching keys.ErrGroupConflict, naming the
// group, when r has a group and the pointer without a group of an index of
// lives that has no pointer in the group (gens[i] is "0") holds the claim
// of another group (SPEC C102): the keys in the rename-in-place shape that
// r's caller would use are nobody's, the index being the other group's. It
// reads those pointers in one round trip, none when there are none.
func (r *Core) otherClaims(ctx context.Context, op string, lives, gens []string) error {
	if r.cluster.Group == "" {
		return nil
	}
	own := keys.Names{Cluster: r.cluster.Cluster}
	var absent []string
	var cmds rueidis.Commands
	for i, l := range lives {
		if gens[i] == "0" {
			absent = append(absent, l)
			cmds = append(cmds, r.client.B().Get().Key(keys.PointerKey(l, own)).Build())
		}
	}
	if len(cmds) == 0 {
		return nil
	}
	for i, res := range r.client.DoMulti(ctx, cmds...) {
		ptr := keys.PointerKey(absent[i], own)
		v, err := res.ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return Fail(ctx, op, absent[i], fmt.Errorf("GET %s: %w", ptr, err))
		}
		if g, ok := keys.ParseGroupMarker(v); ok && g != r.cluster.Group {
			return &Error{Op: op, Key: absent[i], Err: fmt.Errorf("%w; nothing written", keys.GroupConflict(absent[i], ptr, g, r.cluster.Group))}
		}
	}
	return nil
}

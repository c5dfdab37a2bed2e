package protocol

import (
	"context"
	"fmt"
	"strconv"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// claimScript claims an index for a group and reserves the group's next
// generation of it (claim.lua). It is retried: a rerun finds its own
// marker and reserves once more, which skips a number.
var claimScript = newScript("claim", true)

// ClaimGroup claims each index of lives for the group of r's names, and
// reserves in its registry without a group the generation the run that
// holds locks allocates of it (claim.lua), before that run allocates any
// (SPEC C102): the pointer of each index without a group then holds
// keys.GroupMarker(group), and a run or a reader without the group, or in
// another, refuses the index. It returns an error matching
// keys.ErrGroupConflict, naming the index and what it found, when an index
// is in another group or has generations of runs without a group, and
// one matching ErrTampered, naming the registry, when the field next of
// the index's registry without a group is not digits, or when the group's
// registry or pointer is in a state no run leaves (genalloc.lua's checks).
// On a cluster, where another live key can have the index's own base
// (keys.Aliasable), the claim also stamps that base with its live key
// (keys.OwnerKey, SPEC C104) where no stamp is yet, and refuses a base
// another live key owns ("X" and "{X}" share one) with an error matching
// keys.ErrGroupConflict that names both, or a stamp of another type with
// one matching ErrTampered, nothing written.
// With no group it does nothing and returns no floors.
//
// It returns each index's floor, which the run passes to
// AllocateGenerations: the generation it reserved less one. The group's
// registry is read first (genalloc.lua checking only, under the locks,
// which keep it: only a run holding them allocates), for the generation
// it would allocate; the claim takes the larger of that and the field next
// of the registry without a group (the last generation a run without the
// group allocated, or the group reserved) as the floor, and sets that next
// to the floor plus one. So a run without the group that allocated before
// the claim and then lost its lock (its registry field removed by a
// sweep) writes, or removes, data keys no generation of the group shares,
// and so does a run without the group, or in another, once the claim is
// gone: it allocates above that next.
//
// It checks every index first (one claim.lua per index, checking only, in
// one round trip: on a cluster the indexes' own bases are in different
// slots), so that a refusal of one leaves every index as it was, then
// claims and reserves each (a second round trip): each claim checks again
// in its own step, so a change in between is refused there, never
// overwritten; an index claimed and reserved before it stays so, which
// only skips a number of it. With one index the check is the claim's own.
func (r Generations) ClaimGroup(ctx context.Context, op, key string, locks []*Lock, lives []string) ([]int64, error) {
	if r.cluster.Group == "" {
		return nil, nil
	}
	next, _, err := r.genalloc(ctx, op, key, locks, lives, nil, "peek")
	if err != nil {
		return nil, err
	}
	if len(lives) > 1 {
		if _, err := r.claim(ctx, op, lives, nil); err != nil {
			return nil, err
		}
	}
	group := make([]int64, len(next))
	for i, g := range next {
		group[i] = g - 1
	}
	return r.claim(ctx, op, lives, group)
}

// CheckClaims checks, before a flip of the run in the group of r's names
// that allocated gens (one per index of lives), that each index's claim
// and reservation are still there (claim.lua, checking only; nothing
// written): the pointer without a group holds the group's marker, and the
// field next of the registry without a group is at or above the
// generation the run built. A claim or reservation gone since the
// allocation (deleted or set back by hand, or lost in a failover of the
// master of the index's own base, whose writes the run's durability wait
// may have counted on the replica that took over) fails the run with an
// error matching ErrTampered that names the index and the key, before the
// flip makes that generation current unfenced: a run without the group
// could then allocate its number. The next run in the group claims and
// reserves again. With no group it does nothing.
func (r Generations) CheckClaims(ctx context.Context, op string, lives []string, gens []int64) error {
	if r.cluster.Group == "" {
		return nil
	}
	own := keys.Names{Cluster: r.cluster.Cluster}
	results := r.claimResults(ctx, lives, nil)
	for i, res := range results {
		was, next, err := r.claimed(ctx, op, lives[i], res)
		if err != nil {
			return err
		}
		switch {
		case !was:
			return &Error{Op: op, Key: lives[i], Err: fmt.Errorf("%w: the claim of index %s for group %q (%s holding %q) is gone since the run wrote it (deleted by hand, or lost in a failover); the flip would make generation %d current with nothing to keep a run without the group from allocating its number; every index left at its generation. Run again: the run claims it again",
				ErrTampered, lives[i], r.cluster.Group, keys.PointerKey(lives[i], own), keys.GroupMarker(r.cluster.Group), gens[i])}
		case i < len(gens) && next < gens[i]:
			return &Error{Op: op, Key: lives[i], Err: fmt.Errorf("%w: the field next of %s holds %d, below generation %d the run reserved there for group %q (set back by hand, or lost in a failover); the flip would leave that number to a run without the group; every index left at its generation. Run again: the run reserves it again",
				ErrTampered, keys.RegistryKey(lives[i], own), next, gens[i], r.cluster.Group)}
		}
	}
	return nil
}

// claim runs claim.lua for each index of lives, checking only when group
// is nil, else claiming and reserving above group[i], the group's floor of
// index i, and returns the floor of each.
func (r Generations) claim(ctx context.Context, op string, lives []string, group []int64) ([]int64, error) {
	results := r.claimResults(ctx, lives, group)
	floors := make([]int64, len(lives))
	for i, res := range results {
		_, floor, err := r.claimed(ctx, op, lives[i], res)
		if err != nil {
			return nil, err
		}
		floors[i] = floor
	}
	return floors, nil
}

// claimResults runs claim.lua for each index of lives, as claim says, in
// one round trip, and returns its replies.
func (r Generations) claimResults(ctx context.Context, lives []string, group []int64) []rueidis.RedisResult {
	own := keys.Names{Cluster: r.cluster.Cluster}
	ks := func(l string) []string {
		if !keys.Aliasable(l, own.Cluster) {
			return []string{keys.PointerKey(l, own), keys.RegistryKey(l, own)}
		}
		return []string{keys.PointerKey(l, own), keys.RegistryKey(l, own), keys.OwnerKey(l, own)}
	}
	args := func(i int) []string {
		if group == nil {
			return []string{keys.GroupMarker(r.cluster.Group), "1", "0", lives[i]}
		}
		return []string{keys.GroupMarker(r.cluster.Group), "0", strconv.FormatInt(group[i], 10), lives[i]}
	}
	cb := r.client.B()
	cmds := make(rueidis.Commands, len(lives))
	for i, l := range lives {
		cmds[i] = claimScript.command(cb, ks(l), args(i))
	}
	results := r.client.DoMulti(ctx, cmds...)
	for i, res := range results {
		if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
			results[i] = claimScript.Exec(ctx, r.client, ks(lives[i]), args(i))
		}
	}
	return results
}

// claimed returns, from the reply res of the claim of live, whether the
// pointer held the group's marker already and the number the script
// returned (claiming, the floor; checking only, the field next of the
// registry without a group), or its error.
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
		// claim.lua checked the floor; a reply not digits is no floor.
		floor, err := strconv.ParseInt(rep.str(2), 10, 64)
		if err != nil || floor < 0 {
			return false, 0, &Error{Op: op, Key: live, Err: fmt.Errorf("unexpected claim script reply %v: the floor is not a generation", rep)}
		}
		was, _ := rep.int(1)
		return was == 1, floor, nil
	case code == codeBadRegistry:
		return false, 0, &Error{Op: op, Key: live, Err: fmt.Errorf("%w: %s: %s, a state no run leaves (written by hand); nothing written. It holds the last generation a run without a group allocated, or a run in a group reserved, of index %s, which group %q's generations start above: set it to the largest of those, at least the group's latest generation (HSET %s next <G>)",
			ErrTampered, rep.str(1), rep.str(2), live, r.cluster.Group, rep.str(1))}
	case code == codeInGroup:
		return false, 0, &Error{Op: op, Key: live, Err: fmt.Errorf("%w; nothing written", keys.GroupConflict(live, ptr, rep.str(2), r.cluster.Group))}
	case code == codeOwned:
		return false, 0, &Error{Op: op, Key: live, Err: ownerError(live, keys.OwnerKey(live, own), rep)}
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

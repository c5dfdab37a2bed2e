package protocol

import (
	"context"
	"fmt"

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
// is in another group or has generations of runs without a group. With
// no group it does nothing.
//
// It checks every index first (one claim.lua per index, checking only, in
// one round trip: on a cluster the indexes' own bases are in different
// slots), so that a refusal of one leaves the others unclaimed, then
// claims those not yet claimed (a second round trip, none when all were):
// each claim checks again in its own step, so a change in between is
// refused there, never overwritten.
func (r Generations) ClaimGroup(ctx context.Context, op string, lives []string) error {
	if r.cluster.Group == "" {
		return nil
	}
	claimed, err := r.claim(ctx, op, lives, true)
	if err != nil {
		return err
	}
	var rest []string
	for i, l := range lives {
		if !claimed[i] {
			rest = append(rest, l)
		}
	}
	if len(rest) == 0 {
		return nil
	}
	_, err = r.claim(ctx, op, rest, false)
	return err
}

// claim runs claim.lua for each index of lives, checking only when check
// is set, and returns whether each was claimed already.
func (r Generations) claim(ctx context.Context, op string, lives []string, check bool) ([]bool, error) {
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
	for i, res := range results {
		was, err := r.claimed(ctx, op, lives[i], res)
		if err != nil {
			return nil, err
		}
		claimed[i] = was
	}
	return claimed, nil
}

// claimed returns whether the claim of live whose reply is res found it
// claimed already, or its error.
func (r Generations) claimed(ctx context.Context, op, live string, res rueidis.RedisResult) (bool, error) {
	own := keys.Names{Cluster: r.cluster.Cluster}
	ptr := keys.PointerKey(live, own)
	rep, err := parseReply(res)
	if err != nil {
		return false, Fail(ctx, op, live, fmt.Errorf("the claim of %s for group %q: %w", ptr, r.cluster.Group, err))
	}
	switch code, err := rep.code(); {
	case err != nil:
		return false, &Error{Op: op, Key: live, Err: fmt.Errorf("unexpected claim script reply: %w", err)}
	case code == codeOK && len(rep) == 2:
		was, _ := rep.int(1)
		return was == 1, nil
	case code == codeInGroup:
		return false, &Error{Op: op, Key: live, Err: fmt.Errorf("%w; nothing written", keys.GroupConflict(live, ptr, rep.str(2), r.cluster.Group))}
	case code == codeUngrouped:
		return false, &Error{Op: op, Key: live, Err: fmt.Errorf("%w: index %s has generations of runs without a group (%s %s), whose data keys have the names group %q's would; nothing written. Go on without the group, or move the index out of Generations mode first (a run without the group in RenameInPlace mode, then a sweep of its generations once their grace is over)",
			keys.ErrGroupConflict, live, rep.str(1), rep.str(2), r.cluster.Group)}
	}
	return false, &Error{Op: op, Key: live, Err: fmt.Errorf("unexpected claim script reply %v", rep)}
}

// inGroup returns the error of a script that found the pointer of live
// (in r's names) holding the claim of group: nothing was written.
func (r *Core) inGroup(op, live, group string) error {
	return &Error{Op: op, Key: live, Err: fmt.Errorf("%w; nothing written", keys.GroupConflict(live, keys.PointerKey(live, r.cluster), group, r.cluster.Group))}
}

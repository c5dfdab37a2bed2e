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

// ClaimGroup claims each index of lives for the group of r's names, in one
// round trip (one claim.lua per index, in the slot of the index's control
// keys without a group), before a run in the group allocates a generation
// of any (SPEC C102): the pointer without a group then holds
// keys.GroupMarker(group), and a run or a reader without the group, or in
// another, refuses the index. It returns an error matching
// keys.ErrGroupConflict, naming the index and what it found, when an index
// is in another group or has generations of runs without a group; the
// claims of the other indexes stay, as they are only ever the group's.
// With no group it does nothing.
func (r Generations) ClaimGroup(ctx context.Context, op string, lives []string) error {
	group := r.cluster.Group
	if group == "" {
		return nil
	}
	own := keys.Names{Cluster: r.cluster.Cluster}
	marker := keys.GroupMarker(group)
	cb := r.client.B()
	cmds := make(rueidis.Commands, len(lives))
	for i, l := range lives {
		cmds[i] = claimScript.command(cb, []string{keys.PointerKey(l, own), keys.RegistryKey(l, own)}, []string{marker})
	}
	results := r.client.DoMulti(ctx, cmds...)
	for i, res := range results {
		if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
			results[i] = claimScript.Exec(ctx, r.client, []string{keys.PointerKey(lives[i], own), keys.RegistryKey(lives[i], own)}, []string{marker})
		}
	}
	for i, res := range results {
		if err := r.claimed(ctx, op, lives[i], res); err != nil {
			return err
		}
	}
	return nil
}

// claimed returns the error of the claim of live whose reply is res.
func (r Generations) claimed(ctx context.Context, op, live string, res rueidis.RedisResult) error {
	own := keys.Names{Cluster: r.cluster.Cluster}
	ptr := keys.PointerKey(live, own)
	rep, err := parseReply(res)
	if err != nil {
		return Fail(ctx, op, live, fmt.Errorf("the claim of %s for group %q: %w", ptr, r.cluster.Group, err))
	}
	switch code, err := rep.code(); {
	case err != nil:
		return &Error{Op: op, Key: live, Err: fmt.Errorf("unexpected claim script reply: %w", err)}
	case code == codeOK:
		return nil
	case code == codeInGroup:
		return &Error{Op: op, Key: live, Err: fmt.Errorf("%w; nothing written", keys.GroupConflict(live, ptr, rep.str(2), r.cluster.Group))}
	case code == codeUngrouped:
		return &Error{Op: op, Key: live, Err: fmt.Errorf("%w: index %s has generations of runs without a group (%s %s), whose data keys have the names group %q's would; nothing written. Go on without the group, or move the index out of Generations mode first (a run without the group in RenameInPlace mode, then a sweep of its generations once their grace is over)",
			keys.ErrGroupConflict, live, rep.str(1), rep.str(2), r.cluster.Group)}
	}
	return &Error{Op: op, Key: live, Err: fmt.Errorf("unexpected claim script reply %v", rep)}
}

// inGroup returns the error of a script that found the pointer of live
// (in r's names) holding the claim of group: nothing was written.
func (r *Core) inGroup(op, live, group string) error {
	return &Error{Op: op, Key: live, Err: fmt.Errorf("%w; nothing written", keys.GroupConflict(live, keys.PointerKey(live, r.cluster), group, r.cluster.Group))}
}

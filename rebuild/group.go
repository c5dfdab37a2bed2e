package rebuild

import (
	"context"
	"errors"
	"fmt"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

// ErrGroupConflict reports that an index of a Rebuilder with a Group still
// has a pointer outside the group, from runs without one: readers without
// the group follow that pointer, and would never see the group's
// generations. The run wrote nothing. Move the index through the
// rename-in-place shape first (see the package documentation, "Groups").
var ErrGroupConflict = errors.New("the index has a pointer outside its group")

// checkGroup validates Options.Group.
func checkGroup(o *Options, bad func(string, ...any) error) error {
	if o.Group == "" {
		return nil
	}
	if o.Publish != Generations {
		return bad("%w: Group %q in RenameInPlace mode: a rename needs the lock and the data in one hash slot, and a group takes the lock to the group's; use Generations, or no Group", keys.ErrBadGroup, o.Group)
	}
	if err := keys.CheckGroup(o.Group); err != nil {
		return bad("Group: %w", err)
	}
	return nil
}

// checkUngrouped returns an error matching ErrGroupConflict, for a
// Rebuilder with a Group, when an index has a pointer outside the group:
// one EXISTS per index, in one round trip, before the run writes anything
// of its own. It is a check of the configuration, not a fence: the
// pointer outside the group comes from a Rebuilder configured without
// the group, which never looks inside it.
func (r *core) checkUngrouped(ctx context.Context, op string) error {
	if r.opts.Group == "" {
		return nil
	}
	client := r.redis.Client()
	cluster := r.redis.Cluster()
	cmds := make(rueidis.Commands, len(r.lives))
	for i, l := range r.lives {
		cmds[i] = client.B().Exists().Key(keys.PointerKey(l, cluster)).Build()
	}
	for i, res := range client.DoMulti(ctx, cmds...) {
		ptr := keys.PointerKey(r.lives[i], cluster)
		n, err := res.AsInt64()
		if err != nil {
			return protocol.Fail(ctx, op, r.lives[i], fmt.Errorf("EXISTS %s: %w", ptr, err))
		}
		if n > 0 {
			return &Error{Op: op, Key: r.lives[i], Err: fmt.Errorf("%w: %s exists, and group %q puts the pointer at %s; readers without the group would go on reading the generation %s names. Nothing written",
				ErrGroupConflict, ptr, r.opts.Group, keys.PointerKey(r.lives[i], r.redis.Names()), ptr)}
		}
	}
	return nil
}

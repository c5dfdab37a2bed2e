package rebuild

import (
	"github.com/keyswap/keyswap/internal/keys"
)

// ErrGroupConflict reports that an index belongs to another group than
// the Rebuilder's, or to none (SPEC C102): a run in a group found the
// index claimed by another group, or found generations of runs without a
// group (a pointer, or a field of the registry: building, current,
// previous or retired); a run without a group found the index claimed by
// a group. The data keys of a generation keep the index's name whatever
// its group, so the two would write into the same keys. The run wrote
// nothing; the error names the group to pass.
//
// It also reports, at the acquire, an index whose base another index owns
// (SPEC C104): on Redis Cluster the untagged key X and the tagged key
// "{X}" have one base, and so one lock, pointer and registry. The first to
// run in Generations mode stamps the base (<base>:rebuild-owner); a run or
// a rollback of the other, in either mode, writes nothing, and the error
// names both, the base, and how to part them.
var ErrGroupConflict = keys.ErrGroupConflict

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

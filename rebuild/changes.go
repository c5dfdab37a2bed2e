package rebuild

import (
	"context"
	"errors"
	"fmt"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/hook"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
)

// writes collects the writes of a change, for [Rebuilder.Apply]: what an
// index.Writes that a builder's Diff receives wraps.
type writes struct {
	owners  []owner
	cluster bool
	slot    uint16
	builder int
	ops     [][]protocol.Op // per builder, in order
	skipped func(live string)
}

// Add records one op of the current builder, after checking that it owns
// key.
func (w *writes) Add(cmd, key string, args ...string) error {
	if len(args) == 0 {
		return nil // nothing to write
	}
	o := w.owners[w.builder]
	if err := o.owns(key, w.cluster, w.slot); err != nil {
		if errors.Is(err, index.ErrReservedKey) && o.family && w.skipped != nil {
			w.skipped(key)
		}
		return err
	}
	w.ops[w.builder] = append(w.ops[w.builder], protocol.Op{Cmd: cmd, Key: key, Args: args})
	return nil
}

// Apply applies changes to the live keys of every builder, in one atomic
// round trip: each builder's [index.Incremental] Diff turns each change into
// writes, and one script checks this user's rights and the keys' types,
// then applies them all, or none.
//
// Apply is what keeps an index right while it is rebuilt. When a run of
// these keys is in progress, in this process or any other, the script also
// logs the writes for that run, which replays them onto its temp keys after
// the source's last item and before it publishes, the last of them inside
// the publish itself: the changes applied during a run survive its publish.
// See the package documentation, "Writes during a rebuild", for what the
// source and the application must guarantee, chiefly: apply each change
// after it is committed to the source of truth, and the changes to one item
// in the order they were committed.
//
// Without a run in progress, Apply simply maintains the index. Changes that
// write nothing (an update that leaves every entry as it was) send nothing.
//
// While a key's lock is held by a rebuild that would not replay the change
// (store.WithRebuild, a Ruby Familia rebuild, a rollback, a run of a
// keyswap whose record version this one does not know, or one whose record
// is gone or carries another token), Apply refuses the whole change,
// writing nothing, with an error matching ErrInProgress: apply it again
// once that rebuild ends. A change is never applied where that rebuild's
// swap would revert it.
//
// Apply returns an *Error of Op "apply": ErrNotIncremental for a builder
// without Diff; the builder's own Diff error, naming the change; an error
// matching ErrInProgress as above; one matching ErrNoPermission, or naming
// a key of another type, when Redis would refuse a write (nothing
// applied); or one matching ErrOutcomeUnknown when the reply was lost (all
// of it applied, or none: applying it again is safe).
//
// In Generations mode Apply writes the change to each index's current
// generation (the one its pointer names), checking in the same atomic step
// that no flip moved the pointer meanwhile. An index whose pointer holds a
// group's claim (a Rebuilder without a group, of an index a group's run
// claimed) fails it with ErrGroupConflict naming the group, nothing
// applied; so does an index of a Rebuilder in another group, which has no
// pointer of its group, and one in RenameInPlace mode. On a cluster, an
// index whose base another index owns (the untagged X and the tagged
// "{X}" share one, whose owner stamp the first of them to run in
// Generations mode wrote, SPEC C104) fails it with ErrGroupConflict
// naming both, nothing applied or logged: the pointer is the other's, and
// so is the generation it names. While a run of the keys is in
// progress, the same step logs the change for it, as above: the run
// replays it onto the generation it builds, and its flip replays the last
// changes (a bounded tail) itself, in the same atomic step as the pointer's
// move, where the run's keys share its locks' slot.
//
// Where they do not (on Redis Cluster, an index without a hash tag), the
// flip cannot write the other slots, and the run cuts over instead: it
// sets a mark next to its locks, for at most 5 s (twice its last attempt
// to flip, from 250 ms), and drains its log while Apply waits; the flip
// removes the mark. Apply then waits, pausing up to 20 ms between tries
// and never past the mark's deadline, and applies the change once the mark
// is gone: it returns the cause of ctx if ctx ends first, and an error
// matching ErrInProgress after 10 s of waiting in all, nothing applied
// either way. A run that dies with its mark set holds Apply back until the
// mark's deadline at most, or until its lock goes.
//
// On Redis Cluster, an index without a hash tag (a family whose buckets
// spread over every slot, or a key whose generation key leaves its lock's
// slot) cannot be written in the step that checks its pointer and logs the
// change, so Apply goes in three steps: one script in the locks' slot
// resolves and checks the pointers, checks the user's rights on every key
// the change writes and logs the change for a run in progress (or refuses
// it, writing nothing); one script per slot then writes that slot's ops,
// all or none; and a last script in the locks' slot checks that the
// generation written is still current or previous, removing the keys it
// wrote there when a flip retired it meanwhile (the new generation has the
// change, replayed from the log or read from the source). Each slot is
// written atomically, the change as a whole is not: a reader may see a
// move between two buckets in different slots half done (the item in both
// buckets, or in neither) for the time between two scripts, and a
// conditional removal (a Hash's or SortedSet's old entry) keeps its
// condition on its own key only. An error then says whether the change
// was logged and which keys were written, not written, or perhaps written
// (ErrOutcomeUnknown when a reply was lost; ErrTampered when a key of the
// generation has another type): apply the change again.
func (r *Rebuilder[T]) Apply(ctx context.Context, changes ...index.Change[T]) error {
	gen := r.opts.Publish == Generations
	// In Generations mode the plain keys' slots do not matter: the
	// generation's keys are checked once resolved.
	w := &writes{owners: r.owners, cluster: r.redis.Cluster() && !gen, ops: make([][]protocol.Op, len(r.builders))}
	if w.cluster {
		w.slot = keys.Slot(r.owners[0].key)
	}
	w.skipped = func(live string) {
		r.opts.Logger.Warn("keyswap: skipped a change's write to a key with the shape of keyswap's own keys", "key", r.key, "skipped_key", live)
	}
	iw := hook.NewWrites(w).(*index.Writes)
	for b, builder := range r.builders {
		inc, ok := builder.(index.Incremental[T])
		if !ok {
			return &Error{Op: "apply", Key: builder.Key(), Err: fmt.Errorf("%w (%T)", ErrNotIncremental, builder)}
		}
		w.builder = b
		for i, c := range changes {
			if c.Old == nil && c.New == nil {
				return &Error{Op: "apply", Key: r.key, Err: fmt.Errorf("change %d has neither an old nor a new value", i)}
			}
			if err := inc.Diff(iw, c.Old, c.New); err != nil {
				return &Error{Op: "apply", Key: builder.Key(), Err: fmt.Errorf("change %d: %w", i, err)}
			}
		}
	}
	var applied protocol.Applied
	var err error
	if gen {
		applied, err = r.redis.Changes.GenApply(ctx, protocol.GenApplyOptions{
			Op: "apply", Key: r.key, Locks: r.lockKeys, Lives: r.lives, Families: r.families(), Ops: w.ops,
			MaxLog: r.opts.MaxChanges,
		})
	} else {
		applied, err = r.redis.Changes.Apply(ctx, protocol.ApplyOptions{
			Op: "apply", Key: r.key, Locks: r.lockKeys, Lives: r.lives, Ops: w.ops, MaxLog: r.opts.MaxChanges,
		})
	}
	if err != nil {
		return err
	}
	for i, l := range applied.Logged {
		if l == protocol.LogFull {
			r.opts.Logger.Warn("keyswap: change applied, but the log of the run in progress is full: that run will fail with ErrFallingBehind",
				"key", r.lives[i], "max_changes", r.opts.MaxChanges)
		}
	}
	return nil
}

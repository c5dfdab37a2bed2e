package rebuild

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/run"
)

// Change is a change to one source item, as the application made it: its
// value before (Old) and after (New). A nil Old is an insert, a nil New a
// delete. [Insert], [Update] and [Delete] build them.
type Change[T any] struct {
	Old, New *T
}

// Insert returns the change that adds v.
func Insert[T any](v T) Change[T] { return Change[T]{New: &v} }

// Update returns the change from old to new.
func Update[T any](old, new T) Change[T] { return Change[T]{Old: &old, New: &new} }

// Delete returns the change that removes v.
func Delete[T any](v T) Change[T] { return Change[T]{Old: &v} }

// Incremental is implemented by builders that can maintain the index they
// build: Diff adds to w the writes that turn the index of old into the
// index of new (a nil old is an insert, a nil new a delete), such as an
// HDEL of the old field and an HSET of the new one. The builders of package
// builders implement it, except Func and Compat.
//
// Diff must write only the builder's own keys, as Build does, and may be
// called from several goroutines at once. For a family bucket whose key has
// the shape of keyswap's own keys, the Writes methods return an error
// matching [ErrReservedKey]: skip that write, as Build skips such entries.
//
// An entry that another item may hold after this one, such as a field of a
// unique index, must be removed conditionally ([Writes.HDelIf],
// [Writes.ZRemIf]): the changes of two items may be applied in either
// order. A builder that is also [Commutative] and merges SADDs (Set,
// SetIndex) keeps each member for one item: a run whose merged SADD adds
// fewer members than it sends fails, naming the key.
type Incremental[T any] interface {
	Diff(w *Writes, old, new *T) error
}

// Writes collects the writes of a change, for [Rebuilder.Apply]. Each
// method writes one live key of the builder whose Diff is called, and
// returns an error for a key the builder does not own.
//
// Only commands that set or remove entries outright, or remove them only
// while they hold what the write names (HDelIf, ZRemIf), are offered, so
// that the last write of an entry decides it whatever came before: that is
// what lets a run replay the changes applied while it ran onto its
// snapshot.
type Writes struct {
	owners  []owner
	cluster bool
	slot    uint16
	builder int
	ops     [][]run.Op // per builder, in order
	skipped func(live string)
}

// HSet sets field to value in the hash key.
func (w *Writes) HSet(key, field, value string) error {
	return w.add("HSET", key, field, value)
}

// HDel removes fields from the hash key.
func (w *Writes) HDel(key string, fields ...string) error {
	return w.add("HDEL", key, fields...)
}

// HDelIf removes field from the hash key only while it holds value: the
// removal of an old item's entry that another item may have taken since
// (an email moving from one user to another), which an HDel would remove
// from under it. It is not a Redis command: Apply, the catch-up and the
// publish run it as a script.
func (w *Writes) HDelIf(key, field, value string) error {
	return w.add("HDELIF", key, field, value)
}

// ZAdd sets member's score in the sorted set key. A NaN score is an error.
func (w *Writes) ZAdd(key string, score float64, member string) error {
	if math.IsNaN(score) {
		return fmt.Errorf("ZADD %q: member %q has a NaN score", key, member)
	}
	return w.add("ZADD", key, strconv.FormatFloat(score, 'g', -1, 64), member)
}

// ZRem removes members from the sorted set key.
func (w *Writes) ZRem(key string, members ...string) error {
	return w.add("ZREM", key, members...)
}

// ZRemIf removes member from the sorted set key only while it has score:
// the removal of an old item's member that another item may have taken
// since. A NaN score is an error. It is not a Redis command: Apply, the
// catch-up and the publish run it as a script.
func (w *Writes) ZRemIf(key string, score float64, member string) error {
	if math.IsNaN(score) {
		return fmt.Errorf("ZREMIF %q: member %q has a NaN score", key, member)
	}
	return w.add("ZREMIF", key, strconv.FormatFloat(score, 'g', -1, 64), member)
}

// SAdd adds members to the set key.
func (w *Writes) SAdd(key string, members ...string) error {
	return w.add("SADD", key, members...)
}

// SRem removes members from the set key.
func (w *Writes) SRem(key string, members ...string) error {
	return w.add("SREM", key, members...)
}

// add records one op of the current builder, after checking that it owns
// key.
func (w *Writes) add(cmd, key string, args ...string) error {
	if len(args) == 0 {
		return nil // nothing to write
	}
	o := w.owners[w.builder]
	if err := o.owns(key, w.cluster, w.slot); err != nil {
		if errors.Is(err, ErrReservedKey) && o.family && w.skipped != nil {
			w.skipped(key)
		}
		return err
	}
	w.ops[w.builder] = append(w.ops[w.builder], run.Op{Cmd: cmd, Key: key, Args: args})
	return nil
}

// Apply applies changes to the live keys of every builder, in one atomic
// round trip: each builder's [Incremental.Diff] turns each change into
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
func (r *Rebuilder[T]) Apply(ctx context.Context, changes ...Change[T]) error {
	w := &Writes{owners: r.owners, cluster: r.redis.Cluster(), ops: make([][]run.Op, len(r.builders))}
	if w.cluster {
		w.slot = keys.Slot(r.owners[0].key)
	}
	w.skipped = func(live string) {
		r.opts.Logger.Warn("keyswap: skipped a change's write to a key with the shape of keyswap's own keys", "key", r.key, "skipped_key", live)
	}
	for b, builder := range r.builders {
		inc, ok := builder.(Incremental[T])
		if !ok {
			return &Error{Op: "apply", Key: builder.Key(), Err: fmt.Errorf("%w (%T)", ErrNotIncremental, builder)}
		}
		w.builder = b
		for i, c := range changes {
			if c.Old == nil && c.New == nil {
				return &Error{Op: "apply", Key: r.key, Err: fmt.Errorf("change %d has neither an old nor a new value", i)}
			}
			if err := inc.Diff(w, c.Old, c.New); err != nil {
				return &Error{Op: "apply", Key: builder.Key(), Err: fmt.Errorf("change %d: %w", i, err)}
			}
		}
	}
	applied, err := r.redis.Apply(ctx, run.ApplyOptions{
		Op: "apply", Key: r.key, Locks: r.lockKeys, Lives: r.lives, Ops: w.ops, MaxLog: r.opts.MaxChanges,
	})
	if err != nil {
		return err
	}
	for i, l := range applied.Logged {
		if l == run.LogFull {
			r.opts.Logger.Warn("keyswap: change applied, but the log of the run in progress is full: that run will fail with ErrFallingBehind",
				"key", r.lives[i], "max_changes", r.opts.MaxChanges)
		}
	}
	return nil
}

package index

import (
	"fmt"
	"math"
	"strconv"

	"github.com/keyswap/keyswap/internal/hook"
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
// order. A builder that is also [AnyOrder] and merges SADDs (Set,
// SetIndex) keeps each member for one item: a run whose merged SADD adds
// fewer members than it sends fails, naming the key.
type Incremental[T any] interface {
	Diff(w *Writes, old, new *T) error
}

// Writes collects the writes of a change, for the runner's Apply (and its
// replay of changes onto a run's temp keys). Each method writes one live
// key of the builder whose Diff is called, and returns an error for a key
// the builder does not own. Only the runner makes one.
//
// Only commands that set or remove entries outright, or remove them only
// while they hold what the write names (HDelIf, ZRemIf), are offered, so
// that the last write of an entry decides it whatever came before: that is
// what lets a run replay the changes applied while it ran onto its
// snapshot.
type Writes struct{ w hook.Writes }

// HSet sets field to value in the hash key.
func (w *Writes) HSet(key, field, value string) error {
	return w.w.Add("HSET", key, field, value)
}

// HDel removes fields from the hash key.
func (w *Writes) HDel(key string, fields ...string) error {
	return w.w.Add("HDEL", key, fields...)
}

// HDelIf removes field from the hash key only while it holds value: the
// removal of an old item's entry that another item may have taken since
// (an email moving from one user to another), which an HDel would remove
// from under it. It is not a Redis command: Apply, the catch-up and the
// publish run it as a script.
func (w *Writes) HDelIf(key, field, value string) error {
	return w.w.Add("HDELIF", key, field, value)
}

// ZAdd sets member's score in the sorted set key. A NaN score is an error.
func (w *Writes) ZAdd(key string, score float64, member string) error {
	if math.IsNaN(score) {
		return fmt.Errorf("ZADD %q: member %q has a NaN score", key, member)
	}
	return w.w.Add("ZADD", key, strconv.FormatFloat(score, 'g', -1, 64), member)
}

// ZRem removes members from the sorted set key.
func (w *Writes) ZRem(key string, members ...string) error {
	return w.w.Add("ZREM", key, members...)
}

// ZRemIf removes member from the sorted set key only while it has score:
// the removal of an old item's member that another item may have taken
// since. A NaN score is an error. It is not a Redis command: Apply, the
// catch-up and the publish run it as a script.
func (w *Writes) ZRemIf(key string, score float64, member string) error {
	if math.IsNaN(score) {
		return fmt.Errorf("ZREMIF %q: member %q has a NaN score", key, member)
	}
	return w.w.Add("ZREMIF", key, strconv.FormatFloat(score, 'g', -1, 64), member)
}

// SAdd adds members to the set key.
func (w *Writes) SAdd(key string, members ...string) error {
	return w.w.Add("SADD", key, members...)
}

// SRem removes members from the set key.
func (w *Writes) SRem(key string, members ...string) error {
	return w.w.Add("SREM", key, members...)
}

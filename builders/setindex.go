package builders

import (
	"errors"

	"github.com/keyswap/keyswap/index"
)

// SetIndex returns a builder of a family of sets, one per value: the
// members of bucket b are in the set "<prefix>:<b>", as in
// users:by-country:fr. fn maps an item to its bucket and member, or ok false
// to skip the item. A SetIndex implements [index.Family] and
// [index.AnyOrder].
//
// A value whose bucket key would have the shape of keyswap's own keys (a
// bucket named "rebuild-lock", or "rebuild:2024") is skipped, counted in
// Stats.Skipped and logged: the rest of the family is rebuilt.
//
// Every bucket is published in the same atomic step, and so is the removal
// of orphans: live sets under "<prefix>:" that this run did not produce. A
// value that moved buckets is only in its new one, and a bucket left without
// members disappears. Readers never see an empty or half-built
// bucket, which Familia's clear-then-refill allowed.
//
// A member belongs to one item within its bucket, such as the item's id:
// Apply removes an item's member from its old bucket when the item moves,
// which would remove it for any other item with the same member in that
// bucket. A run in which two items have the same member in one bucket
// fails, naming the bucket (and the member when it can), before anything is
// published.
//
// The family owns every set whose key starts with "<prefix>:": do not keep
// other sets there. On Redis Cluster the prefix must carry a hash tag, such
// as "{users}:by-country", so that every bucket shares one hash slot.
//
// [SetIndexErr] takes a mapping that can fail.
func SetIndex[T any](prefix string, fn func(T) (bucket, member string, ok bool)) index.Builder[T] {
	return SetIndexErr(prefix, func(it T) (string, string, bool, error) {
		b, m, ok := fn(it)
		return b, m, ok, nil
	})
}

// SetIndexErr is [SetIndex] with a mapping that can fail. An error from fn
// fails the run before anything is published: Run returns a
// *rebuild.Error of Op "build" whose Key is prefix and which wraps the
// error (errors.Is and errors.As reach it), every bucket is left as it was,
// and no temp key or lock is left behind. A non-nil error fails the run
// whatever ok says.
func SetIndexErr[T any](prefix string, fn func(T) (bucket, member string, ok bool, err error)) index.Builder[T] {
	return &setIndex[T]{prefix, fn}
}

type setIndex[T any] struct {
	prefix string
	fn     func(T) (string, string, bool, error)
}

var (
	_ index.Family  = (*setIndex[int])(nil)
	_ index.Ordered = (*setIndex[int])(nil)
	_ index.Ordered = (*set[int])(nil)
	_ index.Ordered = (*hash[int])(nil)
	_ index.Ordered = (*sortedSet[int])(nil)
)

// Key returns the family's prefix.
func (s *setIndex[T]) Key() string { return s.prefix }

// KeyType returns "set": only sets under the prefix can be orphans.
func (s *setIndex[T]) KeyType() string { return "set" }

// Order returns AnyOrder: SADDs give the same sets in any order.
func (s *setIndex[T]) Order() index.Order { return index.AnyOrder }

// Build writes each item's member to its bucket with SADD, merged across
// batches (Commands.MergeBucket), so that a bucket's members go in commands
// as full as Options.MaxMerged allows. It merges item by item: grouping a
// batch by bucket first would cost a map and a slice per bucket per batch.
func (s *setIndex[T]) Build(c *index.Commands, items []T) error {
	for _, it := range items {
		b, m, ok, err := s.fn(it)
		if err != nil {
			return mappingError(err)
		}
		if !ok {
			continue
		}
		err = c.MergeBucket(b, "SADD", m)
		if errors.Is(err, index.ErrReservedKey) {
			continue // counted and logged by the Rebuilder
		}
		if err != nil {
			return err
		}
	}
	return nil
}

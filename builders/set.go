package builders

import (
	"github.com/keyswap/keyswap/index"
)

// Set returns a builder of the set key. fn maps an item to a member, or ok
// false to skip the item. A Set is [index.AnyOrder]. [SetErr]
// takes a mapping that can fail.
//
// A member belongs to one item, such as the item's id: Apply removes an
// item's member when the item changes or goes, which would remove it for
// any other item that has the same member (a set of countries, say, which
// many items share). A run in which two items have the same member fails,
// naming the key (and the member when it can), before anything is
// published.
func Set[T any](key string, fn func(T) (member string, ok bool)) index.Builder[T] {
	return SetErr(key, func(it T) (string, bool, error) {
		m, ok := fn(it)
		return m, ok, nil
	})
}

// SetErr is [Set] with a mapping that can fail. An error from fn fails the
// run before anything is published: Run returns a *rebuild.Error of Op
// "build" whose Key is key and which wraps the error (errors.Is and
// errors.As reach it), the live key is left as it was, and no temp key or
// lock is left behind. A non-nil error fails the run whatever ok says.
func SetErr[T any](key string, fn func(T) (member string, ok bool, err error)) index.Builder[T] {
	return &set[T]{single{key}, fn}
}

type set[T any] struct {
	single
	fn func(T) (string, bool, error)
}

// Order returns AnyOrder: SADDs give the same set in any order.
func (s *set[T]) Order() index.Order { return index.AnyOrder }

// Build writes items with SADD, merged across batches (Commands.Merge),
// item by item: the batch's entries are kept end to end either way.
func (s *set[T]) Build(c *index.Commands, items []T) error {
	for _, it := range items {
		m, ok, err := s.fn(it)
		if err != nil {
			return mappingError(err)
		}
		if !ok {
			continue
		}
		if err := c.Merge(s.key, "SADD", m); err != nil {
			return err
		}
	}
	return nil
}

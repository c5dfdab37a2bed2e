package builders

import "github.com/keyswap/keyswap/rebuild"

// Set returns a builder of the set key. fn maps an item to a member, or ok
// false to skip the item. A Set implements [rebuild.Commutative].
func Set[T any](key string, fn func(T) (member string, ok bool)) rebuild.Builder[T] {
	return &set[T]{single{key}, fn}
}

type set[T any] struct {
	single
	fn func(T) (string, bool)
}

// Commutative reports true: SADDs give the same set in any order.
func (s *set[T]) Commutative() bool { return true }

// Build writes items with SADD, merged across batches (Commands.Merge).
func (s *set[T]) Build(c *rebuild.Commands, items []T) error {
	members := make([]string, 0, len(items))
	for _, it := range items {
		if m, ok := s.fn(it); ok {
			members = append(members, m)
		}
	}
	if len(members) == 0 {
		return nil
	}
	return c.Merge(s.key, "SADD", members...)
}

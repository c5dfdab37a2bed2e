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

// Build writes items with SADD, MaxArgs members per command.
func (s *set[T]) Build(c *rebuild.Commands, items []T) error {
	temp, err := c.Temp(s.key)
	if err != nil {
		return err
	}
	v := newVariadic(c, "SADD", temp, 1)
	for _, it := range items {
		if m, ok := s.fn(it); ok {
			v.add(m, "", false)
		}
	}
	v.flush()
	return nil
}

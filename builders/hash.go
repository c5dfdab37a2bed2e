package builders

import "github.com/keyswap/keyswap/rebuild"

// Hash returns a builder of the hash key: a unique index such as
// users:by-email (email → id). fn maps an item to a field and its value, or
// ok false to skip the item. The last write of a field wins.
// A Hash implements [rebuild.Keyed].
func Hash[T any](key string, fn func(T) (field, value string, ok bool)) rebuild.Builder[T] {
	return &hash[T]{single{key}, fn}
}

type hash[T any] struct {
	single
	fn func(T) (string, string, bool)
}

// Keyed reports true: batches that write no field in common may reach
// Redis in any order.
func (h *hash[T]) Keyed() bool { return true }

// Build writes items with HSET, MaxArgs fields per command, and reports
// each field with Entry.
func (h *hash[T]) Build(c *rebuild.Commands, items []T) error {
	temp, err := c.Temp(h.key)
	if err != nil {
		return err
	}
	v := newVariadic(c, "HSET", temp, 2)
	for _, it := range items {
		if f, val, ok := h.fn(it); ok {
			v.add(f, val, true)
			c.Entry(f)
		}
	}
	v.flush()
	return nil
}

package builders

import "github.com/keyswap/keyswap/rebuild"

// Hash returns a builder of the hash key: a unique index such as
// users:by-email (email → id). fn maps an item to a field and its value, or
// ok false to skip the item (C48). The last write of a field wins (C50).
func Hash[T any](key string, fn func(T) (field, value string, ok bool)) rebuild.Builder[T] {
	return &hash[T]{single{key}, fn}
}

type hash[T any] struct {
	single
	fn func(T) (string, string, bool)
}

// Build writes items with HSET, MaxArgs fields per command.
func (h *hash[T]) Build(c *rebuild.Commands, items []T) error {
	temp, err := c.Temp(h.key)
	if err != nil {
		return err
	}
	v := newVariadic(c, "HSET", temp, 2)
	for _, it := range items {
		if f, val, ok := h.fn(it); ok {
			v.add(f, val, true)
		}
	}
	v.flush()
	return nil
}

package builders

import (
	"github.com/keyswap/keyswap/index"
)

// Hash returns a builder of the hash key: a unique index such as
// users:by-email (email → id). fn maps an item to a field and its value, or
// ok false to skip the item. The last write of a field wins. A field may
// pass from one item to another (an email that moves): Apply removes an
// item's old field only while it still holds that item's value, so the
// changes of the two items may be applied in either order.
// A Hash is [index.ByEntry]. [HashErr] takes a mapping that can
// fail.
func Hash[T any](key string, fn func(T) (field, value string, ok bool)) index.Builder[T] {
	return HashErr(key, func(it T) (string, string, bool, error) {
		f, v, ok := fn(it)
		return f, v, ok, nil
	})
}

// HashErr is [Hash] with a mapping that can fail, such as one that
// JSON-encodes the value. An error from fn fails the run before anything is
// published: Run returns a *rebuild.Error of Op "build" whose Key is key
// and which wraps the error (errors.Is and errors.As reach it), the live
// key is left as it was, and no temp key or lock is left behind. A non-nil
// error fails the run whatever ok says.
func HashErr[T any](key string, fn func(T) (field, value string, ok bool, err error)) index.Builder[T] {
	return &hash[T]{single{key}, fn}
}

type hash[T any] struct {
	single
	fn func(T) (string, string, bool, error)
}

// Order returns ByEntry: batches that write no field in common may reach
// Redis in any order.
func (h *hash[T]) Order() index.Order { return index.ByEntry }

// Build writes items with HSET, index.MaxArgs fields per command, and reports
// each field with Entry.
func (h *hash[T]) Build(c *index.Commands, items []T) error {
	temp, err := c.Temp(h.key)
	if err != nil {
		return err
	}
	v := newVariadic(c, "HSET", temp, 2)
	for _, it := range items {
		f, val, ok, err := h.fn(it)
		if err != nil {
			return mappingError(err)
		}
		if ok {
			v.add(f, val, true)
			c.Entry(f)
		}
	}
	v.flush()
	return nil
}

package builders

import (
	"github.com/keyswap/keyswap/index"
)

// Func returns a builder of key whose Build is build, as http.HandlerFunc
// makes a Handler of a function. Use it for a key type package builders
// does not cover: build gets this run's temp key from c.Temp(key) and adds
// its commands with c.Add.
//
//	hll := builders.Func("visitors", func(c *index.Commands, visits []Visit) error {
//		temp, err := c.Temp("visitors")
//		if err != nil {
//			return err
//		}
//		ids := make([]string, len(visits))
//		for i, v := range visits {
//			ids[i] = v.UserID
//		}
//		c.Add(c.B().Pfadd().Key(temp).Element(ids...).Build(), len(ids))
//		return nil
//	})
func Func[T any](key string, build func(c *index.Commands, items []T) error) index.Builder[T] {
	return &funcBuilder[T]{single{key}, build}
}

type funcBuilder[T any] struct {
	single
	build func(*index.Commands, []T) error
}

// Build calls the function.
func (f *funcBuilder[T]) Build(c *index.Commands, items []T) error { return f.build(c, items) }

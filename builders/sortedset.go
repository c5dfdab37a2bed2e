package builders

import (
	"fmt"
	"math"
	"strconv"

	"github.com/keyswap/keyswap/index"
)

// SortedSet returns a builder of the sorted-set key: a timeline or a
// leaderboard such as users:by-score. fn maps an item to a member and its
// score, or ok false to skip the item. A member's score is whatever fn
// returns, and the last write of a member wins. A NaN score is an
// error: Redis would refuse it. Apply removes an item's old member only
// while it still has that item's score, so a member that passes from one
// item to another survives the changes of both, in either order. A
// SortedSet is [index.ByEntry]. [SortedSetErr] takes a mapping that
// can fail.
func SortedSet[T any](key string, fn func(T) (member string, score float64, ok bool)) index.Builder[T] {
	return SortedSetErr(key, func(it T) (string, float64, bool, error) {
		m, score, ok := fn(it)
		return m, score, ok, nil
	})
}

// SortedSetErr is [SortedSet] with a mapping that can fail. An error from
// fn fails the run before anything is published: Run returns a
// *rebuild.Error of Op "build" whose Key is key and which wraps the error
// (errors.Is and errors.As reach it), the live key is left as it was, and
// no temp key or lock is left behind. A non-nil error fails the run
// whatever ok says.
func SortedSetErr[T any](key string, fn func(T) (member string, score float64, ok bool, err error)) index.Builder[T] {
	return &sortedSet[T]{single{key}, fn}
}

type sortedSet[T any] struct {
	single
	fn func(T) (string, float64, bool, error)
}

// Order returns ByEntry: batches that write no member in common may reach
// Redis in any order.
func (z *sortedSet[T]) Order() index.Order { return index.ByEntry }

// Build writes items with ZADD, index.MaxArgs members per command, and reports
// each member with Entry.
func (z *sortedSet[T]) Build(c *index.Commands, items []T) error {
	temp, err := c.Temp(z.key)
	if err != nil {
		return err
	}
	v := newVariadic(c, "ZADD", temp, 2)
	for _, it := range items {
		m, score, ok, err := z.fn(it)
		if err != nil {
			return mappingError(err)
		}
		if !ok {
			continue
		}
		if math.IsNaN(score) {
			return fmt.Errorf("member %q has score NaN, which a sorted set cannot hold", m)
		}
		v.add(strconv.FormatFloat(score, 'g', -1, 64), m, true)
		c.Entry(m)
	}
	v.flush()
	return nil
}

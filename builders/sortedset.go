package builders

import (
	"fmt"
	"math"
	"strconv"

	"github.com/keyswap/keyswap/rebuild"
)

// SortedSet returns a builder of the sorted-set key: a timeline or a
// leaderboard such as users:by-score. fn maps an item to a member and its
// score, or ok false to skip the item. A member's score is whatever fn
// returns, and the last write of a member wins. A NaN score is an
// error: Redis would refuse it. A SortedSet implements [rebuild.Keyed].
func SortedSet[T any](key string, fn func(T) (member string, score float64, ok bool)) rebuild.Builder[T] {
	return &sortedSet[T]{single{key}, fn}
}

type sortedSet[T any] struct {
	single
	fn func(T) (string, float64, bool)
}

// Keyed reports true: batches that write no member in common may reach
// Redis in any order.
func (z *sortedSet[T]) Keyed() bool { return true }

// Build writes items with ZADD, MaxArgs members per command, and reports
// each member with Entry.
func (z *sortedSet[T]) Build(c *rebuild.Commands, items []T) error {
	temp, err := c.Temp(z.key)
	if err != nil {
		return err
	}
	v := newVariadic(c, "ZADD", temp, 2)
	for _, it := range items {
		m, score, ok := z.fn(it)
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

package builders

import (
	"fmt"
	"strings"

	"github.com/keyswap/keyswap/index"
)

// Blank reports whether s is empty or only whitespace: an index value
// Familia would skip. Use it in a builder function's ok result. Whitespace is
// Unicode's (strings.TrimSpace), a superset of what Ruby's strip removes.
func Blank(s string) bool { return strings.TrimSpace(s) == "" }

// mappingError is the error of a builder whose mapping function returned
// err: the Rebuilder wraps it in a *rebuild.Error that names the builder's
// key.
func mappingError(err error) error { return fmt.Errorf("mapping an item: %w", err) }

// single is the part every one-key builder shares.
type single struct{ key string }

// Key returns the live key the builder rebuilds.
func (s single) Key() string { return s.key }

// variadic accumulates the entries of one variadic command (HSET, ZADD,
// SADD) and adds it to c every index.MaxArgs entries.
type variadic struct {
	c    *index.Commands
	name string // command name
	key  string // temp key
	args []string
	n    int // entries in args
}

func newVariadic(c *index.Commands, name, temp string, perEntry int) *variadic {
	return &variadic{c: c, name: name, key: temp, args: make([]string, 0, perEntry*index.MaxArgs)}
}

// add appends one entry of one or two arguments.
func (v *variadic) add(a, b string, two bool) {
	v.args = append(v.args, a)
	if two {
		v.args = append(v.args, b)
	}
	if v.n++; v.n == index.MaxArgs {
		v.flush()
	}
}

// flush adds the pending command, if any.
func (v *variadic) flush() {
	if v.n == 0 {
		return
	}
	v.c.Add(v.c.B().Arbitrary(v.name).Keys(v.key).Args(v.args...).Build(), v.n)
	v.args, v.n = v.args[:0], 0
}

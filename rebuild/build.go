package rebuild

import (
	"fmt"
	"runtime/debug"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/hook"
)

// build turns b's items into commands through every builder. A panic in a
// builder becomes a *PanicError, which Run re-panics after cleaning up; a
// runtime.Goexit becomes errGoexit, after which Run calls runtime.Goexit
// itself once it has cleaned up. (The double defer is singleflight's: a
// recover in the inner one tells a panic from a Goexit, which recover does
// not see.)
func (x *execution[T]) build(b *batch, items []T) {
	returned := false
	defer func() {
		if !returned && b.err == nil {
			b.err = errGoexit
		}
		close(b.built)
	}()
	defer func() {
		if p := recover(); p != nil {
			b.err = &PanicError{Value: p, Stack: debug.Stack()}
		}
	}()
	x.buildBatch(b, items)
	returned = true
}

// buildBatch is build without the handling of panics and Goexit.
func (x *execution[T]) buildBatch(b *batch, items []T) {
	r := x.r
	c := newCommands(r.redis.Client().B(), x.targets, len(r.builders))
	c.hint = len(items)
	ic := hook.NewCommands(c).(*index.Commands)
	for i, bl := range r.builders {
		c.builder = i
		err := bl.Build(ic, items)
		if err == nil {
			err = c.err
		}
		if err != nil {
			b.err = &Error{Op: "build", Key: bl.Key(), Err: err}
			return
		}
	}
	if x.targets.cluster {
		for _, cmd := range c.cmds {
			if cmd.Slot() != x.targets.slot {
				b.err = &Error{Op: "build", Key: r.key, Err: fmt.Errorf("a builder's command %q is outside the rebuild's hash slot %d; builders must write only to keys from Commands.Temp", cmd.Commands()[0], x.targets.slot)}
				return
			}
		}
	}
	c.sortEntries()
	b.c = c
}

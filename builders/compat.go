package builders

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidiscompat"
)

// Compat returns a builder of key written against the go-redis-style API of
// rueidiscompat, for code that already builds its index that way. fn queues
// commands on p for a batch of items, addressed to temp, this run's temp
// key; nothing is sent until the Rebuilder sends the batch, and the replies
// of p's commands are never filled in.
//
//	emails := builders.Compat("users:by-email", func(ctx context.Context, p rueidiscompat.Pipeliner, temp string, users []User) error {
//		for _, u := range users {
//			p.HSet(ctx, temp, u.Email, u.ID)
//		}
//		return nil
//	})
//
// The builder is bound to temp: every command fn queues must have temp as
// its first key, and commands that write a key other than their first one
// (SMOVE, COPY, RENAME, LMOVE, SORT, DEL, MSET, scripts, ...) are refused.
// Either fails the rebuild with an error naming the command. Stats count
// one entry per queued command.
func Compat[T any](key string, fn func(ctx context.Context, p rueidiscompat.Pipeliner, temp string, items []T) error) rebuild.Builder[T] {
	return &compat[T]{single{key}, fn}
}

type compat[T any] struct {
	single
	fn func(context.Context, rueidiscompat.Pipeliner, string, []T) error
}

// Build runs fn on a pipeline that captures its commands instead of sending
// them, checks that they write only to temp, and adds them to c.
func (b *compat[T]) Build(c *rebuild.Commands, items []T) error {
	temp, err := c.Temp(b.key)
	if err != nil {
		return err
	}
	sink := &capture{cb: c.B()}
	if err := b.queue(sink, temp, items); err != nil {
		return err
	}
	for _, cmd := range sink.cmds {
		args := cmd.Commands()
		name := strings.ToUpper(args[0])
		switch {
		case len(args) < 2 || args[1] != temp:
			return fmt.Errorf("compat builder %q queued %s on a key other than its temp key %q", b.key, name, temp)
		case writesOtherKeys[name]:
			return fmt.Errorf("compat builder %q queued %s, which can write keys other than its temp key", b.key, name)
		}
		c.Add(cmd, 1)
	}
	return nil
}

// queue runs fn on a pipeline over sink and hands its commands to sink.
//
// A standalone or sentinel client's command builder never looks at slots.
// A cluster client's builder panics on a command whose keys span several
// hash slots; fn, not keyswap, calls the methods that build the commands,
// so such a command cannot be refused before it is built. The panic is a
// refusal, reported as an error, only when its value is the very value this
// builder panics with for keys of two slots (asked of it before fn runs):
// any other panic of fn is passed on, to fail the run as a builder's panic.
func (b *compat[T]) queue(sink *capture, temp string, items []T) (err error) {
	if crossSlot := crossSlotPanic(sink.cb); crossSlot != nil {
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if p != crossSlot {
				panic(p)
			}
			err = fmt.Errorf("compat builder %q queued %s on keys outside its temp key's hash slot: %v", b.key, compatCommand(), p)
		}()
	}
	p := rueidiscompat.NewAdapter(sink).Pipeline()
	ctx := context.Background() // the pipeline only queues; nothing is sent
	if err := b.fn(ctx, p, temp, items); err != nil {
		return err
	}
	if _, err := p.Exec(ctx); err != nil && !errors.Is(err, errCaptured) {
		return err
	}
	return nil
}

// slotPair is two keys of different hash slots.
var slotPair = func() [2]string {
	for i := 1; ; i++ {
		k := fmt.Sprintf("k%d", i)
		if keys.Slot(k) != keys.Slot("k0") {
			return [2]string{"k0", k}
		}
	}
}()

// crossSlotPanic returns what cb panics with when a command's keys span
// two hash slots, or nil when cb does not check slots (it is not a
// cluster client's). A value that cannot be compared is never matched, so
// nil is returned for it too: such a panic then fails the run as a
// builder's panic.
func crossSlotPanic(cb rueidis.Builder) (p any) {
	defer func() {
		if p = recover(); p != nil && !reflect.TypeOf(p).Comparable() {
			p = nil
		}
	}()
	cb.Arbitrary("SUNIONSTORE").Keys(slotPair[0], slotPair[1])
	return nil
}

// compatCommand names the rueidiscompat method being run, as a Redis
// command, from the stack of the panic being recovered ("a command" when
// none is on it): the panic value does not name it.
func compatCommand() string {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		for _, typ := range []string{"(*Compat).", "(*Pipeline)."} {
			if m, ok := strings.CutPrefix(f.Function, "github.com/redis/rueidis/rueidiscompat."+typ); ok {
				if m, _, _ = strings.Cut(m, "."); m != "" {
					return strings.ToUpper(m)
				}
			}
		}
		if !more {
			return "a command"
		}
	}
}

// writesOtherKeys lists commands whose first argument is a key but which
// can write another key too, or which take a key count first.
var writesOtherKeys = map[string]bool{
	"SMOVE": true, "COPY": true, "RENAME": true, "RENAMENX": true, "MOVE": true, "MIGRATE": true,
	"LMOVE": true, "BLMOVE": true, "RPOPLPUSH": true, "BRPOPLPUSH": true,
	"SORT": true, "GEORADIUS": true, "GEORADIUSBYMEMBER": true,
	"DEL": true, "UNLINK": true, "MSET": true, "MSETNX": true, "TOUCH": true,
	"EVAL": true, "EVALSHA": true, "EVAL_RO": true, "EVALSHA_RO": true, "FCALL": true, "FCALL_RO": true,
	"LMPOP": true, "BLMPOP": true, "ZMPOP": true, "BZMPOP": true,
	"MULTI": true, "EXEC": true, "WATCH": true, "SELECT": true, "SWAPDB": true, "FLUSHDB": true, "FLUSHALL": true,
}

// errCaptured is the result capture gives every command: the commands are
// kept for the Rebuilder to send, not executed.
var errCaptured = errors.New("keyswap: command captured by a Compat builder, not executed")

// capture is the rueidis.Client under the rueidiscompat pipeline: it builds
// commands with the run's command builder and keeps what the pipeline's Exec
// would send. Only B and DoMulti are called by rueidiscompat's Pipeline.
type capture struct {
	rueidis.Client // nil: any other method panics, which would be a bug
	cb             rueidis.Builder
	cmds           []rueidis.Completed
}

func (c *capture) B() rueidis.Builder { return c.cb }

func (c *capture) DoMulti(_ context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	c.cmds = append(c.cmds, cmds...)
	out := make([]rueidis.RedisResult, len(cmds))
	for i := range out {
		out[i] = rueidis.NewErrorResult(errCaptured)
	}
	return out
}

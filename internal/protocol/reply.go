package protocol

import (
	"fmt"

	"github.com/keyswap/keyswap/internal/keys"

	"github.com/redis/rueidis"
)

// reply is a script's array reply: a code, then integers or strings.
type reply []rueidis.RedisMessage

// parseReply reads a script's array reply.
func parseReply(res rueidis.RedisResult) (reply, error) {
	return res.ToArray()
}

// code returns the reply's first element.
func (r reply) code() (int64, error) {
	if len(r) == 0 {
		return 0, fmt.Errorf("empty script reply")
	}
	return r[0].AsInt64()
}

// int returns element i as an integer.
func (r reply) int(i int) (int64, error) {
	if i >= len(r) {
		return 0, fmt.Errorf("script reply %v has no element %d", r, i)
	}
	return r[i].AsInt64()
}

// str returns element i as a string.
func (r reply) str(i int) string {
	if i >= len(r) {
		return ""
	}
	s, _ := r[i].ToString()
	return s
}

// ints returns elements from..len(r) as integers.
func (r reply) ints(from int) ([]int64, error) {
	out := make([]int64, 0, max(0, len(r)-from))
	for i := from; i < len(r); i++ {
		n, err := r[i].AsInt64()
		if err != nil {
			return nil, fmt.Errorf("script reply element %d: %w", i, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// refusal turns the {NO_RIGHT, cmd, key} and {UNKNOWN_CMD, cmd} replies into an error
// matching ErrNoPermission that names the command, or returns nil.
func (r reply) refusal() error {
	code, err := r.code()
	if err != nil {
		return nil
	}
	switch code {
	case codeNoRight:
		return fmt.Errorf("%w: this Redis user may not run %s on %q (grant it in the user's ACL rules)", ErrNoPermission, r.str(1), r.str(2))
	case codeUnknownCmd:
		return fmt.Errorf("%w: the server has no command %s (renamed or disabled with rename-command?)", ErrNoPermission, r.str(1))
	}
	return nil
}

// refusals decodes the codes a script refuses a call with: for each code,
// how many things of the call (of its options O) the reply's index, its
// second element, may name, and the error. Each script keeps its table
// next to the call that sends it, built once and only read after.
type refusals[O any] map[int64]refused[O]

// refused decodes one refusing code.
type refused[O any] struct {
	// names returns how many things of o the index may name: the reply
	// names the i-th, 1-based. Nil for a code without an index.
	names func(o O) int
	// err is the error of the reply, whose index is i (0 when it has
	// none).
	err func(o O, res reply, i int64) error
}

// decode returns the error of res, whose first element is code, or nil
// when the table has no such code or its index is out of range: a reply
// the script does not send. No err of a table returns nil.
func (t refusals[O]) decode(o O, code int64, res reply) error {
	d, ok := t[code]
	if !ok {
		return nil
	}
	i, _ := res.int(1)
	if d.names != nil && !names(i, d.names(o)) {
		return nil
	}
	return d.err(o, res, i)
}

// names reports whether the 1-based index i names one of n things.
func names(i int64, n int) bool { return i >= 1 && i <= int64(n) }

// fence is what the checks of scripts/lib/fence.lua, which publish.lua
// and flip.lua share, fence a call with: the run's locks, each with its
// record, the batches it wrote, and its logs of changes.
type fence struct {
	locks   []*Lock
	batches int64
	logs    []LogOffset
}

// withFence adds to t the codes of lib/fence.lua: WRITES_LOST, NO_RECORD,
// TAMPERED, ABORTED, LOG_LOST and UNCOUNTED, decoded against of(o).
// aborted says, after "the operator's cancel came before the ", what was
// refused and what it left unchanged.
func withFence[O any](t refusals[O], of func(o O) fence, aborted string) refusals[O] {
	locks := func(o O) int { return len(of(o).locks) }
	record := func(code int64) refused[O] {
		return refused[O]{locks, func(o O, _ reply, i int64) error {
			return recordError(code, keys.RecordKey(of(o).locks[i-1].Key))
		}}
	}
	logs := func(o O) int { return len(of(o).logs) }
	lost := refused[O]{logs, func(o O, res reply, i int64) error { return logFailure(of(o).logs[i-1], res) }}
	t[codeWritesLost] = refused[O]{nil, func(o O, _ reply, i int64) error { return writesLost(i, of(o).batches) }}
	t[codeNoRecord], t[codeTampered] = record(codeNoRecord), record(codeTampered)
	t[codeAborted] = refused[O]{nil, func(O, reply, int64) error {
		return fmt.Errorf("%w: the operator's cancel came before the %s", ErrAborted, aborted)
	}}
	t[codeLogLost], t[codeUncounted] = lost, lost
	return t
}

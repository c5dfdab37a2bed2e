package run

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/keyswap/keyswap/internal/keys"
)

// Op is one write of a change: a command on one live key. Every op sets or
// removes entries outright, so the last op on an entry decides it whatever
// came before, and replaying a log of ops onto a snapshot gives the same
// entries as applying them live.
type Op struct {
	Cmd  string
	Key  string
	Args []string
}

// OpTypes maps each command an [Op] may run to the type of key it writes.
var OpTypes = map[string]string{
	"HSET": "hash", "HDEL": "hash",
	"ZADD": "zset", "ZREM": "zset",
	"SADD": "set", "SREM": "set",
}

// Removes reports whether op removes entries, so that it may leave its key
// empty, which Redis then deletes.
func (op Op) Removes() bool {
	switch op.Cmd {
	case "HDEL", "ZREM", "SREM":
		return true
	}
	return false
}

// check validates op's shape.
func (op Op) check() error {
	if _, ok := OpTypes[op.Cmd]; !ok {
		return fmt.Errorf("a change cannot run %q: only HSET, HDEL, ZADD, ZREM, SADD and SREM", op.Cmd)
	}
	if op.Key == "" {
		return fmt.Errorf("%s with an empty key", op.Cmd)
	}
	n := len(op.Args)
	if n == 0 || (op.Cmd == "HSET" || op.Cmd == "ZADD") && n%2 != 0 {
		return fmt.Errorf("%s %q with %d arguments", op.Cmd, op.Key, n)
	}
	if op.Cmd == "ZADD" {
		for i := 0; i < n; i += 2 {
			if !validScore(op.Args[i]) {
				return fmt.Errorf("ZADD %q with the score %q", op.Key, op.Args[i])
			}
		}
	}
	return nil
}

// validScore reports whether s is a score as strconv.FormatFloat(v, 'g',
// -1, 64) writes it for a v that is not NaN, which ZADD takes: +Inf, -Inf,
// or a decimal number, with an exponent or not, that is finite and does not
// round to zero unless it is zero. The publish script's decoder
// (lib/changes.lua, score) checks the same, so that it refuses, before any
// write, what ZADD would refuse after the renames.
func validScore(s string) bool {
	if s == "+Inf" || s == "-Inf" {
		return true
	}
	mant, exp, hasExp := strings.Cut(s, "e")
	if hasExp && (len(exp) < 2 || exp[0] != '+' && exp[0] != '-' || !digits(exp[1:])) {
		return false
	}
	whole, frac, dot := strings.Cut(strings.TrimPrefix(mant, "-"), ".")
	if !digits(whole) || dot && !digits(frac) {
		return false
	}
	v, err := strconv.ParseFloat(s, 64)
	return err == nil && !math.IsInf(v, 0) && (v != 0 || !strings.ContainsAny(mant, "123456789"))
}

// digits reports whether s is one or more decimal digits.
func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// count returns s as a count, as EncodeEntry writes it: digits without
// leading zeros.
func count(s string) (int, bool) {
	if !digits(s) || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// Overrun is the log entry that marks a log that reached its bound: the
// changes after it were not logged.
const Overrun = "!overrun"

// EncodeEntry returns ops as one log entry, as the apply script writes it:
// netstrings "<len>:<bytes>" of each op's command, key, argument count and
// arguments.
func EncodeEntry(ops []Op) string {
	var b strings.Builder
	put := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	for _, op := range ops {
		put(op.Cmd)
		put(op.Key)
		put(strconv.Itoa(len(op.Args)))
		for _, a := range op.Args {
			put(a)
		}
	}
	return b.String()
}

// DecodeEntry returns the ops of a log entry. It fails on [Overrun], with
// an error matching [ErrFallingBehind], and on anything the apply script
// does not write. It refuses what the publish script's decoder
// (lib/changes.lua) refuses.
func DecodeEntry(e string) ([]Op, error) {
	if e == Overrun {
		return nil, ErrFallingBehind
	}
	var ops []Op
	take := func() (string, bool) {
		colon := strings.IndexByte(e, ':')
		if colon < 1 {
			return "", false
		}
		n, ok := count(e[:colon])
		if !ok || n > len(e)-colon-1 {
			return "", false
		}
		s := e[colon+1 : colon+1+n]
		e = e[colon+1+n:]
		return s, true
	}
	bad := errors.New("a log entry that is not a change")
	for e != "" {
		cmd, ok1 := take()
		key, ok2 := take()
		c, ok3 := take()
		n, ok4 := count(c)
		if !ok1 || !ok2 || !ok3 || !ok4 || n > len(e) {
			return nil, bad
		}
		op := Op{Cmd: cmd, Key: key, Args: make([]string, n)}
		for i := range op.Args {
			var ok bool
			if op.Args[i], ok = take(); !ok {
				return nil, bad
			}
		}
		if op.check() != nil {
			return nil, bad
		}
		ops = append(ops, op)
	}
	return ops, nil
}

// ApplyOptions configures [Redis.Apply].
type ApplyOptions struct {
	// Op and Key name the operation in errors.
	Op, Key string
	// Locks are the lock keys of the builders the change writes, and Ops
	// the ops on each one's keys, in order: Ops[i] are logged for the run
	// holding Locks[i], if any.
	Locks []string
	Ops   [][]Op
	// MaxLog is the most entries a run's log may hold; a change past it is
	// applied but not logged, and the run fails with ErrFallingBehind.
	MaxLog int
}

// Applied is what [Redis.Apply] did.
type Applied struct {
	// Logged reports, per lock, whether the change was logged for a run in
	// progress: LogNone, Logged or LogFull.
	Logged []int
}

// What Apply did with a change for the run holding a lock.
const (
	LogNone = 0 // no run in progress holds the lock
	Logged  = 1 // logged: the run replays it before it publishes
	LogFull = 2 // the run's log is full: the run fails with ErrFallingBehind
)

// Apply applies ops to the live keys and logs them for the runs in
// progress on those keys, in one atomic script (apply.lua): every right
// and key type is checked first, so that the change is applied whole or
// not at all. On a cluster every key must share one slot.
//
// A lost reply leaves the outcome unknown (an error matching
// [ErrOutcomeUnknown]); the script is not retried, as a rerun would log the
// change twice. Applying the same change again is safe: ops set or remove
// entries outright.
func (r *Redis) Apply(ctx context.Context, opts ApplyOptions) (Applied, error) {
	op, key := opts.Op, opts.Key
	fail := func(err error) (Applied, error) { return Applied{}, &Error{Op: op, Key: key, Err: err} }
	if len(opts.Locks) != len(opts.Ops) || opts.MaxLog < 1 {
		return fail(fmt.Errorf("%d locks for %d lists of ops, log bound %d", len(opts.Locks), len(opts.Ops), opts.MaxLog))
	}
	var locks []string
	var lists [][]Op
	for i, l := range opts.Locks {
		if len(opts.Ops[i]) > 0 {
			locks, lists = append(locks, l), append(lists, opts.Ops[i])
		}
	}
	if len(locks) == 0 {
		return Applied{Logged: make([]int, len(opts.Locks))}, nil
	}
	n := len(locks)
	ks := make([]string, 3*n, 3*n+len(lists))
	for i, l := range locks {
		ks[i], ks[n+i], ks[2*n+i] = l, keys.RecordKey(l), keys.LogKey(l)
	}
	index := map[string]int{}
	args := []string{strconv.Itoa(n), strconv.Itoa(opts.MaxLog), ""}
	count := 0
	for i, ops := range lists {
		for _, o := range ops {
			if err := o.check(); err != nil {
				return fail(err)
			}
			k, ok := index[o.Key]
			if !ok {
				ks = append(ks, o.Key)
				k = len(ks) - 3*n
				index[o.Key] = k
			}
			args = append(args, strconv.Itoa(i+1), strconv.Itoa(k), o.Cmd, strconv.Itoa(len(o.Args)))
			args = append(args, o.Args...)
			count++
		}
	}
	args[2] = strconv.Itoa(count)
	if dup := FirstDuplicate(ks); dup != "" {
		return fail(fmt.Errorf("key %q is both a live key and one of keyswap's own", dup))
	}
	if err := r.SameSlot(op, key, ks...); err != nil {
		return Applied{}, err
	}
	res, err := parseReply(applyScript.Exec(ctx, r.client, ks, args))
	if err != nil {
		if IsServerReply(err) {
			return Applied{}, Fail(ctx, op, key, err)
		}
		return Applied{}, Fail(ctx, op, key, fmt.Errorf("%w: the change may or may not be applied; apply it again before any later change to the same items: %w", ErrOutcomeUnknown, err))
	}
	if err := res.refusal(); err != nil {
		return fail(err)
	}
	code, err := res.code()
	if err != nil {
		return fail(fmt.Errorf("unexpected apply script reply: %w", err))
	}
	switch {
	case code == codeWrongType:
		return fail(fmt.Errorf("%q holds a %s, which this change cannot write; nothing applied", res.str(1), res.str(2)))
	case code != codeOK || len(res) != 1+n:
		return fail(fmt.Errorf("unexpected apply script reply %v", res))
	}
	got, err := res.ints(1)
	if err != nil {
		return fail(err)
	}
	out := Applied{Logged: make([]int, len(opts.Locks))}
	j := 0
	for i := range opts.Locks {
		if len(opts.Ops[i]) > 0 {
			out.Logged[i] = int(got[j])
			j++
		}
	}
	return out, nil
}

// LogOffset is one log of changes of a publish and how many of its entries
// the run replayed itself.
type LogOffset struct {
	Key    string
	Offset int64
}

// BehindError reports a publish refused because the logs' tails held more
// than the bound: the run catches up again, then retries.
type BehindError struct {
	Log  string // the first log with a tail
	Tail int64  // entries past the offsets, over every log
}

func (e *BehindError) Error() string {
	return fmt.Sprintf("%d changes logged since the last catch-up (first in %s), more than a publish replays", e.Tail, e.Log)
}

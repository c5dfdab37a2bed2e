package protocol

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// Op is one write of a change: a command on one live key. Every op sets or
// removes entries outright, or removes them only while they hold what the op
// names (HDELIF, ZREMIF), so the last op on an entry decides it whatever
// came before, and replaying a log of ops onto a snapshot gives the same
// entries as applying them live.
type Op struct {
	Cmd  string
	Key  string
	Args []string
}

// opTypes maps each command an [Op] may run to the type of key it writes.
// HDELIF and ZREMIF are keyswap's own (scripts/lib/remove.lua): "HDELIF key
// field value ..." removes each field only while it holds value, "ZREMIF
// key score member ..." each member only while it has score.
var opTypes = map[string]string{
	"HSET": "hash", "HDEL": "hash", "HDELIF": "hash",
	"ZADD": "zset", "ZREM": "zset", "ZREMIF": "zset",
	"SADD": "set", "SREM": "set",
}

// Removes reports whether op removes entries, so that it may leave its key
// empty, which Redis then deletes.
func (op Op) Removes() bool {
	switch op.Cmd {
	case "HDEL", "HDELIF", "ZREM", "ZREMIF", "SREM":
		return true
	}
	return false
}

// Conditional reports whether op is a conditional removal, which runs in a
// script (lib/remove.lua) rather than as a Redis command.
func (op Op) Conditional() bool { return op.Cmd == "HDELIF" || op.Cmd == "ZREMIF" }

// Work returns the work of op: the op and each of its arguments count one.
// The publish bounds the work of the changes it replays.
func (op Op) Work() int64 { return 1 + int64(len(op.Args)) }

// ReplayCommand returns ops, checked, as one command that replays them, in
// order, op i on temps[at[i]] instead of its live key (scripts/replay.lua):
// a catch-up's transaction sends one per BatchSize ops, so that a
// conditional removal runs in its place among the others. It goes as EVAL,
// not EVALSHA: a NOSCRIPT inside EXEC would leave the rest of the
// transaction applied.
func ReplayCommand(cb rueidis.Builder, temps []string, ops []Op, at []int) rueidis.Completed {
	args := make([]string, 0, 5*len(ops))
	for i, op := range ops {
		args = append(args, strconv.Itoa(at[i]+1), op.Cmd, strconv.Itoa(len(op.Args)))
		args = append(args, op.Args...)
	}
	return cb.Eval().Script(replaySource).Numkeys(int64(len(temps))).Key(temps...).Arg(args...).Build()
}

var replaySource = Source("replay")

// ReplayScriptWork bounds the work (ops and arguments) of one replay
// script that ReplayCommands sends: a conditional removal runs one or two
// commands per pair inside the script, so about this much work keeps one
// call well under a millisecond of the server's time.
const ReplayScriptWork = 256

// ReplayCommands appends to cmds the commands that replay ops, checked,
// all on the same live key, in order, onto temp instead.
//
// When none of them is a conditional removal and all are of one type of
// key, only the last op on each entry (field or member) counts, as every
// op sets or removes its entries outright: they go as at most two
// commands, one that removes the entries whose last op removes them
// (HDEL, ZREM, SREM) and one that sets the others to what their last op
// gives them (HSET, ZADD, SADD). Otherwise each run of one plain command
// goes as one command with the arguments of all of them, in order, and
// each run of conditional removals (HDELIF, ZREMIF) in replay scripts
// (ReplayCommand) of at most ReplayScriptWork ops and arguments each,
// unless one op has more.
func ReplayCommands(cb rueidis.Builder, cmds rueidis.Commands, temp string, ops []Op) rueidis.Commands {
	if set, del, ok := netOps(ops); ok {
		if len(del.Args) > 0 {
			cmds = append(cmds, cb.Arbitrary(del.Cmd).Keys(temp).Args(del.Args...).Build())
		}
		if len(set.Args) > 0 {
			cmds = append(cmds, cb.Arbitrary(set.Cmd).Keys(temp).Args(set.Args...).Build())
		}
		return cmds
	}
	temps := []string{temp}
	for len(ops) > 0 {
		n, work := 1, ops[0].Work()
		if ops[0].Conditional() {
			for n < len(ops) && ops[n].Conditional() && work+ops[n].Work() <= ReplayScriptWork {
				work += ops[n].Work()
				n++
			}
			cmds = append(cmds, ReplayCommand(cb, temps, ops[:n], make([]int, n)))
			ops = ops[n:]
			continue
		}
		for n < len(ops) && ops[n].Cmd == ops[0].Cmd {
			work += ops[n].Work()
			n++
		}
		args := make([]string, 0, work-int64(n))
		for _, op := range ops[:n] {
			args = append(args, op.Args...)
		}
		cmds = append(cmds, cb.Arbitrary(ops[0].Cmd).Keys(temp).Args(args...).Build())
		ops = ops[n:]
	}
	return cmds
}

// The commands that set and that remove the entries of each type of key.
var (
	setCmd = map[string]string{"hash": "HSET", "zset": "ZADD", "set": "SADD"}
	delCmd = map[string]string{"hash": "HDEL", "zset": "ZREM", "set": "SREM"}
)

// netOps returns what ops, on one key, leave: set, the entries whose last
// op sets them, with what it sets, and del, those whose last op removes
// them, each as one op without a key. It returns false when an op is a
// conditional removal, or ops write more than one type of key.
func netOps(ops []Op) (set, del Op, ok bool) {
	kind := opTypes[ops[0].Cmd]
	step := 2 // field value, score member
	if kind == "set" {
		step = 1
	}
	// The entries in the order first written, each with the args of its
	// last op (a removal's: the entry alone).
	type entry struct {
		args   []string
		remove bool
	}
	var entries []entry
	last := make(map[string]int, len(ops))
	sets, dels := 0, 0
	for _, op := range ops {
		if op.Conditional() || opTypes[op.Cmd] != kind {
			return set, del, false
		}
		n, remove := step, op.Removes()
		if remove {
			n = 1
		}
		for j := 0; j+n <= len(op.Args); j += n {
			e := op.Args[j]
			if kind == "zset" && !remove {
				e = op.Args[j+1] // score, member
			}
			if i, seen := last[e]; seen {
				entries[i] = entry{op.Args[j : j+n], remove}
				continue
			}
			last[e] = len(entries)
			entries = append(entries, entry{op.Args[j : j+n], remove})
		}
		if remove {
			dels += len(op.Args)
		} else {
			sets += len(op.Args)
		}
	}
	set = Op{Cmd: setCmd[kind], Args: make([]string, 0, sets)}
	del = Op{Cmd: delCmd[kind], Args: make([]string, 0, dels)}
	for _, e := range entries {
		if e.remove {
			del.Args = append(del.Args, e.args...)
		} else {
			set.Args = append(set.Args, e.args...)
		}
	}
	return set, del, true
}

// ReadLogCommands returns the catch-up's read of log, the log of changes
// of the lock whose record is record, for the caller's own DoMulti, in this
// order: a script (scripts/readlog.lua) that reads the log's length and the
// record's counts and token in one atomic step, then an LRANGE of the
// entries from start to stop. Both only read, so rueidis may send them
// again on a new connection when a reply is lost; the script goes as EVAL,
// which needs no script cache. The entries are not read inside the script:
// a script that returns thousands of them costs the server several times
// what LRANGE does. Read their replies with ReadLogReply.
func ReadLogCommands(cb rueidis.Builder, log, record string, start, stop int64) (script, lrange rueidis.Completed) {
	return cb.Eval().Script(readLogSource).Numkeys(2).Key(log, record).Build().ToRetryable(),
		cb.Lrange().Key(log).Start(start).Stop(stop).Build()
}

var readLogSource = Source("readlog")

// ReadLogReply reads the replies of ReadLogCommands read from start: the
// entries, the log's count (its length, and what Apply counted), the work
// Apply counted, and the record's token ("" when the record has none).
// Only the entries below the length the script read are returned: a log
// only grows, so they are the entries it counted, and any appended
// between the script and the LRANGE wait for the next read, and its count.
func ReadLogReply(script, lrange rueidis.RedisResult, start int64) (entries []string, c LogCount, work int64, token string, err error) {
	arr, err := script.ToArray()
	if err != nil {
		return nil, c, 0, "", err
	}
	if len(arr) != 2 {
		return nil, c, 0, "", fmt.Errorf("unexpected readlog script reply %v", arr)
	}
	if entries, err = lrange.AsStrSlice(); err != nil {
		return nil, c, 0, "", fmt.Errorf("LRANGE: %w", err)
	}
	if c.Len, err = arr[0].AsInt64(); err != nil {
		return nil, c, 0, "", err
	}
	entries = entries[:max(0, min(int64(len(entries)), c.Len-start))]
	fields, err := arr[1].ToArray()
	if err != nil || len(fields) != 3 {
		return nil, c, 0, "", fmt.Errorf("unexpected readlog script reply %v", arr)
	}
	for i, dst := range []*int64{&c.Logged, &work} {
		if fields[i].IsNil() {
			continue
		}
		s, err := fields[i].ToString()
		if err == nil {
			*dst, err = strconv.ParseInt(s, 10, 64)
		}
		if err != nil {
			return nil, c, 0, "", fmt.Errorf("the record's %s: %q: %w", []string{FieldLogged, FieldWork}[i], s, err)
		}
	}
	if !fields[2].IsNil() {
		token, _ = fields[2].ToString()
	}
	return entries, c, work, token, nil
}

// check validates op's shape.
func (op Op) check() error {
	if _, ok := opTypes[op.Cmd]; !ok {
		return fmt.Errorf("a change cannot run %q: only HSET, HDEL, HDELIF, ZADD, ZREM, ZREMIF, SADD and SREM", op.Cmd)
	}
	if op.Key == "" {
		return fmt.Errorf("%s with an empty key", op.Cmd)
	}
	n := len(op.Args)
	paired := op.Cmd == "HSET" || op.Cmd == "HDELIF" || op.Cmd == "ZADD" || op.Cmd == "ZREMIF"
	if n == 0 || paired && n%2 != 0 {
		return fmt.Errorf("%s %q with %d arguments", op.Cmd, op.Key, n)
	}
	if op.Cmd == "ZADD" || op.Cmd == "ZREMIF" {
		for i := 0; i < n; i += 2 {
			if !validScore(op.Args[i]) {
				return fmt.Errorf("%s %q with the score %q", op.Cmd, op.Key, op.Args[i])
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
// does not write, with an error saying what. It refuses what the publish
// script's decoder (lib/changes.lua) refuses.
func DecodeEntry(e string) ([]Op, error) {
	ops, _, err := AppendEntry(nil, nil, e)
	if err != nil {
		return nil, err
	}
	return ops, nil
}

// AppendEntry is DecodeEntry appending the ops of e to ops, and their
// arguments to args, which the ops' Args share: a caller that decodes many
// entries allocates a few large slices rather than one per op. Appending
// more to args later leaves the ops' Args as they are. On an error, what
// it appended before it is not to be used: the entry is not a change.
func AppendEntry(ops []Op, args []string, e string) ([]Op, []string, error) {
	if e == Overrun {
		return ops, args, ErrFallingBehind
	}
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
	for e != "" {
		cmd, ok1 := take()
		key, ok2 := take()
		c, ok3 := take()
		n, ok4 := count(c)
		if !ok1 || !ok2 || !ok3 || !ok4 || n > len(e) {
			return ops, args, errNotEncoded
		}
		if _, ok := opTypes[cmd]; !ok {
			return ops, args, fmt.Errorf("its command %q is not one a builder writes", cmd)
		}
		from := len(args)
		for range n {
			a, ok := take()
			if !ok {
				return ops, args, errNotEncoded
			}
			args = append(args, a)
		}
		op := Op{Cmd: cmd, Key: key, Args: args[from:len(args):len(args)]}
		if err := op.check(); err != nil {
			return ops, args, fmt.Errorf("its %w", err)
		}
		ops = append(ops, op)
	}
	return ops, args, nil
}

// errNotEncoded says why an entry is not a change.
var errNotEncoded = errors.New("it is not a change as keyswap encodes one")

// ApplyOptions configures [Changes.Apply].
type ApplyOptions struct {
	// Op and Key name the operation in errors.
	Op, Key string
	// Locks are the lock keys of the builders the change writes, Lives
	// their live keys (for errors and owner stamps), and Ops the ops on
	// each one's keys, in order: Ops[i] are logged for the run holding
	// Locks[i], if any.
	Locks []string
	Lives []string
	Ops   [][]Op
	// MaxLog is the most entries a run's log may hold; a change past it is
	// applied but not logged, and the run fails with ErrFallingBehind.
	MaxLog int
}

// Applied is what [Changes.Apply] did.
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
// While a lock is held, the change is logged for the run holding it, or
// refused whole: Apply returns an error matching [ErrInProgress], having
// written nothing, when a lock is held by a run that does not log changes
// (store.WithRebuild, a Familia rebuild, a rollback, a run of a record
// version this keyswap does not know, or one whose record is gone or
// carries another token), or by a run that does not rebuild a key the
// change writes. The change must be applied again once that run ends. An
// index whose pointer holds a group's claim fails it with an error
// matching keys.ErrGroupConflict naming the group, nothing written (SPEC
// C102), unless the index's base is another index's: on a cluster, for a
// live key another can share (keys.Aliasable), the script reads the base's
// owner stamp, and one naming another live key leaves the pointer, and its
// claim, to that index; a stamp of another type fails it with an error
// matching [ErrTampered] (SPEC C104).
//
// A lost reply leaves the outcome unknown (an error matching
// [ErrOutcomeUnknown]); the script is not retried, as a rerun would log the
// change twice. Applying the same change again is safe: ops set or remove
// entries outright.
func (r Changes) Apply(ctx context.Context, opts ApplyOptions) (Applied, error) {
	op, key := opts.Op, opts.Key
	fail := func(err error) (Applied, error) { return Applied{}, &Error{Op: op, Key: key, Err: err} }
	if len(opts.Locks) != len(opts.Ops) || opts.MaxLog < 1 {
		return fail(fmt.Errorf("%d locks for %d lists of ops, log bound %d", len(opts.Locks), len(opts.Ops), opts.MaxLog))
	}
	c := pickChange(opts.Locks, opts.Lives, nil, opts.Ops)
	if len(c.locks) == 0 {
		return c.none(), nil
	}
	if err := c.check(); err != nil {
		return fail(err)
	}
	n := len(c.locks)
	ks := make([]string, 3*n, 3*n+len(c.lists))
	for i, l := range c.locks {
		ks[i], ks[n+i], ks[2*n+i] = l, keys.RecordKey(l), keys.LogKey(l)
	}
	index := map[string]int{}
	// The owner stamps of the bases another index can share (SPEC C104):
	// for each, its index among the locks, then its live key.
	var stamped []string
	for i, l := range c.lives {
		if len(r.aliasable([]string{l})) > 0 {
			c.owners, stamped = append(c.owners, l), append(stamped, strconv.Itoa(i+1))
		}
	}
	args := []string{strconv.Itoa(n), strconv.Itoa(opts.MaxLog), strconv.Itoa(c.count()), strconv.Itoa(len(c.owners))}
	args = append(append(args, stamped...), c.owners...)
	for _, l := range c.owners {
		args = append(args, keys.Alias(l, keys.Base(l, true)))
	}
	for i, ops := range c.lists {
		for _, o := range ops {
			k, ok := index[o.Key]
			if !ok {
				ks = append(ks, o.Key)
				k = len(ks) - 3*n
				index[o.Key] = k
			}
			args = append(args, strconv.Itoa(i+1), strconv.Itoa(k), o.Cmd, strconv.Itoa(len(o.Args)))
			args = append(args, o.Args...)
		}
	}
	if dup := FirstDuplicate(ks); dup != "" {
		return fail(fmt.Errorf("key %q is both a live key and one of keyswap's own", dup))
	}
	// The pointers last: a group's claim there refuses the change (SPEC
	// C102).
	for _, l := range c.lives {
		ks = append(ks, keys.PointerKey(l, r.cluster))
	}
	for _, l := range c.owners {
		ks = append(ks, keys.OwnerKey(l, r.cluster))
	}
	if err := r.SameSlot(op, key, ks...); err != nil {
		return Applied{}, err
	}
	res, err := parseReply(applyScript.Exec(ctx, r.client, ks, args))
	if err != nil {
		return Applied{}, applyLost(ctx, op, key, err)
	}
	out, _, err := c.decode("apply", res, 0)
	if err != nil {
		return fail(err)
	}
	return out, nil
}

// change is the part of a change that writes something: the locks whose
// ops are not empty, with their live keys (families' prefixes, as families
// says) and ops, and each one's index among all the locks of the change.
type change struct {
	locks, lives []string
	families     []bool
	lists        [][]Op
	at           []int
	all          int // the number of locks of the whole change
	// owners are the lives whose base's owner stamp the change scripts of
	// Generations mode check (see Core.aliasable), in the order of their
	// stamps in the scripts' keys.
	owners []string
}

// pickChange returns the part of a change that writes something: lock i
// has live key lives[i] (locks[i] when lives is short), is a family's when
// families[i] is set, and writes ops[i].
func pickChange(locks, lives []string, families []bool, ops [][]Op) change {
	c := change{all: len(locks)}
	for i, l := range locks {
		if i >= len(ops) || len(ops[i]) == 0 {
			continue
		}
		live := l
		if i < len(lives) {
			live = lives[i]
		}
		c.locks, c.lives, c.lists = append(c.locks, l), append(c.lives, live), append(c.lists, ops[i])
		c.families = append(c.families, i < len(families) && families[i])
		c.at = append(c.at, i)
	}
	return c
}

// check validates the shape of every op.
func (c change) check() error {
	for _, ops := range c.lists {
		for _, o := range ops {
			if err := o.check(); err != nil {
				return err
			}
		}
	}
	return nil
}

// count returns the number of ops.
func (c change) count() int {
	n := 0
	for _, ops := range c.lists {
		n += len(ops)
	}
	return n
}

// none is what a change that writes nothing did: nothing logged.
func (c change) none() Applied { return Applied{Logged: make([]int, c.all)} }

// errMoved is decode's error for the GEN_LOST reply of genapply: a pointer
// moved since the caller resolved it.
var errMoved = errors.New("a pointer moved")

// decode reads the reply of script (apply, genapply or genlog) to c:
// {OK, l1..ln} followed by extra more elements, which it returns. A
// refusal is returned as the error that names it (errMoved for GEN_LOST);
// nothing was written then.
func (c change) decode(script string, res reply, extra int) (Applied, reply, error) {
	if err := res.refusal(); err != nil {
		return Applied{}, nil, err
	}
	code, err := res.code()
	if err != nil {
		return Applied{}, nil, fmt.Errorf("unexpected %s script reply: %w", script, err)
	}
	n := len(c.locks)
	i, _ := res.int(1)
	switch {
	case code == codeGenLost:
		return Applied{}, nil, errMoved
	case code == codeWait && i >= 1 && int(i) <= n:
		ms, _ := res.int(2)
		return Applied{}, nil, &cutOverError{lock: c.locks[i-1], left: time.Duration(max(ms, 0)) * time.Millisecond}
	case code == codeWrongType:
		return Applied{}, nil, fmt.Errorf("%q holds a %s, which this change cannot write; nothing applied", res.str(1), res.str(2))
	case code == codeUnlogged && i >= 1 && int(i) <= n:
		return Applied{}, nil, unlogged(c.lives[i-1], c.locks[i-1], res.str(2), res.str(3))
	case code == codeNotTheRuns && i >= 1 && int(i) <= n:
		return Applied{}, nil, fmt.Errorf("%w: %q is not one of the keys of the run holding %s, which rebuilds %q (does this process apply changes with another definition of the index?); nothing applied: apply the change again once that run ends", ErrInProgress, res.str(2), c.locks[i-1], res.str(3))
	case code == codeInGroup && i >= 1 && int(i) <= n:
		g := res.str(2)
		return Applied{}, nil, fmt.Errorf("%w: index %s is in group %q (its pointer without a group holds %q): pass the group %q; nothing written, nothing logged", keys.ErrGroupConflict, c.lives[i-1], g, keys.GroupMarker(g), g)
	case code == codeBadRegistry && i >= 1 && int(i) <= n:
		return Applied{}, nil, fmt.Errorf("%w: index %q: %s, a state no run leaves; nothing written, nothing logged", ErrTampered, c.lives[i-1], res.str(2))
	case code == codeOwned && names(i, len(c.owners)):
		// Only a base another live key can have is stamped: on a cluster.
		l := c.owners[i-1]
		return Applied{}, nil, ownerError(l, keys.OwnerKey(l, true), res)
	case code != codeOK || len(res) != 1+n+extra:
		return Applied{}, nil, fmt.Errorf("unexpected %s script reply %v", script, res)
	}
	got, err := res[:1+n].ints(1)
	if err != nil {
		return Applied{}, nil, fmt.Errorf("unexpected %s script reply: %w", script, err)
	}
	out := c.none()
	for j, l := range got {
		switch l {
		case LogNone, Logged, LogFull:
			out.Logged[c.at[j]] = int(l)
		default:
			return Applied{}, nil, fmt.Errorf("unexpected %s script reply %v: status %d for lock %d", script, res, l, c.at[j]+1)
		}
	}
	return out, res[1+n:], nil
}

// applyLost returns the error of a change script that failed: a refusal
// of the user's rights matching ErrNoPermission, another Redis error as it
// is, else one matching ErrOutcomeUnknown.
func applyLost(ctx context.Context, op, key string, err error) error {
	if rerr := Refused(err); rerr != nil {
		// The user may not run the script on one of its keys: nothing
		// written.
		return Fail(ctx, op, key, rerr)
	}
	if IsServerReply(err) {
		return Fail(ctx, op, key, err)
	}
	return Fail(ctx, op, key, fmt.Errorf("%w: the change may or may not be applied; apply it again before any later change to the same items: %w", ErrOutcomeUnknown, err))
}

// unlogged describes a change refused because the lock of live is held by
// a run that would not replay it: why and detail as apply.lua gives them.
func unlogged(live, lock, why, detail string) error {
	var holder string
	switch why {
	case "none":
		holder = "a rebuild that does not log changes (store.WithRebuild, or a Familia rebuild), or one whose record is gone"
	case "token":
		holder = "a run whose record does not carry the lock's token (forged, or lost and re-created; that run fails)"
	case "mode":
		if detail == ModeRollback {
			holder = "a rollback"
		} else {
			holder = fmt.Sprintf("a run of mode %q, which this keyswap does not know (upgrade keyswap)", detail)
		}
	case "version":
		holder = fmt.Sprintf("a run of another keyswap, whose record version %q this one does not know (upgrade keyswap)", detail)
	default:
		holder = "a run whose record names no key"
	}
	return fmt.Errorf("%w: %q is locked (%s) by %s, which would not replay this change; nothing applied: apply the change again once that rebuild ends", ErrInProgress, live, lock, holder)
}

// LogOffset is one log of changes of a publish: how many of its entries the
// run replayed itself, and their work; the highest count of logged entries
// the run saw; and the builder whose keys its entries write.
type LogOffset struct {
	Key    string
	Offset int64
	Work   int64
	Logged int64
	// Owner is the builder's key, or a family's prefix when Family is set.
	Owner  string
	Family bool
}

// BehindError reports a publish refused because the logs' tails held more
// than the bounds: the run catches up again, then retries.
type BehindError struct {
	Log  string // the first log with a tail
	Tail int64  // entries past the offsets, over every log
	Work int64  // their work (ops and arguments)
}

func (e *BehindError) Error() string {
	return fmt.Sprintf("%d changes (%d ops and arguments) logged since the last catch-up (first in %s), more than a publish replays", e.Tail, e.Work, e.Log)
}

// Owns reports whether key is one of the keys of the builder owner: owner
// itself or, for a family, "<owner>:<bucket>" with a non-empty bucket that
// does not have the shape of keyswap's own keys (keys.Reserved). The Lua
// scripts decide the same (lib/keys.lua).
func Owns(key, owner string, family bool) bool {
	if !family {
		return key == owner
	}
	return len(key) > len(owner)+1 && key[:len(owner)] == owner && key[len(owner)] == ':' && !keys.Reserved(key)
}

// badEntry describes entry e of log, which is not a change: why; left
// says what the refusal left unchanged.
func badEntry(log string, e int64, why error, left string) error {
	return fmt.Errorf("%w: %s, entry %d (LINDEX %d), is not a change keyswap logged: %w; %s", ErrTampered, log, e, e, why, left)
}

// foreignEntry describes entry e of l, which writes key, not one of its
// builder's; left says what the refusal left unchanged.
func foreignEntry(l LogOffset, e int64, key, left string) error {
	what := fmt.Sprintf("the key %q", l.Owner)
	if l.Family {
		what = fmt.Sprintf("the buckets of %q", l.Owner+":")
	}
	return fmt.Errorf("%w: %s, entry %d (LINDEX %d), writes %q, which is not one of the keys of its builder (%s); %s", ErrTampered, l.Key, e, e, key, what, left)
}

// CheckEntry checks ops, entry e of l, as the publish script does: every
// op writes one of the builder's keys. It returns an error matching
// [ErrTampered] naming the log, the entry and the key.
func CheckEntry(l LogOffset, e int64, ops []Op) error {
	for _, op := range ops {
		if !Owns(op.Key, l.Owner, l.Family) {
			return foreignEntry(l, e, op.Key, liveUnchanged)
		}
	}
	return nil
}

// BadEntry returns the error of entry e of log, which DecodeEntry refused
// with err (not ErrFallingBehind): one matching [ErrTampered].
func BadEntry(log string, e int64, err error) error { return badEntry(log, e, err, liveUnchanged) }

// liveUnchanged is what a refusal of the catch-up or of the rename
// publish leaves.
const liveUnchanged = "every live key left unchanged"

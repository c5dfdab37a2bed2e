package protocol

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/keyswap/keyswap/internal/keys"
)

// The scripts of a change applied in Generations mode across slots
// (genApplySpread). genlog is not retried: a rerun would log the change
// twice. genwrite is not retried, as apply is not: the caller must learn
// that the outcome is unknown. genkept only reads.
var (
	genlogScript   = newScript("genlog", false)
	genwriteScript = newScript("genwrite", false)
	genkeptScript  = newScript("genkept", true)
)

// spreads reports whether the keys of the indexes lives (live keys, or
// families' prefixes) in a generation may leave their locks' slot: on a
// cluster, when one of them has no hash tag. A key keeps its own tag in a
// generation; without one, "L:rebuild-g:G" and a family's buckets hash
// anywhere, while the lock hangs off "{L}"; in a group, the locks hang off
// the group's tag, and every key may leave their slot.
func (r Changes) spreads(lives []string) bool {
	for _, l := range lives {
		if !keys.SameSlot(l, r.cluster) {
			return true
		}
	}
	return false
}

// genShape returns the head and the tail of key, one of the keys of the
// index live (a family's prefix when family), in a generation: its key in
// generation G is head + G + tail (keys.GenKey, keys.GenBucketKey).
func genShape(live string, family bool, key string) (head, tail string) {
	head = live + keys.GenInfix
	if family {
		tail = ":" + strings.TrimPrefix(key, live+":")
	}
	return head, tail
}

// slotWrite is the ops of a change on the keys of one slot, as genwrite.lua
// takes them, and their outcome.
type slotWrite struct {
	keys []string
	ops  int
	args []string
	// refusal is the script's refusal (nothing of the slot written); err
	// a failure to learn its outcome, or a Redis error.
	refusal, err error
}

// genApplySpread is GenApply for a change whose keys in a generation are
// not all in the locks' slot (see spreads). No script can write them in
// the step that checks the pointers and logs the change, so it goes in
// three steps:
//
//  1. genlog.lua, in the locks' slot: check the owner stamps of the
//     indexes' bases (keys.ErrGroupConflict when one names another live
//     key, SPEC C104), resolve each pointer (a generation
//     the registry marks current, else ErrTampered, nothing written),
//     check this user's rights on every key the change writes in it, and
//     log the change for the run holding a lock, as Apply does (or refuse
//     it, nothing written). It returns the generation G of each index.
//  2. genwrite.lua, once per slot of the keys: the ops on G's keys in that
//     slot, all or none, in parallel.
//  3. genkept.lua, in the locks' slot: whether each G is still one the
//     pointer names or the registry marks current or previous. A flip
//     between steps 1 and 2 leaves the writes in a generation that readers
//     are leaving, which is harmless (the new generation has the change:
//     replayed from the log when step 1 logged it, else read from the
//     source by a run that took the lock after step 1); but once G is
//     retired the sweep may have scanned it already, so the keys of G that
//     step 2 wrote are removed here. A retired or removed generation never
//     becomes current again, and the keys have its shape.
//
// Whenever step 3 finds that a pointer no longer names G, the three steps
// run again, against the generation it names now (at most genApplyTries
// times, then ErrInProgress): a rollback between steps 1 and 2 makes an
// older generation current, which was built before the change and has it
// from nowhere else. Applying the change again is harmless where it was
// already (a flip's new generation): its ops set the items' entries.
//
// A failure at a step returns an error that says what was logged, what
// was written and what is left.
func (r Changes) genApplySpread(ctx context.Context, opts GenApplyOptions, c change) (Applied, error) {
	op, key := opts.Op, opts.Key
	n := len(c.locks)
	ks := make([]string, 6*n)
	for i, l := range c.locks {
		ks[i], ks[n+i], ks[2*n+i] = l, keys.RecordKey(l), keys.LogKey(l)
		ks[3*n+i], ks[4*n+i] = keys.PointerKey(c.lives[i], r.cluster), keys.RegistryKey(c.lives[i], r.cluster)
		ks[5*n+i] = keys.CutOverKey(l)
	}
	for _, l := range c.owners {
		ks = append(ks, keys.OwnerKey(l, r.cluster))
	}
	if err := r.SameSlot(op, key, ks...); err != nil {
		return Applied{}, err
	}
	args := []string{strconv.Itoa(n), strconv.Itoa(opts.MaxLog), strconv.Itoa(c.count()), strconv.Itoa(len(c.owners))}
	args = append(args, c.owners...)
	for i, ops := range c.lists {
		for _, o := range ops {
			head, tail := genShape(c.lives[i], c.families[i], o.Key)
			args = append(args, strconv.Itoa(i+1), o.Key, head, tail, o.Cmd, strconv.Itoa(len(o.Args)))
			args = append(args, o.Args...)
		}
	}

	// The steps again while the pointer moved meanwhile (see keptSpread),
	// a bounded number of times, as GenApply resolves again.
	var waiter cutOverWaiter
	for try := 1; ; try++ {
		out, writes, lost, moved, err := r.spreadOnce(ctx, opts, c, ks, args)
		if co := (*cutOverError)(nil); errors.As(err, &co) {
			// Step 1 found a run draining its log to flip: nothing
			// logged or written. Apply the change once it is done (it
			// does not count as a try).
			if err := waiter.wait(ctx, op, key, co); err != nil {
				return Applied{}, err
			}
			try--
			continue
		}
		if err != nil || !moved || try == genApplyTries {
			if err == nil && moved {
				err = &Error{Op: op, Key: key, Err: fmt.Errorf("%w: the indexes' pointers moved %d times while the change was applied across slots (flips or rollbacks in quick succession); it is in the generations it was written to, perhaps not in the current one: apply it again", ErrInProgress, genApplyTries)}
			}
			if err != nil {
				return Applied{}, err
			}
			return out, spreadError(ctx, op, key, writes, lost, out)
		}
		if err := spreadError(ctx, op, key, writes, lost, out); err != nil {
			return Applied{}, err
		}
	}
}

// spreadOnce runs the three steps of a change applied across slots once.
// moved reports that a pointer no longer names the generation the change
// was written to (or that an index without a pointer has one now): the
// caller applies it again to the generation the pointer names now.
func (r Changes) spreadOnce(ctx context.Context, opts GenApplyOptions, c change, ks, args []string) (out Applied, writes []*slotWrite, lost *leftover, moved bool, err error) {
	op, key := opts.Op, opts.Key
	n := len(c.locks)
	// Step 1: resolve, check and log.
	res, err := parseReply(genlogScript.Exec(ctx, r.client, ks, args))
	if err != nil {
		if IsServerReply(err) {
			return Applied{}, nil, nil, false, applyLost(ctx, op, key, err) // a refusal, or another Redis error
		}
		return Applied{}, nil, nil, false, Fail(ctx, op, key, fmt.Errorf("%w: the change may or may not be logged for a run in progress, and is written nowhere: apply it again before any later change to the same items: %w", ErrOutcomeUnknown, err))
	}
	out, rest, err := c.decode("genlog", res, n)
	if err != nil {
		return Applied{}, nil, nil, false, &Error{Op: op, Key: key, Err: err}
	}
	gens := make([]string, n)
	for i := range gens {
		gens[i], _ = rest[i].ToString()
		if gens[i] != "0" && !isGeneration(gens[i]) {
			return Applied{}, nil, nil, false, &Error{Op: op, Key: key, Err: fmt.Errorf("unexpected genlog script reply %v", res)}
		}
	}
	// An index without the group's pointer may be another group's (SPEC
	// C102): its keys in the plain shape are nobody's. Checked before any
	// write, only then (a run of this group it was logged for is refused
	// by the same claim).
	if err := r.otherClaims(ctx, op, c.lives, gens); err != nil {
		return Applied{}, nil, nil, false, err
	}

	// Step 2: the writes, one script per slot.
	writes, written := r.writeSpread(ctx, c, gens)

	// Step 3: keep them, or remove them from a generation left behind. It
	// runs even when the caller's ctx ended after the writes: what they
	// left in a retired generation would otherwise stay.
	kctx, cancel := CleanupContext(ctx)
	defer cancel()
	lost, moved = r.keptSpread(kctx, c, gens, written)
	return out, writes, lost, moved, nil
}

// writeSpread writes the ops of c on the keys of generations gens (the
// plain keys for "0"), one genwrite script per slot, all at once. It
// returns each slot's write, with its outcome, and per index the keys
// that may have been written (those of every slot that did not refuse).
func (r Changes) writeSpread(ctx context.Context, c change, gens []string) ([]*slotWrite, [][]string) {
	bySlot := map[uint16]*slotWrite{}
	at := map[string]int{}    // a key's index in its slot's keys, from 1
	index := map[string]int{} // a key's index
	for i, ops := range c.lists {
		for _, o := range ops {
			k := o.Key
			if gens[i] != "0" {
				head, tail := genShape(c.lives[i], c.families[i], o.Key)
				k = head + gens[i] + tail
			}
			s := keys.Slot(k)
			w := bySlot[s]
			if w == nil {
				w = &slotWrite{args: []string{""}}
				bySlot[s] = w
			}
			j, ok := at[k]
			if !ok {
				w.keys = append(w.keys, k)
				j = len(w.keys)
				at[k], index[k] = j, i
			}
			w.ops++
			w.args = append(w.args, strconv.Itoa(j), o.Cmd, strconv.Itoa(len(o.Args)))
			w.args = append(w.args, o.Args...)
		}
	}
	writes := make([]*slotWrite, 0, len(bySlot))
	for _, s := range slices.Sorted(maps.Keys(bySlot)) {
		w := bySlot[s]
		w.args[0] = strconv.Itoa(w.ops)
		writes = append(writes, w)
	}
	var wg sync.WaitGroup
	for _, w := range writes {
		wg.Go(func() {
			res, err := parseReply(genwriteScript.Exec(ctx, r.client, w.keys, w.args))
			if err != nil {
				w.err = err
				return
			}
			if w.refusal = res.refusal(); w.refusal != nil {
				return
			}
			switch code, err := res.code(); {
			case err != nil:
				w.err = fmt.Errorf("unexpected genwrite script reply: %w", err)
			case code == codeWrongType:
				w.refusal = fmt.Errorf("%w: %q holds a %s, which this change cannot write (another client wrote into the generation)", ErrTampered, res.str(1), res.str(2))
			case code != codeOK:
				w.err = fmt.Errorf("unexpected genwrite script reply %v", res)
			}
		})
	}
	wg.Wait()
	written := make([][]string, len(c.locks))
	for _, w := range writes {
		if w.refusal != nil {
			continue // nothing of this slot written
		}
		for _, k := range w.keys {
			written[index[k]] = append(written[index[k]], k)
		}
	}
	return writes, written
}

// keptSpread checks, in the locks' slot, that each generation of gens the
// change wrote is still kept (genkept.lua), and removes the keys written
// (per index) from those that are not: retired, or removed by a sweep. It
// returns the keys it could not remove, or whose generation it could not
// check, with why; and whether a pointer no longer names the generation
// written (moved), so that the change must be applied again.
func (r Changes) keptSpread(ctx context.Context, c change, gens []string, written [][]string) (lost *leftover, moved bool) {
	n := len(c.locks)
	ks := make([]string, 2*n)
	for i, l := range c.lives {
		ks[i], ks[n+i] = keys.PointerKey(l, r.cluster), keys.RegistryKey(l, r.cluster)
	}
	left := func(err error) *leftover {
		l := &leftover{err: err}
		for i, w := range written {
			if gens[i] != "0" {
				l.keys = append(l.keys, w...)
			}
		}
		if len(l.keys) == 0 {
			return nil
		}
		return l
	}
	res, err := parseReply(genkeptScript.Exec(ctx, r.client, ks, gens))
	if err != nil {
		return left(err), false
	}
	kept, err := res.ints(1)
	if code, cerr := res.code(); cerr != nil || code != codeOK || err != nil || len(kept) != n {
		return left(fmt.Errorf("unexpected genkept script reply %v", res)), false
	}
	var dead []string
	for i, k := range kept {
		moved = moved || k != keptNamed
		switch {
		case k == keptNamed || k == keptMoved || len(written[i]) == 0:
		case gens[i] == "0":
			// Not removed here: the pointer's existence is checked in
			// another step than the delete, and a switch back to the
			// rename shape in between would make these keys live again.
			r.log.Warn("keyswap: a change was written to an index's plain keys as its first flip came; readers no longer read them: run Rebuilder.DropPlain (keyswap sweep --plain) again to remove them",
				"key", c.lives[i], "keys", written[i])
		default:
			r.log.Info("keyswap: a flip retired the generation a change was written to meanwhile: its writes there are removed (the new generation has the change)",
				"key", c.lives[i], "generation", gens[i], "keys", written[i])
			dead = append(dead, written[i]...)
		}
	}
	if err := r.Unlink(ctx, dead); err != nil {
		return &leftover{keys: dead, err: err, retired: true}, moved
	}
	return nil, moved
}

// What genkept.lua reports of a generation a change was written to.
const (
	keptGone  = 0 // retired or removed: nothing reads it
	keptMoved = 1 // kept (current or previous), but the pointer names another
	keptNamed = 2 // the pointer names it (for "0": the index has no pointer)
)

// leftover is the keys of a change applied across slots that may be left
// in a generation no reader reads and no sweep will find.
type leftover struct {
	keys    []string
	err     error
	retired bool // known retired, not unchecked
}

// spreadError returns the error of a change applied across slots whose
// writes are writes, and whose keys lost were left unchecked or
// unremoved, or nil when all went well.
func spreadError(ctx context.Context, op, key string, writes []*slotWrite, lost *leftover, out Applied) error {
	var done, refusedKeys, unknown []string
	var first error
	for _, w := range writes {
		switch {
		case w.refusal != nil:
			refusedKeys = append(refusedKeys, w.keys...)
			if first == nil {
				first = w.refusal
			}
		case w.err != nil:
			unknown = append(unknown, w.keys...)
			if first == nil {
				first = w.err
			}
		default:
			done = append(done, w.keys...)
		}
	}
	if first == nil && lost == nil {
		return nil
	}
	logged := "not logged for a run"
	switch {
	case slices.Contains(out.Logged, Logged):
		logged = "logged for the run in progress, which replays it"
	case slices.Contains(out.Logged, LogFull):
		logged = "not logged: the log of the run in progress is full, and that run fails (ErrFallingBehind)"
	}
	var b strings.Builder
	if first != nil {
		fmt.Fprintf(&b, "the change was %s", logged)
		if len(done) > 0 {
			fmt.Fprintf(&b, "; written to %s", list(done))
		}
		if len(refusedKeys) > 0 {
			fmt.Fprintf(&b, "; not written to %s", list(refusedKeys))
		}
		if len(unknown) > 0 {
			fmt.Fprintf(&b, "; written or not to %s", list(unknown))
		}
		b.WriteString(": apply it again before any later change to the same items")
	}
	if lost != nil {
		if b.Len() > 0 {
			b.WriteString("; and ")
		}
		if lost.retired {
			fmt.Fprintf(&b, "a flip retired the generation it was written to, and its writes there, %s, could not be removed (%v): no sweep will find them once the generation is removed; UNLINK them", list(lost.keys), lost.err)
		} else {
			fmt.Fprintf(&b, "whether the generation it was written to is still kept could not be checked (%v): if a flip retired it meanwhile, UNLINK %s once the registry no longer marks it current or previous", lost.err, list(lost.keys))
		}
	}
	var causes []error
	if first != nil {
		b.WriteString(": ")
		b.WriteString(first.Error())
		causes = append(causes, first)
	}
	if len(unknown) > 0 || lost != nil {
		causes = append(causes, ErrOutcomeUnknown)
	}
	if lost != nil {
		causes = append(causes, lost.err)
	}
	return Fail(ctx, op, key, &partError{msg: b.String(), causes: causes})
}

// partError is the error of a change applied across slots that failed
// partway: its message says what was done and what is left, and it
// matches each of its causes.
type partError struct {
	msg    string
	causes []error
}

func (e *partError) Error() string {
	if slices.Contains(e.causes, ErrOutcomeUnknown) {
		return ErrOutcomeUnknown.Error() + ": " + e.msg
	}
	return e.msg
}

func (e *partError) Unwrap() []error { return e.causes }

// list names ks in an error: the first few, quoted, and how many more.
func list(ks []string) string {
	if len(ks) == 0 {
		return "no key"
	}
	const most = 5
	var b strings.Builder
	for i, k := range ks[:min(len(ks), most)] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(k))
	}
	if len(ks) > most {
		fmt.Fprintf(&b, " and %d more", len(ks)-most)
	}
	return b.String()
}

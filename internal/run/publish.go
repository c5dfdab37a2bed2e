package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
)

// Outcome is what a successful publish did to a live key.
type Outcome int8

const (
	// Swapped: the live key now holds exactly the temp key's contents.
	Swapped Outcome = iota + 1
	// Emptied: the rebuild produced nothing for the key, or it was a family
	// bucket the rebuild no longer produced, so the live key was deleted.
	Emptied
)

func (o Outcome) String() string {
	switch o {
	case Swapped:
		return "swapped"
	case Emptied:
		return "emptied"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Target is one live key of a publish and the temp key that replaces it.
type Target struct {
	// Temp is the rebuilt temp key.
	Temp string
	// Live is the live key Temp replaces.
	Live string
	// Populated records that the caller saw Temp hold data, so a missing
	// Temp at publish time is a loss and fails closed with ErrTempKeyLost.
	// False means a missing Temp is an empty result: Live is deleted.
	Populated bool
}

// PublishOptions configures [Redis.Publish].
type PublishOptions struct {
	// Op names the operation in errors ("publish", "swap").
	Op string
	// Key names the rebuild in errors and logs.
	Key string
	// Locks fences the publish: it happens only while every lock still holds
	// its token. The locks must share one token. Nil is an unfenced publish.
	Locks []*Lock
	// Targets are the keys to publish.
	Targets []Target
	// Orphans are live keys to delete in the same atomic step, such as the
	// buckets of a rebuilt family that the rebuild no longer produces.
	Orphans []string
	// PreserveFor is how long populated temp keys are kept after the
	// publish script itself fails. It must be a whole number of seconds.
	PreserveFor time.Duration
}

// Publish checks every lock, then that every populated temp key still
// exists, and only then, for each target, UNLINKs the live key and RENAMEs
// and PERSISTs the temp key over it (or leaves the live key deleted for an
// empty temp key), and finally UNLINKs the orphans: all in one script.
// Readers see every target old or every target new, never a mixture and
// never a missing key. It returns one [Outcome] per target, in order.
//
// It fails closed. A lock that is not ours deletes every temp key and
// returns an error matching [ErrLockLost] that names that lock's live key.
// A populated temp key that is gone changes nothing and returns an error
// matching [ErrTempKeyLost] that names it. A failure of the script itself
// keeps the populated temp keys for PreserveFor and returns the error
// wrapped; pass it to [Redis.Settle]. On a cluster every key must share one
// hash slot, or Publish returns an error before sending anything. Publish is
// never retried: a retried RENAME would find its own temp key gone and
// report a loss that did not happen.
func (r *Redis) Publish(ctx context.Context, opts PublishOptions) ([]Outcome, error) {
	op, key := opts.Op, opts.Key
	if len(opts.Targets) == 0 && len(opts.Orphans) == 0 {
		return nil, &Error{Op: op, Key: key, Err: errors.New("no targets")}
	}
	preserve, err := Seconds(op, key, "PreserveFor", opts.PreserveFor)
	if err != nil {
		return nil, err
	}
	plan := publishPlan{orphans: opts.Orphans}
	if len(opts.Locks) > 0 {
		if plan.locks, plan.token, err = CheckLocks(op, opts.Locks); err != nil {
			return nil, err
		}
		plan.receipt = keys.ReceiptKey(opts.Locks[0].Key)
	}
	all := make([]string, 0, 2*len(opts.Targets))
	for _, t := range opts.Targets {
		switch {
		case t.Live == "":
			return nil, &Error{Op: op, Key: key, Err: errors.New("empty key")}
		case t.Temp == "":
			return nil, &Error{Op: op, Key: t.Live, Err: errors.New("empty temp key")}
		case t.Temp == t.Live:
			return nil, &Error{Op: op, Key: t.Live, Err: errors.New("temp key is the live key")}
		}
		all = append(all, t.Live, t.Temp)
		plan.temps = append(plan.temps, t.Temp)
		plan.lives = append(plan.lives, t.Live)
		plan.populated = append(plan.populated, t.Populated)
	}
	if dup := FirstDuplicate(all); dup != "" {
		return nil, &Error{Op: op, Key: key, Err: fmt.Errorf("key %q appears twice among the targets", dup)}
	}
	for _, o := range opts.Orphans {
		if o == "" {
			return nil, &Error{Op: op, Key: key, Err: errors.New("empty orphan key")}
		}
	}
	outcomes, err := r.publish(ctx, op, key, plan)
	var lost *lostLockError
	switch {
	case err == nil:
		return outcomes, nil
	case errors.As(err, &lost):
		// A successor owns the lock, so our snapshot is the stale one.
		// Drop it rather than preserve it: there is nothing to diagnose.
		live := opts.Locks[lost.index].Live
		r.log.Warn("keyswap: rebuild lock lost before the publish; nothing published", "key", live, "lock_key", opts.Locks[lost.index].Key)
		r.Discard(ctx, key, plan.temps...)
		return nil, &Error{Op: op, Key: live, Err: ErrLockLost}
	case errors.Is(err, ErrTempKeyLost):
		// Populated at a renewal, gone inside the script: evicted, expired
		// or swept mid-publish. The live keys are stale but intact;
		// reporting success would be the fail-open bug.
		return nil, &Error{Op: op, Key: key, Err: err}
	case IsBadInput(err):
		return nil, err
	}
	// OOM, a dropped connection, a timeout: the caller must see the error,
	// not a success. Keep what was built for a bounded diagnostic window
	// instead of leaking index-sized keys indefinitely.
	for _, t := range opts.Targets {
		if t.Populated {
			r.preserveTemp(ctx, t.Live, t.Temp, preserve)
		}
	}
	return nil, Fail(ctx, op, key, err)
}

// receiptTTL is how long the receipt of a fenced publish lives: long
// enough for Settle, which runs right after the publish failed.
const receiptTTL = 30 * time.Second

// Settle settles the outcome of a [Redis.Publish] fenced on locks that
// returned perr. It returns perr unchanged when perr is an answer: Redis
// replied (an error reply, ErrLockLost, ErrTempKeyLost), so the publish did
// not happen; or when the publish was not fenced, since nothing can then
// stop a script still on its way.
//
// When the reply was lost instead (a dropped connection, a timeout, a
// cancelled context), the script may or may not have run, and Settle finds
// out. A fenced publish script leaves a receipt, in the same atomic step as
// the publish: our token under "<lock key>:done". Settle releases the locks
// and takes the receipt in one script, so that a publish script still on its
// way on a broken connection fails its fence if it runs at all: what the
// receipt says is final. Our receipt means the publish happened, and Settle
// returns (true, nil); no receipt means it did not, and Settle returns
// (false, perr). A receipt that was lost (evicted) errs on the safe side: a
// publish that happened is reported as failed, never the reverse.
//
// When Redis cannot be reached to settle it, the error matches both
// [ErrOutcomeUnknown] and perr. Settle runs on a [CleanupContext].
func (r *Redis) Settle(ctx context.Context, perr error, locks []*Lock) (published bool, err error) {
	if perr == nil || !replyLost(perr) || len(locks) == 0 {
		return false, perr
	}
	unknown := func(err error) error {
		return &Error{Op: "publish", Key: locks[0].Live, Err: fmt.Errorf("%w: %w; publish failed: %w", ErrOutcomeUnknown, err, perr)}
	}
	ctx, cancel := CleanupContext(ctx)
	defer cancel()
	// One script releases the locks and takes the receipt: from then on no
	// publish fenced on them can happen, and the receipt says whether one
	// did. (Another rebuild's lock found instead of ours: ours expired, and
	// its publish, if any, is over too.)
	receipt, err := r.release(ctx, locks)
	if err != nil && !errors.Is(err, ErrLockLost) {
		return false, unknown(fmt.Errorf("releasing the locks: %w", err))
	}
	if !receipt {
		return false, perr
	}
	r.log.Warn("keyswap: the publish reply was lost, but the publish happened", "key", locks[0].Live, "err", perr)
	return true, nil
}

// replyLost reports whether err, from a publish, leaves it unknown whether
// the script ran: the connection broke or the wait for the reply ended
// (a timeout, a cancelled context), as opposed to a reply from Redis or a
// refusal of ours before anything was sent.
func replyLost(err error) bool {
	var ne net.Error
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne)
}

// publishPlan is one run of the publish script.
type publishPlan struct {
	token     string   // "" for an unfenced publish
	locks     []string // lock keys to check (none when unfenced)
	temps     []string
	lives     []string // lives[i] receives temps[i]
	populated []bool   // populated[i]: temps[i] was seen holding data
	orphans   []string // live keys to delete in the same step
	receipt   string   // fenced: the key the script leaves its receipt in
}

// lostLockError carries the index of the lock that publish found not ours.
type lostLockError struct{ index int }

func (e *lostLockError) Error() string { return "lock " + strconv.Itoa(e.index) + " is not ours" }

// publish runs the publish script for p and returns one outcome per target.
// A lost lock comes back as *lostLockError, a vanished populated temp key as
// an error wrapping ErrTempKeyLost that names the key; anything else is the
// script's own failure.
func (r *Redis) publish(ctx context.Context, op, key string, p publishPlan) ([]Outcome, error) {
	ks := make([]string, 0, len(p.locks)+2*len(p.temps)+len(p.orphans)+1)
	ks = append(ks, p.locks...)
	ks = append(ks, p.temps...)
	ks = append(ks, p.lives...)
	ks = append(ks, p.orphans...)
	if p.receipt != "" {
		ks = append(ks, p.receipt)
	}
	if err := r.SameSlot(op, key, ks...); err != nil {
		return nil, err
	}
	var flags strings.Builder
	for _, seen := range p.populated {
		if seen {
			flags.WriteByte('1')
		} else {
			flags.WriteByte('0')
		}
	}
	args := []string{p.token, strconv.Itoa(len(p.locks)), strconv.Itoa(len(p.temps)), flags.String()}
	if p.receipt != "" {
		args = append(args, strconv.Itoa(int(receiptTTL/time.Second)))
	}
	reply, err := publishScript.Exec(ctx, r.client, ks, args).AsIntSlice()
	if err != nil {
		return nil, err
	}
	if len(reply) == 2 && reply[0] == codeLockLost && reply[1] >= 1 && int(reply[1]) <= len(p.locks) {
		return nil, &lostLockError{index: int(reply[1] - 1)}
	}
	if len(reply) == 2 && reply[0] == codeTempLost && reply[1] >= 1 && int(reply[1]) <= len(p.temps) {
		i := reply[1] - 1
		return nil, fmt.Errorf("%w: %s vanished during the %s; %s and every other live key left unchanged", ErrTempKeyLost, p.temps[i], op, p.lives[i])
	}
	if len(reply) != 1+len(p.temps) || reply[0] != codeOK {
		return nil, fmt.Errorf("unexpected publish script reply %v", reply)
	}
	out := make([]Outcome, len(p.temps))
	for i, code := range reply[1:] {
		switch code {
		case codeRenamed:
			out[i] = Swapped
		case codeEmptied:
			out[i] = Emptied
		default:
			return nil, fmt.Errorf("unexpected publish outcome %d for %s", code, p.temps[i])
		}
	}
	return out, nil
}

// preserveTemp bounds a temp key after a failed publish (Familia's
// preserve_temp_key), best effort.
func (r *Redis) preserveTemp(ctx context.Context, live, temp string, secs int64) {
	ctx, cancel := CleanupContext(ctx)
	defer cancel()
	// Idempotent, so rueidis may retry it on a fresh connection.
	if err := r.client.Do(ctx, r.client.B().Expire().Key(temp).Seconds(secs).Build().ToRetryable()).Error(); err != nil {
		r.log.Warn("keyswap: could not bound temp key after a failed publish", "key", live, "temp_key", temp, "err", err)
		return
	}
	r.log.Warn("keyswap: temp key preserved after a failed publish", "key", live, "temp_key", temp, "preserve_for", time.Duration(secs)*time.Second)
}

package store

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

// Target is one live key of a [Store.Publish] and the temp key that replaces
// it.
type Target struct {
	// Temp is the rebuilt temp key.
	Temp string
	// Final is the live key Temp replaces.
	Final string
	// Populated records that the caller saw Temp hold data, so a missing
	// Temp at publish time is a loss and fails closed with ErrTempKeyLost.
	// False means a missing Temp is an empty result: Final is deleted.
	Populated bool
}

// PublishOptions configures [Store.Publish].
type PublishOptions struct {
	// Locks fences the publish: it happens only while every lock still holds
	// its token. The locks must share one token. Nil is an unfenced publish.
	Locks []*Lock
	// Targets are the keys to publish. There must be at least one.
	Targets []Target
	// Orphans are live keys to delete in the same atomic step, such as the
	// buckets of a rebuilt family that the rebuild no longer produces.
	Orphans []string
	// PreserveFor is how long populated temp keys are kept after the
	// publish script itself fails. Zero means DefaultPreserveFor.
	PreserveFor time.Duration
}

// Publish is [Store.Swap] for a rebuild of several keys: one script checks
// every lock, then checks that every populated temp key still exists, and
// only then, for each target, UNLINKs the live key and RENAMEs and PERSISTs
// the temp key over it (or leaves the live key deleted for an empty temp
// key), and finally UNLINKs the orphans. Readers see every target old or
// every target new, never a mixture and never a missing key. It returns one
// [Outcome] per target, in order.
//
// It fails closed like Swap: a lock that is not ours deletes every temp key
// and returns an error matching [ErrLockLost] that names that lock's live
// key; a populated temp key that is gone changes nothing and returns an
// error matching [ErrTempKeyLost] that names it; a failure of the script
// itself keeps the populated temp keys for PreserveFor and returns the error
// wrapped. On a cluster every key must share one hash slot, or Publish
// returns an error before sending anything.
func (s *Store) Publish(ctx context.Context, opts PublishOptions) ([]Outcome, error) {
	const op = "publish"
	if len(opts.Targets) == 0 {
		return nil, &Error{Op: op, Err: errors.New("no targets")}
	}
	final := opts.Targets[0].Final
	preserve, err := seconds(op, final, "PreserveFor", orDefault(opts.PreserveFor, DefaultPreserveFor))
	if err != nil {
		return nil, err
	}
	if len(opts.Locks) > 0 {
		if _, _, err := s.checkLocks(op, opts.Locks); err != nil {
			return nil, err
		}
	}
	finals := make([]string, 0, len(opts.Targets))
	for _, t := range opts.Targets {
		switch {
		case t.Final == "":
			return nil, &Error{Op: op, Err: errors.New("empty key")}
		case t.Temp == "":
			return nil, &Error{Op: op, Key: t.Final, Err: errEmptyTemp}
		case t.Temp == t.Final:
			return nil, &Error{Op: op, Key: t.Final, Err: errors.New("temp key is the live key")}
		}
		finals = append(finals, t.Final, t.Temp)
	}
	if dup := firstDuplicate(finals); dup != "" {
		return nil, &Error{Op: op, Key: final, Err: fmt.Errorf("key %q appears twice among the targets", dup)}
	}
	for _, o := range opts.Orphans {
		if o == "" {
			return nil, &Error{Op: op, Key: final, Err: errors.New("empty orphan key")}
		}
	}
	return s.publishTargets(ctx, op, final, opts.Locks, opts.Targets, opts.Orphans, preserve)
}

// publishTargets runs the publish script and maps its failures, for Swap
// and Publish alike. final names the rebuild in errors.
func (s *Store) publishTargets(ctx context.Context, op, final string, locks []*Lock, targets []Target, orphans []string, preserve int64) ([]Outcome, error) {
	plan := publishPlan{orphans: orphans}
	for _, l := range locks {
		plan.token = l.Token
		plan.locks = append(plan.locks, l.Key)
		plan.lockFinals = append(plan.lockFinals, l.Final)
	}
	if len(locks) > 0 {
		plan.receipt = keys.ReceiptKey(locks[0].Key)
	}
	for _, t := range targets {
		plan.temps = append(plan.temps, t.Temp)
		plan.finals = append(plan.finals, t.Final)
		plan.populated = append(plan.populated, t.Populated)
	}
	outcomes, err := s.publish(ctx, op, final, plan)
	var lost *lostLockError
	switch {
	case err == nil:
		return outcomes, nil
	case errors.As(err, &lost):
		// A successor owns the lock, so our snapshot is the stale one.
		// Drop it rather than preserve it: there is nothing to diagnose.
		s.log.Warn("keyswap: rebuild lock lost before the swap; nothing published", "key", lost.final, "lock_key", lost.lock)
		s.discardTemp(ctx, final, plan.temps...)
		return nil, &Error{Op: op, Key: lost.final, Err: ErrLockLost}
	case errors.Is(err, ErrTempKeyLost):
		// Populated at the EXISTS check or by a touch, gone inside the
		// script: evicted, expired or swept mid-swap. The live key is stale
		// but intact; reporting success would be the fail-open bug.
		return nil, &Error{Op: op, Key: final, Err: err}
	case isBadInput(err):
		return nil, err
	}
	// OOM, a dropped connection, a timeout: the caller must see the error,
	// not a success. Keep what was built for a bounded diagnostic window
	// instead of leaking index-sized keys indefinitely.
	for _, t := range targets {
		if t.Populated {
			s.preserveTemp(ctx, t.Final, t.Temp, preserve)
		}
	}
	return nil, fail(ctx, op, final, err)
}

// receiptTTL is how long the receipt of a fenced publish lives: long
// enough for Settle, which runs right after the publish failed.
const receiptTTL = 30 * time.Second

// Settle settles the outcome of a [Store.Publish] or [Store.Swap] fenced on
// locks that returned perr. It returns perr unchanged when perr is an
// answer: Redis replied (an error reply, ErrLockLost, ErrTempKeyLost), so
// the publish did not happen; or when the publish was not fenced, since
// nothing can then stop a script still on its way.
//
// When the reply was lost instead (a dropped connection, a timeout, a
// cancelled context), the script may or may not have run, and Settle finds
// out. A fenced publish script leaves a receipt, in the same atomic step as
// the publish: our token under "<lock key>:done". Settle releases locks and
// takes the receipt in one script, so that a publish script still on its way
// on a broken connection fails its fence if it runs at all: what the receipt
// says is final. Our receipt means the publish happened, and Settle returns
// (true, nil); no receipt means it did not, and Settle returns (false,
// perr). A receipt that was lost (evicted) errs on the safe side: a publish
// that happened is reported as failed, never the reverse. Every release
// deletes the receipt, so it lingers only when a release fails, for 30 s.
//
// When Redis cannot be reached to settle it, the error matches both
// [ErrOutcomeUnknown] and perr. Settle runs even after ctx is cancelled,
// bounded by a short timeout.
func (s *Store) Settle(ctx context.Context, perr error, locks []*Lock) (published bool, err error) {
	if perr == nil || !replyLost(perr) || len(locks) == 0 {
		return false, perr
	}
	unknown := func(err error) error {
		return &Error{Op: "publish", Key: locks[0].Final, Err: fmt.Errorf("%w: %w; publish failed: %w", ErrOutcomeUnknown, err, perr)}
	}
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	// One script releases the locks and takes the receipt: from then on no
	// publish fenced on them can happen, and the receipt says whether one
	// did. (Another rebuild's lock found instead of ours: ours expired, and
	// its publish, if any, is over too.)
	receipt, err := s.release(ctx, locks)
	if err != nil && !errors.Is(err, ErrLockLost) {
		return false, unknown(fmt.Errorf("releasing the locks: %w", err))
	}
	if !receipt {
		return false, perr
	}
	s.log.Warn("keyswap: the publish reply was lost, but the publish happened", "key", locks[0].Final, "err", perr)
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

// lockKeys returns the keys of locks.
func lockKeys(locks []*Lock) []string {
	out := make([]string, len(locks))
	for i, l := range locks {
		out[i] = l.Key
	}
	return out
}

// isBadInput reports whether err is one of our own argument errors, which
// are returned before anything is sent.
func isBadInput(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

// publishPlan is one run of the publish script.
type publishPlan struct {
	token      string   // "" for an unfenced publish
	locks      []string // lock keys to check (none when unfenced)
	lockFinals []string // lockFinals[i] is the live key locks[i] guards
	temps      []string
	finals     []string // finals[i] receives temps[i]
	populated  []bool   // populated[i]: temps[i] was seen holding data
	orphans    []string // live keys to delete in the same step
	receipt    string   // fenced: the key the script leaves its receipt in
}

// lostLockError carries the lock that publish found not ours.
type lostLockError struct{ lock, final string }

func (e *lostLockError) Error() string { return "lock " + e.lock + " is not ours" }

// publish runs the publish script for p and returns one outcome per target.
// A lost lock comes back as *lostLockError, a vanished populated temp key as
// an error wrapping ErrTempKeyLost that names the key; anything else is the
// script's own failure.
func (s *Store) publish(ctx context.Context, op, final string, p publishPlan) ([]Outcome, error) {
	ks := make([]string, 0, len(p.locks)+2*len(p.temps)+len(p.orphans))
	ks = append(ks, p.locks...)
	ks = append(ks, p.temps...)
	ks = append(ks, p.finals...)
	ks = append(ks, p.orphans...)
	if p.receipt != "" {
		ks = append(ks, p.receipt)
	}
	if err := s.sameSlot(op, final, ks...); err != nil {
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
	reply, err := publishScript.Exec(ctx, s.client, ks, args).AsIntSlice()
	if err != nil {
		return nil, err
	}
	if len(reply) == 2 && reply[0] == codeLockLost && reply[1] >= 1 && int(reply[1]) <= len(p.locks) {
		i := reply[1] - 1
		return nil, &lostLockError{lock: p.locks[i], final: p.lockFinals[i]}
	}
	if len(reply) == 2 && reply[0] == codeTempLost && reply[1] >= 1 && int(reply[1]) <= len(p.temps) {
		i := reply[1] - 1
		return nil, fmt.Errorf("%w: %s vanished during the swap; %s and every other live key left unchanged", ErrTempKeyLost, p.temps[i], p.finals[i])
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

// preserveTemp bounds a temp key after a failed swap (Familia's
// preserve_temp_key), best effort.
func (s *Store) preserveTemp(ctx context.Context, final, temp string, secs int64) {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	// Idempotent, so rueidis may retry it on a fresh connection.
	if err := s.client.Do(ctx, s.client.B().Expire().Key(temp).Seconds(secs).Build().ToRetryable()).Error(); err != nil {
		s.log.Warn("keyswap: could not bound temp key after a failed swap", "key", final, "temp_key", temp, "err", err)
		return
	}
	s.log.Warn("keyswap: temp key preserved after a failed swap", "key", final, "temp_key", temp, "preserve_for", time.Duration(secs)*time.Second)
}

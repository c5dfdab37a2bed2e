package run

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// TempState is what a renewal found of a temp key.
type TempState int8

const (
	// TempAbsent: the temp key does not exist. Nothing was written to it
	// yet or, if it was populated before, it was lost.
	TempAbsent TempState = iota
	// TempAlive: the temp key existed with a TTL, so it has lived since an
	// earlier renewal or write gave it one.
	TempAlive
	// TempCreated: the temp key existed without a TTL, which the renewal
	// then gave it, so it was created since the previous one. On a key
	// already seen populated this means it was lost (evicted, deleted) and
	// re-created by a later write, and holds only part of the rebuild; or
	// that a write removed its TTL, as a plain SET does (use SET KEEPTTL).
	TempCreated
)

func (t TempState) String() string {
	switch t {
	case TempAbsent:
		return "absent"
	case TempAlive:
		return "alive"
	case TempCreated:
		return "created"
	}
	return "TempState(" + strconv.Itoa(int(t)) + ")"
}

// Temp is one temp key of a run, and what the run has seen of it. It is
// safe for concurrent use.
type Temp struct {
	// Live is the live key the temp key replaces.
	Live string
	// Key is the temp key.
	Key string
	// populated records that Key was created: a write's EXPIRE NX or a
	// renewal found it without a TTL. A second creation means it was lost
	// and re-created by a later write.
	populated atomic.Bool
}

// Populated reports whether the temp key was seen created.
func (t *Temp) Populated() bool { return t.populated.Load() }

// MarkPopulated records that the temp key was seen holding data, without
// having been seen created: a later creation is then a loss.
func (t *Temp) MarkPopulated() { t.populated.Store(true) }

// Created records that the temp key was found without a TTL: created since
// the last look. It returns an error matching [ErrTempKeyLost] when the key
// had been created before: it was lost and re-created, and holds only part
// of the rebuild.
func (t *Temp) Created() error {
	if t.populated.CompareAndSwap(false, true) {
		return nil
	}
	return t.Lost("vanished and was re-created by a later write (or a write removed its TTL, as a plain SET does: use SET KEEPTTL), so it holds only part of the rebuild")
}

// Lost returns an error matching [ErrTempKeyLost] that says what happened
// to the temp key.
func (t *Temp) Lost(what string) error {
	return fmt.Errorf("%w: %s %s; every live key left unchanged", ErrTempKeyLost, t.Key, what)
}

// Snapshot is a set of temp keys and which of them were populated when it
// was taken. Only those can have vanished if a renewal finds them absent: a
// key created later, by a write still in flight or on another connection,
// may be created after the renewal runs.
type Snapshot struct {
	Temps     []*Temp
	Populated []bool
}

// Snap returns a Snapshot of temps as they are now.
func Snap(temps []*Temp) Snapshot {
	s := Snapshot{Temps: temps, Populated: make([]bool, len(temps))}
	for i, t := range temps {
		s.Populated[i] = t.Populated()
	}
	return s
}

// Keys returns the temp keys of s.
func (s Snapshot) Keys() []string { return TempKeys(s.Temps) }

// Check records what a renewal found of s's temp keys, and returns an error
// matching [ErrTempKeyLost] if one populated when s was taken is gone, or
// one was re-created. when says when, for the error ("during the run").
func (s Snapshot) Check(states []TempState, when string) error {
	for i, t := range s.Temps {
		switch {
		case states[i] == TempCreated:
			if err := t.Created(); err != nil {
				return err
			}
		case states[i] == TempAbsent && s.Populated[i]:
			return t.Lost("vanished " + when)
		}
	}
	return nil
}

// TempKeys returns the keys of temps.
func TempKeys(temps []*Temp) []string {
	out := make([]string, len(temps))
	for i, t := range temps {
		out[i] = t.Key
	}
	return out
}

// Touch renews a run's lease in one script: it extends every lock (which
// must share one token and TTL) first and then, only if every lock is still
// ours, resets every temp key's TTL. It reports what it found of each temp
// key. If any lock is no longer ours, nothing changes and the error matches
// [ErrLockLost], naming that lock's live key.
//
// Order matters. Extending the locks first means a temp key's deadline is
// never earlier than its lock's, so a stall long enough to lose a temp key
// has already lost the lock and fails with ErrLockLost instead of
// publishing a vanished key. Both happen in one script, at one instant.
func (r *Redis) Touch(ctx context.Context, op string, locks []*Lock, temps []string) ([]TempState, error) {
	ks, args, err := r.leaseCall(op, locks, temps)
	if err != nil {
		return nil, err
	}
	return r.leaseReply(ctx, op, locks, temps, leaseScript.Exec(ctx, r.client, ks, args))
}

// TouchCommand returns the EVALSHA that [Redis.Touch] would run, for a
// caller that sends it inside its own DoMulti, next to a batch's writes, so
// that the renewal costs no extra round trip. Pass its reply to
// [Redis.TouchReply].
func (r *Redis) TouchCommand(locks []*Lock, temps []string) (rueidis.Completed, error) {
	ks, args, err := r.leaseCall("touch", locks, temps)
	if err != nil {
		return rueidis.Completed{}, err
	}
	return r.client.B().Evalsha().Sha1(leaseSHA1).Numkeys(int64(len(ks))).Key(ks...).Arg(args...).Build(), nil
}

// TouchReply interprets the reply to a [Redis.TouchCommand] exactly as
// [Redis.Touch] does. rueidis falls back from EVALSHA to EVAL only for
// commands sent alone, so when the server had no cached copy of the script
// (NOSCRIPT: first use, SCRIPT FLUSH, a restarted server) TouchReply runs
// the touch again through EVALSHA with EVAL fallback. The script only
// compares and extends, so running it twice is harmless.
func (r *Redis) TouchReply(ctx context.Context, res rueidis.RedisResult, locks []*Lock, temps []string) ([]TempState, error) {
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		return r.Touch(ctx, "touch", locks, temps)
	}
	return r.leaseReply(ctx, "touch", locks, temps, res)
}

// leaseCall validates a lease script call and returns its keys and args.
func (r *Redis) leaseCall(op string, locks []*Lock, temps []string) (ks, args []string, err error) {
	lockKeys, token, err := CheckLocks(op, locks)
	if err != nil {
		return nil, nil, err
	}
	secs, err := Seconds(op, locks[0].Live, "lock TTL", locks[0].TTL)
	if err != nil {
		return nil, nil, err
	}
	for _, l := range locks[1:] {
		if l.TTL != locks[0].TTL {
			return nil, nil, &Error{Op: op, Key: l.Live, Err: fmt.Errorf("lock TTL %v differs from %v", l.TTL, locks[0].TTL)}
		}
	}
	for _, t := range temps {
		if t == "" {
			return nil, nil, &Error{Op: op, Key: locks[0].Live, Err: errors.New("empty temp key")}
		}
	}
	ks = append(lockKeys, temps...)
	if err := r.SameSlot(op, locks[0].Live, ks...); err != nil {
		return nil, nil, err
	}
	return ks, []string{token, strconv.FormatInt(secs, 10), strconv.Itoa(len(locks))}, nil
}

// leaseReply interprets the lease script's reply.
func (r *Redis) leaseReply(ctx context.Context, op string, locks []*Lock, temps []string, res rueidis.RedisResult) ([]TempState, error) {
	reply, err := res.AsIntSlice()
	if err != nil {
		return nil, Fail(ctx, op, locks[0].Live, err)
	}
	switch {
	case len(reply) == 2 && reply[0] == codeLockLost && reply[1] >= 1 && int(reply[1]) <= len(locks):
		return nil, &Error{Op: op, Key: locks[reply[1]-1].Live, Err: ErrLockLost}
	case len(reply) != 1+len(temps) || reply[0] != codeOK:
		return nil, &Error{Op: op, Key: locks[0].Live, Err: fmt.Errorf("unexpected lease script reply %v", reply)}
	}
	states := make([]TempState, len(temps))
	for i := range temps {
		switch reply[1+i] {
		case 0:
			states[i] = TempAbsent
		case 1:
			states[i] = TempAlive
		case 2:
			states[i] = TempCreated
		default:
			return nil, &Error{Op: op, Key: locks[0].Live, Err: fmt.Errorf("unexpected lease script reply %v", reply)}
		}
	}
	return states, nil
}

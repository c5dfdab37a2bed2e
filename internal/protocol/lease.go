package protocol

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
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

// SetPopulated records whether the temp key holds data, as seen by a write
// that may have emptied it (a replayed change that removes entries): an
// emptied key is an empty result, and a later creation is no loss.
func (t *Temp) SetPopulated(p bool) { t.populated.Store(p) }

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

// Touch renews a single-key rebuild in one script, Familia's touch: it
// extends every lock (which must share one token and TTL) first and then,
// only if every lock is still ours, resets every temp key's TTL to the
// lock's. It reports what it found of each temp key. If any lock is no
// longer ours, nothing changes and the error matches [ErrLockLost], naming
// that lock's live key.
//
// Order matters. Extending the locks first means a temp key's deadline is
// never earlier than its lock's, so a stall long enough to lose a temp key
// has already lost the lock and fails with ErrLockLost instead of
// publishing a vanished key. Both happen in one script, at one instant.
func (r Lease) Touch(ctx context.Context, op string, locks []*Lock, temps []string) ([]TempState, error) {
	lockKeys, token, err := CheckLocks(op, locks)
	if err != nil {
		return nil, err
	}
	secs, err := Seconds(op, locks[0].Live, "lock TTL", locks[0].TTL)
	if err != nil {
		return nil, err
	}
	for _, l := range locks[1:] {
		if l.TTL != locks[0].TTL {
			return nil, &Error{Op: op, Key: l.Live, Err: fmt.Errorf("lock TTL %v differs from %v", l.TTL, locks[0].TTL)}
		}
	}
	if err := checkTemps(op, locks[0].Live, temps); err != nil {
		return nil, err
	}
	ks := append(lockKeys, temps...)
	if err := r.SameSlot(op, locks[0].Live, ks...); err != nil {
		return nil, err
	}
	args := []string{token, strconv.FormatInt(secs, 10), strconv.Itoa(len(locks))}
	res, err := touchScript.Exec(ctx, r.client, ks, args).AsIntSlice()
	if err != nil {
		return nil, Fail(ctx, op, locks[0].Live, err)
	}
	if len(res) == 2 && res[0] == codeLockLost && res[1] >= 1 && int(res[1]) <= len(locks) {
		return nil, &Error{Op: op, Key: locks[res[1]-1].Live, Err: ErrLockLost}
	}
	return tempStates(op, locks[0].Live, res, len(temps))
}

// checkTemps refuses an empty temp key.
func checkTemps(op, live string, temps []string) error {
	for _, t := range temps {
		if t == "" {
			return &Error{Op: op, Key: live, Err: errors.New("empty temp key")}
		}
	}
	return nil
}

// tempStates reads the {1, s1, s2, ...} reply of touch or refresh.
func tempStates(op, live string, res []int64, n int) ([]TempState, error) {
	if len(res) != 1+n || res[0] != codeOK {
		return nil, &Error{Op: op, Key: live, Err: fmt.Errorf("unexpected script reply %v", res)}
	}
	states := make([]TempState, n)
	for i := range n {
		switch res[1+i] {
		case tempAbsent:
			states[i] = TempAbsent
		case tempAlive:
			states[i] = TempAlive
		case tempCreated:
			states[i] = TempCreated
		default:
			return nil, &Error{Op: op, Key: live, Err: fmt.Errorf("unexpected script reply %v", res)}
		}
	}
	return states, nil
}

// RefreshChunk is the most temp keys one refresh script renews: a few
// milliseconds of server time at most, whatever the size of a family.
const RefreshChunk = 500

// Refresh renews the TTL of temps, a run's temp keys, to ttl, in scripts of
// at most RefreshChunk keys sent one after the other, so that other clients
// run between them. Each checks first that lock, the run's first lock,
// still holds its token; it does not extend it. Refresh reports what it
// found of each temp key. If the lock is no longer ours it stops and returns
// an error matching [ErrLockLost]; once ctx is done it stops between two
// chunks, and returns its error. It calls chunked, if not nil, after each
// chunk.
func (r Lease) Refresh(ctx context.Context, lock *Lock, temps []string, ttl time.Duration, chunked func()) ([]TempState, error) {
	const op = "lease"
	if err := CheckLock(op, lock); err != nil {
		return nil, err
	}
	secs, err := Seconds(op, lock.Live, "temp key TTL", ttl)
	if err != nil {
		return nil, err
	}
	if err := checkTemps(op, lock.Live, temps); err != nil {
		return nil, err
	}
	out := make([]TempState, 0, len(temps))
	for chunk := range slices.Chunk(temps, RefreshChunk) {
		if err := ctx.Err(); err != nil {
			return nil, Fail(ctx, op, lock.Live, err)
		}
		ks := append([]string{lock.Key}, chunk...)
		if err := r.SameSlot(op, lock.Live, ks...); err != nil {
			return nil, err
		}
		res, err := refreshScript.Exec(ctx, r.client, ks, []string{lock.Token, strconv.FormatInt(secs, 10)}).AsIntSlice()
		if err != nil {
			return nil, Fail(ctx, op, lock.Live, err)
		}
		if len(res) == 1 && res[0] == codeLockLost {
			return nil, &Error{Op: op, Key: lock.Live, Err: ErrLockLost}
		}
		states, err := tempStates(op, lock.Live, res, len(chunk))
		if err != nil {
			return nil, err
		}
		out = append(out, states...)
		if chunked != nil {
			chunked()
		}
	}
	return out, nil
}

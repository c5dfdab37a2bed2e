package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// Lock is a held rebuild lock. It is a plain value, so a caller of the
// lower-level API can build one to fence a [Store.Swap] on.
type Lock struct {
	// Final is the live key the lock guards.
	Final string
	// Key is the lock's Redis key, [Store.LockKey] of Final.
	Key string
	// Token is the random value the lock holds while it is ours.
	Token string
	// TTL is the lock's lifetime; every extension resets it to TTL.
	TTL time.Duration
}

// Acquire takes the rebuild lock of final with one SET NX EX: a 128-bit
// random token that expires after ttl (C6). It never waits or retries. If
// another rebuild holds the lock, Acquire returns an error matching
// [ErrInProgress] that names final, and changes nothing (C7).
//
// ttl must be a positive whole number of seconds.
func (s *Store) Acquire(ctx context.Context, final string, ttl time.Duration) (*Lock, error) {
	locks, err := s.acquire(ctx, "acquire", []string{final}, ttl)
	if err != nil {
		return nil, err
	}
	return locks[0], nil
}

// AcquireAll takes the rebuild locks of several live keys, all under one
// fresh token, for a rebuild that publishes them together. It takes all of
// them or none: if another rebuild holds any of the locks, AcquireAll
// releases those it took and returns an error matching [ErrInProgress] that
// names the first key it could not lock. The locks are taken in sorted key
// order, so two overlapping AcquireAll calls cannot both fail on each other.
//
// On a cluster every lock key must share one hash slot; the returned locks
// are in the order of finals.
func (s *Store) AcquireAll(ctx context.Context, finals []string, ttl time.Duration) ([]*Lock, error) {
	return s.acquire(ctx, "acquire", finals, ttl)
}

func (s *Store) acquire(ctx context.Context, op string, finals []string, ttl time.Duration) ([]*Lock, error) {
	if len(finals) == 0 {
		return nil, &Error{Op: op, Err: errors.New("no keys to lock")}
	}
	for _, f := range finals {
		if err := checkKey(op, f); err != nil {
			return nil, err
		}
	}
	secs, err := seconds(op, finals[0], "ttl", ttl)
	if err != nil {
		return nil, err
	}
	token := newToken()
	locks := make([]*Lock, len(finals))
	lockKeys := make([]string, len(finals))
	for i, f := range finals {
		locks[i] = &Lock{Final: f, Key: s.LockKey(f), Token: token, TTL: ttl}
		lockKeys[i] = locks[i].Key
	}
	if err := s.sameSlot(op, finals[0], lockKeys...); err != nil {
		return nil, err
	}
	if dup := firstDuplicate(lockKeys); dup != "" {
		return nil, &Error{Op: op, Key: finals[0], Err: fmt.Errorf("lock key %q requested twice", dup)}
	}
	order := make([]*Lock, len(locks))
	copy(order, locks)
	slices.SortFunc(order, func(a, b *Lock) int { return strings.Compare(a.Key, b.Key) })
	cmds := make(rueidis.Commands, len(order))
	for i, l := range order {
		cmds[i] = s.client.B().Set().Key(l.Key).Value(token).Nx().ExSeconds(secs).Build()
	}
	var taken []*Lock
	var failed error
	for i, r := range s.client.DoMulti(ctx, cmds...) {
		err := r.Error()
		switch {
		case err == nil:
			taken = append(taken, order[i])
		case failed != nil:
		case rueidis.IsRedisNil(err):
			failed = &Error{Op: op, Key: order[i].Final, Err: ErrInProgress}
		default:
			failed = fail(ctx, op, order[i].Final, err)
		}
		if err != nil && !rueidis.IsRedisNil(err) && !isServerReply(err) {
			// The SET may have run before its reply was lost. The token is
			// ours alone, so compare-and-delete cannot hurt another lock.
			taken = append(taken, order[i])
		}
	}
	if failed == nil {
		return locks, nil
	}
	if len(taken) > 0 {
		if rerr := s.ReleaseAll(ctx, taken); rerr != nil && !errors.Is(rerr, ErrLockLost) {
			s.log.Warn("keyswap: could not release locks after a failed acquire; they expire by themselves",
				"key", taken[0].Final, "lock_key", taken[0].Key, "err", rerr)
		}
	}
	return nil, failed
}

// Extend resets the lock's TTL to l.TTL if it still holds l.Token
// (compare-and-extend, C9). Otherwise nothing changes and Extend returns an
// error matching [ErrLockLost]. A blind EXPIRE would let a stalled rebuild
// keep extending a lock that a successor already took over.
func (s *Store) Extend(ctx context.Context, l *Lock) error {
	_, err := s.touch(ctx, "extend", []*Lock{l}, nil)
	return err
}

// Release deletes the lock if it still holds l.Token (compare-and-delete,
// C8). It never deletes a lock someone else holds: if another rebuild took
// the lock over, Release changes nothing and returns an error matching
// [ErrLockLost]. A lock that is already gone (it expired, or this release
// ran before and its reply was lost) leaves nothing to release: nil.
func (s *Store) Release(ctx context.Context, l *Lock) error {
	return s.ReleaseAll(ctx, []*Lock{l})
}

// ReleaseAll deletes every lock of locks that still holds its token, in one
// compare-and-delete script, and never a lock someone else holds. If
// another rebuild holds some lock, the others are still released and the
// error matches [ErrLockLost]. The locks must share one token.
func (s *Store) ReleaseAll(ctx context.Context, locks []*Lock) error {
	_, err := s.release(ctx, locks)
	return err
}

// release releases locks and deletes the receipt a publish fenced on them
// left, in one script, and reports whether there was one.
func (s *Store) release(ctx context.Context, locks []*Lock) (receipt bool, err error) {
	const op = "release"
	lockKeys, token, err := s.checkLocks(op, locks)
	if err != nil {
		return false, err
	}
	ks := append(lockKeys, keys.ReceiptKey(locks[0].Key))
	if err := s.sameSlot(op, locks[0].Final, ks...); err != nil {
		return false, err
	}
	reply, err := releaseScript.Exec(ctx, s.client, ks, []string{token, "1"}).AsIntSlice()
	if err != nil {
		return false, fail(ctx, op, locks[0].Final, err)
	}
	if len(reply) != 3 {
		return false, &Error{Op: op, Key: locks[0].Final, Err: fmt.Errorf("unexpected release script reply %v", reply)}
	}
	if reply[1] > 0 {
		return reply[2] == 1, &Error{Op: op, Key: locks[0].Final, Err: ErrLockLost}
	}
	return reply[2] == 1, nil
}

// touch extends locks and refreshes the TTL of temps in one lease script.
// It returns what it found of each temp key.
func (s *Store) touch(ctx context.Context, op string, locks []*Lock, temps []string) ([]TempState, error) {
	keys, args, err := s.leaseCall(op, locks, temps)
	if err != nil {
		return nil, err
	}
	return s.leaseReply(ctx, op, locks, temps, leaseScript.Exec(ctx, s.client, keys, args))
}

// leaseCall validates a lease script call and returns its keys and args.
func (s *Store) leaseCall(op string, locks []*Lock, temps []string) (keys, args []string, err error) {
	lockKeys, token, err := s.checkLocks(op, locks)
	if err != nil {
		return nil, nil, err
	}
	secs, err := seconds(op, locks[0].Final, "lock TTL", locks[0].TTL)
	if err != nil {
		return nil, nil, err
	}
	for _, l := range locks[1:] {
		if l.TTL != locks[0].TTL {
			return nil, nil, &Error{Op: op, Key: l.Final, Err: fmt.Errorf("lock TTL %v differs from %v", l.TTL, locks[0].TTL)}
		}
	}
	for _, t := range temps {
		if t == "" {
			return nil, nil, &Error{Op: op, Key: locks[0].Final, Err: errors.New("empty temp key")}
		}
	}
	keys = append(lockKeys, temps...)
	if err := s.sameSlot(op, locks[0].Final, keys...); err != nil {
		return nil, nil, err
	}
	return keys, []string{token, strconv.FormatInt(secs, 10), strconv.Itoa(len(locks))}, nil
}

// leaseReply interprets the lease script's reply.
func (s *Store) leaseReply(ctx context.Context, op string, locks []*Lock, temps []string, r rueidis.RedisResult) ([]TempState, error) {
	reply, err := r.AsIntSlice()
	if err != nil {
		return nil, fail(ctx, op, locks[0].Final, err)
	}
	switch {
	case len(reply) == 2 && reply[0] == codeLockLost && reply[1] >= 1 && int(reply[1]) <= len(locks):
		return nil, &Error{Op: op, Key: locks[reply[1]-1].Final, Err: ErrLockLost}
	case len(reply) != 1+len(temps) || reply[0] != codeOK:
		return nil, &Error{Op: op, Key: locks[0].Final, Err: fmt.Errorf("unexpected lease script reply %v", reply)}
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
			return nil, &Error{Op: op, Key: locks[0].Final, Err: fmt.Errorf("unexpected lease script reply %v", reply)}
		}
	}
	return states, nil
}

// checkLocks validates locks that are used together and returns their keys
// and their common token.
func (s *Store) checkLocks(op string, locks []*Lock) (keys []string, token string, err error) {
	if len(locks) == 0 {
		return nil, "", &Error{Op: op, Err: errors.New("no locks")}
	}
	keys = make([]string, len(locks))
	for i, l := range locks {
		if err := checkLock(op, l); err != nil {
			return nil, "", err
		}
		if l.Token != locks[0].Token {
			return nil, "", &Error{Op: op, Key: l.Final, Err: errors.New("locks used together must share one token")}
		}
		keys[i] = l.Key
	}
	return keys, locks[0].Token, nil
}

// firstDuplicate returns the first string that occurs twice in ss, or "".
func firstDuplicate(ss []string) string {
	seen := make(map[string]bool, len(ss))
	for _, x := range ss {
		if seen[x] {
			return x
		}
		seen[x] = true
	}
	return ""
}

// checkLock refuses a nil lock, or one that could not fence anything.
func checkLock(op string, l *Lock) error {
	switch {
	case l == nil:
		return &Error{Op: op, Err: errors.New("nil lock")}
	case l.Key == "":
		return &Error{Op: op, Key: l.Final, Err: errors.New("lock has an empty key")}
	case l.Token == "":
		// An empty token is the publish script's "unfenced" sentinel:
		// a fence with a blank token would silently be none (C30).
		return &Error{Op: op, Key: l.Final, Err: errors.New("lock token must be non-empty")}
	}
	return nil
}

// isServerReply reports whether err is an error reply from Redis (as
// opposed to a transport error or a cancelled context), after which the
// command certainly did not run.
func isServerReply(err error) bool {
	_, ok := rueidis.IsRedisErr(err)
	return ok
}

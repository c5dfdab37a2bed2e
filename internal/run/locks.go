package run

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// Lock is one held rebuild lock.
type Lock struct {
	// Live is the live key the lock guards.
	Live string
	// Key is the lock's Redis key.
	Key string
	// Token is the random value the lock holds while it is ours.
	Token string
	// TTL is the lock's lifetime; every extension resets it to TTL.
	TTL time.Duration
}

// NewToken returns 128 random bits as 32 hex characters.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Acquire takes the rebuild locks of lives, all under one fresh token, each
// with one SET NX EX, for a rebuild that publishes them together. It never
// waits or retries. It takes all of them or none: if another rebuild holds
// any of the locks, Acquire releases those it took and returns an error
// matching [ErrInProgress] that names the first live key it could not lock.
// The locks are taken in sorted key order, so two overlapping calls cannot
// both fail on each other.
//
// A lock whose SET reply was lost may have been taken; it is released like
// the others, on a [CleanupContext], so that a cancelled ctx does not leave
// it held for its whole TTL. On a cluster every lock key must share one hash
// slot. The returned locks are in the order of lives.
func (r *Redis) Acquire(ctx context.Context, op string, lives []string, ttl time.Duration) ([]*Lock, error) {
	if len(lives) == 0 {
		return nil, &Error{Op: op, Err: errors.New("no keys to lock")}
	}
	for _, l := range lives {
		if err := CheckKey(op, l); err != nil {
			return nil, err
		}
	}
	secs, err := Seconds(op, lives[0], "ttl", ttl)
	if err != nil {
		return nil, err
	}
	token := NewToken()
	locks := make([]*Lock, len(lives))
	lockKeys := make([]string, len(lives))
	for i, l := range lives {
		locks[i] = &Lock{Live: l, Key: r.LockKey(l), Token: token, TTL: ttl}
		lockKeys[i] = locks[i].Key
	}
	if err := r.SameSlot(op, lives[0], lockKeys...); err != nil {
		return nil, err
	}
	if dup := FirstDuplicate(lockKeys); dup != "" {
		return nil, &Error{Op: op, Key: lives[0], Err: fmt.Errorf("lock key %q requested twice", dup)}
	}
	order := slices.Clone(locks)
	slices.SortFunc(order, func(a, b *Lock) int { return strings.Compare(a.Key, b.Key) })
	cmds := make(rueidis.Commands, len(order))
	for i, l := range order {
		cmds[i] = r.client.B().Set().Key(l.Key).Value(token).Nx().ExSeconds(secs).Build()
	}
	var taken []*Lock
	var failed error
	for i, res := range r.client.DoMulti(ctx, cmds...) {
		err := res.Error()
		switch {
		case err == nil:
			taken = append(taken, order[i])
		case failed != nil:
		case rueidis.IsRedisNil(err):
			failed = &Error{Op: op, Key: order[i].Live, Err: ErrInProgress}
		default:
			failed = Fail(ctx, op, order[i].Live, err)
		}
		if err != nil && !rueidis.IsRedisNil(err) && !IsServerReply(err) {
			// The SET may have run before its reply was lost. The token is
			// ours alone, so compare-and-delete cannot hurt another lock.
			taken = append(taken, order[i])
		}
	}
	if failed == nil {
		return locks, nil
	}
	if len(taken) > 0 {
		_ = r.ReleaseAfter(ctx, taken, nil)
	}
	return nil, failed
}

// Release deletes every lock of locks that still holds its token, in one
// compare-and-delete script, and never a lock someone else holds. If
// another rebuild holds some lock, the others are still released and the
// error matches [ErrLockLost]. A lock already gone (it expired, or this
// release ran before and its reply was lost) leaves nothing to release. The
// locks must share one token.
func (r *Redis) Release(ctx context.Context, locks []*Lock) error {
	_, err := r.release(ctx, locks)
	return err
}

// ReleaseAfter releases locks once a rebuild has ended with err, on a
// [CleanupContext], and returns the rebuild's result. A lock that is no
// longer ours needs no release: the rebuild's own error already says so. Any
// other release failure is joined onto err, or logged when err is nil, so
// that it never hides the result.
func (r *Redis) ReleaseAfter(ctx context.Context, locks []*Lock, err error) error {
	ctx, cancel := CleanupContext(ctx)
	defer cancel()
	rerr := r.Release(ctx, locks)
	switch {
	case rerr == nil:
	case errors.Is(rerr, ErrLockLost):
		r.log.Debug("keyswap: lock was no longer ours at release", "key", locks[0].Live, "lock_key", locks[0].Key)
	case err != nil:
		err = errors.Join(err, rerr)
	default:
		r.log.Warn("keyswap: could not release rebuild locks; they expire by themselves",
			"key", locks[0].Live, "lock_key", locks[0].Key, "ttl", locks[0].TTL, "err", rerr)
	}
	return err
}

// release releases locks and deletes the receipt a publish fenced on them
// left, in one script, and reports whether there was one.
func (r *Redis) release(ctx context.Context, locks []*Lock) (receipt bool, err error) {
	const op = "release"
	lockKeys, token, err := CheckLocks(op, locks)
	if err != nil {
		return false, err
	}
	ks := append(lockKeys, keys.ReceiptKey(locks[0].Key))
	if err := r.SameSlot(op, locks[0].Live, ks...); err != nil {
		return false, err
	}
	reply, err := releaseScript.Exec(ctx, r.client, ks, []string{token, "1"}).AsIntSlice()
	if err != nil {
		return false, Fail(ctx, op, locks[0].Live, err)
	}
	if len(reply) != 3 {
		return false, &Error{Op: op, Key: locks[0].Live, Err: fmt.Errorf("unexpected release script reply %v", reply)}
	}
	if reply[1] > 0 {
		return reply[2] == 1, &Error{Op: op, Key: locks[0].Live, Err: ErrLockLost}
	}
	return reply[2] == 1, nil
}

// CheckLocks validates locks that are used together and returns their keys
// and their common token.
func CheckLocks(op string, locks []*Lock) (keys []string, token string, err error) {
	if len(locks) == 0 {
		return nil, "", &Error{Op: op, Err: errors.New("no locks")}
	}
	keys = make([]string, len(locks))
	for i, l := range locks {
		if err := CheckLock(op, l); err != nil {
			return nil, "", err
		}
		if l.Token != locks[0].Token {
			return nil, "", &Error{Op: op, Key: l.Live, Err: errors.New("locks used together must share one token")}
		}
		keys[i] = l.Key
	}
	return keys, locks[0].Token, nil
}

// CheckLock refuses a nil lock, or one that could not fence anything.
func CheckLock(op string, l *Lock) error {
	switch {
	case l == nil:
		return &Error{Op: op, Err: errors.New("nil lock")}
	case l.Key == "":
		return &Error{Op: op, Key: l.Live, Err: errors.New("lock has an empty key")}
	case l.Token == "":
		// An empty token is the publish script's "unfenced" sentinel: a
		// fence with a blank token would silently be none.
		return &Error{Op: op, Key: l.Live, Err: errors.New("lock token must be non-empty")}
	}
	return nil
}

// FirstDuplicate returns the first string that occurs twice in ss, or "".
func FirstDuplicate(ss []string) string {
	seen := make(map[string]bool, len(ss))
	for _, x := range ss {
		if seen[x] {
			return x
		}
		seen[x] = true
	}
	return ""
}

// IsServerReply reports whether err is an error reply from Redis (as
// opposed to a transport error or a cancelled context), after which the
// command certainly did not run.
func IsServerReply(err error) bool {
	_, ok := rueidis.IsRedisErr(err)
	return ok
}

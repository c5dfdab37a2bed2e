package store

import (
	"context"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
)

// Lock is a held rebuild lock. It is a plain value, so a caller of the
// lower-level API can build one to fence a [Store.Swap] on.
type Lock struct {
	// Live is the live key the lock guards.
	Live string
	// Key is the lock's Redis key, [Store.LockKey] of Live.
	Key string
	// Token is the random value the lock holds while it is ours.
	Token string
	// TTL is the lock's lifetime; every extension resets it to TTL.
	TTL time.Duration
}

// core returns l as the run package's lock.
func (l *Lock) core() *protocol.Lock {
	if l == nil {
		return nil
	}
	c := protocol.Lock(*l)
	return &c
}

// Acquire takes the rebuild lock of live with one SET NX EX: a 128-bit
// random token that expires after ttl. It never waits or retries. If
// another rebuild holds the lock, Acquire returns an error matching
// [ErrInProgress] that names live, and changes nothing.
//
// On Redis Cluster the untagged "X" and the tagged "{X}" share one base,
// so one lock (SPEC C104). Once a rebuild of one of them in Generations
// mode stamped the base with its name, Acquire of the other fails with an
// error matching [ErrGroupConflict] that names both, and changes nothing:
// the lock, and what it guards, are that index's. The stamp is checked in
// the same step as the SET, only for such keys; a stamp of another type
// fails it with [ErrTampered].
//
// ttl must be a positive whole number of seconds.
func (s *Store) Acquire(ctx context.Context, live string, ttl time.Duration) (*Lock, error) {
	rl, err := s.redis.Locks.Lock(ctx, "acquire", live, ttl)
	if err != nil {
		return nil, err
	}
	l := Lock(*rl)
	return &l, nil
}

// Extend resets the lock's TTL to l.TTL if it still holds l.Token
// (compare-and-extend). Otherwise nothing changes and Extend returns an
// error matching [ErrLockLost]. A blind EXPIRE would let a stalled rebuild
// keep extending a lock that a successor already took over.
func (s *Store) Extend(ctx context.Context, l *Lock) error {
	_, err := s.redis.Lease.Touch(ctx, "extend", []*protocol.Lock{l.core()}, nil)
	return err
}

// Release deletes the lock if it still holds l.Token (compare-and-delete).
// It never deletes a lock someone else holds: if another rebuild took the
// lock over, Release changes nothing and returns an error matching
// [ErrLockLost]. A lock that is already gone (it expired, or this release
// ran before and its reply was lost) leaves nothing to release: nil.
func (s *Store) Release(ctx context.Context, l *Lock) error {
	return s.redis.Locks.Release(ctx, []*protocol.Lock{l.core()})
}

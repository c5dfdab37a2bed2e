package store

import (
	"context"
	"errors"

	"github.com/keyswap/keyswap/internal/protocol"
)

// Touch renews a rebuild in progress: it extends the lock first and, only if
// the lock is still ours, resets the temp key's TTL to l.TTL. It reports
// whether the temp key exists: true is proof that the rebuild has written
// something, which is what makes it populated.
//
// Order matters. Extending the lock first means the temp key's deadline is
// never earlier than the lock's, so a stall long enough to lose the temp key
// has already lost the lock and fails with [ErrLockLost] instead of
// swapping a vanished key. Both happen in one script, at one instant.
//
// EXPIRE cannot precede the key: the first write is what creates the temp
// key, so touching before it is not an error; Touch then reports false and
// the lock is still extended.
//
// If the lock expired or another rebuild took it over, Touch changes nothing
// and returns an error matching [ErrLockLost].
func (s *Store) Touch(ctx context.Context, l *Lock, temp string) (populated bool, err error) {
	state, err := s.touch(ctx, l, temp)
	return state != protocol.TempAbsent, err
}

// touch is Touch, reporting what it found of temp.
func (s *Store) touch(ctx context.Context, l *Lock, temp string) (protocol.TempState, error) {
	if temp == "" {
		live := ""
		if l != nil {
			live = l.Live
		}
		return protocol.TempAbsent, &Error{Op: "touch", Key: live, Err: errors.New("empty temp key")}
	}
	states, err := s.redis.Lease.Touch(ctx, "touch", []*protocol.Lock{l.core()}, []string{temp})
	if err != nil {
		return protocol.TempAbsent, err
	}
	return states[0], nil
}

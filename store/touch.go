package store

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"

	"github.com/redis/rueidis"
)

// Touch renews a rebuild in progress: it extends the lock first and, only if
// the lock is still ours, resets the temp key's TTL to l.TTL (C11, C13). It
// reports whether the temp key exists: true is proof that the rebuild has
// written something, which is what makes it populated.
//
// Order matters. Extending the lock first means the temp key's deadline is
// never earlier than the lock's, so a stall long enough to lose the temp key
// has already lost the lock and fails with [ErrLockLost] instead of
// swapping a vanished key (C15). Both happen in one script, at one instant.
//
// EXPIRE cannot precede the key: the first write is what creates the temp
// key, so touching before it is not an error; Touch then reports false and
// the lock is still extended (C12).
//
// If the lock expired or another rebuild took it over, Touch changes nothing
// and returns an error matching [ErrLockLost] (C16).
func (s *Store) Touch(ctx context.Context, l *Lock, temp string) (populated bool, err error) {
	if temp == "" {
		return false, &Error{Op: "touch", Key: lockFinal(l), Err: errEmptyTemp}
	}
	states, err := s.touch(ctx, "touch", []*Lock{l}, []string{temp})
	if err != nil {
		return false, err
	}
	return states[0] != TempAbsent, nil
}

// TempState is what a touch found of a temp key.
type TempState int8

const (
	// TempAbsent: the temp key does not exist. Nothing was written to it
	// yet or, if it was populated before, it was lost.
	TempAbsent TempState = iota
	// TempAlive: the temp key existed with a TTL, so it has lived since
	// an earlier touch gave it one.
	TempAlive
	// TempCreated: the temp key existed without a TTL, which the touch
	// then gave it, so it was created since the previous touch. On a key
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

// TouchAll is [Store.Touch] for a rebuild of several keys: in one script it
// extends every lock (which must share one token and TTL) and then resets
// every temp key's TTL. It reports what it found of each temp key. If any
// lock is no longer ours, nothing changes and the error matches
// [ErrLockLost], naming that lock's live key.
func (s *Store) TouchAll(ctx context.Context, locks []*Lock, temps []string) ([]TempState, error) {
	return s.touch(ctx, "touch", locks, temps)
}

// leaseSHA1 is the SHA1 rueidis uses for EVALSHA of the lease script.
var leaseSHA1 = func() string {
	sum := sha1.Sum([]byte(leaseSource))
	return hex.EncodeToString(sum[:])
}()

// TouchCommand returns the EVALSHA that [Store.TouchAll] would run, for a
// caller that sends it inside its own DoMulti, next to a batch's writes, so
// that the renewal costs no extra round trip. Pass its reply to
// [Store.TouchReply].
func (s *Store) TouchCommand(locks []*Lock, temps []string) (rueidis.Completed, error) {
	keys, args, err := s.leaseCall("touch", locks, temps)
	if err != nil {
		return rueidis.Completed{}, err
	}
	return s.client.B().Evalsha().Sha1(leaseSHA1).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), nil
}

// TouchReply interprets the reply to a [Store.TouchCommand] exactly as
// [Store.TouchAll] does. rueidis falls back from EVALSHA to EVAL only for
// commands sent alone, so when the server had no cached copy of the script
// (NOSCRIPT: first use, SCRIPT FLUSH, a restarted server) TouchReply runs
// the touch again through EVALSHA with EVAL fallback. The script only
// compares and extends, so running it twice is harmless.
func (s *Store) TouchReply(ctx context.Context, r rueidis.RedisResult, locks []*Lock, temps []string) ([]TempState, error) {
	if rerr, ok := rueidis.IsRedisErr(r.Error()); ok && rerr.IsNoScript() {
		return s.TouchAll(ctx, locks, temps)
	}
	return s.leaseReply(ctx, "touch", locks, temps, r)
}

// lockFinal returns l.Final, or "" for a nil lock.
func lockFinal(l *Lock) string {
	if l == nil {
		return ""
	}
	return l.Final
}

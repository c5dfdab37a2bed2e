package store

import (
	"context"
	"errors"

	"sync"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
)

// RebuildOptions configures [Store.WithRebuild]. The zero value uses the
// defaults.
type RebuildOptions struct {
	// TTL is the lifetime of the lock and of the temp key between touches:
	// a single batch must complete within it. Zero means DefaultTTL. It
	// must be a whole number of seconds.
	TTL time.Duration
	// PreserveFor is how long the temp key is kept after the swap script
	// itself fails. Zero means DefaultPreserveFor.
	PreserveFor time.Duration
}

// WithRebuild rebuilds live under an exclusive lock, in a bounded-TTL temp
// key, and swaps the result into place. The sequence is Familia's:
//
//  1. Acquire live's lock with SET NX EX. If another rebuild holds it,
//     return an error matching [ErrInProgress] at once; fn does not run.
//     On Redis Cluster, if another index owns live's base (see
//     [Store.Acquire]), return an error matching [ErrGroupConflict]; fn
//     does not run.
//  2. Call fn(ctx, temp, touch) with a new temp key. fn writes batches into
//     temp and calls touch after each one; touch extends the lock, then the
//     temp key's TTL, and returns an error matching [ErrLockLost] once the
//     lock is gone.
//  3. Touch once more after fn returns, re-verifying ownership.
//  4. Swap temp into live, fenced on the lock's token, so a rebuild that
//     lost its lock cannot publish over its successor.
//  5. Release the lock, compare-and-delete, on every path.
//
// A rebuild is all or nothing. An error from fn or from the final touch
// deletes the temp key, leaves live untouched, and is returned unchanged. A
// panic in fn gets the same cleanup and keeps panicking. If fn populated the
// temp key but it is gone after the final touch, the result matches
// [ErrTempKeyLost] ("vanished before the swap") and live is left unchanged.
// Swap failures are described at [Store.Swap]; a swap whose reply was lost
// is settled from the receipt it leaves, so WithRebuild returns nil for a
// swap that happened, and an error matching [ErrOutcomeUnknown] only when
// Redis cannot be asked.
//
// A failure to release the lock never hides the result: it is joined onto a
// returned error, and logged after a success (the lock then expires within
// TTL).
//
// fn must write temp through the same Redis deployment and database as the
// Store's client: the lock, the touches and the swap all run there. touch is
// safe to call from several goroutines.
//
// Beyond Familia, a touch also notices a populated temp key that was lost
// (evicted, say) and then re-created by a later write: it would hold only
// the later batches, so touch and WithRebuild fail with [ErrTempKeyLost]
// instead of publishing it. The sign is a temp key without a TTL after one
// was seen, so writes must not remove the temp key's TTL: a plain SET or a
// *STORE command into the temp key does; use SET KEEPTTL.
func (s *Store) WithRebuild(ctx context.Context, live string, opts RebuildOptions,
	fn func(ctx context.Context, temp string, touch func(context.Context) error) error) (err error) {
	const op = "rebuild"
	if err := protocol.CheckKey(op, live); err != nil {
		return err
	}
	if fn == nil {
		return &Error{Op: op, Key: live, Err: errors.New("nil callback")}
	}
	ttl := protocol.OrDefault(opts.TTL, DefaultTTL)
	if _, err := protocol.Seconds(op, live, "TTL", ttl); err != nil {
		return err
	}
	preserveFor := protocol.OrDefault(opts.PreserveFor, DefaultPreserveFor)
	if _, err := protocol.Seconds(op, live, "PreserveFor", preserveFor); err != nil {
		return err
	}

	lock, err := s.Acquire(ctx, live, ttl)
	if err != nil {
		return err
	}
	defer func() { err = s.redis.Locks.ReleaseAfter(ctx, []*protocol.Lock{lock.core()}, err) }()

	tr := &tracker{temp: &protocol.Temp{Live: live, Key: s.NewTempKey(live)}}
	touch := func(ctx context.Context) error {
		state, err := s.touch(ctx, lock, tr.temp.Key)
		if err != nil {
			return err
		}
		return tr.observe(state)
	}

	// Until the swap takes ownership of the temp key, every way out of this
	// function, a panic included, discards it.
	discard := true
	defer func() {
		if discard {
			s.redis.Discard(ctx, live, tr.temp.Key)
		}
	}()
	if err := fn(ctx, tr.temp.Key, touch); err != nil {
		return err
	}
	if err := touch(ctx); err != nil {
		return err
	}
	discard = false
	// No touch can run any more: fn has returned.
	if tr.temp.Populated() && !tr.present {
		// Expired, evicted or swept between touches. The swap would read
		// the missing key as an empty result set and delete the live index.
		return &Error{Op: op, Key: live, Err: tr.temp.Lost("vanished before the swap")}
	}
	populated := PopulatedNo
	if tr.temp.Populated() {
		// What the touches saw goes into the script itself, so a temp key
		// that vanishes after the last touch fails closed inside the atomic
		// step instead of being read as an empty rebuild.
		populated = PopulatedYes
	}
	// A lost reply (a dropped connection, a timeout) leaves it open whether
	// the swap ran; settling finds out from its receipt, so that a swap that
	// happened is not reported as a failure, nor one that did not as a
	// success.
	_, err = s.swap(ctx, tr.temp.Key, live, SwapOptions{Lock: lock, Populated: populated, PreserveFor: preserveFor}, true)
	return err
}

// tracker is what the touches of one WithRebuild saw of its temp key. The
// callback may touch from several goroutines, hence the mutex; it is not
// held across the touch itself.
type tracker struct {
	temp *protocol.Temp

	mu      sync.Mutex
	present bool  // the last touch found the temp key
	lost    error // sticky: the re-created key has a TTL again after
}

// observe records what a touch found, and returns an error matching
// ErrTempKeyLost once the temp key was found lost and re-created.
func (tr *tracker) observe(state protocol.TempState) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.lost != nil {
		return tr.lost
	}
	switch state {
	case protocol.TempCreated:
		if err := tr.temp.Created(); err != nil {
			tr.lost = &Error{Op: "touch", Key: tr.temp.Live, Err: err}
			return tr.lost
		}
	case protocol.TempAlive:
		// The callback gave the key a TTL itself: it is populated all the
		// same, and a later creation is a loss.
		tr.temp.MarkPopulated()
	}
	tr.present = state != protocol.TempAbsent
	return nil
}

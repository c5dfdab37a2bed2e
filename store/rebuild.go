package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
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

// WithRebuild rebuilds final under an exclusive lock, in a bounded-TTL temp
// key, and swaps the result into place. The sequence is Familia's:
//
//  1. Acquire final's lock with SET NX EX. If another rebuild holds it,
//     return an error matching [ErrInProgress] at once; fn does not run.
//  2. Call fn(ctx, temp, touch) with a new temp key (C17). fn writes batches
//     into temp and calls touch after each one; touch extends the lock, then
//     the temp key's TTL, and returns an error matching [ErrLockLost] once
//     the lock is gone.
//  3. Touch once more after fn returns (C14), re-verifying ownership.
//  4. Swap temp into final, fenced on the lock's token (C21), so a rebuild
//     that lost its lock cannot publish over its successor.
//  5. Release the lock, compare-and-delete, on every path (C8).
//
// A rebuild is all or nothing. An error from fn or from the final touch
// deletes the temp key, leaves final untouched, and is returned unchanged
// (C18). A panic in fn gets the same cleanup and keeps panicking. If fn
// populated the temp key but it is gone after the final touch, the result
// matches [ErrTempKeyLost] ("vanished before the swap") and final is left
// unchanged (C20). Swap failures are described at [Store.Swap].
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
// instead of publishing it (C45). The sign is a temp key without a TTL after
// one was seen, so writes must not remove the temp key's TTL: a plain SET or
// a *STORE command into the temp key does; use SET KEEPTTL.
func (s *Store) WithRebuild(ctx context.Context, final string, opts RebuildOptions,
	fn func(ctx context.Context, temp string, touch func(context.Context) error) error) (err error) {
	const op = "rebuild"
	if err := checkKey(op, final); err != nil {
		return err
	}
	if fn == nil {
		return &Error{Op: op, Key: final, Err: errors.New("nil callback")}
	}
	ttl := orDefault(opts.TTL, DefaultTTL)
	if _, err := seconds(op, final, "TTL", ttl); err != nil {
		return err
	}
	preserveFor := orDefault(opts.PreserveFor, DefaultPreserveFor)
	if _, err := seconds(op, final, "PreserveFor", preserveFor); err != nil {
		return err
	}

	lock, err := s.Acquire(ctx, final, ttl)
	if err != nil {
		return err
	}
	defer func() { err = s.releaseAfter(ctx, []*Lock{lock}, err) }()

	temp := s.NewTempKey(final)
	// seen: some touch found temp; present: the last one did; lost: a touch
	// found it re-created after it was seen, so it holds only part of the
	// rebuild. lost is sticky: the re-created key has a TTL again after.
	// The callback may touch from several goroutines, hence the mutex; it is
	// not held across the touch itself.
	var (
		mu                  sync.Mutex
		seen, present, lost bool
	)
	touch := func(ctx context.Context) error {
		states, err := s.touch(ctx, "touch", []*Lock{lock}, []string{temp})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if states[0] == TempCreated && seen {
			lost = true
		}
		if lost {
			return recreatedError("touch", final, temp)
		}
		present = states[0] != TempAbsent
		seen = seen || present
		return nil
	}

	// Until the swap takes ownership of the temp key, every way out of this
	// function, a panic included, discards it.
	discard := true
	defer func() {
		if discard {
			s.discardTemp(ctx, final, temp)
		}
	}()
	if err := fn(ctx, temp, touch); err != nil {
		return err
	}
	if err := touch(ctx); err != nil {
		return err
	}
	discard = false
	mu.Lock()
	vanished := seen && !present
	mu.Unlock()
	if vanished {
		// Expired, evicted or swept between touches. The swap would read
		// the missing key as an empty result set and delete the live index.
		return &Error{Op: op, Key: final, Err: fmt.Errorf("%w: %s vanished before the swap; live key left unchanged", ErrTempKeyLost, temp)}
	}
	populated := PopulatedNo
	if seen { // no touch can run any more: fn has returned
		// What the touches saw goes into the script itself, so a temp key
		// that vanishes after the last touch fails closed inside the atomic
		// step instead of being read as an empty rebuild.
		populated = PopulatedYes
	}
	_, err = s.Swap(ctx, temp, final, SwapOptions{Lock: lock, Populated: populated, PreserveFor: preserveFor})
	// A lost reply (a dropped connection, a timeout) leaves it open whether
	// the swap ran; Settle finds out, so that a swap that happened is not
	// reported as a failure, nor one that did not as a success.
	published, err := s.Settle(ctx, err, []*Lock{lock})
	if published {
		return nil
	}
	return err
}

// releaseAfter releases locks once a rebuild has ended with err, and returns
// the rebuild's result. A lock that is no longer ours needs no release: the
// rebuild's own error already says so. Any other release failure is joined
// onto err, or logged when err is nil, so it never hides the result (C8).
func (s *Store) releaseAfter(ctx context.Context, locks []*Lock, err error) error {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	for _, l := range locks {
		rerr := s.Release(ctx, l)
		switch {
		case rerr == nil:
		case errors.Is(rerr, ErrLockLost):
			s.log.Debug("keyswap: lock was no longer ours at release", "key", l.Final, "lock_key", l.Key)
		case err != nil:
			err = errors.Join(err, rerr)
		default:
			s.log.Warn("keyswap: could not release rebuild lock; it expires by itself", "key", l.Final, "lock_key", l.Key, "ttl", l.TTL, "err", rerr)
		}
	}
	return err
}

// recreatedError reports a temp key that was lost and re-created.
func recreatedError(op, final, temp string) error {
	return &Error{Op: op, Key: final, Err: fmt.Errorf(
		"%w: %s vanished and was re-created by a later write, so it holds only part of the rebuild (or a write removed its TTL, as a plain SET does: use SET KEEPTTL); live key left unchanged",
		ErrTempKeyLost, temp)}
}

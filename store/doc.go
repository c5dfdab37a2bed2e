// Package store is keyswap's Redis core, a port of Ruby's
// Familia::AtomicOperations to rueidis: key naming, the rebuild lock, touch,
// the fenced atomic swap, the WithRebuild lifecycle, and the sweep of
// orphaned temp keys.
//
// Most programs use package rebuild, which runs the same steps for many keys
// at once, from a typed source. Use Store directly to rebuild one key by
// hand:
//
//	s := store.New(client, store.Options{})
//	err := s.WithRebuild(ctx, "users:by-email", store.RebuildOptions{},
//		func(ctx context.Context, temp string, touch func(context.Context) error) error {
//			for batch := range batches {
//				if err := client.Do(ctx, hsetAll(temp, batch)).Error(); err != nil {
//					return err
//				}
//				if err := touch(ctx); err != nil {
//					return err
//				}
//			}
//			return nil
//		})
//
// # Guarantees
//
// Readers see either the old value or the new one, never a missing or
// half-built key. At most one rebuild of a key runs at a time; a second one
// fails at once with ErrInProgress. A rebuild that lost its lock cannot
// publish: the lock's token is checked inside the same script that renames
// the temp key. Every failure leaves the live key untouched, and every temp
// key gets a bounded TTL once written.
//
// # Lifecycle
//
// [Store.WithRebuild] acquires "<key>:rebuild-lock" with SET NX EX, hands the
// callback a unique temp key "<key>:rebuild:<unix>:<16 hex>" and a touch
// function, touches once more when the callback returns, swaps fenced on the
// lock, and releases the lock on every path. The lower-level methods
// ([Store.Acquire], [Store.Touch], [Store.Swap], [Store.Release]) are the
// same steps, for callers who need to arrange them differently.
//
// TTLs: the lock and the temp key live for TTL (default 300 s) between
// touches, so a single batch must complete within TTL. The temp key has no
// TTL until the first touch after its first write. After the swap script
// itself fails, a populated temp key is kept for PreserveFor (default
// 3600 s). After a successful swap the live key has no TTL.
//
// # Errors
//
// Methods return *Error, which names the operation and the live key, and
// wraps one of the sentinels ErrInProgress, ErrLockLost (which also matches
// ErrInProgress) and ErrTempKeyLost, a Redis or transport error, or a
// description of bad input. Use errors.Is and errors.As. On Redis Cluster,
// a key whose base another index owns (SPEC C104) is refused with
// ErrGroupConflict, and an owner stamp written by hand with ErrTampered.
//
// A swap whose reply was lost (a dropped connection, a timeout) may or may
// not have happened. A fenced swap leaves a short-lived receipt in the same
// atomic step, and [Store.WithRebuild] reads it after a lost reply: it
// returns nil for a swap that happened, and an error matching
// ErrOutcomeUnknown only when Redis cannot be asked.
//
// # Concurrency
//
// A Store is safe for concurrent use. Every command goes through the one
// rueidis.Client given to New, so wrapping that client (for example with
// rueidishook) sees them all.
//
// # Redis Cluster
//
// On a cluster client the lock and temp keys are placed in the live key's
// hash slot (see [Store.LockKey]), so the fenced swap is one single-slot
// script. Sweep scans every master.
//
// # Writes during a rebuild
//
// Writes made to the live key while a rebuild runs are replaced by the
// swap: the rebuilt value is a snapshot of the source, not a merge.
package store

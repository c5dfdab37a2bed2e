// Package protocol is keyswap's protocol in Redis: the keys and the Lua
// scripts through which runs, Apply, rollbacks and operators coordinate,
// and the Go side of each step. Package store (the single-key API) and
// package rebuild (the pipeline) share it: taking and releasing a run's
// locks, renewing its lease, publishing its temp keys in one fenced script
// (or flipping the pointers of its generations), settling a publish whose
// reply was lost, and discarding what a failed run wrote.
//
// Every step is written once, here. A run of one key (store.WithRebuild) is
// a run of several (rebuild.Rebuilder.Run) with one key.
//
// # Concerns
//
// [Redis] holds one small type per concern, over one shared [Core] (the
// client, the key shapes, the logger): [Locks], [Lease], [Publisher],
// [Generations], [Changes], [Operator] and [Durable]. Each says in its doc
// which keys and scripts it touches.
//
// # Lifecycle
//
//  1. [Locks.Acquire] takes one lock per live key under one fresh token,
//     all or none.
//  2. The caller writes temp keys and renews the lease with [Lease.Beat]
//     (or [Lease.BeatCommand] inside its own DoMulti, and
//     [Lease.BeatReply]) and the temp keys' TTL with [Lease.Refresh] (a
//     single key's with [Lease.Touch]). [Temp] tracks what the renewals
//     and writes saw of each temp key, and reports a temp key lost or
//     re-created.
//  3. [Publisher.Publish] checks the locks and the temp keys and publishes
//     them in one script, and, with Settle, finds out whether a publish
//     whose reply was lost ran ([Generations.Flip] in Generations mode).
//  4. [Core.Discard] removes the temp keys of a run that will not publish,
//     and [Locks.ReleaseAfter] releases the locks on every path.
//
// Cleanup that must survive the caller's cancelled context runs on
// [CleanupContext].
//
// # Errors
//
// Methods return *[Error], which names the operation and the live key and
// wraps one of the sentinels [ErrInProgress], [ErrLockLost],
// [ErrTempKeyLost], [ErrOutcomeUnknown], [ErrWritesLost], [ErrTampered]
// (a key keyswap relies on, a run's log of changes or its record, holds
// what keyswap did not write: an entry that is not a change of the log's
// builder, more entries than Apply counted, a record of another token),
// [ErrNoPermission], [ErrFallingBehind], [ErrNotDurable], [ErrAborted],
// [ErrTooManyKeys] or [ErrNothingToRollBack], a Redis or transport error,
// or a description of bad input. Packages store and rebuild re-export them.
//
// # State
//
// The keys a run keeps, their fields and the schema's version are defined
// in one place, record.go ([Record], [RecordVersion]); the scripts name
// the same fields. So are the codes the scripts reply with, in codes.go
// (replyCodes): a script names them (return {LOCK_LOST, i}), and [Expand]
// starts the script's text with a line that defines those it names, so
// that the text sent, and the SHA1 that EVALSHA sends, include it.
package protocol

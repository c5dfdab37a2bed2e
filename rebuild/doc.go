// Package rebuild rebuilds Redis indexes from a source of truth in one pass,
// and publishes them atomically, with zero downtime.
//
// A [Rebuilder] pulls items from a [sources.Source], turns batches of them
// into commands through its builders (package builders: hashes, sorted
// sets, sets, one set per value; package index for your own), writes them
// to fresh temp keys, and when the source is exhausted publishes every key
// in one fenced Lua script:
//
//	emails := builders.Hash("users:by-email", func(u User) (string, string, bool) {
//		return u.Email, u.ID, !builders.Blank(u.Email)
//	})
//	scores := builders.SortedSet("users:by-score", func(u User) (string, float64, bool) {
//		return u.ID, u.Score, true
//	})
//	countries := builders.SetIndex("users:by-country", func(u User) (string, string, bool) {
//		return u.Country, u.ID, !builders.Blank(u.Country)
//	})
//	r, err := rebuild.New(client, rebuild.Options{}, emails, scores, countries)
//	if err != nil {
//		return err // a configuration error: nothing was sent
//	}
//	stats, err := r.Run(ctx, sources.Slice(users))
//
// # Guarantees
//
// Readers see every key old or every key new: never a missing, empty or
// half-built key. At most one rebuild of a key runs at a time: a second run
// fails at once with [ErrInProgress]. A run that loses its lease cannot
// publish, because the lock token is checked inside the publish script. A
// failed run leaves every live key untouched and no temp key behind.
//
// # Lifecycle
//
//  1. Lock every builder's key (a family's prefix) under one token, and open
//     the run's record next to the first lock, in one script that first
//     checks every right the run will need. If any lock is held, return an
//     error matching ErrInProgress that names the key. Nothing is written.
//  2. Pull the source and write its items through the pipeline below,
//     renewing the lease (see Lease).
//  3. Catch up: replay the changes applied to the live keys meanwhile (see
//     Writes during a rebuild) onto the temp keys.
//  4. If Options.Guards are set, or the run is held (Rebuilder.Build), review
//     the result: a guard may refuse it (guards.ErrRefused), and a held run
//     waits for Held.Publish, Held.Discard or an operator, renewing its
//     lease, then catches up again.
//  5. Publish: wait for Options.Durability, if set; then one script checks
//     the rights, the locks, the record (every batch Redis acknowledged is
//     still there: otherwise ErrWritesLost) and the temp keys, replaces every
//     live key, deletes the keys of builders that produced nothing and the
//     family buckets the run no longer produced, replays the changes logged
//     since the catch-up, and advances every key's generation.
//  6. Release the locks.
//
// # Pipeline
//
// The caller's goroutine pulls the source and cuts batches of
// Options.BatchSize items. Each batch is built, turned into commands by the
// builders, in a goroutine of its own, up to Options.Writers batches ahead.
// One sender takes the built batches in source order and writes those
// already waiting, up to Writers/2, in one pipelined round trip while the
// next ones are being built. Each batch is one MULTI/EXEC transaction that
// also gives every temp key it creates its TTL, so no temp key outlives a
// crashed process by more than the TTL; the lease renewal rides in the same
// round trip when one is due. A batch holds one of Writers slots from the
// moment it is cut until it is written, and the source is pulled only as a
// slot frees: memory is bounded by (Writers+1) × BatchSize items, whatever
// the size of the source.
//
// rueidis writes a whole round trip before any of it leaves, and the server
// waits meanwhile, so the sender keeps a second round trip in flight
// whenever the order of the two cannot change the result, as the builders'
// [index.Order] says:
//
//   - when every builder is [index.AnyOrder] (builders.Set,
//     builders.SetIndex), always;
//   - when every builder is AnyOrder or [index.ByEntry] (builders.Hash,
//     builders.SortedSet), unless the two write a common field or member of
//     a ByEntry builder: then the later waits for the earlier, so that the
//     last write in source order wins;
//   - with an [index.InOrder] builder (builders.Func, builders.Compat, one
//     of your own without an Order method), never: one round trip at a
//     time, in source order;
//   - with [Options.Unordered], always, whatever the builders.
//
// The round trips go on a connection of their own, which the run takes from
// the client's blocking pool (rueidis ClientOption.BlockingPoolSize) as it
// starts and gives back as it ends. rueidis pipelines every other command
// of the client on a few shared connections: there, the application's
// commands would wait behind a round trip of the run's transactions (about
// 360 KB at the default BatchSize and Writers) on the way to Redis and back.
// Apart from them, they wait only for what the server is running at that
// moment, as the commands of any other client do. While the pool gives no
// connection within a second, the writes go on the shared connections,
// with one warning, until one comes (see Options.LatencyBudget for the
// pool's size). A connection that closes between two writes is replaced,
// on RESP3 and on RESP2; on a cluster, a round trip whose master no longer
// serves the run's slot (it moved: MOVED, or ASK while it moves) ran none
// of the transactions it redirected, which go again on the shared
// connections, and a connection to the new master carries the next.
//
// # Pacing
//
// Pulling the source is what a run paces: Options.MaxRate (or an
// operator's throttle, "keyswap throttle") caps the items per second, and
// Options.LatencyBudget sets a cap of its own from how long other clients
// wait behind the run, as the run's own probes measure it (round trips of
// a GET on connections of its own, 100 a second, to the server of each
// lock): it starts low, rises while they are well under the budget, and
// falls when they are over. The
// pacing applies while the source runs, between batches; a batch's
// transaction runs whole, so Options.BatchSize bounds what one batch adds
// to another client's wait. The catch-up and the publish are not paced.
//
// # Errors
//
// New returns an *Error of Op "config" for invalid options or builders,
// and Run returns an *Error naming the failed step and wrapping its cause, so
// errors.Is and errors.As see the source's error, a Redis error,
// context.Canceled, or one of the sentinels: [ErrInProgress], [ErrLockLost]
// (which also matches ErrInProgress), [ErrTempKeyLost], [ErrWritesLost]
// (which also matches ErrTempKeyLost), [ErrNoPermission], [ErrNotDurable],
// [ErrStalled], [ErrAborted], [guards.ErrRefused], [ErrDiscarded],
// [ErrFallingBehind], [ErrTooManyKeys], [ErrTampered] (a key keyswap relies
// on, a run's log of changes or its record, holds what keyswap did not
// write: an entry that is not a change of the log's own keys, more entries
// than Apply counted, or a record of another token). Any of those means that
// nothing was published. When the
// publish script's reply is lost (a dropped connection, a timeout, a
// cancelled context), Run finds out from the receipt the publish leaves
// whether it ran: if it did, Run succeeds; only if Redis cannot be asked
// does the error match [ErrOutcomeUnknown], and then every live key holds
// its old value or every one its new value. After a failure of the publish
// script itself the temp keys are kept for Options.PreserveFor, for
// diagnosis; after every other failure they are deleted.
//
// # Concurrency
//
// A Rebuilder is safe for concurrent use. Run is synchronous: every
// goroutine it starts has ended when it returns. Builders are called
// concurrently for different batches; Progress is called from one goroutine
// (the sender).
//
// # Redis Cluster
//
// One publish is one script, so on a cluster every key of a Rebuilder must
// share one hash slot: give the keys a common hash tag, such as
// "{users}:by-email" and "{users}:by-country". New refuses keys in different
// slots.
//
// The keys keyswap keeps next to an untagged key X hang off "{X}", which
// is also the tagged key "{X}" itself: the two would share every one. The
// first run of either in Generations mode stamps that base with its key
// ("<base>:rebuild-owner", no TTL); a run or a rollback of the other, in
// either mode, fails with [ErrGroupConflict], naming both, before it
// writes anything. Runs in RenameInPlace mode only check the stamp: two
// indexes X and "{X}" that both rebuild in place still share their base,
// so do not name two indexes so. A key with a tag of its own,
// "{users}:by-email", has a base of its own, and no stamp.
//
// # Lease
//
// A run's locks live for Options.TTL, its temp keys for twice that at
// least. The heartbeat, every second (or TTL/3 if shorter), checks that
// every lock and record still holds the run's token, that the run's record
// holds every batch Redis acknowledged, and that each log of changes holds
// what Apply counted; renews the locks; writes the run's status; and reads
// an operator's requests. It rides in a batch's round trip, and goes alone
// only when no batch went out for half its period. The refresh, every
// TTL/3, in a goroutine of its own, renews the temp keys' TTL, at most 500
// keys per script, so that no renewal blocks Redis for long whatever a
// family's size; a refresh that takes long makes the temp keys' TTL grow
// (and logs it) rather than hold the heartbeats back. The lease lasts
// through the wait for Options.Durability. A run whose heartbeats cannot
// reach Redis for a whole TTL fails with ErrLockLost; one whose source
// yields nothing for Options.StallTimeout, with ErrStalled.
//
// # Writes during a rebuild
//
// [Rebuilder.Apply] applies a change to an item (its old and new value) to
// the live keys through the builders ([index.Incremental]), in one atomic script.
// When a run of those keys is in progress, in any process, the script also
// logs the change for it, next to its lock. After the source's last item,
// the run replays its logs onto the temp keys, until at most [PublishTail]
// changes are left, and the publish script replays those in the same
// atomic step as the renames: no change falls between the catch-up and the
// publish, and each change overrides the source's read of the same item.
//
// The source must show every change committed before it reads (read the
// primary, not a lagging replica; do not start from a snapshot taken before
// the run), and the application must apply each change after committing
// it, the changes of one item in commit order, retrying an Apply until it
// succeeds: while a rebuild that does not log changes holds a key's lock
// (store.WithRebuild, a Familia rebuild, a rollback), Apply refuses the
// change with ErrInProgress, writing nothing. Writes to the live keys made
// without Apply are replaced by the publish. A log holds at most
// Options.MaxChanges changes and the catch-up may take
// Options.CatchUpTimeout: past either, the run fails with ErrFallingBehind,
// and the live keys hold every change.
//
// The log is input from other processes: Apply counts every entry in the
// run's record as it appends it, and the catch-up and the publish check
// every log against its count and every entry against the log's builder
// (its key, or a bucket of its family); anything else fails the run with
// ErrTampered or ErrWritesLost, and nothing is published. A member of a Set
// or SetIndex belongs to one item (a run whose items share one fails); a
// Hash's field or a SortedSet's member is removed only while it holds the
// old item's value.
//
// # Generations
//
// With Options.Publish set to [Generations], a run does not write temp keys
// and rename them: it allocates a new generation of each index (a number,
// in the index's registry "<base>:rebuild-gens") and writes the index's
// data under it, "<key>:rebuild-g:<G>" for a plain key and
// "<prefix>:rebuild-g:<G>:<bucket>" for a family's bucket, without a TTL.
// The publish is a flip: one script, fenced as the rename publish is,
// points each index's pointer ("<base>:rebuild-ptr") at its new generation.
// It costs the same whatever the size of the index, so MaxKeys does not
// bind, and on Redis Cluster a family's buckets need no hash tag: they
// spread over every slot, and the run counts its transactions per slot to
// detect lost writes before the flip; it also compares each key's size
// with the entries its writes added, to tell a key deleted or evicted
// during the run (Options.SkipSizeCheck skips that, and watches the
// masters' evicted_keys instead). Readers resolve the pointer first,
// then read the generation's keys; an index without a pointer is in the
// rename-in-place shape.
//
// After the flip the old generation stays readable for Options.Grace, which
// must exceed the time a reader caches a pointer, and is then removed in
// small chunks; with KeepPrevious it stays as the previous generation
// instead, and [Rebuilder.Rollback] flips back to it. A failed run never
// touches a pointer and removes its own generation. [Rebuilder.Apply]
// writes a change to the current generation and, while a run is in
// progress, logs it for the run, which replays it onto its own generation;
// the flip replays the last changes itself where the run's keys share its
// locks' slot, and elsewhere (on a cluster, a family without a hash tag,
// or the indexes of a group) the run cuts over, holding Apply back for a few milliseconds while it
// drains its log and flips (see Apply). On a
// cluster the writes of a run in this mode go on the client's shared
// connections, not on a connection of their own.
//
// What runs leave behind (a generation retired while the run's ctx was
// cancelled during the grace, or with a negative Grace; the generation of
// a run that crashed) is removed by [Rebuilder.Sweep], in small chunks,
// on the server's clock, at any time. Switching an index between the
// modes keeps it readable throughout: to Generations, deploy readers that
// resolve the pointer, run in Generations mode (its flip creates the
// pointer over the plain keys), then call [Rebuilder.DropPlain] to remove
// the plain keys; back to RenameInPlace, run in that mode: its publish
// deletes the pointer in the same script as it renames the plain keys into
// place, and retires the generations, which a later Sweep removes.
//
// # Groups
//
// On Redis Cluster a run flips the pointers of all its indexes in one
// script, so without more they share a hash slot: their keys' own, which a
// common hash tag then pins their data to as well. Options.Group (in
// Generations mode) puts the Rebuilder's indexes in a group instead: every
// control key of each index (its lock, run record, log of changes,
// requests, meta, pointer and registry) hangs off
// "{<group>}:rebuild-group:<key>", in the group's slot, while the data keys
// keep the index's name and spread over every master. Readers give the same
// group (reader.Options.Group), and so does the CLI (keyswap rollback
// --group, keyswap status --group --index).
//
// The data keys of a generation do not name the group, and each registry
// numbers its generations from 1, so one index is written in one group
// only, or in none. A run with a group claims each index before it
// allocates a generation: one script per index, in the slot of the
// index's own control keys, sets its pointer outside the group to
// "group:<group>", unless that pointer names a generation or another
// group, or the index's registry outside the group holds a generation
// (building, kept or retired), which fail the run with [ErrGroupConflict]
// before it writes anything. A claimed index is then refused, naming the
// group, by a run without a group or in another one (its allocation, in
// the same slot as the claim, reads the claim: whichever comes first
// wins), by Apply, Rollback and a reader without a group, and by a
// RenameInPlace publish, which keeps the claim rather than delete it. To
// move an index with generations of its own into a group, switch it back
// to rename-in-place and sweep its generations first, or build it under a
// new key. See docs/generations.md, "Groups".
//
// # Safe publishing
//
// Options.Guards refuse a suspicious result before it is published
// ([guards.RefuseEmpty], [guards.RefuseShrink]). [Rebuilder.Build] stops short of the
// publish and returns a [Held] run, which keeps its lease while the program
// or an operator inspects it ([Held.Review], [Held.Diff]) and then publishes
// or discards it. With Options.KeepPrevious, the publish keeps the values
// it replaces, and [Rebuilder.Rollback] swaps them back. Every publish
// advances each key's generation, in Stats.Generations and in
// "<key>:rebuild-gen".
package rebuild

// Package rebuild rebuilds Redis indexes from a source of truth in one pass,
// and publishes them atomically, with zero downtime.
//
// A [Rebuilder] pulls items from a source, cuts them into batches, turns
// each batch into commands through its builders (package builders: hashes,
// sorted sets, sets, one set per value), concurrently, and sends them to
// fresh temp keys in source order. When the source is exhausted it publishes every
// key in one fenced Lua script:
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
//	r := rebuild.New(client, rebuild.Options{}, emails, scores, countries)
//	stats, err := r.Run(ctx, rebuild.FromSlice(users))
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
// Run locks every builder's key (under one token), streams the source,
// renews the lease as batches complete, publishes, and releases the locks.
// Each batch is one MULTI/EXEC transaction that also gives every temp key it
// creates its TTL, so no temp key outlives a crashed process by more than
// the TTL.
// Memory is bounded by (Writers+1) × BatchSize items, whatever the size of
// the source: the source is pulled only as fast as Redis takes the writes.
// Batches are built concurrently and sent in source order; two round trips
// overlap only when their order cannot matter ([Commutative] builders, or
// [Keyed] ones that write no entry in common), so the last write of a field
// or member in the source wins, unless [Options.Unordered] trades that for
// speed. Writes made to a live key while its rebuild runs are replaced by
// the publish: the result is a snapshot of the source, not a merge.
//
// # Errors
//
// Run returns an *Error naming the failed step and wrapping its cause, so
// errors.Is and errors.As see the source's error, a Redis error,
// context.Canceled, or one of [ErrInProgress], [ErrLockLost] and
// [ErrTempKeyLost]. Any of those means that nothing was published. When the
// publish script's reply is lost, Run finds out whether it ran; only if
// Redis cannot be asked does the error match [ErrOutcomeUnknown], and then
// every live key holds its old value or every one its new value.
//
// # Concurrency
//
// A Rebuilder is safe for concurrent use. Run is synchronous: every
// goroutine it starts has ended when it returns. Builders are called
// concurrently for different batches; Progress is called from one goroutine
// (the one that sends the batches).
//
// # Redis Cluster
//
// One publish is one script, so on a cluster every key of a Rebuilder must
// share one hash slot: give the keys a common hash tag, such as
// "{users}:by-email" and "{users}:by-country". Run refuses keys in different
// slots before writing anything.
package rebuild

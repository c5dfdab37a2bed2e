// Package builders provides the index.Builder implementations for the
// index kinds of Familia, in Go: a hash (a unique index, field → value), a
// sorted set (a timeline or leaderboard), a set, and a family of sets, one
// per value (SetIndex). Func and Compat adapt plain functions, the latter
// written against the go-redis-style API of rueidiscompat.
//
// Each builder takes a function that maps an item to an entry, with ok
// false to skip the item: Familia skips nil, empty and whitespace-only index
// values, and [Blank] is there to say the same. Non-blank values are written
// as given. A mapping that can fail, such as one that JSON-encodes the
// value, goes to the builder's Err form instead: [HashErr], [SortedSetErr],
// [SetErr], [SetIndexErr], whose functions return an error as well.
//
// Builders are pure: they turn a batch of items into variadic commands of at
// most [index.MaxArgs] entries each, addressed to the run's temp keys, and never do
// I/O. The last write of a hash field or a sorted-set member wins.
//
// # Errors
//
// A builder's error fails the run, and nothing is published: the live keys
// are left as they were, and no temp key or lock is left behind. Run
// returns it as a *rebuild.Error of Op "build" whose Key is the builder's
// key, wrapping the cause, so that errors.Is and errors.As reach an error
// returned by an Err form's mapping, by Func's build function or by
// Compat's. SortedSet refuses a NaN score the same way.
package builders

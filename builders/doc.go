// Package builders provides the rebuild.Builder implementations for the
// index kinds of Familia, in Go: a hash (a unique index, field → value), a
// sorted set (a timeline or leaderboard), a set, and a family of sets, one
// per value (SetIndex). Func and Compat adapt plain functions, the latter
// written against the go-redis-style API of rueidiscompat.
//
// Each builder takes a function that maps an item to an entry, with ok
// false to skip the item: Familia skips nil, empty and whitespace-only index
// values, and [Blank] is there to say the same. Non-blank values are written
// as given.
//
// Builders are pure: they turn a batch of items into variadic commands of at
// most [MaxArgs] entries each, addressed to the run's temp keys, and never do
// I/O. The last write of a hash field or a sorted-set member wins.
package builders

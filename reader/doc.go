// Package reader finds the keys that hold an index's data, for an
// application that reads indexes rebuilt in generations, and reads them.
//
// An index rebuilt in place keeps its data at its live key L (a family with
// prefix P at P:B, one key per bucket B). An index rebuilt in generations
// keeps it at L:rebuild-g:G (P:rebuild-g:G:B), where G, the current
// generation, is a decimal number in the index's pointer, a string key
// next to the index's lock (L:rebuild-ptr on a standalone server and for a
// key with a hash tag on a cluster, {L}:rebuild-ptr for other keys on a
// cluster). A rebuild publishes by setting the
// pointer to a new generation: a flip, one SET, whatever the index's size.
// An index without a pointer is in the rename-in-place shape, so a reader
// that resolves works before, during and after a switch between the two
// modes. The indexes of a group (rebuild.Options.Group) have their
// pointers in the group's shape, read with [Options.Group]; the pointer
// without a group of such an index holds "group:" + the group, which a
// reader without a group refuses with an error matching
// [ErrGroupConflict], naming the group.
//
// # Shared pointers on a cluster
//
// On Redis Cluster two live keys can share a pointer (SPEC C104): the
// untagged X and the tagged "{X}" both have {X}:rebuild-ptr (and a}b and
// "{rbN}a}b" share one too). A run in Generations mode stamps such a base
// with its live key, "<base>:rebuild-owner", before it sets the pointer;
// a run in place writes no stamp. For such a name the reader reads the
// stamp with the pointer (one DoMultiCache: once both are cached, still no
// round trip; a Recheck reads both in one round trip) and follows the
// pointer only when the stamp names the index it resolves. A stamp naming
// the other key means the pointer is that index's: the reader reads the
// index's plain key, so an index that rebuilds in place keeps its readers
// when the other key's Generations run takes the base. A set pointer with
// no stamp (one written before the stamp existed, or a stamp deleted by
// hand), a stamp of another type, or one naming neither key fails the
// resolve with an error matching [ErrBadPointer] that names the stamp and
// how to write it: the reader does not guess whose generation it is. A
// Generations run of the index writes the stamp. Names with a hash tag of
// their own ("{users}:by-email"), groups' pointers and standalone servers
// have no shared pointer and resolve with one cached GET, as before.
//
// A [Reader] resolves the pointer with rueidis's client-side caching
// (DoCache): once the pointer is cached, finding a key costs no round trip,
// and Redis's invalidation drops the cached pointer when a flip sets it,
// so the next read fetches the new generation. A cached pointer is used
// for at most [Options.CacheTTL] (default 5 s) even if an invalidation is
// lost: that is the worst-case staleness, and the writer keeps a
// generation it flipped away from readable for its grace period, which
// must exceed the TTL of every reader.
//
// The typed reads ([Reader.HGet], [Reader.SIsMember], [Reader.SMembers],
// [Reader.ZScore], [Reader.ZRange], [Reader.ZRevRange]) add one rule: an
// answer that may mean the data key is missing (a nil reply, an empty set,
// a member not found) is checked once against the pointer read without the
// cache, and the data is read again if the generation changed, so that a
// cached generation removed after a flip the cache missed never reads as
// empty. That check costs one more round trip for every such answer, and a
// second read when it finds the cached pointer stale; the reader's later
// resolves of that pointer then use the generation the check read, until
// the cache drops its stale reply (an invalidation, or the end of its
// TTL), so that a stale cache costs one second read, not one per read. A
// program that reads the keys from [Reader.Key] and [Reader.Bucket] itself
// applies the same rule with [Reader.Recheck].
//
// # Clients without client-side caching
//
// rueidis caches only on a RESP3 connection with client tracking. A client
// created with ClientOption.DisableCache (required with AlwaysRESP2, and
// with servers that lack CLIENT TRACKING such as miniredis, to which rueidis
// refuses to connect otherwise) sends every DoCache as a plain command: the
// reader then reads the pointer with a GET on every resolve, one round trip
// more per read, and always sees the current generation. [Reader.Cached]
// reports which of the two a reader's last resolve did.
//
// See docs/generations.md for the protocol, for readers in other languages.
package reader

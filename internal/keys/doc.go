// Package keys derives and recognises the Redis key names keyswap uses:
// the rebuild lock, the per-run temp key, and the Redis Cluster hash slot
// that ties them to the live key.
//
// # Shapes
//
// On a standalone server the shapes are Familia's, byte for byte:
//
//	lock: <final>:rebuild-lock
//	temp: <final>:rebuild:<unix seconds>:<16 lowercase hex>
//
// so a Go and a Ruby process rebuilding the same key exclude each other,
// and a sweep from either cleans up the other's temp keys.
//
// On Redis Cluster every derived key must hash to the live key's slot, or
// the lock check and the RENAME could not run in one script. The derived
// keys hang off a slot-pinned base instead of the live key itself:
//
//   - a key with a valid hash tag ("user{42}:idx") is its own base;
//   - an untagged key with no '}' is wrapped: base "{<final>}";
//   - any other key ("a{}b", "a}b") gets a synthetic tag: base
//     "{rbN}<final>", where N is the smallest number with
//     Slot("rbN") == Slot(final).
//
// In every mode the lock key is Base + ":rebuild-lock", and a temp key is
// Base + ":rebuild:<T>:<N>", so [LockKeyForBase] recovers a temp key's lock
// without knowing the mode.
//
// # Owner stamp
//
// Two live keys may share a base on a cluster: the untagged "X" and the
// tagged "{X}" both have the base "{X}" (and "a}b" shares the base
// "{rbN}a}b" with that key itself), so they would share the lock, the
// pointer and every other key derived from it. The base remembers the
// live key it belongs to:
//
//	owner: <base>:rebuild-owner   a string: the live key (or family prefix)
//
// set, without a TTL, by the first run in Generations mode that takes the
// base's lock (or, in a group, claims the index in its own base), in the
// same step; a run (in either mode) or a rollback of another live key
// whose base it is is refused before it writes. There is one only where
// another key can have the base (Aliasable): on a cluster, for an
// untagged key, a key "{T}" and a key "{rbN}rest". A tagged "{T}rest" has
// a base of its own, and on a standalone server the base is the live key
// itself: no stamp. Runs in RenameInPlace mode check a stamp and never
// write one, so two indexes X and "{X}" both in RenameInPlace mode still
// share their base.
//
// # Groups
//
// The control keys of an index in a group (Names with a Group) hang off
// GroupBase: "{<group>}:rebuild-group:<final>", on a standalone server as on
// a cluster, so that the indexes of a group share its slot whatever their
// names. Their data keys in a generation keep the index's name.
package keys

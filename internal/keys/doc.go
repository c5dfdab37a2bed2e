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
// # Groups
//
// The control keys of an index in a group (Names with a Group) hang off
// GroupBase: "{<group>}:rebuild-group:<final>", on a standalone server as on
// a cluster, so that the indexes of a group share its slot whatever their
// names. Their data keys in a generation keep the index's name.
package keys

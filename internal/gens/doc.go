// Package gens reads an index's registry of generations and removes the
// generations that no reader can reach any more, in small chunks: the
// sweep of generational publishing, for the run and for the keyswap
// command. It also removes a family's keys of the rename-in-place shape
// once the index has switched to generations ([DropPlain]).
//
// # The registry
//
// An index (a live key, or a family's prefix) published in generations has
// a registry, the hash keys.RegistryKey, next to its lock. Its field "next"
// holds the last generation allocated (HINCRBY next 1 allocates one), and
// each generation G still present has a field "G" holding its state:
//
//	building:<token>   the run holding the index's lock with <token> writes it
//	current            the pointer names it: readers read it
//	previous           kept for a rollback, which makes it current again
//	retired:<unix ms>  flipped away from at that time
//
// The registry is written by runs, in scripts fenced by the lock, but it
// lives in Redis, where anyone can write. [Read] checks what it holds before
// the sweep acts on it: a field that is neither "next" nor a generation in
// canonical decimal, a state it does not know, a generation above "next",
// two generations current (or previous), a pointer that does not name the
// current generation, or a registry, pointer or lock of another type than
// keyswap gives it: each is a [*CorruptError] that names the key, the field
// and the value, and the sweep then deletes nothing.
//
// # The rules of the sweep
//
// [Sweep] removes exactly two kinds of generations:
//
//   - retired:<ms> whose retirement is older than the grace period. Readers
//     resolve the pointer through a cache whose TTL is shorter than the
//     grace, so after it none of them reads the generation;
//   - building:<token> whose lock does not hold <token>: the run that built
//     it is gone (it failed, crashed, or lost its lock), and since a run's
//     token is random and a lock is never taken again with an old token,
//     it can never flip to that generation.
//
// Both states are final: no run or rollback makes such a generation current
// or previous again. The sweep still never removes a generation whose state
// changed while it ran: every chunk it deletes is checked against the
// state it read (atomically with the deletion wherever the generation's keys
// share the registry's hash slot), and the registry field goes last, only
// once no key of the generation remains, by a script that checks the state
// again. A sweep interrupted at any point (a cancelled context, a lost
// connection) leaves the field in place, so the next sweep finds the
// generation again and finishes it. It never removes a current or a previous
// generation, nor one the index's pointer names (checked in the same step
// as each deletion), nor any key that does not have the shape of a data key of the
// generation it removes (keys.GenKey, or keys.GenPattern for a family).
//
// The grace is measured on the server's clock (TIME, read in the same step
// as the registry) unless the caller gives a time: a client's clock that
// runs ahead of the one that stamped the retirement cannot cut it short.
// A registry without a pointer (an index switched back to rename-in-place)
// is swept by the same rules: only what its states say is dead goes.
//
// Removal is chunked so that Redis is never blocked for long: SCAN MATCH
// with a COUNT of 100 per call (DefaultScanCount), on every master of a cluster
// (only the registry's master when the keys share its slot), and UNLINK of
// at most 256 keys per command, which frees large values in the
// background. Where a family's keys share the registry's slot, each chunk
// goes on a connection of its own as WATCH of the registry, the lock and
// the pointer, their checks read by the sweep, then MULTI, UNLINK, EXEC:
// EXEC deletes nothing if any of them changed since the WATCH (the chunk
// then goes by a script that checks and deletes in one step), so the
// checks hold when the keys go, and the keys do not pass through Lua,
// which cost the server about as much again as the UNLINK.
//
// # The manifest
//
// A family whose keys share the registry's slot has, per generation, a
// manifest: a list (keys.ManifestListKey) of the keys its run wrote, each
// appended in the transaction of the run's first write of it, and a set
// (keys.ManifestKey) of the keys Apply wrote while the generation was
// current, added in the script of the writes, with keys.ManifestListed,
// which the run adds once its flip to the generation returned (the flip
// adds the keys its tail of changes writes to the set, in its step). A
// generation is written only by its run, its flip and, while current, by
// Apply; so once it is retired and its set holds keys.ManifestListed, the
// manifest names every key of the generation that keyswap wrote. The sweep of such
// a generation reads the manifest (LRANGE, then SSCAN with the SCAN's
// COUNT) rather than SCANning the keyspace, and deletes its members in
// the same chunks and checks, a page and a chunk at a time: the client's
// memory does not grow with the generation. A key listed twice (in the
// list and the set) is sent twice, and counted once, by UNLINK's replies.
// Everything in it is untrusted: a member that
// is not a key of the generation's shape (keys.GenPrefix: another index,
// another generation, any other key) is never deleted, and a manifest or
// list of another type makes the sweep SCAN. So does every generation the
// manifest cannot vouch for: one building (its run crashed, or lost its
// lock and may still write), one whose run stopped between its flip and
// the mark, one of a run that did not list
// its keys (built before manifests existed), one [RemoveOwn] removes, and
// a family spread over a cluster's slots, which has no manifest. The
// manifest goes with the registry field, in the same step. Its cost: an
// RPUSH per transaction of the run, and the memory of one key name per
// key until the generation is removed.
//
// A key of the generation's shape that no writer listed (written by hand,
// or by a keyswap process that predates manifests while the generation was
// current) is not found by a manifest's removal: every process that
// applies changes must list, as this version's do, before a run's
// generation is removed by its manifest.
//
// A caller that knows which buckets a family's generation mostly holds
// (a run knows those it wrote, most of which the generation it flipped away
// from holds too) names them in Options.Buckets: each generation removed
// by SCAN then loses those buckets first, by name, in the same chunks and
// checks; then the SCAN passes find the rest. The names only change the
// order of the deletions, never what is deleted: the named keys are freed
// in the order they were written, which costs the server less than a
// SCAN's order. Completeness rests on the SCAN, since keys of the
// generation nobody named (buckets the new data no longer has, keys Apply
// created while the generation was current) may exist. Matches of several
// SCAN pages are deleted together, up to Unlink keys per command. A
// generation removed by its manifest ignores the names: the manifest
// already lists exactly its keys, in the order its run wrote them, and a
// name would cost a lookup of a bucket the generation may not hold (the
// new data's buckets the old lacks) and the memory to remember it.
//
// [DryRun] applies the sweep's rule without deleting anything: it returns
// the generations a sweep would remove and those it would keep, and why.
//
// [RemoveOwn] is the same removal for the run that built a generation and
// failed before its flip: it removes its own building generation while it
// still holds the lock, which Sweep would wait for.
//
// A run that lost its lock may go on writing its generation for a moment,
// until its next heartbeat. The sweep therefore scans a generation again
// after a pass that deleted keys, and removes the field only after a pass
// that found none (after three passes that all found some, it keeps the
// field for a later sweep: SkipWritten). Keys such a run writes after that
// are removed by the run's own RemoveOwn, which deletes the keys of its
// generation even when a sweep has removed its field.
//
// # Leftovers of the plain shape
//
// [DropPlain] is the other half of the switch from rename-in-place to
// generations: once the pointer exists, readers no longer read the plain
// key or the family's plain buckets, and DropPlain deletes them in the same
// chunks, checking in each deleting step that the pointer still exists. Its
// documentation says exactly what it deletes.
package gens

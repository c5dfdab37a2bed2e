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
// background.
//
// A caller that knows which buckets a family's generation mostly holds
// (a run knows those it wrote, most of which the generation it flipped away
// from holds too) names them in Options.Buckets: each generation removed
// then loses those buckets first, by name, in the same chunks and checks,
// and the SCAN passes follow as always. The names only change the order of
// the deletions, never what is deleted: completeness still rests on the
// SCAN, since keys of the generation nobody named (buckets the new data no
// longer has, keys Apply created while the generation was current) may
// exist, and no count of a generation's keys is kept that could prove
// otherwise. The SCAN then returns few keys, and the named keys are freed
// in the order they were written, which costs the server less than the
// SCAN's order. Matches of several SCAN pages are deleted together, up to
// Unlink keys per command.
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

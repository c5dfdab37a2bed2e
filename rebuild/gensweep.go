package rebuild

import (
	"context"
	"errors"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/gens"
)

// ErrNoPointer reports that [Rebuilder.DropPlain] found an index without a
// pointer: the index is in the rename-in-place shape, and its plain keys
// are its live data, not leftovers. Nothing of that index was deleted.
var ErrNoPointer = gens.ErrNoPointer

// SweepStats is what [Rebuilder.Sweep] or [Rebuilder.DropPlain] did.
type SweepStats struct {
	// Indexes has an entry per index of the Rebuilder swept, by its live
	// key or family prefix.
	Indexes map[string]IndexSweep
	// Keys is the number of keys deleted, over every index.
	Keys int64
}

// IndexSweep is what a sweep did to one index.
type IndexSweep struct {
	// Removed lists the generations removed (their keys and their
	// registry field), in increasing order.
	Removed []int64
	// Kept lists the generations left, and why.
	Kept []KeptGeneration
	// Keys is the number of keys deleted: those of the generations removed
	// for Sweep, those of the rename-in-place shape for DropPlain.
	Keys int64
}

// KeptGeneration is a generation that a sweep left in place.
type KeptGeneration struct {
	Gen int64
	// State is its state in the index's registry ("current", "previous",
	// "building:<token>", "retired:<unix ms>").
	State string
	// Reason says why it stays.
	Reason string
	// Keys is the number of its keys deleted before the sweep stopped
	// (when its state changed during the sweep).
	Keys int64
}

// Sweep removes the generations of the Rebuilder's indexes that no reader
// reads and no run builds (see the package documentation, "Generations"):
// those retired more than Options.Grace ago (the default, 10 s, when Grace is
// negative), measured on the server's clock, which stamped the
// retirement; and those a run built that crashed or lost its lock before
// its flip (building, while the index's lock does not hold that run's
// token). It never removes the current or the previous generation, nor a
// generation an index's pointer names. Keys go in small chunks (SCAN COUNT
// 100, UNLINK of at most 256 keys per command), each checked in the same
// step against the generation's state, so that Redis is never held long
// and a sweep is safe at any time, during a run or another sweep
// included.
//
// A run in Generations mode sweeps what its flip retired by itself, after
// the grace period; Sweep is for what runs leave: a run whose ctx was
// cancelled during the grace, a crashed run, a negative Grace, or the
// generations left after switching an index back to RenameInPlace. It
// works whatever the Rebuilder's Publish mode, and takes no lock.
//
// A registry or a pointer that holds what keyswap does not write fails the
// index's sweep before it deletes anything; the other indexes are swept
// still, and the errors joined. On any other error a generation partly
// deleted keeps its registry field, and the next sweep finishes it.
func (r *Rebuilder[T]) Sweep(ctx context.Context) (SweepStats, error) {
	grace := r.opts.Grace
	if grace < 0 {
		grace = defaultGrace
	}
	stats := SweepStats{Indexes: map[string]IndexSweep{}}
	var errs []error
	for i, l := range r.lives {
		res, err := gens.Sweep(ctx, r.redis.Client(), r.genIndex(i), gens.Options{Grace: grace, Logger: r.opts.Logger})
		s := IndexSweep{Keys: res.Keys}
		for _, g := range res.Removed {
			s.Removed = append(s.Removed, g.Gen)
		}
		for _, k := range res.Skipped {
			s.Kept = append(s.Kept, KeptGeneration{Gen: k.Gen, State: k.State.Raw, Reason: string(k.Reason), Keys: k.Keys})
		}
		stats.Indexes[l] = s
		stats.Keys += res.Keys
		if err != nil {
			errs = append(errs, err)
		}
	}
	return stats, errors.Join(errs...)
}

// DropPlain deletes the keys of the rename-in-place shape of each of the
// Rebuilder's indexes that has a pointer: the second half of the switch
// from RenameInPlace to Generations. After the first Generations run of an
// index its readers (package reader) resolve the pointer and read its
// generation, never the plain key or the family's plain buckets: those are
// dead data, and DropPlain removes them in chunks (SCAN COUNT 100 on the
// prefix's master, UNLINK of at most 256 keys per command), each only
// while the pointer exists, checked in the same step. For a family it
// deletes the keys of the family's type under "<prefix>:" that are not
// keyswap's own (its generations, locks, registry...); for a plain index,
// the live key.
//
// An index without a pointer is left whole and fails with an error
// matching [ErrNoPointer]: its plain keys are its live data. So does an
// index whose pointer a RenameInPlace publish deletes while DropPlain
// runs (the switch back): the chunks after it are refused. On a cluster an
// index whose base another index owns (SPEC C104: X and "{X}" share one)
// fails with an error matching [ErrGroupConflict], nothing of it deleted:
// the pointer is the other index's. The other
// indexes are dropped still, and the errors joined. On a cluster a family
// without a hash tag never had plain keys (RenameInPlace needs the tag),
// and nothing is looked for; the plain keys of an index of a group
// (Options.Group) outside the group's slot fail it, nothing of them
// deleted, since no step can check the pointer and delete them together.
func (r *Rebuilder[T]) DropPlain(ctx context.Context) (SweepStats, error) {
	stats := SweepStats{Indexes: map[string]IndexSweep{}}
	var errs []error
	for i, l := range r.lives {
		idx := r.genIndex(i)
		if f, ok := r.builders[i].(index.Family); ok {
			idx.Type = f.KeyType()
		}
		res, err := gens.DropPlain(ctx, r.redis.Client(), idx, gens.Options{Logger: r.opts.Logger})
		stats.Indexes[l] = IndexSweep{Keys: res.Keys}
		stats.Keys += res.Keys
		if err != nil {
			errs = append(errs, err)
		}
	}
	return stats, errors.Join(errs...)
}

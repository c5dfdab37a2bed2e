package rebuild

import (
	"context"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
)

// ErrNothingToRollBack reports a rollback of keys that keep no previous
// generation: they were not published with Options.KeepPrevious, or its
// time ran out. Nothing changed.
var ErrNothingToRollBack = protocol.ErrNothingToRollBack

// Rollback swaps the previous generation of every builder's keys back in,
// in one atomic step: the values the last publish replaced, kept for
// Options.KeepPrevious, become live again, a family's buckets included
// (those the publish deleted come back, those it created go), and each
// key's generation goes back to the previous one. The values rolled back
// become the kept previous generation in turn, for what is left of its
// time, so a second Rollback rolls forward again.
//
// It is fenced like a run: it takes the builders' locks first, and fails
// with ErrInProgress, changing nothing, while a run of them is in
// progress. Changes applied (Apply) since the last publish are in the
// generation rolled back, not in the one restored; Apply refuses changes to
// its keys while it runs (ErrInProgress). It fails with
// ErrNothingToRollBack when a key keeps no previous generation, and with
// ErrTooManyKeys, before any write, when it would swap more keys than
// Options.MaxKeys: a rollback is one atomic script, as a publish is. It
// returns each builder's generation now live, keyed by its Key.
//
// In Generations mode a rollback is a flip back, O(1) per index: each
// index's pointer goes back to its previous generation (kept by a flip with
// KeepPrevious), the generation rolled back becomes the previous one (so a
// second Rollback rolls forward), and it returns the generation now
// current of each builder. It fails with ErrNothingToRollBack when an index
// has no previous generation, and with ErrGroupConflict, naming the group,
// when a Rebuilder without a group meets the claim of a group's run.
func (r *Rebuilder[T]) Rollback(ctx context.Context) (map[string]int64, error) {
	families := r.familyTypes()
	opts := protocol.RollbackOptions{
		Op: "rollback", Key: r.key, Lives: r.lives, FamilyTypes: families, TTL: r.opts.TTL, Now: time.Now(),
		MaxKeys: r.opts.MaxKeys,
	}
	rollback := r.redis.Publisher.Rollback
	if r.opts.Publish == Generations {
		rollback = r.redis.Generations.GenRollback
	}
	gens, err := rollback(ctx, opts)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(gens))
	for i, g := range gens {
		out[r.lives[i]] = g
	}
	return out, nil
}

// familyTypes returns each builder's family key type, or "" for a plain
// builder.
func (r *core) familyTypes() []string {
	out := make([]string, len(r.owners))
	for i, o := range r.owners {
		out[i] = o.keyType
	}
	return out
}

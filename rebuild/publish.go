package rebuild

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/run"
)

// publish publishes every target in one script, which checks, before any
// write, the rights it needs, the locks, the run's record and the temp
// keys. It reports whether the temp keys were handed over to the publish
// (and so must not be discarded).
func (x *execution[T]) publish(ctx context.Context, live []map[string]bool) (bool, error) {
	r := x.r
	x.stats.Batches = x.batches.Load()
	for i, b := range r.builders {
		x.stats.Entries[b.Key()] = x.entries[i]
	}
	var targets []run.Target
	for _, t := range x.targets.temps() {
		targets = append(targets, run.Target{Temp: t.Key, Live: t.Live, Populated: t.Populated(), HasTTL: true})
	}
	var orphans []string
	for _, set := range live {
		for _, k := range slices.Sorted(maps.Keys(set)) {
			if !x.targets.has(k) {
				orphans = append(orphans, k)
			}
		}
	}
	metas := make([]string, len(r.lives))
	for i, l := range r.lives {
		metas[i] = keys.MetaKey(l, r.redis.Cluster())
	}
	p, err := r.redis.Publish(ctx, run.PublishOptions{
		Op: "publish", Key: r.key, Locks: x.locks, Batches: x.acked.Load(),
		Targets: targets, Orphans: orphans, Metas: metas,
		PreserveFor: r.opts.PreserveFor, Settle: true, Now: time.Now(),
		Logs: x.logOffsets(), MaxTail: PublishTail,
	})
	if errors.Is(err, ErrLockLost) || run.PublishRefused(err) {
		// The script refused before writing anything: the temp keys are
		// worthless, and deleted like those of any failed run (or, for a
		// tail too long to replay, kept for the next catch-up). Every
		// refusal, not only those of a sentinel: a log entry that is not a
		// change, or a key of another type, once left the temp keys behind
		// until their TTL.
		return false, err
	}
	if err != nil {
		return true, err // kept for PreserveFor, for diagnosis
	}
	for i, t := range targets {
		x.stats.Outcomes[t.Live] = p.Outcomes[i]
	}
	for _, o := range orphans {
		x.stats.Outcomes[o] = Emptied
	}
	for i, g := range p.Generations {
		x.stats.Generations[r.lives[i]] = g
	}
	x.stats.Changes = x.replayed.Load() + p.Replayed
	return true, nil
}

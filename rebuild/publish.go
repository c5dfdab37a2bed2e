package rebuild

import (
	"context"
	"maps"
	"slices"

	"github.com/keyswap/keyswap/internal/run"
)

// publish renews the lease a last time, checks the temp keys, and publishes
// every target in one script. It reports whether the temp keys were handed
// over to the publish (and so must not be discarded).
func (x *execution[T]) publish(ctx context.Context, live []map[string]bool) (bool, error) {
	r := x.r
	x.stats.Batches = x.batches.Load()
	for i, b := range r.builders {
		x.stats.Entries[b.Key()] = x.entries[i]
	}
	temps := x.targets.temps()
	rn := run.Snap(temps) // every write has returned: populated is final
	states, err := r.redis.Touch(ctx, "touch", x.locks, rn.Keys())
	if err != nil {
		return false, run.Wrap("lease", r.key, err)
	}
	// A populated temp key that is gone would read as an empty result and
	// delete its live key; one re-created holds part of the rebuild.
	if err := rn.Check(states, "before the publish"); err != nil {
		return false, &Error{Op: "publish", Key: r.key, Err: err}
	}
	targets := make([]run.Target, len(temps))
	for i, t := range temps {
		targets[i] = run.Target{Temp: t.Key, Live: t.Live, Populated: t.Populated()}
	}
	var orphans []string
	for _, set := range live {
		for _, k := range slices.Sorted(maps.Keys(set)) {
			if !x.targets.has(k) {
				orphans = append(orphans, k)
			}
		}
	}
	outcomes, err := r.redis.Publish(ctx, run.PublishOptions{
		Op: "publish", Key: r.key, Locks: x.locks, Targets: targets, Orphans: orphans, PreserveFor: r.opts.PreserveFor,
	})
	if err != nil {
		// A lost reply leaves it open whether the publish ran: settle it.
		published, err := r.redis.Settle(ctx, err, x.locks)
		if !published {
			return true, err
		}
		outcomes = make([]Outcome, len(targets))
		for i, t := range targets {
			outcomes[i] = Emptied
			if t.Populated {
				outcomes[i] = Swapped
			}
		}
	}
	for i, t := range targets {
		x.stats.Outcomes[t.Live] = outcomes[i]
	}
	for _, o := range orphans {
		x.stats.Outcomes[o] = Emptied
	}
	return true, nil
}

package rebuild

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
)

// publish publishes every target in one script, which checks, before any
// write, the rights it needs, the locks, the run's record and the temp
// keys. It reports whether the temp keys were handed over to the publish
// (and so must not be discarded).
func (x *runState) publish(ctx context.Context, live []map[string]bool) (bool, error) {
	r := x.r
	x.stats.Batches = x.batches.Load()
	for i, o := range r.owners {
		x.stats.Entries[o.key] = x.entries[i]
	}
	var targets []protocol.Target
	for _, t := range x.targets.temps() {
		targets = append(targets, protocol.Target{Temp: t.Key, Live: t.Live, Populated: t.Populated(), HasTTL: true})
	}
	orphans, drops := x.stale(live)
	if m, n := r.opts.MaxKeys, len(targets)+len(orphans)+len(drops); m > 0 && n > m {
		return false, &Error{Op: "publish", Key: r.key, Err: tooManyKeys(m, fmt.Sprintf("this one would touch %d (%d rebuilt, %d stale buckets to delete, %d old kept values to drop)", n, len(targets), len(orphans), len(drops)))}
	}
	metas := make([]string, len(r.lives))
	for i, l := range r.lives {
		metas[i] = keys.MetaKey(l, r.redis.Cluster())
	}
	sent := time.Now()
	p, err := r.redis.Publisher.Publish(ctx, protocol.PublishOptions{
		Op: "publish", Key: r.key, Locks: x.locks, Records: true, Batches: x.acked.Load(),
		Targets: targets, Orphans: orphans, Drops: drops, Metas: metas, FamilyTypes: r.familyTypes(),
		KeepPrevious: r.opts.KeepPrevious, PreserveFor: r.opts.PreserveFor, Settle: true, Now: time.Now(),
		Logs: x.catchUp.logOffsets(), MaxTail: PublishTail, MaxWork: PublishTailWork,
		// An index published in Generations mode until now switches back:
		// its pointer goes, in the same step.
		Indexes: r.lives,
	})
	x.obs.Published(time.Since(sent))
	if errors.Is(err, ErrLockLost) || protocol.PublishRefused(err) {
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
	x.count(p, targets, orphans)
	return true, nil
}

// stale returns the families' live buckets the run did not rebuild, which
// the publish deletes, and the kept previous values it drops.
func (x *runState) stale(live []map[string]bool) (orphans, drops []string) {
	orphan := map[string]bool{}
	for _, set := range live {
		for _, k := range slices.Sorted(maps.Keys(set)) {
			if !x.targets.has(k) {
				orphans = append(orphans, k)
				orphan[k] = true
			}
		}
	}
	// The kept previous values of buckets this publish neither replaces
	// nor deletes belong to an older generation: a rollback must not bring
	// them back. (The publish replaces the others, or drops them.)
	for _, prevs := range x.stalePrevs {
		for _, p := range slices.Sorted(maps.Keys(prevs)) {
			if b := strings.TrimSuffix(p, keys.PrevSuffix); !x.targets.has(b) && !orphan[b] {
				drops = append(drops, p)
			}
		}
	}
	return orphans, drops
}

// count adds what publish p did to the run's stats.
func (x *runState) count(p protocol.Published, targets []protocol.Target, orphans []string) {
	for i, t := range targets {
		x.stats.Outcomes[t.Live] = p.Outcomes[i]
	}
	for _, o := range orphans {
		x.stats.Outcomes[o] = Emptied
	}
	for i, g := range p.Generations {
		x.stats.Generations[x.r.lives[i]] = g
	}
	_, replayed := x.catchUp.counts()
	x.stats.Changes = replayed + p.Replayed
}

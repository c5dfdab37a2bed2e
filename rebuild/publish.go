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

// publisher is the publish stage of a run: the rename publish
// (RenameInPlace mode), or the flip and its cut-over (Generations mode),
// with the durability wait before either. It owns what the publish needs
// of the run, set once the run holds its locks (and, in Generations mode,
// its generations): the locks, the targets, the catch-up whose offsets it
// sends, and the stats it fills in; and what the attempts of one run share
// (the cut-over, the generations the flip retired). The pipeline calls it
// once the run caught up, again while the publish finds more changes than
// it replays itself.
type publisher struct {
	r        *core
	locks    []*protocol.Lock
	progress *progress // the run's counts, read at each attempt
	stats    *Stats
	targets  *targets
	catchUp  *catchUp
	gen      *generations // nil in RenameInPlace mode
	// spread reports a run in Generations mode whose keys are not all in
	// its locks' slot: its flip cannot replay a tail, and it cuts over
	// instead (see cutOver).
	spread bool
	// behind reports that the last flip was refused for a tail: the next
	// attempt cuts over. began is when the current attempt began, and
	// last how long the last one took, which the cut-over's mark lasts
	// a multiple of.
	behind bool
	began  time.Time
	last   time.Duration
	// retired are the generations the flip retired, per index.
	retired [][]int64
}

// newPublisher returns the publish stage of x, which holds its locks and
// has its targets, catch-up and (in Generations mode) generations.
func (x *runState) newPublisher() *publisher {
	return &publisher{
		r: x.r, locks: x.locks, progress: &x.progress, stats: x.stats, targets: x.targets, catchUp: x.catchUp,
		gen: x.gen, spread: x.gen != nil && x.r.spreads(),
	}
}

// spreads reports whether the keys of r's indexes in a generation may
// leave their locks' slot: on a cluster, when one of them has no hash tag,
// or in a group, whose locks hang off the group's tag.
func (r *core) spreads() bool {
	for _, l := range r.lives {
		if !keys.SameSlot(l, r.redis.Names()) {
			return true
		}
	}
	return false
}

// counts copies the run's counts into its stats, for the publish.
func (p *publisher) counts() {
	p.stats.Batches = p.progress.batches.Load()
	for i, o := range p.r.owners {
		p.stats.Entries[o.key] = p.progress.entries[i]
	}
}

// publish publishes every target in one script, which checks, before any
// write, the rights it needs, the locks, the run's record and the temp
// keys. live are the families' live buckets the scans found, stalePrevs
// their kept previous values. It reports whether the temp keys were
// handed over to the publish (and so must not be discarded).
func (p *publisher) publish(ctx context.Context, live, stalePrevs []map[string]bool) (bool, error) {
	r := p.r
	p.counts()
	var targets []protocol.Target
	for _, t := range p.targets.temps() {
		targets = append(targets, protocol.Target{Temp: t.Key, Live: t.Live, Populated: t.Populated(), HasTTL: true})
	}
	orphans, drops := p.stale(live, stalePrevs)
	if m, n := r.opts.MaxKeys, len(targets)+len(orphans)+len(drops); m > 0 && n > m {
		return false, &Error{Op: "publish", Key: r.key, Err: tooManyKeys(m, fmt.Sprintf("this one would touch %d (%d rebuilt, %d stale buckets to delete, %d old kept values to drop)", n, len(targets), len(orphans), len(drops)))}
	}
	metas := make([]string, len(r.lives))
	for i, l := range r.lives {
		metas[i] = keys.MetaKey(l, r.redis.Cluster())
	}
	sent := time.Now()
	pub, err := r.redis.Publisher.Publish(ctx, protocol.PublishOptions{
		Op: "publish", Key: r.key, Locks: p.locks, Records: true, Batches: p.progress.acked.Load(),
		Targets: targets, Orphans: orphans, Drops: drops, Metas: metas, FamilyTypes: r.familyTypes(),
		KeepPrevious: r.opts.KeepPrevious, PreserveFor: r.opts.PreserveFor, Settle: true, Now: time.Now(),
		Logs: p.catchUp.logOffsets(), MaxTail: PublishTail, MaxWork: PublishTailWork,
		// An index published in Generations mode until now switches back:
		// its pointer goes, in the same step.
		Indexes: r.lives,
	})
	p.progress.obs.Published(time.Since(sent))
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
	p.count(pub, targets, orphans)
	return true, nil
}

// stale returns the families' live buckets the run did not rebuild, which
// the publish deletes, and the kept previous values it drops.
func (p *publisher) stale(live, stalePrevs []map[string]bool) (orphans, drops []string) {
	orphan := map[string]bool{}
	for _, set := range live {
		for _, k := range slices.Sorted(maps.Keys(set)) {
			if !p.targets.has(k) {
				orphans = append(orphans, k)
				orphan[k] = true
			}
		}
	}
	// The kept previous values of buckets this publish neither replaces
	// nor deletes belong to an older generation: a rollback must not bring
	// them back. (The publish replaces the others, or drops them.)
	for _, prevs := range stalePrevs {
		for _, prev := range slices.Sorted(maps.Keys(prevs)) {
			if b := strings.TrimSuffix(prev, keys.PrevSuffix); !p.targets.has(b) && !orphan[b] {
				drops = append(drops, prev)
			}
		}
	}
	return orphans, drops
}

// count adds what publish pub did to the run's stats.
func (p *publisher) count(pub protocol.Published, targets []protocol.Target, orphans []string) {
	for i, t := range targets {
		p.stats.Outcomes[t.Live] = pub.Outcomes[i]
	}
	for _, o := range orphans {
		p.stats.Outcomes[o] = Emptied
	}
	for i, g := range pub.Generations {
		p.stats.Generations[p.r.lives[i]] = g
	}
	_, replayed := p.catchUp.counts()
	p.stats.Changes = replayed + pub.Replayed
}

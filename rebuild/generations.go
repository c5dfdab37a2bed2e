package rebuild

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
)

// PublishMode is how a run publishes what it built (see the package
// documentation, "Generations").
type PublishMode int8

const (
	// RenameInPlace writes temp keys and RENAMEs each over its live key in
	// one atomic script: O(keys) at the publish, and on a cluster a family
	// must live in one hash slot. The zero value.
	RenameInPlace PublishMode = iota
	// Generations writes each index under a new generation and publishes by
	// pointing the index's pointer at it: O(indexes) at the publish,
	// whatever the size of the data, and a family's buckets may spread
	// over every slot of a cluster. Readers resolve the pointer first.
	Generations
)

// String returns the mode's name.
func (m PublishMode) String() string {
	switch m {
	case RenameInPlace:
		return "RenameInPlace"
	case Generations:
		return "Generations"
	}
	return "PublishMode(" + strconv.Itoa(int(m)) + ")"
}

// generations is the state of a run in Generations mode.
type generations struct {
	gens     []int64        // per builder: the generation the run builds
	current  []int64        // per builder: the generation current (0: none, the plain shape)
	sizes    *sizeCheck     // counts the writes' additions, and compares them with the sizes; nil with SkipSizeCheck
	evicted  *evictionWatch // with SkipSizeCheck: the masters' evicted_keys at the run's start
	counters *slotCounters  // on a cluster: the transactions acknowledged per slot
}

// genTemp returns the key that holds live in the run's generation: the
// "temp key" of a target, in Generations mode.
func (x *runState) genTemp(live string) string {
	var gens []int64
	if x.gen != nil {
		gens = x.gen.gens
	}
	for i, o := range x.r.owners {
		g := int64(0)
		if i < len(gens) {
			g = gens[i]
		}
		switch {
		case !o.family && live == o.key:
			return keys.GenKey(live, g)
		case o.family && isBucket(live, o.key):
			return keys.GenBucketKey(o.key, g, live[len(o.key)+1:])
		}
	}
	return keys.GenKey(live, 0) // refused by targets.get: not the run's
}

// liveKey returns the key that holds live for readers now: live itself in
// RenameInPlace mode, or for an index without a pointer; else its key in
// the index's current generation.
func (x *runState) liveKey(live string) string {
	if x.gen == nil {
		return live
	}
	for i, o := range x.r.owners {
		cur := x.gen.current[i]
		switch {
		case cur == 0:
		case !o.family && live == o.key:
			return keys.GenKey(live, cur)
		case o.family && isBucket(live, o.key):
			return keys.GenBucketKey(o.key, cur, live[len(o.key)+1:])
		}
	}
	return live
}

// allocate allocates the run's generations and makes its targets write
// them.
func (x *runState) allocate(ctx context.Context) error {
	r := x.r
	var watch *evictionWatch
	if r.opts.SkipSizeCheck {
		// Before anything is allocated: a master that refuses INFO fails
		// the run with nothing to remove, and an eviction between this
		// read and the allocation refuses the flip too.
		var err error
		if watch, err = watchEvictions(ctx, "acquire", r); err != nil {
			return err
		}
	}
	// The claim first (SPEC C102): a run in a group allocates nothing
	// while the index has generations of runs without it, or is another
	// group's. It comes after the locks, whose acquire checked its rights
	// with the run's, so that a user lacking one writes nothing. It
	// reserves each generation the run allocates in the index's registry
	// without a group, and its floors put the group's generations above
	// any a run without the group allocated, which may still write after
	// losing its lock, or may allocate once the claim is gone.
	floors, err := r.redis.Generations.ClaimGroup(ctx, "acquire", r.key, x.locks, r.lives)
	if err != nil {
		return err
	}
	gens, current, err := r.redis.Generations.AllocateGenerations(ctx, "acquire", r.key, x.locks, r.lives, floors)
	if err != nil {
		return err
	}
	x.gen = &generations{gens: gens, current: current, counters: newSlotCounters(r, gens), evicted: watch}
	x.targets = x.newTargets()
	if watch == nil {
		x.gen.sizes = newSizeCheck(r, gens, x.targets)
	}
	return nil
}

// flip publishes a run in Generations mode: it points every index at the
// run's generation, replaying the tail of the logs of changes onto it in
// the same step where the run's keys share the locks' slot. It reports
// whether the flip is known to have run. A flip refused for a tail makes
// the next attempt cut over (see cutOver).
func (p *publisher) flip(ctx context.Context) (bool, error) {
	r := p.r
	p.counts()
	defer func() { p.last = time.Since(p.began) }()
	cluster := r.redis.Cluster()
	// In a group, the claims and reservations the run wrote at its
	// allocation must still be there (after the durability wait, which
	// may have counted on a replica that then took over without them).
	if err := r.redis.Generations.CheckClaims(ctx, "publish", r.lives, p.gen.gens); err != nil {
		return false, err
	}
	if cluster {
		if err := p.gen.counters.check(ctx); err != nil {
			return false, err
		}
	}
	if p.gen.sizes != nil {
		if err := p.gen.sizes.check(ctx); err != nil {
			return false, err
		}
	} else if err := p.gen.evicted.check(ctx); err != nil {
		return false, err
	}
	maxTail, maxWork := PublishTail, int64(PublishTailWork)
	if p.spread {
		// The flip cannot write the other slots: the run replays every
		// change itself, under the cut-over's mark.
		maxTail, maxWork = 0, 0
	}
	sent := time.Now()
	f, err := r.redis.Generations.Flip(ctx, protocol.FlipOptions{
		Op: "publish", Key: r.key, Locks: p.locks, Lives: r.lives, Gens: p.gen.gens,
		CountBatches: !cluster, Batches: p.progress.acked.Load(), KeepPrevious: r.opts.KeepPrevious > 0,
		Logs: p.catchUp.logOffsets(), MaxTail: maxTail, MaxWork: maxWork, Now: time.Now(),
	})
	p.progress.obs.Published(time.Since(sent))
	var behind *protocol.BehindError
	p.behind = errors.As(err, &behind)
	if errors.Is(err, ErrLockLost) || protocol.PublishRefused(err) {
		return false, err // nothing written: the generation is worthless
	}
	if err != nil {
		// An error reply: the script checks everything that can fail
		// before its first write, so it flipped nothing. Or a lost reply
		// that the receipt settled: it did not run. Or a lost reply the
		// receipt could not settle (ErrOutcomeUnknown): the flip may have
		// run, and the generation is removed only if it did not, as
		// gens.RemoveOwn never removes one that is current or that a
		// pointer names.
		return false, err
	}
	for _, t := range p.targets.all() {
		p.stats.Outcomes[t.Live] = Swapped
	}
	for i, l := range r.lives {
		p.stats.Generations[l] = p.gen.gens[i]
	}
	p.retired = f.Retired
	_, replayed := p.catchUp.counts()
	p.stats.Changes = replayed + f.Replayed
	p.gen.vouch(ctx, r)
	return true, nil
}

// The cut-over's mark lasts twice the last attempt to flip, within these
// bounds: long enough for the run to drain its log and flip, short enough
// that a run that dies with its mark set holds Apply back for little
// (protocol.CutOverWait bounds one Apply's wait in all).
const (
	cutOverMin = 250 * time.Millisecond
	cutOverMax = 5 * time.Second
)

// cutOver begins an attempt to publish. After a flip refused for a tail,
// in a run whose keys are not all in its locks' slot (on a cluster, a
// family without a hash tag: the flip cannot replay the tail), it sets the
// run's cut-over marks (protocol.Generations.SetCutOver), which Apply
// waits on: the log stops growing while the run catches up with it and
// flips, and the flip deletes the marks. A mark the run leaves (it failed,
// or took longer) goes at its PX.
func (p *publisher) cutOver(ctx context.Context) error {
	p.began = time.Now()
	if !p.spread || !p.behind {
		return nil
	}
	px := min(max(2*p.last, cutOverMin), cutOverMax)
	return p.r.redis.Generations.SetCutOver(ctx, "publish", p.r.key, p.locks, px)
}

// discardGen removes a failed run's generation, best effort, with
// gens.RemoveOwn: its data keys, in chunks, then its registry fields, each
// only while the registry marks it as the run's and no pointer names it.
// What it cannot remove stays marked as building by the run's token, for a
// later sweep.
func (x *runState) discardGen(ctx context.Context) {
	r := x.r
	ctx, cancel := protocol.CleanupContext(ctx)
	defer cancel()
	token := x.locks[0].Token
	for i := range r.lives {
		res, err := gens.RemoveOwn(ctx, r.redis.Client(), r.genIndex(i), x.gen.gens[i], token, gens.Options{Logger: r.opts.Logger})
		if err != nil {
			r.opts.Logger.Warn("keyswap: could not remove the generation of a failed run; a sweep removes it later", "key", r.lives[i], "generation", x.gen.gens[i], "err", err)
			return
		}
		for _, sk := range res.Skipped {
			r.opts.Logger.Warn("keyswap: kept the generation of a failed run", "key", r.lives[i], "generation", sk.Gen, "state", sk.State.Raw, "reason", string(sk.Reason))
		}
	}
}

// genIndex returns the gens.Index of the run's index i.
func (r *core) genIndex(i int) gens.Index {
	return gens.Index{Live: r.lives[i], Family: r.owners[i].family, Group: r.opts.Group}
}

// buckets returns, per builder, the buckets of a family the run wrote, in
// the order it first wrote them (none for a plain builder): the removal of
// the generation the run flipped away from deletes those first, by name
// (gens.Options.Buckets), and SCANs only for the rest. None either for a
// family whose keys share its registry's slot: that generation's manifest
// names exactly its keys, and the removal reads it instead (a generation
// without one, left by a crashed run or an older keyswap, is SCANned).
func (x *execution[T]) buckets() [][]string {
	out := make([][]string, len(x.r.owners))
	named := make([]bool, len(x.r.owners))
	for b, o := range x.r.owners {
		named[b] = o.family && !keys.SameSlot(o.key, x.r.redis.Names())
	}
	if !slices.Contains(named, true) {
		return out
	}
	for _, t := range x.targets.all() {
		if named[t.builder] {
			out[t.builder] = append(out[t.builder], t.bucket)
		}
	}
	return out
}

// retireTries bounds the sweeps of retire that find a generation still
// in its grace period (the server's clock behind the run's timer).
const retireTries = 3

// retire waits Options.Grace, then sweeps each index that a flip retired a
// generation of (gens.Sweep: the grace measured on the server's clock,
// which stamped the retirement), deleting first the buckets the run wrote
// (buckets, per builder) by name. A cancelled ctx leaves them, retired, to
// a later sweep; so does a negative Grace.
func (r *core) retire(ctx context.Context, retired [][]int64, buckets [][]string) {
	if r.opts.Grace < 0 {
		return
	}
	wait := r.opts.Grace
	for i, gs := range retired {
		if len(gs) == 0 {
			continue
		}
		for try := 1; ; try++ {
			if !sleep(ctx, wait) {
				return
			}
			wait = 0
			res, err := gens.Sweep(ctx, r.redis.Client(), r.genIndex(i), gens.Options{Grace: r.opts.Grace, Logger: r.opts.Logger, Buckets: buckets[i]})
			if err != nil {
				r.opts.Logger.Warn("keyswap: could not remove a retired generation; a sweep removes it later", "key", r.lives[i], "err", err)
				return
			}
			// A retirement the server stamped less than Grace ago by its
			// own clock: wait for the rest.
			for _, sk := range res.Skipped {
				if sk.Reason == gens.SkipGrace && slices.Contains(gs, sk.Gen) {
					wait = max(wait, sk.State.RetiredAt.Add(r.opts.Grace).Sub(res.Now)+time.Millisecond)
				}
			}
			if wait == 0 || try == retireTries {
				break
			}
		}
	}
}

// sleep waits d, and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

package rebuild

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
	"golang.org/x/sync/errgroup"
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

// DefaultGrace is how long an old generation stays readable after a flip
// (see Options.Grace).
const DefaultGrace = 10 * time.Second

// ErrNotInGenerations reports an operation that Generations mode does not
// support yet: Apply during a run, or on a cluster, Apply to a family
// without a hash tag.
var ErrNotInGenerations = protocol.ErrNotInGenerations

// counterSuffix follows a run's base in the key of a per-slot counter of
// its writes, on a cluster in Generations mode.
const counterSuffix = ":rebuild-n:"

// slotTags holds, for each hash slot, keys.SyntheticTag(slot): computed
// once for every slot at once, as a run that spreads over a cluster needs
// many of them.
var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, keys.SlotCount)
	left := len(tags)
	buf := []byte("rb")
	for n := uint64(0); left > 0; n++ {
		buf = strconv.AppendUint(buf[:2], n, 10)
		if s := keys.Slot(string(buf)); tags[s] == "" {
			tags[s] = string(buf)
			left--
		}
	}
	return tags
})

// generations is the state of a run in Generations mode.
type generations struct {
	gens    []int64 // per builder: the generation the run builds
	current []int64 // per builder: the generation current (0: none, the plain shape)

	mu     sync.Mutex
	counts map[uint16]int64 // on a cluster: transactions acknowledged per slot
}

// genTemp returns the key that holds live in the run's generation: the
// "temp key" of a target, in Generations mode.
func (x *execution[T]) genTemp(live string) string {
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
func (x *execution[T]) liveKey(live string) string {
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
func (x *execution[T]) allocate(ctx context.Context) error {
	r := x.r
	gens, current, err := r.redis.AllocateGenerations(ctx, "acquire", r.key, x.locks, r.lives)
	if err != nil {
		return err
	}
	x.gen = &generations{gens: gens, current: current, counts: map[uint16]int64{}}
	x.targets = x.newTargets()
	return nil
}

// counterKey returns the key of the counter of the run's transactions in
// slot: in slot, named after the run's base and its first generation.
func (x *execution[T]) counterKey(slot uint16) string {
	return "{" + slotTags()[slot] + "}" + keys.Base(x.r.lives[0], true) + counterSuffix + strconv.FormatInt(x.gen.gens[0], 10)
}

// counterKeys returns the keys of the run's per-slot counters, and the
// counts the run expects of them.
func (x *execution[T]) counterKeys() ([]string, []int64) {
	x.gen.mu.Lock()
	defer x.gen.mu.Unlock()
	var ks []string
	var want []int64
	for s, n := range x.gen.counts {
		ks = append(ks, x.counterKey(s))
		want = append(want, n)
	}
	return ks, want
}

// spreadWrites is the most per-slot transactions of a round trip in flight
// at once.
const spreadWrites = 256

// writeSpread is write on a cluster in Generations mode, where the keys of
// a transaction spread over many slots: each transaction is split by hash
// slot into one MULTI/EXEC per slot, each with an INCR of the run's
// counter in that slot, so that the flip can tell whether Redis still
// holds every transaction it acknowledged. The writes go on the client's
// shared connections: the run's own connection (protocol.Bulk) serves one slot.
func (x *execution[T]) writeSpread(ctx context.Context, txns []*txn) error {
	r := x.r
	client := r.redis.Client()
	cb := client.B()
	sent := time.Now()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.TTL)
	defer cancel()
	if h, beat := x.lease.claim(sent, false); beat {
		// The heartbeat is in the locks' slot: a round trip of its own.
		cmd, err := x.lease.command(h)
		if err != nil {
			x.lease.settle(ctx, sent, h, nil) // reports the same error
		} else {
			res := client.DoMulti(wctx, cmd)
			x.lease.settle(wctx, sent, h, &res[0])
		}
	}
	for _, t := range txns {
		parts := splitBySlot(t)
		g := errgroup.Group{}
		g.SetLimit(spreadWrites)
		for slot, p := range parts {
			counter := x.counterKey(slot)
			g.Go(func() error {
				cmds := rueidis.Commands{cb.Multi().Build()}
				for _, tg := range p.probes {
					cmds = append(cmds, cb.Exists().Key(tg.Key).Build())
				}
				cmds = append(cmds, p.cmds...)
				for _, tg := range p.probes {
					cmds = append(cmds, cb.Exists().Key(tg.Key).Build())
				}
				cmds = append(cmds, cb.Incr().Key(counter).Build(),
					cb.Expire().Key(counter).Seconds(2*r.ttlSecs).Build(), cb.Exec().Build())
				if err := x.check(p, client.DoMulti(wctx, cmds...)); err != nil {
					return err
				}
				x.gen.mu.Lock()
				x.gen.counts[slot]++
				x.gen.mu.Unlock()
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		x.acked.Add(1)
	}
	return nil
}

// splitBySlot splits t by the hash slot of its commands.
func splitBySlot(t *txn) map[uint16]*txn {
	out := map[uint16]*txn{}
	part := func(s uint16) *txn {
		p := out[s]
		if p == nil {
			p = &txn{label: fmt.Sprintf("%s, slot %d", t.label, s)}
			out[s] = p
		}
		return p
	}
	parallel := len(t.members) == len(t.cmds) && len(t.writes) == len(t.cmds)
	for i, c := range t.cmds {
		p := part(c.Slot())
		p.cmds = append(p.cmds, c)
		if parallel {
			p.writes = append(p.writes, t.writes[i])
			p.members = append(p.members, t.members[i])
		}
	}
	for _, tg := range t.probes {
		p := part(keys.Slot(tg.Key))
		p.probes = append(p.probes, tg)
	}
	return out
}

// checkCounters compares the run's per-slot counters with the
// transactions the run saw acknowledged: a counter below its count lost
// writes (a failover to a replica that was behind, a restart), and the run
// must not publish.
func (x *execution[T]) checkCounters(ctx context.Context) error {
	ks, want := x.counterKeys()
	if len(ks) == 0 {
		return nil
	}
	client := x.r.redis.Client()
	cmds := make(rueidis.Commands, len(ks))
	for i, k := range ks {
		cmds[i] = client.B().Get().Key(k).Build()
	}
	for i, res := range client.DoMulti(ctx, cmds...) {
		have, err := res.AsInt64()
		if rueidis.IsRedisNil(err) {
			have, err = 0, nil
		}
		if err != nil {
			return protocol.Fail(ctx, "publish", x.r.key, fmt.Errorf("GET %s: %w", ks[i], err))
		}
		if have < want[i] {
			return &Error{Op: "publish", Key: x.r.key, Err: fmt.Errorf("%w: Redis acknowledged %d transactions of this run in the slot of %s but holds %d (a failover to a replica that was behind, or a restart from an older snapshot or AOF); every index left at its generation", ErrWritesLost, want[i], ks[i], have)}
		}
	}
	return nil
}

// renewCounters renews the TTL of the run's per-slot counters: the
// lease's refresh in Generations mode, whose data keys have no TTL.
func (x *execution[T]) renewCounters(ctx context.Context) error {
	if x.gen == nil {
		return nil
	}
	ks, _ := x.counterKeys()
	if len(ks) == 0 {
		return nil
	}
	client := x.r.redis.Client()
	cmds := make(rueidis.Commands, len(ks))
	for i, k := range ks {
		cmds[i] = client.B().Expire().Key(k).Seconds(2 * x.r.ttlSecs).Build()
	}
	for _, res := range client.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			return err
		}
	}
	return nil
}

// flip publishes a run in Generations mode: it points every index at the
// run's generation. It reports whether the generation must be kept (it
// was published, or may have been).
func (x *execution[T]) flip(ctx context.Context) (bool, error) {
	r := x.r
	x.stats.Batches = x.batches.Load()
	for i, b := range r.builders {
		x.stats.Entries[b.Key()] = x.entries[i]
	}
	cluster := r.redis.Cluster()
	if cluster {
		if err := x.checkCounters(ctx); err != nil {
			return false, err
		}
	}
	sent := time.Now()
	f, err := r.redis.Flip(ctx, protocol.FlipOptions{
		Op: "publish", Key: r.key, Locks: x.locks, Lives: r.lives, Gens: x.gen.gens,
		CountBatches: !cluster, Batches: x.acked.Load(), KeepPrevious: r.opts.KeepPrevious > 0,
		Logs: x.catchUp.logOffsets(), Now: time.Now(),
	})
	x.obs.Published(time.Since(sent))
	if errors.Is(err, ErrLockLost) || protocol.PublishRefused(err) {
		return false, err // nothing written: the generation is worthless
	}
	if errors.Is(err, ErrOutcomeUnknown) {
		// The reply was lost and the receipt could not be read: the
		// pointer may name the generation. It stays, marked building, for
		// a sweep to judge.
		return true, err
	}
	if err != nil {
		// An error reply: the script checks everything that can fail
		// before its first write, so it flipped nothing. Or a lost reply
		// that the receipt settled: it did not run.
		return false, err
	}
	for _, t := range x.targets.all() {
		x.stats.Outcomes[t.Live] = Swapped
	}
	for i, l := range r.lives {
		x.stats.Generations[l] = x.gen.gens[i]
	}
	x.retired = f.Retired
	_, replayed := x.catchUp.counts()
	x.stats.Changes = replayed
	return true, nil
}

// discardGen removes a failed run's generation, best effort, with
// gens.RemoveOwn: its data keys, in chunks, then its registry fields, each
// only while the registry marks it as the run's and no pointer names it.
// What it cannot remove stays marked as building by the run's token, for a
// later sweep.
func (x *execution[T]) discardGen(ctx context.Context) {
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
func (r *Rebuilder[T]) genIndex(i int) gens.Index {
	return gens.Index{Live: r.lives[i], Family: r.owners[i].family}
}

// dropCounters deletes the run's per-slot counters, best effort: they
// expire by themselves.
func (x *execution[T]) dropCounters(ctx context.Context) {
	if x.gen == nil {
		return
	}
	ks, _ := x.counterKeys()
	ctx, cancel := protocol.CleanupContext(ctx)
	defer cancel()
	if err := x.r.redis.Unlink(ctx, ks); err != nil {
		x.r.opts.Logger.Warn("keyswap: could not delete the run's counters; they expire by themselves", "key", x.r.key, "err", err)
	}
}

// retireTries bounds the sweeps of retire that find a generation still
// in its grace period (the server's clock behind the run's timer).
const retireTries = 3

// retire waits Options.Grace, then sweeps each index that a flip retired a
// generation of (gens.Sweep: the grace measured on the server's clock,
// which stamped the retirement). A cancelled ctx leaves them, retired, to
// a later sweep; so does a negative Grace.
func (r *Rebuilder[T]) retire(ctx context.Context, retired [][]int64) {
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
			res, err := gens.Sweep(ctx, r.redis.Client(), r.genIndex(i), gens.Options{Grace: r.opts.Grace, Logger: r.opts.Logger})
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

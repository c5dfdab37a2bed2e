package rebuild

import (
	"context"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
	"golang.org/x/sync/errgroup"
)

// spreadWrites is the most per-slot transactions of a round trip in flight
// at once.
const spreadWrites = 256

// writeSpread is write on a cluster in Generations mode, where the keys of
// a round trip spread over many slots: its transactions are split by hash
// slot, and the parts of every transaction of the round trip in one slot
// go in one MULTI/EXEC, in the order of the transactions, with an INCR of
// the run's counter in that slot, so that the flip can tell whether Redis
// still holds every transaction it acknowledged. A round trip of merged
// writes that the sender sorted by slot (see sortBySlot) thus carries
// several buckets per transaction, rather than one or two. The writes go on
// the client's shared connections: the run's own connection (protocol.Bulk)
// serves one slot.
//
// Writes to one key are in one slot, so they reach Redis in the order of
// the transactions, as they do in write; writes to different slots never
// had an order between them: a cluster runs each master's commands apart.
//
// Each slot's part keeps its MULTI/EXEC, which now costs four commands
// (MULTI, INCR, EXPIRE, EXEC) per slot and round trip rather than per
// bucket. Sending a master's writes bare, each slot's followed by its INCR
// on one connection, would count on Redis replicating a prefix of that
// connection's stream; but the cluster client redirects and retries
// commands one by one (MOVED, ASK, TRYAGAIN), so a redirected write could
// reach its master after the INCR that vouches for it. And the EXISTS
// probes of a replayed change must see no other write between them and
// the change's.
func (x *writer) writeSpread(ctx context.Context, txns []*txn) error {
	r := x.r
	client := r.redis.Client()
	cb := client.B()
	sent := time.Now()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.TTL)
	defer cancel()
	l := x.lease()
	if h, beat := l.claim(sent, false); beat {
		// The heartbeat is in the locks' slot: a round trip of its own.
		cmd, err := l.command(h)
		if err != nil {
			l.settle(ctx, sent, h, nil) // reports the same error
		} else {
			res := client.DoMulti(wctx, cmd)
			l.settle(wctx, sent, h, &res[0])
		}
	}
	parts, slots := splitBySlot(txns)
	written := map[uint16][]*target{}
	for _, t := range txns {
		for _, tg := range t.writes {
			written[tg.slot] = append(written[tg.slot], tg)
		}
	}
	g := errgroup.Group{}
	g.SetLimit(spreadWrites)
	for _, slot := range slots {
		p := parts[slot]
		counter := x.gen.counters.key(slot)
		listed := x.listing(cb, written[slot], int(slot))
		g.Go(func() error {
			cmds := make(rueidis.Commands, 0, len(p.cmds)+2*len(p.probes)+len(listed)+4)
			cmds = append(cmds, cb.Multi().Build())
			for _, tg := range p.probes {
				cmds = append(cmds, cb.Exists().Key(tg.Key).Build())
			}
			cmds = append(cmds, p.cmds...)
			for _, tg := range p.probes {
				cmds = append(cmds, cb.Exists().Key(tg.Key).Build())
			}
			cmds = append(cmds, listed...)
			cmds = append(cmds, cb.Incr().Key(counter).Build(),
				cb.Expire().Key(counter).Seconds(2*r.ttlSecs).Build(), cb.Exec().Build())
			if err := x.check(p, client.DoMulti(wctx, cmds...)); err != nil {
				return err
			}
			x.gen.counters.add(slot)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	x.acked.Add(int64(len(txns)))
	return nil
}

// listing returns the commands that list ws, keys written by one
// transaction, in their generations' manifests: for each family of the run
// whose manifest is in slot (any slot when slot < 0, a standalone server),
// an RPUSH to its list (keys.ManifestListKey) of its keys of ws that no
// transaction carried yet. They go in the transaction of the writes, so
// that whenever a write lands, even after the run lost its lock, its key
// is listed. The run vouches for the list after its flip (vouch). A
// family whose keys spread over a cluster's slots has no manifest.
func (x *writer) listing(cb rueidis.Builder, ws []*target, slot int) rueidis.Commands {
	r := x.r
	var byBuilder map[int][]string
	for _, tg := range ws {
		o := r.owners[tg.builder]
		if !o.family || !x.gen.listed(r, tg.builder, slot) {
			continue
		}
		if tg.listed.CompareAndSwap(false, true) {
			if byBuilder == nil {
				byBuilder = map[int][]string{}
			}
			byBuilder[tg.builder] = append(byBuilder[tg.builder], tg.Key)
		}
	}
	var cmds rueidis.Commands
	for _, b := range slices.Sorted(maps.Keys(byBuilder)) {
		l := keys.ManifestListKey(r.owners[b].key, r.redis.Names(), x.gen.gens[b])
		cmds = append(cmds, cb.Rpush().Key(l).Element(byBuilder[b]...).Build())
	}
	return cmds
}

// listed reports whether builder b of the run has a manifest in slot (any
// slot when slot < 0): a family whose keys share its registry's slot
// (keys.SameSlot).
func (g *generations) listed(r *core, b, slot int) bool {
	if !keys.SameSlot(r.owners[b].key, r.redis.Names()) {
		return false // spread over a cluster's slots, or in a group
	}
	m := keys.ManifestKey(r.owners[b].key, r.redis.Names(), g.gens[b])
	return slot < 0 || int(keys.Slot(m)) == slot
}

// vouch marks the manifests of the run's families listed
// (keys.ManifestListed in each set), after a flip to the run's
// generations: every key the run wrote in them is in their lists (written
// in the transaction of the writes, all acknowledged before the flip),
// every key the flip's tail wrote is in their sets (listed by the flip, in
// its step), and from the flip on Apply adds the keys it writes to the
// sets in the step of its writes. The removal of such a generation, once
// retired, then reads its manifest rather than SCANning (see gens.Sweep).
// An error leaves them unmarked, which costs a SCAN and nothing else: it
// is logged at the Debug level.
func (g *generations) vouch(ctx context.Context, r *core) {
	cb := r.redis.Client().B()
	var cmds rueidis.Commands
	var sets []string
	for b, o := range r.owners {
		if o.family && g.listed(r, b, -1) {
			m := keys.ManifestKey(o.key, r.redis.Names(), g.gens[b])
			sets = append(sets, m)
			cmds = append(cmds, cb.Sadd().Key(m).Member(keys.ManifestListed).Build())
		}
	}
	if len(cmds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.TTL)
	defer cancel()
	for i, res := range r.redis.Client().DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			r.opts.Logger.Debug("keyswap: could not mark a generation's manifest listed; its removal will SCAN", "key", r.key, "manifest", sets[i], "error", err)
		}
	}
}

// splitBySlot splits txns by the hash slot of their commands: one
// transaction per slot, with that slot's commands of every one of txns in
// turn, and the slots in the order they first appear.
func splitBySlot(txns []*txn) (map[uint16]*txn, []uint16) {
	out := map[uint16]*txn{}
	var slots []uint16
	from := map[uint16]*txn{}  // the last of txns with a part in each slot
	others := map[uint16]int{} // how many more of txns have one
	for _, t := range txns {
		parallel := len(t.members) == len(t.cmds) && len(t.writes) == len(t.cmds)
		part := func(s uint16) *txn {
			p := out[s]
			switch {
			case p == nil:
				p = &txn{label: t.label}
				out[s] = p
				slots = append(slots, s)
				from[s] = t
			case from[s] != t:
				from[s] = t
				others[s]++
			}
			return p
		}
		for i, c := range t.cmds {
			p := part(c.Slot())
			if parallel {
				// members and writes stay parallel to cmds: nil where
				// those of a transaction before t are not (a batch's own
				// writes).
				for len(p.members) < len(p.cmds) {
					p.members = append(p.members, nil)
					p.writes = append(p.writes, nil)
				}
				p.writes = append(p.writes, t.writes[i])
				p.members = append(p.members, t.members[i])
			}
			if len(t.sized) == len(t.cmds) {
				// Every transaction of a Generations run has them.
				p.sized = append(p.sized, t.sized[i])
			}
			p.cmds = append(p.cmds, c)
		}
		for _, tg := range t.probes {
			p := part(tg.slot)
			// One pair of EXISTS per key and transaction: before the
			// first write of any of txns, after the last.
			if !slices.Contains(p.probes, tg) {
				p.probes = append(p.probes, tg)
			}
		}
	}
	for _, s := range slots {
		p := out[s]
		if n := others[s]; n > 0 {
			p.label = fmt.Sprintf("%s and %d more, slot %d", p.label, n, s)
		} else {
			p.label = fmt.Sprintf("%s, slot %d", p.label, s)
		}
	}
	return out, slots
}

// sortBySlot sorts cmds by the hash slot of their keys, on a cluster in
// Generations mode, so that pack fills each transaction with few slots
// and writeSpread sends few transactions: a family spread over every slot
// would otherwise have one transaction, and one counter INCR, per bucket or
// two. The commands are merged writes of AnyOrder builders (each on a key
// of its own, in any order); their order within a slot is kept.
func (x *writer) sortBySlot(cmds []mergedCmd) []mergedCmd {
	if x.gen == nil || !x.r.redis.Cluster() {
		return cmds
	}
	return sortBySlot(cmds)
}

// sortBySlot sorts cmds by the hash slot of their keys (see
// writer.sortBySlot), by the slot's bits in reverse order: still grouped
// by slot, but consecutive groups far apart in the slot space, and so on
// every master in turn (a master serves ranges of slots), rather than a
// round trip's transactions all on one master. The drain of a family of
// 100,000 buckets sorts as many commands: they are counted into place.
func sortBySlot(cmds []mergedCmd) []mergedCmd {
	if len(cmds) < 2 {
		return cmds
	}
	order := make([]uint16, len(cmds))
	for i, c := range cmds {
		order[i] = bits.Reverse16(c.t.slot) >> 2 // 14 bits
	}
	if len(cmds) < 1024 {
		idx := make([]int, len(cmds))
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int { return int(order[a]) - int(order[b]) })
		out := make([]mergedCmd, len(cmds))
		for i, j := range idx {
			out[i] = cmds[j]
		}
		return out
	}
	start := make([]int, keys.SlotCount+1)
	for _, o := range order {
		start[o+1]++
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	out := make([]mergedCmd, len(cmds))
	for i, c := range cmds {
		out[start[order[i]]] = c
		start[order[i]]++
	}
	return out
}

package rebuild

import (
	"context"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"strings"
	"sync"
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
// The slots' transactions go by master: each master's, one after the
// other, in one DoMulti on that master's node client (rueidis
// Client.Nodes, on the cluster client's connections), the masters in
// parallel, rather than one DoMulti of the cluster client per slot. The
// masters are read with CLUSTER SLOTS once per run (slotMasters), and
// again after a fallback; a slot of no known master goes on its own on the
// cluster client. A node client follows no redirection: a transaction
// that its master did not run because its slot moved (MOVED, ASK,
// TRYAGAIN, CLUSTERDOWN, answered to a command or to EXEC, which then ran
// nothing: see unrun), or whose EXEC rueidis never sent (its connection
// past ClientOption.ConnLifetime: see unsent), is sent again on its own on
// the cluster client, which follows them. Nothing else is sent again: a transaction whose
// reply is lost (a broken connection, a timeout) may have run, and fails
// the run, as any other error does.
//
// Writes to one key are in one slot, so they reach Redis in the order of
// the transactions, as they do in write: a round trip has one transaction
// per slot, a transaction sent again had not run, and writeSpread returns
// only once every one of the round trip's transactions is acknowledged,
// which the sender waits for before it sends a round trip that must come
// after. Writes to different slots never had an order between them: a
// cluster runs each master's commands apart, and a slot's transaction
// does not depend on the one before it in its master's DoMulti.
//
// Each slot's part keeps its MULTI/EXEC, which now costs four commands
// (MULTI, INCR, EXPIRE, EXEC) per slot and round trip rather than per
// bucket. Sending a master's writes bare, each slot's followed by its INCR
// on one connection, would count on Redis replicating a prefix of that
// connection's stream; but the cluster client redirects and retries
// commands one by one (MOVED, ASK, TRYAGAIN), so a redirected write could
// reach its master after the INCR that vouches for it; and a write sent
// again after a redirection must be known not to have run, which EXEC
// tells of a whole transaction. And the EXISTS probes of a replayed change
// must see no other write between them and the change's.
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
	sends := make([]slotSend, len(slots))
	for i, slot := range slots {
		p := parts[slot]
		counter := x.gen.counters.key(slot)
		listed := x.listing(cb, written[slot], int(slot))
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
		sends[i] = slotSend{slot: slot, p: p, cmds: cmds}
	}
	m := x.slotMasters(wctx)
	g := errgroup.Group{}
	g.SetLimit(spreadWrites)
	byNode := make([][]*slotSend, len(m.nodes))
	for i := range sends {
		s := &sends[i]
		if n := m.of[s.slot]; n >= 0 {
			byNode[n] = append(byNode[n], s)
			continue
		}
		g.Go(func() error { return x.sendSlot(wctx, s) })
	}
	var mu sync.Mutex
	var again []*slotSend
	for n, ss := range byNode {
		if len(ss) == 0 {
			continue
		}
		g.Go(func() error {
			size := 0
			for _, s := range ss {
				size += len(s.cmds)
			}
			all := make(rueidis.Commands, 0, size)
			for _, s := range ss {
				for i, c := range s.cmds {
					// A transaction its master did not run is sent
					// again: rueidis must not recycle its commands.
					s.cmds[i] = c.Pin()
				}
				all = append(all, s.cmds...)
			}
			res := m.nodes[n].DoMulti(wctx, all...)
			for _, s := range ss {
				sr := res[:len(s.cmds)]
				res = res[len(s.cmds):]
				if unrun(sr) || unsent(sr) {
					mu.Lock()
					again = append(again, s)
					mu.Unlock()
					continue
				}
				if err := x.checkSlot(s, sr); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if len(again) > 0 {
		// A slot moved: read the masters again for the next round trip.
		x.masters.CompareAndSwap(m, nil)
		for _, s := range again {
			g.Go(func() error { return x.sendSlot(wctx, s) })
		}
		if err := g.Wait(); err != nil {
			return err
		}
	}
	x.acked.Add(int64(len(txns)))
	return nil
}

// slotSend is one slot's transaction of a round trip in writeSpread: the
// slot's part of the round trip's transactions, and the commands of its
// MULTI ... EXEC.
type slotSend struct {
	slot uint16
	p    *txn
	cmds rueidis.Commands
}

// sendSlot sends s on its own on the cluster client, which follows
// redirections, and checks it.
func (x *writer) sendSlot(ctx context.Context, s *slotSend) error {
	return x.checkSlot(s, x.r.redis.Client().DoMulti(ctx, s.cmds...))
}

// checkSlot checks the replies to s, and counts the transaction in its
// slot's counter once its EXEC confirmed it.
func (x *writer) checkSlot(s *slotSend, res []rueidis.RedisResult) error {
	if err := x.check(s.p, res); err != nil {
		return err
	}
	x.gen.counters.add(s.slot)
	return nil
}

// connExpired is the text of the error rueidis (v1.0.79, errConnExpired,
// not exported) answers a command with when it was to go on a connection
// past ClientOption.ConnLifetime: it closes such a connection once the
// commands sent on it are answered, and answers this, without sending
// them, to those that came after. Its cluster client then sends a
// transaction with such a reply again from its MULTI, on a new
// connection; a node client of Client.Nodes does not. If rueidis changes
// the text, TestGenerationsSpreadConnLifetime fails on any run.
const connExpired = "connection is expired"

// unsent reports whether res, the replies to a MULTI ... EXEC a node client
// sent, tell that its EXEC never went out: rueidis answered it connExpired.
// The transaction then ran nothing (a MULTI without its EXEC ends with its
// connection), and goes again on the cluster client, as that client would
// have sent it again itself.
func unsent(res []rueidis.RedisResult) bool {
	err := res[len(res)-1].NonRedisError()
	return err != nil && err.Error() == connExpired
}

// unrun reports whether res, the replies to a MULTI ... EXEC a node client
// sent, tell that its master ran none of it because the slot is not (or
// not wholly) its own: MULTI was queued, and EXEC answered a cluster's
// error (see clusterErr), or EXECABORT after every command refused to
// queue answered one. Any other error, and above all one that is not
// Redis's (a broken connection, a timeout: EXEC may have run), is not.
func unrun(res []rueidis.RedisResult) bool {
	if res[0].Error() != nil {
		return false
	}
	e, ok := rueidis.IsRedisErr(res[len(res)-1].Error())
	if !ok {
		return false
	}
	refused := 0
	for _, q := range res[1 : len(res)-1] {
		if err := q.Error(); err != nil {
			if !clusterErr(err) {
				return false
			}
			refused++
		}
	}
	return clusterErr(e) || (refused > 0 && strings.HasPrefix(e.Error(), "EXECABORT"))
}

// clusterErr reports whether err is a cluster's refusal of a command of a
// slot it does not serve now: MOVED, ASK, TRYAGAIN or CLUSTERDOWN. The
// command did not run.
func clusterErr(err error) bool {
	e, ok := rueidis.IsRedisErr(err)
	if !ok {
		return false
	}
	_, moved := e.IsMoved()
	_, ask := e.IsAsk()
	return moved || ask || e.IsTryAgain() || e.IsClusterDown()
}

// slotMasters are the node clients of a cluster's masters, and the master
// of each hash slot.
type slotMasters struct {
	nodes []rueidis.Client
	of    [keys.SlotCount]int16 // each slot's index in nodes; -1 for none known
}

// slotMasters returns the masters of the cluster's slots: read with
// CLUSTER SLOTS at the run's first round trip on a cluster, and again
// after one whose transaction its master did not run (writeSpread). A
// reply that cannot be read (CLUSTER SLOTS refused to the user, say)
// leaves every slot without a known master for the run; a lost one, for
// this round trip.
func (x *writer) slotMasters(ctx context.Context) *slotMasters {
	if m := x.masters.Load(); m != nil {
		return m
	}
	m := &slotMasters{}
	for i := range m.of {
		m.of[i] = -1
	}
	client := x.r.redis.Client()
	res := client.Do(ctx, client.B().ClusterSlots().Build())
	if res.NonRedisError() != nil {
		return m
	}
	ranges, err := res.ToArray()
	var spans slotSpans
	if err == nil {
		spans, err = parseClusterSlots(ranges)
	}
	if err != nil {
		x.r.opts.Logger.Debug("keyswap: could not read the masters of the cluster's slots; the run's writes go slot by slot", "key", x.r.key, "error", err)
	}
	nodes := client.Nodes()
	index := map[string]int16{}
	for _, sp := range spans {
		node, ok := nodes[sp.master]
		if !ok {
			continue
		}
		n, seen := index[sp.master]
		if !seen {
			n = int16(len(m.nodes))
			index[sp.master] = n
			m.nodes = append(m.nodes, node)
		}
		for s := max(sp.from, 0); s <= min(sp.to, keys.SlotCount-1); s++ {
			m.of[s] = n
		}
	}
	x.masters.Store(m)
	return m
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

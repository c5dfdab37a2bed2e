package rebuild

import (
	"context"
	"fmt"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
	"golang.org/x/sync/errgroup"
)

// counterKey returns the key of the counter of the run's transactions in
// slot: in slot, named after the run's base and its first generation.
func (x *execution[T]) counterKey(slot uint16) string {
	return keys.CounterKey(x.r.lives[0], slot, x.gen.gens[0])
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
		if len(t.sized) == len(t.cmds) {
			p.sized = append(p.sized, t.sized[i])
		}
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

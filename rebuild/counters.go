package rebuild

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

// slotCounters are the counters of a run's transactions per hash slot, on
// a cluster in Generations mode: writeSpread INCRs the counter of a slot
// in each transaction it sends there, and counts the transaction once
// Redis acknowledged it (add). It owns the counts, and what it needs to
// name, check, renew and delete the counters. allocate makes it with the
// run's generations; the flip compares the counters with the counts
// (check), the lease renews them (renew), and the end of the run deletes
// them (drop).
type slotCounters struct {
	redis   *protocol.Redis
	runKey  string // the run's, for errors
	base    string // the lock base of the run's first index: the counters are named after it
	gen     int64  // the generation the run builds of it
	ttlSecs int64  // the lease, in seconds: the counters live twice as long
	logger  *slog.Logger

	mu     sync.Mutex
	counts map[uint16]int64 // transactions acknowledged per slot
	waits  []string         // keys a durability wait wrote for the claims (claimed)
}

// newSlotCounters returns the counters of a run of r that builds
// generations gens (one per builder).
func newSlotCounters(r *core, gens []int64) *slotCounters {
	return &slotCounters{
		redis: r.redis, runKey: r.key, base: keys.Base(r.lives[0], r.redis.Names()), gen: gens[0], ttlSecs: r.ttlSecs, logger: r.opts.Logger,
		counts: map[uint16]int64{},
	}
}

// key returns the key of the counter of the run's transactions in slot:
// in slot, named after the run's base and its first generation.
func (c *slotCounters) key(slot uint16) string {
	return keys.CounterKey(c.base, slot, c.gen)
}

// add counts a transaction Redis acknowledged in slot.
func (c *slotCounters) add(slot uint16) {
	c.mu.Lock()
	c.counts[slot]++
	c.mu.Unlock()
}

// keys returns the keys of the run's per-slot counters, and the
// counts the run expects of them.
func (c *slotCounters) keys() ([]string, []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ks []string
	var want []int64
	for s, n := range c.counts {
		ks = append(ks, c.key(s))
		want = append(want, n)
	}
	return ks, want
}

// claimKeys returns, for a run in group (none without one) of the
// indexes lives, the key of a counter in the slot of each index's own
// base, where the run claimed it (claim.lua), but for those among ks (the
// run's counters) and repeats: the keys a durability wait may bind to, to
// wait on the claims' masters.
func (c *slotCounters) claimKeys(group string, lives []string, ks []string) []string {
	if group == "" {
		return nil
	}
	var claims []string
	for _, live := range lives {
		k := c.key(keys.Slot(keys.PointerKey(live, true)))
		if !slices.Contains(ks, k) && !slices.Contains(claims, k) {
			claims = append(claims, k)
		}
	}
	return claims
}

// claimed records k, a key of claimKeys that a durability wait wrote, for
// drop.
func (c *slotCounters) claimed(k string) {
	c.mu.Lock()
	if !slices.Contains(c.waits, k) {
		c.waits = append(c.waits, k)
	}
	c.mu.Unlock()
}

// check compares the run's per-slot counters with the
// transactions the run saw acknowledged: a counter below its count lost
// writes (a failover to a replica that was behind, a restart), and the run
// must not publish.
func (c *slotCounters) check(ctx context.Context) error {
	ks, want, replies := c.do(ctx, func(b rueidis.Builder, k string) rueidis.Completed { return b.Get().Key(k).Build() })
	for i, res := range replies {
		have, err := res.AsInt64()
		if rueidis.IsRedisNil(err) {
			have, err = 0, nil
		}
		if err != nil {
			return protocol.Fail(ctx, "publish", c.runKey, fmt.Errorf("GET %s: %w", ks[i], err))
		}
		if have < want[i] {
			return &Error{Op: "publish", Key: c.runKey, Err: fmt.Errorf("%w: Redis acknowledged %d transactions of this run in the slot of %s but holds %d (a failover to a replica that was behind, or a restart from an older snapshot or AOF); every index left at its generation", ErrWritesLost, want[i], ks[i], have)}
		}
	}
	return nil
}

// renew renews the TTL of the run's per-slot counters: the lease's
// refresh in Generations mode, whose data keys have no TTL.
func (c *slotCounters) renew(ctx context.Context) error {
	_, _, replies := c.do(ctx, func(b rueidis.Builder, k string) rueidis.Completed {
		return b.Expire().Key(k).Seconds(2 * c.ttlSecs).Build()
	})
	for _, res := range replies {
		if err := res.Error(); err != nil {
			return err
		}
	}
	return nil
}

// do sends cmd of each of the run's per-slot counters in one round trip,
// and returns their keys, the counts the run expects of them, and the
// replies: none when the run counted no transaction.
func (c *slotCounters) do(ctx context.Context, cmd func(b rueidis.Builder, key string) rueidis.Completed) ([]string, []int64, []rueidis.RedisResult) {
	ks, want := c.keys()
	if len(ks) == 0 {
		return nil, nil, nil
	}
	client := c.redis.Client()
	cmds := make(rueidis.Commands, len(ks))
	for i, k := range ks {
		cmds[i] = cmd(client.B(), k)
	}
	return ks, want, client.DoMulti(ctx, cmds...)
}

// drop deletes the run's per-slot counters, best effort: they expire by
// themselves.
func (c *slotCounters) drop(ctx context.Context) {
	ks, _ := c.keys()
	c.mu.Lock()
	ks = append(ks, c.waits...)
	c.mu.Unlock()
	ctx, cancel := protocol.CleanupContext(ctx)
	defer cancel()
	if err := c.redis.Unlink(ctx, ks); err != nil {
		c.logger.Warn("keyswap: could not delete the run's counters; they expire by themselves", "key", c.runKey, "err", err)
	}
}

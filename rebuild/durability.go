package rebuild

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

// Durability is how durable a run's writes must be before they are
// published, for replicated or persisted deployments. The zero value waits
// for nothing. In Generations mode on a cluster, whose writes spread over
// the masters, each wait runs on every master the run wrote, at once, and
// all must succeed: with Options.Group, those of the claims and
// reservations too (each index's pointer and registry without a group,
// written before the build, in the slot of the index's own base). See the
// README, "Durability", for what each deployment gets with and without it.
type Durability struct {
	// Replicas is how many replicas must acknowledge every write of the run
	// before it is published (WAIT). Zero waits for none.
	Replicas int
	// LocalAOF makes the master fsync every write of the run to its AOF
	// before it is published (WAITAOF). It needs Redis 7.2 or later, with
	// appendonly yes: on an older server, or one without an AOF, Run fails
	// at once, before writing anything.
	LocalAOF bool
	// ReplicasAOF is how many replicas must fsync every write of the run to
	// their AOF before it is published (WAITAOF, Redis 7.2 or later).
	ReplicasAOF int
	// Timeout bounds the wait. Zero means 10 s (see [Defaults]), or half
	// the lease (Options.TTL) if that is shorter. The run keeps its lease
	// while it waits (its phase is PhaseWaiting), and an operator's cancel
	// ends the wait.
	//
	// WAIT and WAITAOF are blocking commands: rueidis sends them on a
	// connection of the client's blocking pool (ClientOption.BlockingPoolSize).
	// If the application keeps every one of them busy, with BLPOP say, for
	// longer than Timeout, the run fails closed with an error matching
	// ErrNotDurable that says so.
	Timeout time.Duration
}

// durability returns the run's Durability for package protocol.
func (r *core) durability() protocol.Durability {
	d := r.opts.Durability
	return protocol.Durability{Replicas: d.Replicas, LocalAOF: d.LocalAOF, ReplicasAOF: d.ReplicasAOF, Timeout: d.Timeout}
}

// checkDurability fills in and checks Options.Durability.
func (r *Rebuilder[T]) checkDurability(bad func(string, ...any) error) error {
	d := &r.opts.Durability
	switch {
	case d.Replicas < 0:
		return bad("Durability.Replicas %d: must not be negative", d.Replicas)
	case d.ReplicasAOF < 0:
		return bad("Durability.ReplicasAOF %d: must not be negative", d.ReplicasAOF)
	case d.Timeout < 0:
		return bad("Durability.Timeout %v: must not be negative (zero means %v)", d.Timeout, defaultDurabilityTimeout)
	}
	if d.Replicas == 0 && !d.LocalAOF && d.ReplicasAOF == 0 {
		return nil // nothing to wait for
	}
	d.Timeout = protocol.OrDefault(d.Timeout, min(defaultDurabilityTimeout, r.opts.TTL/2))
	return nil
}

// waitDurable makes the run's writes as durable as Options.Durability asks
// before the publish. In RenameInPlace mode, and in Generations mode on a
// standalone server, every write went to one master: the wait runs there,
// on the lock's connection. In Generations mode on a cluster the writes
// spread over the masters, and WAIT and WAITAOF count only the writes of
// the master they run on: the wait runs on the lock's master and, at once,
// on every other master that holds a slot the run wrote, each counted from
// a write of the run's counter in one of its slots, the claims' slots
// included (see RELIABILITY.md, "Generations mode", for the window this
// closes).
func (p *publisher) waitDurable(ctx context.Context, d protocol.Durability) error {
	r := p.r
	lock := p.locks[0].Key
	if p.gen == nil || !r.redis.Cluster() {
		return r.redis.Durable.Wait(ctx, "publish", r.key, lock, d)
	}
	ks, _ := p.gen.counters.keys()
	// A run in a group claimed each index and reserved its generation
	// (claim.lua) in the slot of the index's own base, whose master may
	// be none of those above: the claim and the reservation are writes of
	// the run too, and a failover that lost them would leave the group's
	// current generation unfenced (docs/generations.md, "What the claim
	// does not cover"). They are waited for here, before the flip, with
	// the run's other writes: they were written at the allocation, before
	// the first write of data, so a wait now covers them, and the flip is
	// the step that makes the generation they fence current.
	claims := p.gen.counters.claimKeys(r.opts.Group, r.lives, ks)
	ats, err := p.oneKeyPerMaster(ctx, lock, slices.Concat(ks, claims))
	if err != nil {
		return err
	}
	secs := 2 * r.ttlSecs
	errs := make([]error, len(ats)+1)
	var g sync.WaitGroup
	g.Go(func() { errs[0] = r.redis.Durable.Wait(ctx, "publish", r.key, lock, d) })
	for i, at := range ats {
		// The counter's own renewal (slotCounters.renew): a write that
		// Redis propagates while the counter exists. A counter gone
		// fails the check of the counters after the wait.
		touch := func(b rueidis.Builder) rueidis.Completed {
			return b.Expire().Key(at).Seconds(secs).Build()
		}
		if slices.Contains(claims, at) {
			// No counter of the run is on the claim's master: the write
			// the wait counts from is a counter of the claim's slot, made
			// for it (WAIT counts from the connection's last write, which
			// must come after the claim: EXPIRE of a missing key writes
			// nothing). It lives as long as the counters, and goes with
			// them (slotCounters.drop).
			p.gen.counters.claimed(at)
			touch = func(b rueidis.Builder) rueidis.Completed {
				return b.Set().Key(at).Value("0").ExSeconds(secs).Build()
			}
		}
		g.Go(func() { errs[i+1] = r.redis.Durable.WaitAt(ctx, "publish", r.key, at, touch, d) })
	}
	g.Wait()
	return errors.Join(errs...)
}

// oneKeyPerMaster returns, of ks (the run's per-slot counters), one key in
// a slot of each master of the cluster that holds a slot of ks, but for
// the master that holds lock. It reads the slots' masters with CLUSTER
// SLOTS: a slot that moves to another master after it was read is waited
// for on the master of the key chosen for its old master.
func (p *publisher) oneKeyPerMaster(ctx context.Context, lock string, ks []string) ([]string, error) {
	if len(ks) == 0 {
		return nil, nil
	}
	client := p.r.redis.Client()
	ranges, err := client.Do(ctx, client.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, protocol.Fail(ctx, "publish", p.r.key, fmt.Errorf("CLUSTER SLOTS: %w", err))
	}
	spans, err := parseClusterSlots(ranges)
	if err != nil {
		return nil, &Error{Op: "publish", Key: p.r.key, Err: err}
	}
	masterOf := func(k string) string {
		// A slot no master serves gives "": its key is waited for on its own.
		return spans.master(keys.Slot(k))
	}
	seen := map[string]bool{masterOf(lock): true}
	var ats []string
	for _, k := range ks {
		m := masterOf(k)
		if m == "" || !seen[m] {
			seen[m] = m != ""
			ats = append(ats, k)
		}
	}
	return ats, nil
}

// slotSpans are the ranges of hash slots of a cluster and the address
// (host:port) of the master that serves each, as CLUSTER SLOTS lists them.
type slotSpans []slotSpan

// slotSpan is a range of hash slots, from to to, and its master's address.
type slotSpan struct {
	from, to int64
	master   string
}

// parseClusterSlots parses ranges, the reply to CLUSTER SLOTS.
func parseClusterSlots(ranges []rueidis.RedisMessage) (slotSpans, error) {
	var spans slotSpans
	for _, rg := range ranges {
		f, err := rg.ToArray()
		if err != nil || len(f) < 3 {
			return nil, fmt.Errorf("CLUSTER SLOTS: an entry %v, want [start end [host port ...] ...]", f)
		}
		from, err1 := f[0].AsInt64()
		to, err2 := f[1].AsInt64()
		node, err3 := f[2].ToArray()
		if err := errors.Join(err1, err2, err3); err != nil || len(node) < 2 {
			return nil, fmt.Errorf("CLUSTER SLOTS: an entry %v, want [start end [host port ...] ...]: %w", f, err)
		}
		host, _ := node[0].ToString()
		port, _ := node[1].AsInt64()
		spans = append(spans, slotSpan{from, to, net.JoinHostPort(host, strconv.FormatInt(port, 10))})
	}
	return spans, nil
}

// master returns the address of the master that serves slot, or "" when
// none does.
func (spans slotSpans) master(slot uint16) string {
	s := int64(slot)
	for _, sp := range spans {
		if sp.from <= s && s <= sp.to {
			return sp.master
		}
	}
	return ""
}

package gens

import (
	"context"
	"fmt"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

// Planned is a generation that [Sweep] would remove.
type Planned struct {
	Gen   int64
	State State
	// Keys is the number of its data keys that exist, for a plain index
	// (0 or 1), read with EXISTS; -1 for a family, whose buckets are not
	// counted: that takes a SCAN of the whole keyspace, which a dry run
	// does not make.
	Keys int64
}

// Plan is what [Sweep] would do, as [DryRun] found it.
type Plan struct {
	Remove []Planned
	// Keep are the generations a sweep would keep, and why (Keys is
	// zero).
	Keep []Skipped
	// Now is the time the grace was measured at, as in [Result].
	Now time.Time
}

// DryRun returns what [Sweep] with opts would remove and keep of idx's
// generations now, and deletes nothing: it reads the registry, the
// pointer and the lock in one step ([Read]) and applies Sweep's rule to
// each generation. Only Grace and Now of opts matter. A corrupt registry
// or pointer fails it with a [*CorruptError], as it fails Sweep.
//
// The plan is that of a sweep starting now: a sweep run later reads the
// registry again, and keeps a generation whose state changed meanwhile.
func DryRun(ctx context.Context, client rueidis.Client, idx Index, opts Options) (Plan, error) {
	const op = "sweep dry run"
	var plan Plan
	o, snap, err := begin(ctx, client, idx, opts, op)
	if err != nil {
		return plan, err
	}
	plan.Now = o.Now
	var plain []string
	for _, g := range snap.Registry.Sorted() {
		st := snap.Registry.Gens[g]
		if reason := keep(o, snap, st); reason != "" {
			plan.Keep = append(plan.Keep, Skipped{Gen: g, State: st, Reason: reason})
			continue
		}
		plan.Remove = append(plan.Remove, Planned{Gen: g, State: st, Keys: -1})
		if !idx.Family {
			plain = append(plain, keys.GenKey(idx.Live, g))
		}
	}
	if len(plain) == 0 {
		return plan, nil
	}
	// One EXISTS per key: on a cluster they may be in different slots.
	cmds := make(rueidis.Commands, len(plain))
	for i, k := range plain {
		cmds[i] = client.B().Exists().Key(k).Build()
	}
	for i, r := range client.DoMulti(ctx, cmds...) {
		n, err := r.AsInt64()
		if err != nil {
			return plan, protocol.Fail(ctx, op, idx.Live, fmt.Errorf("EXISTS %s: %w", plain[i], err))
		}
		plan.Remove[i].Keys = n
	}
	return plan, nil
}

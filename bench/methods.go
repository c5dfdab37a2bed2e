package main

import (
	"context"
	"fmt"

	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"golang.org/x/sync/errgroup"
)

// method is one way of writing a workload's data.
type method string

const (
	methodLimit   method = "limit"   // redis-cli --pipe, 1000 entries per command
	methodRaw     method = "raw"     // the same commands through rueidis, no lock, lease or swap
	methodKeyswap method = "keyswap" // a full Rebuilder run onto an existing key
	// methodUnordered is keyswap with Options.Unordered: two round trips in
	// flight whatever they write. keyswap overlaps them too when every
	// builder is commutative or keyed and they share no entry.
	methodUnordered method = "unordered"
	methodNaive     method = "naive" // one command per entry, pipelined
)

// allMethods is every method, in the order of a round.
var allMethods = []method{methodLimit, methodRaw, methodKeyswap, methodUnordered, methodNaive}

// describe says what a method does, for the report.
func (m method) describe() string {
	switch m {
	case methodLimit:
		return "`redis-cli --pipe` of pre-generated RESP, 1000 entries per command: the physical limit"
	case methodRaw:
		return fmt.Sprintf("the same variadic commands through rueidis, %d batches in flight, no lock, lease or swap: the floor of our overhead", rebuild.Defaults().Writers)
	case methodKeyswap:
		return "a full `rebuild.Rebuilder` run (lock, lease, fenced publish), default options unless the command says otherwise, onto an existing key of the same size"
	case methodUnordered:
		return "keyswap with `Options.Unordered`: a second round trip is sent while the first is in flight, whatever the two write, for sources that yield each field or member once. keyswap does this by default when every builder is `AnyOrder` (Set, SetIndex) or `ByEntry` (Hash, SortedSet) and the two round trips write no field or member in common, as in every workload here"
	case methodNaive:
		return fmt.Sprintf("one command per entry, pipelined in DoMulti batches of %d commands, %d in flight", rebuild.Defaults().BatchSize, rebuild.Defaults().Writers)
	}
	return string(m)
}

// pipeline sends the commands of w for d, at most perCmd entries per
// command, in DoMulti batches of about rebuild.Defaults().BatchSize entries,
// with up to writers batches in flight: raw with perCmd = 1000, naive with
// perCmd = 1. It fails on the first error reply.
func pipeline(ctx context.Context, c rueidis.Client, w workload, d dataset, perCmd, writers int) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(writers)
	var batch rueidis.Commands
	entries := 0
	send := func() {
		b := batch
		g.Go(func() error {
			for i, r := range c.DoMulti(gctx, b...) {
				if err := r.Error(); err != nil {
					return fmt.Errorf("command %d of a batch of %d: %w", i+1, len(b), err)
				}
			}
			return nil
		})
		batch, entries = make(rueidis.Commands, 0, len(b)), 0
	}
	err := w.commands(d, perCmd, func(name, key string, args []string, n int) error {
		if gctx.Err() != nil {
			return gctx.Err()
		}
		batch = append(batch, c.B().Arbitrary(name).Keys(key).Args(args...).Build())
		if entries += n; entries >= rebuild.Defaults().BatchSize {
			send()
		}
		return nil
	})
	if err == nil && len(batch) > 0 {
		send()
	}
	if werr := g.Wait(); werr != nil {
		return werr
	}
	return err
}

// runRaw is the raw method.
func runRaw(ctx context.Context, c rueidis.Client, w workload, d dataset) error {
	return pipeline(ctx, c, w, d, perCommand, rebuild.Defaults().Writers)
}

// runNaive is the naive method.
func runNaive(ctx context.Context, c rueidis.Client, w workload, d dataset) error {
	return pipeline(ctx, c, w, d, 1, rebuild.Defaults().Writers)
}

// preload writes the previous dataset of d, which a keyswap run replaces.
func preload(ctx context.Context, c rueidis.Client, w workload, d dataset) error {
	if err := pipeline(ctx, c, w, d.previous(), perCommand, rebuild.Defaults().Writers); err != nil {
		return fmt.Errorf("preload: %w", err)
	}
	return nil
}

// rebuilder returns the Rebuilder of the keyswap method.
func rebuilder(c rueidis.Client, w workload, opts rebuild.Options) (*rebuild.Rebuilder[item], error) {
	return rebuild.New(c, opts, w.builders()...)
}

// runKeyswap runs r over d and checks its stats: every item seen, every
// entry written, every plain target swapped.
func runKeyswap(ctx context.Context, r *rebuild.Rebuilder[item], w workload, d dataset) error {
	stats, err := r.Run(ctx, sources.Seq(d.all()))
	if err != nil {
		return err
	}
	if stats.Items != int64(d.n) {
		return fmt.Errorf("keyswap: the run saw %d items, want %d", stats.Items, d.n)
	}
	for _, t := range w.targets {
		if got := stats.Entries[t.key]; got != int64(d.n) {
			return fmt.Errorf("keyswap: %s: %d entries written, want %d", t.key, got, d.n)
		}
		if o, ok := stats.Outcomes[t.key]; t.kind != kindIndex && (!ok || o != store.Swapped) {
			return fmt.Errorf("keyswap: %s: outcome %v, want %v", t.key, o, store.Swapped)
		}
	}
	return nil
}

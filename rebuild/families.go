package rebuild

import (
	"context"
	"fmt"
	"strings"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/scan"
)

// scanFamilies starts the family scans in rv.scans. It returns the sets
// they fill.
func (rv *reviewer) scanFamilies(ctx context.Context) []map[string]bool {
	x, g := rv.x, rv.scans
	live := make([]map[string]bool, len(x.r.owners))
	x.stalePrevs = make([]map[string]bool, len(x.r.owners))
	if x.gen != nil && len(x.r.opts.Guards) == 0 && x.held == nil {
		// Generations mode deletes nothing at the flip: the live buckets
		// serve the guards and a held run's review alone, and without
		// them a SCAN would visit every key of the keyspace (of every
		// master, for a family without a hash tag) for nothing.
		for i, o := range x.r.owners {
			if o.family {
				live[i] = map[string]bool{}
			}
		}
		return live
	}
	for i, o := range x.r.owners {
		if !o.family {
			continue
		}
		live[i] = map[string]bool{}
		prevs := map[string]bool{}
		x.stalePrevs[i] = prevs
		prefix := o.key + ":"
		// On a cluster every bucket is in the prefix's slot (its hash tag is
		// required): only that slot's master is scanned.
		opts := scan.Options{Match: scan.EscapeGlob(prefix) + "*", Type: o.keyType, InSlot: true, Slot: keys.Slot(o.key)}
		if x.gen != nil {
			// Generations mode deletes nothing at the flip (buckets the
			// run does not produce do not exist in its generation): the
			// buckets live now, in the current generation, are found for
			// the guards and a held run's review alone (and not scanned
			// at all without them, above).
			if cur := x.gen.current[i]; cur > 0 {
				g.Go(func() error { return rv.scanGeneration(ctx, i, o.keyType, cur, live[i]) })
				continue
			}
			if _, tagged := keys.HashTag(o.key); !tagged {
				opts.InSlot = false
			}
		}
		g.Go(func() error { return rv.scanFamily(ctx, opts, live[i], prevs) })
	}
	return live
}

// scanFamily adds to live the buckets of a family that SCAN with opts
// finds, and to prevs their kept previous values.
func (rv *reviewer) scanFamily(ctx context.Context, opts scan.Options, live, prevs map[string]bool) error {
	for page, err := range scan.Pages(ctx, rv.x.r.redis.Client(), opts) {
		if err != nil {
			return fmt.Errorf("SCAN %s: %w", opts.Match, err)
		}
		for _, k := range page {
			// keyswap's own keys are not buckets: temp keys, locks,
			// records, logs, and the kept previous values, which
			// the publish drops unless it replaces them.
			if bucket, ok := strings.CutSuffix(k, keys.PrevSuffix); ok && !keys.Reserved(bucket) {
				prevs[k] = true
			} else if !keys.Reserved(k) {
				live[k] = true
			}
		}
	}
	return nil
}

// scanGeneration adds to live the buckets of family builder i in its
// generation cur, under their plain names, from every master: a
// generation's keys spread over every slot.
func (rv *reviewer) scanGeneration(ctx context.Context, i int, kind string, cur int64, live map[string]bool) error {
	prefix := rv.x.r.owners[i].key
	opts := scan.Options{Match: keys.GenPattern(prefix, cur), Type: kind}
	if _, tagged := keys.HashTag(prefix); tagged {
		opts.InSlot, opts.Slot = true, keys.Slot(prefix)
	}
	gp := keys.GenPrefix(prefix, cur)
	for page, err := range scan.Pages(ctx, rv.x.r.redis.Client(), opts) {
		if err != nil {
			return fmt.Errorf("SCAN %s: %w", opts.Match, err)
		}
		for _, k := range page {
			if bucket, ok := strings.CutPrefix(k, gp); ok && bucket != "" {
				live[prefix+":"+bucket] = true
			}
		}
	}
	return nil
}

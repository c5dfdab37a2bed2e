package rebuild

import (
	"context"
	"fmt"
	"strings"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/scan"
	"golang.org/x/sync/errgroup"
)

// scanFamilies starts a SCAN per family builder for its live keys, whose
// leftovers become orphans at publish. It returns the sets the scans fill.
func (x *execution[T]) scanFamilies(ctx context.Context, g *errgroup.Group) []map[string]bool {
	live := make([]map[string]bool, len(x.r.builders))
	x.stalePrevs = make([]map[string]bool, len(x.r.builders))
	for i, b := range x.r.builders {
		f, ok := b.(index.Family)
		if !ok {
			continue
		}
		live[i] = map[string]bool{}
		prevs := map[string]bool{}
		x.stalePrevs[i] = prevs
		if x.gen != nil {
			// Generations mode deletes nothing at the flip: buckets the
			// run does not produce do not exist in its generation.
			continue
		}
		prefix := b.Key() + ":"
		// On a cluster every bucket is in the prefix's slot (its hash tag is
		// required): only that slot's master is scanned.
		opts := scan.Options{Match: scan.EscapeGlob(prefix) + "*", Type: f.KeyType(), InSlot: true, Slot: keys.Slot(b.Key())}
		g.Go(func() error {
			for page, err := range scan.Pages(ctx, x.r.redis.Client(), opts) {
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
						live[i][k] = true
					}
				}
			}
			return nil
		})
	}
	return live
}

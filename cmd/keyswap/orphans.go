package main

import (
	"context"
	"fmt"
	"time"

	"github.com/keyswap/keyswap/internal/sweep"
	"github.com/redis/rueidis"
)

// sweepCandidates returns the keys among ks that store.Sweep, run at now
// with OlderThan olderThan (and the legacy shape with legacy), would
// delete: status found them in its own SCAN, and a sweep's dry run would
// scan the keyspace a second time. It applies the library's own rule.
func sweepCandidates(ctx context.Context, client rueidis.Client, ks []string, now time.Time, olderThan time.Duration, legacy bool) ([]string, error) {
	rule := sweep.Rule{Cutoff: now.Add(-olderThan).Unix(), Legacy: legacy} // as store.Sweep computes it
	out, err := sweep.Orphans(ctx, client, ks, rule)
	if err != nil {
		return nil, fmt.Errorf("checking the sweep candidates: %w", err)
	}
	return out, nil
}

// existing returns which of ks exist, with EXISTS.
func existing(ctx context.Context, client rueidis.Client, ks []string) (map[string]bool, error) {
	cmds := make(rueidis.Commands, 0, len(ks))
	for _, k := range ks {
		cmds = append(cmds, client.B().Exists().Key(k).Build())
	}
	out := make(map[string]bool, len(ks))
	for i, r := range client.DoMulti(ctx, cmds...) {
		n, err := r.AsInt64()
		if err != nil {
			return nil, fmt.Errorf("EXISTS %s: %w", displayKey(ks[i]), err)
		}
		out[ks[i]] = n > 0
	}
	return out, nil
}

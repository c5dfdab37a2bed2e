package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// sweepCandidates returns the keys among ks that store.Sweep, run at now
// with OlderThan olderThan, would delete: status found them in its own SCAN,
// and a sweep's dry run would scan the keyspace a second time. It applies
// the sweep's four checks in the sweep's order, with the library's temp-key
// recogniser and lock rule: the name has a temp key's shape
// (keys.ParseTempKey); no lock exists for its base nor for a ':'-prefix of
// it (keys.VetoLocks); it has no TTL; its timestamp is older than now -
// olderThan.
//
// TODO(lib): replace with an exported (*store.Store).Orphans(ctx, ks
// []string, opts store.SweepOptions) ([]string, error) that returns the keys
// among ks that Sweep with opts would delete, without scanning or deleting:
// the per-page half of Store.Sweep (its orphans method), so that the rule is
// written once. Until then TestSweepCandidatesAgreeWithSweep holds this copy
// to store.Sweep.
func sweepCandidates(ctx context.Context, client rueidis.Client, ks []string, now time.Time, olderThan time.Duration) ([]string, error) {
	cutoff := now.Add(-olderThan).Unix() // as store.Sweep computes it
	type temp struct {
		key   string
		unix  int64
		locks []string
	}
	var temps []temp
	lockSet := map[string]bool{}
	for _, k := range ks {
		if base, unix, ok := keys.ParseTempKey(k); ok {
			t := temp{key: k, unix: unix, locks: keys.VetoLocks(base)}
			for _, l := range t.locks {
				lockSet[l] = true
			}
			temps = append(temps, t)
		}
	}
	held, err := existing(ctx, client, slices.Sorted(maps.Keys(lockSet)))
	if err != nil {
		return nil, err
	}
	unlocked := slices.DeleteFunc(temps, func(t temp) bool {
		return slices.ContainsFunc(t.locks, func(l string) bool { return held[l] })
	})
	cmds := make(rueidis.Commands, 0, len(unlocked))
	for _, t := range unlocked {
		cmds = append(cmds, client.B().Ttl().Key(t.key).Build())
	}
	var out []string
	for i, r := range client.DoMulti(ctx, cmds...) {
		ttl, err := r.AsInt64()
		if err != nil {
			return nil, fmt.Errorf("TTL %s: %w", displayKey(unlocked[i].key), err)
		}
		if ttl == -1 && unlocked[i].unix < cutoff {
			out = append(out, unlocked[i].key)
		}
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

package store

import (
	"context"
	"fmt"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/keyswap/keyswap/internal/sweep"
)

// SweepOptions configures [Store.Sweep]. The zero value sweeps every temp
// key older than an hour.
type SweepOptions struct {
	// Pattern is the SCAN MATCH pattern. Empty means DefaultSweepPattern,
	// "*:rebuild:*". Keys the pattern matches are still checked against the
	// temp-key shape.
	Pattern string
	// OlderThan is the minimum age of a temp key to delete, judged by the
	// timestamp in its name. Zero means DefaultSweepOlderThan; negative is
	// an error.
	OlderThan time.Duration
	// DryRun reports what would be deleted and deletes nothing.
	DryRun bool
	// Legacy also sweeps keys of the legacy shape "<key>:rebuild:<digits>",
	// without a nonce, which Familia made before its temp keys had one.
	// keyswap does not make that shape, and application keys can have it
	// (ci:rebuild:12345, jobs:rebuild:20240101), so it is swept only when
	// you ask: after an upgrade from Familia, say. The current shape
	// "<key>:rebuild:<unix>:<16 hex>" is always swept.
	Legacy bool
	// Progress, if not nil, is called after each SCAN call with the sweep's
	// progress so far.
	Progress func(SweepProgress)
}

// SweepProgress is a sweep's progress, for a progress bar.
type SweepProgress struct {
	// Visited estimates the keys SCAN has visited: its COUNT hint times
	// the SCAN calls so far, over every master. Compare it with DBSIZE.
	Visited int64
	// Matched is the number of keys the pattern matched so far.
	Matched int
	// Swept is the number of keys deleted (or, with DryRun, to delete).
	Swept int
}

// Sweep deletes orphaned temp keys left behind by crashed processes, and
// returns the keys it deleted (or, with DryRun, would delete).
//
// A key is deleted only if all of these hold, checked in this order:
//
//  1. it has a temp key's shape: the current one, or with Legacy the legacy
//     one too;
//  2. no rebuild lock exists for its base, nor for any ':'-separated prefix
//     of its base (a SetIndex family locks its prefix, while its buckets'
//     temp keys derive from the bucket keys below it);
//  3. it has no TTL (TTL is exactly -1), so it would never clean itself up:
//     a TTL means its rebuild is alive or it is on a diagnostic window;
//  4. its timestamp is strictly older than now - OlderThan.
//
// So the sweep never deletes a lock, a key with a TTL, a vanished key, a
// recent key, or a key whose rebuild holds the lock. A running
// rebuild's temp key has no TTL between the write that creates it and the
// first touch; deleting it then would turn the owner's swap into an empty
// rebuild, which is why a held lock vetoes it.
//
// Sweep uses SCAN, never KEYS. On a cluster it scans every master
// (nodes whose ROLE is not "master" are skipped; a node that cannot answer
// ROLE, as with miniredis, is scanned anyway) and deletes through the
// Store's client, one hash slot at a time, in chunks.
//
// # Rolling upgrades
//
// Do not run Sweep during a rolling upgrade from a version without the
// rebuild lock. Such versions hold no lock and put no TTL on their
// temp keys, so the sweep cannot tell their running rebuilds from abandoned
// ones: past OlderThan it deletes both, and the old code then swaps a
// missing temp key as an empty rebuild and deletes the live index. Sweep
// once every process runs a locking version and no older rebuild is left.
func (s *Store) Sweep(ctx context.Context, opts SweepOptions) ([]string, error) {
	const op = "sweep"
	pattern := opts.Pattern
	if pattern == "" {
		pattern = DefaultSweepPattern
	}
	olderThan := protocol.OrDefault(opts.OlderThan, DefaultSweepOlderThan)
	if olderThan < 0 {
		return nil, &Error{Op: op, Err: fmt.Errorf("OlderThan %v: must not be negative", olderThan)}
	}
	cutoff := s.now().Add(-olderThan).Unix()

	swept := []string{}
	var progress SweepProgress
	seen := map[string]bool{} // SCAN may return a key more than once
	for page, err := range scan.Pages(ctx, s.redis.Client(), scan.Options{Match: pattern, Count: sweep.Chunk}) {
		if err != nil {
			return swept, protocol.Fail(ctx, op, "", err)
		}
		fresh := page[:0]
		for _, k := range page {
			if !seen[k] {
				seen[k] = true
				fresh = append(fresh, k)
			}
		}
		doomed, err := sweep.Orphans(ctx, s.redis.Client(), fresh, sweep.Rule{Cutoff: cutoff, Legacy: opts.Legacy})
		if err != nil {
			return swept, protocol.Fail(ctx, op, "", err)
		}
		if !opts.DryRun {
			if err := sweep.Unlink(ctx, s.redis.Client(), doomed); err != nil {
				return swept, protocol.Fail(ctx, op, "", err)
			}
		}
		swept = append(swept, doomed...)
		progress.Visited += sweep.Chunk
		progress.Matched += len(page)
		progress.Swept = len(swept)
		if opts.Progress != nil {
			opts.Progress(progress)
		}
	}
	return swept, nil
}

package main

import (
	"slices"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/keyswap/keyswap/store"
)

// TestSweepCandidatesAgreeWithSweep holds sweepCandidates, the CLI's copy of
// the sweep's rule, to the library's: over a keyspace of orphans and of keys
// that only look like orphans (a TTL, a recent timestamp, a lock on the key,
// a lock on its family's prefix, a running rebuild), both pick the same
// keys, whatever the cutoff.
func TestSweepCandidatesAgreeWithSweep(t *testing.T) {
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			s := seedSweep(t, d)
			p := redistest.Prefix(t)
			old := time.Now().Add(-2 * time.Hour).Unix()
			family := "{" + p + "fam}:idx"
			bucket := keys.TempKey(family+":us", d.cluster, old, 7)
			do(t, d.client, "SET", bucket, "x")
			do(t, d.client, "SET", keys.LockKey(family, d.cluster), "token", "EX", "600")

			var ks []string
			for page, err := range scan.Pages(t.Context(), d.client, scan.Options{Match: "*" + p + "*"}) {
				if err != nil {
					t.Fatal(err)
				}
				ks = append(ks, page...)
			}
			now := time.Now()
			for _, olderThan := range []time.Duration{time.Minute, time.Hour, 3 * time.Hour} {
				got, err := sweepCandidates(t.Context(), d.client, ks, now, olderThan, false)
				if err != nil {
					t.Fatal(err)
				}
				want, err := store.New(d.client, store.Options{Now: func() time.Time { return now }}).
					Sweep(t.Context(), store.SweepOptions{Pattern: testSweepPattern(t), OlderThan: olderThan, DryRun: true})
				if err != nil {
					t.Fatal(err)
				}
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Errorf("older than %v: sweepCandidates got %q, store.Sweep %q", olderThan, got, want)
				}
				if olderThan == time.Hour && !slices.Equal(got, s.orphans) {
					t.Errorf("older than 1h: got %q, want the orphans %q", got, s.orphans)
				}
			}
		})
	}
}

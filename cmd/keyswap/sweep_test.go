package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
)

// testSweepPattern is a --pattern that sees only the running test's keys,
// whatever hash tag a cluster puts in front of them.
func testSweepPattern(t *testing.T) string { return "*" + redistest.Prefix(t) + "*:rebuild:*" }

// sweepSeed is the keyspace of a sweep test.
type sweepSeed struct {
	// orphans are the keys a sweep must delete, sorted.
	orphans []string
	// legacy is an orphan of the legacy shape: swept only with --legacy.
	legacy string
	// kept are the keys a sweep must leave alone.
	kept []string
	// rb is a running rebuild whose temp key is old and TTL-less: only its
	// lock protects it.
	rb *rebuild
}

// seedSweep fills d with orphans, with keys that look like orphans but are
// not (C38), and with a running rebuild that has written its temp key, two
// hours old by its name, and not touched it yet: the window in which only
// the lock tells the sweep to keep away.
func seedSweep(t *testing.T, d deployment) sweepSeed {
	t.Helper()
	p := testPrefix(t, d)
	old := time.Now().Add(-2 * time.Hour).Unix()
	c := d.client
	var s sweepSeed

	s.rb = startRebuild(t, c, p+"live", store.Options{Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }}, false)
	s.kept = append(s.kept, s.rb.temp, s.rb.lockKey)

	// Orphans: old, no TTL, no lock.
	a := keys.TempKey(p+"a", d.cluster, old, 1)
	do(t, c, "HSET", a, "f", "v")
	f := keys.TempKey(p+"f", d.cluster, old, 5)
	do(t, c, "SET", f, "x")
	s.orphans = []string{a, f}
	s.legacy = p + "legacy:rebuild:" + strconv.FormatInt(old, 10)
	do(t, c, "SET", s.legacy, "x")

	// Not orphans.
	withTTL := keys.TempKey(p+"b", d.cluster, old, 2)
	do(t, c, "SET", withTTL, "x", "EX", "600")
	recent := keys.TempKey(p+"c", d.cluster, time.Now().Unix(), 3)
	do(t, c, "SET", recent, "x")
	locked := keys.TempKey(p+"d", d.cluster, old, 4)
	do(t, c, "SET", locked, "x")
	lock := keys.LockKey(p+"d", d.cluster)
	do(t, c, "SET", lock, "someone-elses-token", "EX", "600")
	liveKey := p + "e"
	do(t, c, "SET", liveKey, "x")
	s.kept = append(s.kept, withTTL, recent, locked, lock, liveKey, s.legacy)

	slices.Sort(s.orphans)
	return s
}

// wantKeys fails unless each of ks exists (want true) or not (want false).
func wantKeys(t *testing.T, d deployment, ks []string, want bool) {
	t.Helper()
	for _, k := range ks {
		if got := exists(t, d.client, k); got != want {
			t.Errorf("%s exists: got %v, want %v", k, got, want)
		}
	}
}

func TestSweepDryRunDeletesNothing(t *testing.T) {
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			s := seedSweep(t, d)
			r := keyswap(t, d.args("sweep", "--pattern", testSweepPattern(t))...)
			r.wantCode(t, exitOrphans)
			want := strings.Join(s.orphans, "\n") + "\nwould delete 2 keys of " + d.server().String() + " (dry run; pass --delete to delete)\n"
			if r.stdout != want {
				t.Errorf("stdout: got\n%s\nwant\n%s", r.stdout, want)
			}
			if r.stderr != "" {
				t.Errorf("stderr: got %q, want none", r.stderr)
			}
			wantKeys(t, d, s.orphans, true)
			wantKeys(t, d, s.kept, true)

			// --dry-run says so explicitly, and does the same.
			r = keyswap(t, d.args("sweep", "--dry-run", "--pattern", testSweepPattern(t))...)
			r.wantCode(t, exitOrphans)
			if r.stdout != want || r.stderr != "" {
				t.Errorf("--dry-run: got stdout\n%s\nstderr %q, want\n%s", r.stdout, r.stderr, want)
			}
			wantKeys(t, d, s.orphans, true)

			// -json says the same.
			r = keyswap(t, d.args("sweep", "-json", "--pattern", testSweepPattern(t), "--older-than", "90m")...)
			r.wantCode(t, exitOrphans)
			rep := decodeSweep(t, r.stdout)
			if !rep.DryRun || rep.Pattern != testSweepPattern(t) || rep.OlderThanSeconds != 5400 ||
				!slices.Equal(rep.Keys, s.orphans) || rep.Count != 2 || rep.Error != "" {
				t.Errorf("sweep -json: got %+v, want a dry run of %q", rep, s.orphans)
			}
			wantKeys(t, d, s.orphans, true)

			// A younger cutoff than the orphans' age finds nothing.
			r = keyswap(t, d.args("sweep", "--pattern", testSweepPattern(t), "--older-than", "3h")...)
			r.wantCode(t, exitOK)
			if want := "would delete 0 keys of " + d.server().String() + " (dry run; pass --delete to delete)\n"; r.stdout != want {
				t.Errorf("--older-than 3h: got %q, want %q", r.stdout, want)
			}
		})
	}
}

func TestSweepDeleteRemovesExactlyTheOrphans(t *testing.T) {
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			s := seedSweep(t, d)
			r := keyswap(t, d.args("sweep", "--delete", "--pattern", testSweepPattern(t))...)
			r.wantCode(t, exitOK)
			want := strings.Join(s.orphans, "\n") + "\ndeleted 2 keys of " + d.server().String() + "\n"
			if r.stdout != want {
				t.Errorf("stdout: got\n%s\nwant\n%s", r.stdout, want)
			}
			wantKeys(t, d, s.orphans, false)
			wantKeys(t, d, s.kept, true)

			// The running rebuild never noticed: it swaps its temp key in.
			if err := s.rb.finish(); err != nil {
				t.Fatalf("rebuild after the sweep: %v", err)
			}
			got, err := d.client.Do(t.Context(), d.client.B().Hgetall().Key(s.rb.final).Build()).AsStrMap()
			if err != nil || len(got) != 3 {
				t.Errorf("live key after the rebuild: got %v, %v, want 3 fields", got, err)
			}

			// Nothing is left to sweep.
			r = keyswap(t, d.args("sweep", "--delete", "--pattern", testSweepPattern(t))...)
			r.wantCode(t, exitOK)
			if want := "deleted 0 keys of " + d.server().String() + "\n"; r.stdout != want {
				t.Errorf("second sweep: got %q, want %q", r.stdout, want)
			}
		})
	}
}

// TestSweepClusterEveryMaster puts orphans on each of the cluster's three
// masters and sweeps them through comma-separated seeds.
func TestSweepClusterEveryMaster(t *testing.T) {
	t.Parallel()
	d := deployments(t)[1]
	p := testPrefix(t, d)
	old := time.Now().Add(-2 * time.Hour).Unix()
	perNode := map[string]int{}
	var orphans []string
	for i := 0; len(perNode) < len(env.Cluster.Nodes) || len(orphans) < 6; i++ {
		k := keys.TempKey(fmt.Sprintf("%so%d", p, i), true, old, uint64(i))
		perNode[env.Cluster.NodeFor(t, k).Addr]++
		do(t, d.client, "SET", k, "x")
		orphans = append(orphans, k)
	}
	slices.Sort(orphans)
	seeds := strings.Join(env.Cluster.Addrs, ",")

	r := keyswap(t, "status", "-json", "-redis", seeds, p+"*")
	r.wantCode(t, exitOrphans)
	rep := decodeStatus(t, r.stdout)
	var candidates []string
	for _, tk := range rep.TempKeys {
		if tk.SweepCandidate {
			candidates = append(candidates, tk.Key)
		}
	}
	if !rep.Cluster || !slices.Equal(candidates, orphans) {
		t.Errorf("status: got cluster %v, candidates %q, want true, %q", rep.Cluster, candidates, orphans)
	}

	// One seed finds the whole cluster too.
	r = keyswap(t, "sweep", "-u", env.Cluster.Addrs[0], "--pattern", testSweepPattern(t))
	r.wantCode(t, exitOrphans)
	if want := strings.Join(orphans, "\n") + fmt.Sprintf("\nwould delete %d keys of %s (dry run; pass --delete to delete)\n", len(orphans), d.server()); r.stdout != want {
		t.Errorf("sweep through one seed: got\n%s\nwant\n%s", r.stdout, want)
	}

	r = keyswap(t, "sweep", "--delete", "-redis", seeds, "--pattern", testSweepPattern(t))
	r.wantCode(t, exitOK)
	want := strings.Join(orphans, "\n") + fmt.Sprintf("\ndeleted %d keys of %s\n", len(orphans), d.server())
	if r.stdout != want {
		t.Errorf("sweep on masters %v: got\n%s\nwant\n%s", perNode, r.stdout, want)
	}
	wantKeys(t, d, orphans, false)
}

// TestSweepProgress forces the progress display onto a stderr that is not a
// terminal: it goes to stderr only, and stdout stays the same.
func TestSweepProgress(t *testing.T) {
	t.Parallel()
	d := deployments(t)[0]
	s := seedSweep(t, d)
	r := keyswap(t, d.args("sweep", "-progress", "always", "--pattern", testSweepPattern(t))...)
	r.wantCode(t, exitOrphans)
	if want := strings.Join(s.orphans, "\n") + "\nwould delete 2 keys of " + d.server().String() + " (dry run; pass --delete to delete)\n"; r.stdout != want {
		t.Errorf("stdout: got\n%s\nwant\n%s", r.stdout, want)
	}
	if !strings.Contains(r.stderr, "matching keys, 2 to delete (keyspace: ") {
		t.Errorf("stderr: got %q, want the progress display", r.stderr)
	}
	// auto on a stderr that is not a terminal: no display.
	r = keyswap(t, d.args("sweep", "--pattern", testSweepPattern(t))...)
	if r.stderr != "" {
		t.Errorf("-progress auto without a terminal: got stderr %q, want none", r.stderr)
	}
}

// TestSweepLegacy (C3): the legacy shape <key>:rebuild:<digits> is swept
// only with --legacy: application keys can have it.
func TestSweepLegacy(t *testing.T) {
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			s := seedSweep(t, d)
			r := keyswap(t, d.args("sweep", "--pattern", testSweepPattern(t), "--delete")...)
			r.wantCode(t, exitOK)
			if !exists(t, d.client, s.legacy) {
				t.Errorf("sweep without --legacy deleted %s", s.legacy)
			}
			r = keyswap(t, d.args("sweep", "--pattern", testSweepPattern(t), "--delete", "--legacy")...)
			r.wantCode(t, exitOK)
			if r.stdout != s.legacy+"\ndeleted 1 key of "+d.server().String()+"\n" {
				t.Errorf("sweep --delete --legacy: stdout %q, want %s deleted", r.stdout, s.legacy)
			}
			if exists(t, d.client, s.legacy) {
				t.Errorf("sweep --legacy left %s", s.legacy)
			}
		})
	}
}

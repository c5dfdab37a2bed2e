package reliability

// The fault matrix in Generations mode (C82-C88): faults made to happen
// during a run that publishes by a flip of its index's pointer, on a
// standalone server and on a 3-master cluster where the family's buckets
// spread over every master. After each case the pointer, the registry and
// the current generation's exact contents are checked, and that no lock,
// record, log, receipt or per-slot counter is left; a stray generation only
// marked in the registry for a sweep (building: or retired:).

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/redistest/replication"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// gItem is an entry of a Generations case's SetIndex: id in bucket.
type gItem struct{ id, bucket string }

// gItems returns n entries over buckets buckets, named after set: two sets
// differ in every member.
func gItems(set string, n, buckets int) []gItem {
	out := make([]gItem, n)
	for i := range out {
		out[i] = gItem{id: fmt.Sprintf("%s-%04d", set, i), bucket: fmt.Sprintf("b%02d", i%buckets)}
	}
	return out
}

const (
	gEntries = 600 // per data set
	gBuckets = 24  // spread over the 3 masters of a cluster
	gBatch   = 50  // 12 batches
)

// gCase is one Generations case: a family prefix (untagged on a cluster, so
// that its buckets spread over the masters), the rebuild's client, and an
// independent client to seed, break and observe.
type gCase struct {
	cluster bool
	prefix  string
	client  rueidis.Client
	admin   rueidis.Client
}

// gStandalone returns a case on the package's standalone server.
func gStandalone(t *testing.T) *gCase {
	return &gCase{prefix: redistest.Prefix(t) + "by-bucket", client: env.Standalone.Client(t), admin: env.Standalone.Client(t)}
}

// gCluster returns a case on the package's 3-master cluster.
func gCluster(t *testing.T) *gCase {
	return &gCase{cluster: true, prefix: redistest.Prefix(t) + "by-bucket", client: env.Cluster.Client(t), admin: env.Cluster.Client(t)}
}

// rebuilder returns a Rebuilder in Generations mode of the case's family,
// through c.
func (g *gCase) rebuilder(t testing.TB, c rueidis.Client, opts rebuild.Options) *rebuild.Rebuilder[gItem] {
	t.Helper()
	opts.Publish = rebuild.Generations
	if opts.BatchSize == 0 {
		opts.BatchSize = gBatch
	}
	if opts.Writers == 0 {
		opts.Writers = 1
	}
	if opts.Grace == 0 {
		opts.Grace = time.Millisecond
	}
	return redistest.Rebuilder(t, c, opts,
		builders.SetIndex(g.prefix, func(it gItem) (string, string, bool) { return it.bucket, it.id, true }))
}

// seed publishes data set "old" as generation 1 with a run of its own,
// after deleting what an earlier run of the test (-count) left on a shared
// deployment.
func (g *gCase) seed(t testing.TB) []gItem {
	t.Helper()
	base := keys.Base(g.prefix, g.cluster)
	for _, k := range slices.Concat(redistest.Keys(t, g.admin, g.prefix), redistest.Keys(t, g.admin, base), redistest.Keys(t, g.admin, "{")) {
		if strings.HasPrefix(k, g.prefix) || strings.HasPrefix(k, base) || strings.Contains(k, "}"+base+":rebuild-n:") {
			redistest.Do(t, g.admin, g.admin.B().Del().Key(k).Build())
		}
	}
	old := gItems("old", gEntries, gBuckets)
	if _, err := g.rebuilder(t, g.client, rebuild.Options{}).Run(redistest.Ctx(t), sources.Slice(old)); err != nil {
		t.Fatalf("seeding run: %v", err)
	}
	g.want(t, 1, 1, map[string]string{"1": keys.RegCurrent}, old)
	return old
}

// registry returns the case's registry.
func (g *gCase) registry(t testing.TB) map[string]string {
	t.Helper()
	return redistest.HGetAll(t, g.admin, keys.RegistryKey(g.prefix, g.cluster))
}

// want checks that the pointer names gen, that the registry holds exactly
// reg and next (a value ending in '*' matches any value with that
// beginning), that generation gen holds exactly the buckets of items,
// without a TTL, and that nothing else of the case is left: no lock,
// record, log, receipt, counter, nor key of a generation reg does not list.
func (g *gCase) want(t testing.TB, gen, next int64, reg map[string]string, items []gItem) {
	t.Helper()
	c := g.admin
	redistest.WantString(t, c, keys.PointerKey(g.prefix, g.cluster), strconv.FormatInt(gen, 10))
	have := g.registry(t)
	want := maps.Clone(reg)
	want[keys.RegNext] = strconv.FormatInt(next, 10)
	ok := len(have) == len(want)
	for f, v := range want {
		if p, star := strings.CutSuffix(v, "*"); star {
			ok = ok && strings.HasPrefix(have[f], p)
		} else {
			ok = ok && have[f] == v
		}
	}
	if !ok {
		t.Errorf("registry: got %v, want %v", have, want)
	}
	buckets := map[string][]string{}
	for _, it := range items {
		k := keys.GenBucketKey(g.prefix, gen, it.bucket)
		buckets[k] = append(buckets[k], it.id)
	}
	got := redistest.Keys(t, c, keys.GenPrefix(g.prefix, gen))
	if !slices.Equal(got, slices.Sorted(maps.Keys(buckets))) {
		t.Errorf("generation %d holds %d keys %v, want %d", gen, len(got), got[:min(len(got), 4)], len(buckets))
	}
	for k, members := range buckets {
		slices.Sort(members)
		if have := redistest.SMembers(t, c, k); !slices.Equal(have, members) {
			t.Errorf("%s holds %d members, want %d", k, len(have), len(members))
		}
		if ttl := redistest.PTTL(t, c, k); ttl != -1 {
			t.Errorf("%s has a TTL of %v, want none", k, ttl)
		}
	}
	g.wantNothingElse(t, reg)
}

// wantNothingElse checks that the case's keys are only its pointer,
// registry and meta, and the data and manifests of the generations that
// reg lists, and that no per-slot counter of the case is left on any
// master.
func (g *gCase) wantNothingElse(t testing.TB, reg map[string]string) {
	t.Helper()
	allowed := []string{keys.PointerKey(g.prefix, g.cluster), keys.RegistryKey(g.prefix, g.cluster), keys.MetaKey(g.prefix, g.cluster)}
	allowed = append(allowed, redistest.OwnerStamps(g.cluster, g.prefix)...) // C104
	var gens []string
	for f := range reg {
		if gen, err := strconv.ParseInt(f, 10, 64); err == nil {
			gens = append(gens, keys.GenPrefix(g.prefix, gen))
			allowed = append(allowed, keys.ManifestKey(g.prefix, g.cluster, gen), keys.ManifestListKey(g.prefix, g.cluster, gen))
		}
	}
	base := keys.Base(g.prefix, g.cluster)
	for _, k := range slices.Concat(redistest.Keys(t, g.admin, g.prefix), redistest.Keys(t, g.admin, base)) {
		if slices.Contains(allowed, k) || slices.ContainsFunc(gens, func(p string) bool { return strings.HasPrefix(k, p) }) {
			continue
		}
		t.Errorf("left behind: %s", k)
	}
	// The counters hash to their slots' own tags: scan every master.
	for _, k := range redistest.Keys(t, g.admin, "{") {
		if strings.Contains(k, "}"+base+":rebuild-n:") {
			t.Errorf("counter left behind: %s", k)
		}
	}
}

// isGenBatch reports whether multi is a write transaction of a
// generation's data.
func isGenBatch(multi []rueidis.Completed) bool {
	if len(multi) < 2 || multi[0].Commands()[0] != "MULTI" {
		return false
	}
	for _, cmd := range multi {
		if args := cmd.Commands(); len(args) > 1 && args[0] == "SADD" && strings.Contains(args[1], ":rebuild-g:") {
			return true
		}
	}
	return false
}

// gHooks are what a case does at points of a run.
type gHooks struct {
	afterBatch func(n int)     // once the nth write transaction returned (per slot on a cluster)
	beforeFlip func()          // before the flip script is sent
	afterFlip  func(err error) // once it returned, with its reply's error
}

// gHook returns c with h's hooks.
func gHook(c rueidis.Client, h gHooks) rueidis.Client {
	var n atomic.Int64
	flip := redistest.ScriptNamed("flip")
	return rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			isFlip := flip.Is(cmd.Commands())
			if isFlip && h.beforeFlip != nil {
				h.beforeFlip()
			}
			res := c.Do(ctx, cmd)
			if isFlip && h.afterFlip != nil {
				h.afterFlip(res.Error())
			}
			return res
		},
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			batch := isGenBatch(multi)
			isFlip := false
			for _, cmd := range multi {
				isFlip = isFlip || flip.Is(cmd.Commands())
			}
			if isFlip && h.beforeFlip != nil {
				h.beforeFlip()
			}
			res := c.DoMulti(ctx, multi...)
			if batch && h.afterBatch != nil {
				h.afterBatch(int(n.Add(1)))
			}
			if isFlip && h.afterFlip != nil {
				h.afterFlip(res[len(res)-1].Error())
			}
			return res
		},
	})
}

// gDeployments runs f on a standalone server and on the cluster.
func gDeployments(t *testing.T, f func(t *testing.T, g *gCase)) {
	t.Run("standalone", func(t *testing.T) { t.Parallel(); f(t, gStandalone(t)) })
	t.Run("cluster", func(t *testing.T) { t.Parallel(); f(t, gCluster(t)) })
}

// failedRun is the state after a run that failed before its flip: the
// seeding run's generation 1 current and exact, generation 2 (the failed
// run's) gone with its registry field.
func (g *gCase) failedRun(t testing.TB, old []gItem) {
	t.Helper()
	g.want(t, 1, 2, map[string]string{"1": keys.RegCurrent}, old)
}

// TestGenerationsLockStolen (C83, C85): mid-write, another client deletes the
// run's lock and takes it with a token of its own. The run fails with
// ErrLockLost, the flip never happens, the run's generation is removed;
// the thief's lock is left to its holder.
func TestGenerationsLockStolen(t *testing.T) {
	t.Parallel()
	gDeployments(t, func(t *testing.T, g *gCase) {
		old := g.seed(t)
		lock := keys.LockKey(g.prefix, g.cluster)
		hooked := gHook(g.client, gHooks{afterBatch: func(n int) {
			if n == 3 {
				redistest.Do(t, g.admin, g.admin.B().Set().Key(lock).Value("thief").Px(2*time.Second).Build())
			}
		}})
		_, err := g.rebuilder(t, hooked, rebuild.Options{TTL: 2 * time.Second}).Run(redistest.Ctx(t), sources.Slice(gItems("new", gEntries, gBuckets)))
		t.Logf("Run: %v", err)
		redistest.WantErr(t, err, rebuild.ErrLockLost)
		if v, _ := redistest.Get(t, g.admin, lock); v != "thief" {
			t.Errorf("the thief's lock holds %q", v)
		}
		redistest.Do(t, g.admin, g.admin.B().Del().Key(lock).Build())
		g.failedRun(t, old)
	})
}

// TestGenerationsCounterDeleted (C83, C85): on a cluster, an operator deletes
// the run's per-slot counters mid-write, as a failover to a replica that
// missed them would lose them. The check before the flip finds fewer
// transactions than Redis acknowledged: ErrWritesLost, the pointer
// untouched.
func TestGenerationsCounterDeleted(t *testing.T) {
	t.Parallel()
	g := gCluster(t)
	old := g.seed(t)
	base := keys.Base(g.prefix, true)
	deleted := 0
	hooked := gHook(g.client, gHooks{afterBatch: func(n int) {
		if n != 2 {
			return
		}
		for _, k := range redistest.Keys(t, g.admin, "{") {
			if strings.Contains(k, "}"+base+":rebuild-n:") {
				redistest.Do(t, g.admin, g.admin.B().Del().Key(k).Build())
				deleted++
			}
		}
	}})
	_, err := g.rebuilder(t, hooked, rebuild.Options{}).Run(redistest.Ctx(t), sources.Slice(gItems("new", gEntries, gBuckets)))
	t.Logf("Run, %d counters deleted: %v", deleted, err)
	if deleted == 0 {
		t.Fatal("no counter found to delete")
	}
	redistest.WantErr(t, err, rebuild.ErrWritesLost)
	g.failedRun(t, old)
}

// TestGenerationsCancelDuringGrace (C86): the caller's ctx is cancelled
// once the flip has returned, while Run waits out Options.Grace. Run
// returns nil (the flip happened); the new generation is current and
// exact; the old one is left whole, marked retired: for a sweep.
func TestGenerationsCancelDuringGrace(t *testing.T) {
	t.Parallel()
	gDeployments(t, func(t *testing.T, g *gCase) {
		old := g.seed(t)
		ctx, cancel := context.WithCancel(redistest.Ctx(t))
		defer cancel()
		flipped := false
		hooked := gHook(g.client, gHooks{afterFlip: func(err error) {
			flipped = err == nil
			cancel()
		}})
		updated := gItems("new", gEntries, gBuckets)
		stats, err := g.rebuilder(t, hooked, rebuild.Options{Grace: time.Hour}).Run(ctx, sources.Slice(updated))
		if err != nil || !flipped {
			t.Fatalf("Run: %v (flip returned without error: %v), want nil", err, flipped)
		}
		if got := stats.Generations[g.prefix]; got != 2 {
			t.Errorf("Stats.Generations[%s] = %d, want 2", g.prefix, got)
		}
		g.want(t, 2, 2, map[string]string{"2": keys.RegCurrent, "1": keys.RegRetired + "*"}, updated)
		// The retired generation is whole, for readers that still
		// resolve to it and for the sweep.
		g.wantGen(t, 1, old)
	})
}

// wantGen checks generation gen's exact contents.
func (g *gCase) wantGen(t testing.TB, gen int64, items []gItem) {
	t.Helper()
	buckets := map[string][]string{}
	for _, it := range items {
		k := keys.GenBucketKey(g.prefix, gen, it.bucket)
		buckets[k] = append(buckets[k], it.id)
	}
	if got := redistest.Keys(t, g.admin, keys.GenPrefix(g.prefix, gen)); len(got) != len(buckets) {
		t.Errorf("generation %d holds %d keys, want %d", gen, len(got), len(buckets))
	}
	for k, members := range buckets {
		slices.Sort(members)
		if have := redistest.SMembers(t, g.admin, k); !slices.Equal(have, members) {
			t.Errorf("%s holds %d members, want %d", k, len(have), len(members))
		}
	}
}

// TestGenerationsFailover (C83, C85): standalone master and replica; the
// replication link is paused after the 3rd write transaction, and the
// replica promoted just before the flip script is sent. The record's batch count, checked by
// the flip, gives the loss away: ErrWritesLost, the promoted replica's
// pointer, registry and generation 1 as the seeding run left them.
func TestGenerationsFailover(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t)
	pair := replication.Start(t)
	g := &gCase{prefix: redistest.Prefix(t) + "by-bucket", client: pair.Client(t), admin: pair.Replica.Client(t)}
	old := gItems("old", gEntries, gBuckets)
	if _, err := g.rebuilder(t, g.client, rebuild.Options{}).Run(ctx, sources.Slice(old)); err != nil {
		t.Fatalf("seeding run: %v", err)
	}
	if err := pair.WaitSync(ctx); err != nil {
		t.Fatal(err)
	}
	var failedOver atomic.Bool
	hooked := gHook(g.client, gHooks{
		afterBatch: func(n int) {
			if n == 3 {
				// Every write so far is on the replica, and no later one.
				if err := pair.WaitSync(ctx); err != nil {
					t.Error(err)
				}
				pair.Link.Pause()
			}
		},
		beforeFlip: func() {
			if failedOver.Load() {
				return
			}
			if _, err := pair.Failover(ctx); err != nil {
				t.Error(err)
				return
			}
			failedOver.Store(true)
			if err := reach(g.client, pair.Replica.Port); err != nil {
				t.Errorf("the run's client never reached the promoted replica: %v", err)
			}
		},
	})
	_, err := g.rebuilder(t, hooked, rebuild.Options{}).Run(ctx, sources.Slice(gItems("new", gEntries, gBuckets)))
	t.Logf("Run: %v", err)
	if !failedOver.Load() {
		t.Fatalf("the run never reached its flip: %v", err)
	}
	redistest.WantErr(t, err, rebuild.ErrWritesLost)
	g.failedRun(t, old)
}

// TestGenerationsDurability (C83, C85): Options.Durability in Generations mode.
// A master whose replica is stopped mid-write: WAIT finds 0 of 1 replicas,
// the run fails before the flip with ErrNotDurable, the pointer untouched
// and the run's generation removed. On a cluster, whose masters have no
// replica, the wait runs on every master the run wrote, and each says so.
func TestGenerationsDurability(t *testing.T) {
	t.Parallel()
	durable := rebuild.Durability{Replicas: 1, Timeout: 500 * time.Millisecond}

	t.Run("replica stopped", func(t *testing.T) {
		t.Parallel()
		ctx := redistest.Ctx(t)
		pair := replication.Start(t)
		g := &gCase{prefix: redistest.Prefix(t) + "by-bucket", client: pair.Client(t), admin: pair.Master.Client(t)}
		if err := pair.WaitSync(ctx); err != nil {
			t.Fatal(err)
		}
		old := gItems("old", gEntries, gBuckets)
		// The seeding run waits as long as a loaded machine needs for its
		// replica's acknowledgement (500 ms was too short under load): only
		// the run whose replica stops must fail, whatever the timeout.
		seed := rebuild.Durability{Replicas: 1, Timeout: 30 * time.Second}
		if _, err := g.rebuilder(t, g.client, rebuild.Options{Durability: seed}).Run(ctx, sources.Slice(old)); err != nil {
			t.Fatalf("seeding run with its replica: %v", err)
		}
		hooked := gHook(g.client, gHooks{afterBatch: func(n int) {
			if n == 3 {
				if err := pair.Replica.Stop(); err != nil {
					t.Error(err)
				}
			}
		}, beforeFlip: func() { t.Error("the flip was sent") }})
		_, err := g.rebuilder(t, hooked, rebuild.Options{Durability: durable}).Run(ctx, sources.Slice(gItems("new", gEntries, gBuckets)))
		t.Logf("Run: %v", err)
		redistest.WantErr(t, err, rebuild.ErrNotDurable)
		if err != nil && !strings.Contains(err.Error(), "0 of 1 replicas") {
			t.Errorf("err = %q, want it to say 0 of 1 replicas acknowledged", err)
		}
		g.failedRun(t, old)
	})

	t.Run("cluster, every master", func(t *testing.T) {
		t.Parallel()
		g := gCluster(t)
		old := g.seed(t)
		flips := 0
		hooked := gHook(g.client, gHooks{beforeFlip: func() { flips++ }})
		_, err := g.rebuilder(t, hooked, rebuild.Options{Durability: durable}).Run(redistest.Ctx(t), sources.Slice(gItems("new", gEntries, gBuckets)))
		t.Logf("Run: %v", err)
		redistest.WantErr(t, err, rebuild.ErrNotDurable)
		if err != nil {
			if n := strings.Count(err.Error(), "0 of 1 replicas"); n != 3 {
				t.Errorf("%d waits failed, want one per master (3): %v", n, err)
			}
		}
		if flips != 0 {
			t.Errorf("the flip was sent %d times, want none", flips)
		}
		g.failedRun(t, old)
	})
}

// gOutcome checks a case whose run may or may not have flipped: the
// pointer names generation 1 (the seeding run's, old) or 2 (the faulted
// run's, updated), and must name 2 when Run returned nil; that generation
// is current and exact; the other one is gone with its registry field, or
// left whole for a sweep, marked building: (a run that could not clean up
// after itself) or retired: (a flip whose grace removal did not run). It
// waits until the run's lock, record and log are gone (a run cut off from
// Redis leaves them to their TTL), then checks nothing else is left, and
// returns the pointer and the stray generation's state ("" if none).
func (g *gCase) gOutcome(t testing.TB, runErr error, old, updated []gItem) (int64, string) {
	t.Helper()
	if err := poll(func() error {
		if left := g.leftovers(t); len(left) > 0 {
			return fmt.Errorf("left behind: %v", left)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	ptr, _ := redistest.Get(t, g.admin, keys.PointerKey(g.prefix, g.cluster))
	reg := g.registry(t)
	cur, other, items := int64(1), "2", old
	if ptr == "2" {
		cur, other, items = 2, "1", updated
	} else if runErr == nil {
		t.Errorf("Run returned nil, but the pointer names %q", ptr)
	}
	want := map[string]string{strconv.FormatInt(cur, 10): keys.RegCurrent}
	stray := reg[other]
	switch {
	case stray == "":
	case cur == 1 && strings.HasPrefix(stray, keys.RegBuilding), cur == 2 && strings.HasPrefix(stray, keys.RegRetired):
		want[other] = stray
	default:
		t.Errorf("generation %s is %q in the registry, want it gone or marked for a sweep", other, stray)
	}
	g.want(t, cur, 2, want, items)
	return cur, stray
}

// runFaulted rebuilds the case's family with data set "new" through h's
// hooks, with a lease of 2 s, calls after once Run returned, fails t unless
// fired reports that the fault happened, checks the outcome (gOutcome) and
// returns the current generation.
func (g *gCase) runFaulted(t testing.TB, h gHooks, old []gItem, fired func() bool, after func()) int64 {
	t.Helper()
	updated := gItems("new", gEntries, gBuckets)
	_, err := g.rebuilder(t, gHook(g.client, h), rebuild.Options{TTL: 2 * time.Second}).Run(redistest.Ctx(t), sources.Slice(updated))
	after()
	if !fired() {
		t.Fatalf("the fault never happened: %v", err)
	}
	cur, stray := g.gOutcome(t, err, old, updated)
	t.Logf("Run: %v; current generation %d, stray %q", err, cur, stray)
	return cur
}

// leftovers returns the case's lock, record, log, receipt and counter keys.
func (g *gCase) leftovers(t testing.TB) []string {
	t.Helper()
	base := keys.Base(g.prefix, g.cluster)
	var left []string
	for _, k := range slices.Concat(redistest.Keys(t, g.admin, base+":rebuild-lock"), redistest.Keys(t, g.admin, "{")) {
		if strings.HasPrefix(k, base+":rebuild-lock") || strings.Contains(k, "}"+base+":rebuild-n:") {
			left = append(left, k)
		}
	}
	return left
}

// TestGenerationsKillRestart (C83, C85): a standalone server with
// appendfsync always is killed with SIGKILL and restarted mid-write, just
// before the flip script is sent, and just after its reply came. The
// pointer names a whole generation in every case: the old one unless the
// flip ran.
func TestGenerationsKillRestart(t *testing.T) {
	t.Parallel()
	for _, at := range []string{"mid-write", "before the flip", "after the flip"} {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			srv := redistest.OwnServer(t, "--appendonly", "yes", "--appendfsync", "always")
			g := &gCase{prefix: redistest.Prefix(t) + "by-bucket", client: srv.Client(t), admin: srv.Client(t)}
			old := g.seed(t)
			var once atomic.Bool
			kill := func() {
				if once.Swap(true) {
					return
				}
				if err := srv.Kill(); err != nil {
					t.Error(err)
				}
				if err := srv.Restart(); err != nil {
					t.Error(err)
				}
			}
			h := gHooks{}
			switch at {
			case "mid-write":
				h.afterBatch = func(n int) {
					if n == 3 {
						kill()
					}
				}
			case "before the flip":
				h.beforeFlip = kill
			case "after the flip":
				h.afterFlip = func(error) { kill() }
			}
			cur := g.runFaulted(t, h, old, once.Load, func() {})
			if at == "after the flip" && cur != 2 {
				t.Errorf("the flip's reply came, with appendfsync always: generation 2 must be current, is %d", cur)
			}
		})
	}
}

// TestGenerationsConnectionCut (C83, C85): the proxy between the run's client
// and Redis cuts every connection and refuses new ones just before the flip
// script is sent (healed once Run returned), or lets the script run and
// loses its reply. On a standalone server and on the cluster.
func TestGenerationsConnectionCut(t *testing.T) {
	t.Parallel()
	for _, dep := range []string{"standalone", "cluster"} {
		for _, at := range []string{"before the flip", "reply of the flip lost"} {
			t.Run(dep+", "+at, func(t *testing.T) {
				t.Parallel()
				g := &gCase{prefix: redistest.Prefix(t) + "by-bucket"}
				// refuse cuts every connection of the run's client and
				// refuses new ones (false: accepts them again); loseReply
				// loses the next reply of the lock's master.
				var refuse func(bool)
				var loseReply func()
				if dep == "standalone" {
					d := standalone(t)
					g.client, g.admin = d.client, d.srv.Client(t)
					refuse = func(on bool) {
						d.proxy.Refuse(on)
						if on {
							d.cutAll()
						}
					}
					loseReply = func() { d.proxy.CutAfter(faultproxy.ToClient, 0) }
				} else {
					// A Dialer of the case's own, whose proxies it can
					// all refuse: the flip goes to whichever master
					// holds the lock's slot.
					d := &faultproxy.Dialer{}
					t.Cleanup(func() {
						if err := d.Close(); err != nil {
							t.Error(err)
						}
					})
					opt := rebuildClientOption()
					opt.InitAddress = env.Cluster.Addrs
					opt.DialCtxFn = d.Dial
					c, err := rueidis.NewClient(opt)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(c.Close)
					g.cluster, g.client, g.admin = true, c, env.Cluster.Client(t)
					refuse = func(on bool) {
						d.Refuse(on)
						if on {
							d.CutAll()
						}
					}
					loseReply = func() {
						p, err := d.Proxy(env.Cluster.NodeFor(t, keys.LockKey(g.prefix, true)).Addr)
						if err != nil {
							t.Error(err)
							return
						}
						p.CutAfter(faultproxy.ToClient, 0)
					}
				}
				old := g.seed(t)
				fired := false
				h := gHooks{beforeFlip: func() {
					fired = true
					if at == "before the flip" {
						refuse(true)
						return
					}
					loseReply()
				}}
				cur := g.runFaulted(t, h, old, func() bool { return fired }, func() { refuse(false) })
				if at == "before the flip" && cur != 1 {
					t.Errorf("the flip never reached Redis, yet generation %d is current", cur)
				}
			})
		}
	}
}

// TestGenerationsNoSetOnPointer (C82): the rebuild's user may run SET on
// its lock and receipt, but not on the index's pointer. The run must be
// refused at the acquire (ErrNoPermission) naming SET and the pointer, with
// the pointer, the registry and generation 1 as the seeding run left them,
// and nothing of the run left.
func TestGenerationsNoSetOnPointer(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	g := &gCase{prefix: redistest.Prefix(t) + "by-bucket", admin: srv.Client(t)}
	g.client = g.admin
	old := g.seed(t)
	restricted := srv.ClientAs(t, "ks-no-set-pointer", "~ks:*", "+@all", "-set", "(+set ~*:rebuild-lock*)")
	updated := gItems("new", gEntries, gBuckets)
	stats, err := g.rebuilder(t, restricted, rebuild.Options{TTL: 2 * time.Second}).Run(redistest.Ctx(t), sources.Slice(updated))
	t.Logf("Run: %v", err)
	redistest.WantErr(t, err, rebuild.ErrNoPermission)
	if err != nil && (!strings.Contains(err.Error(), "SET") || !strings.Contains(err.Error(), keys.PointerKey(g.prefix, false))) {
		t.Errorf("err = %v, want it to name SET and the pointer", err)
	}
	if stats.Batches != 0 {
		t.Errorf("Stats.Batches = %d, want 0: refused at the acquire, before anything is written", stats.Batches)
	}
	// Refused before the allocation: no generation was ever allocated.
	g.want(t, 1, 1, map[string]string{"1": keys.RegCurrent}, old)
}

// TestGenerationsEviction (C82, C85): a server at its maxmemory while the run
// writes. Generation keys have no TTL: under volatile-lru Redis evicts only
// the run's lock, record and counters, never a generation, and the
// seeding run's generation must stay whole; under allkeys-lru it may evict
// anything, the current generation included (as it would evict live keys in
// rename-in-place mode). Either way a run that returns nil must have
// flipped to a whole generation, and a run that fails must leave the
// pointer untouched.
func TestGenerationsEviction(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"volatile-lru", "allkeys-lru"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv := redistest.OwnServer(t)
			g := &gCase{prefix: redistest.Prefix(t) + "by-bucket", admin: srv.Client(t)}
			g.client = srv.Client(t)
			old := g.seed(t)
			hooked := gHook(g.client, gHooks{afterBatch: func(n int) {
				if n == 2 {
					srv.LimitMemory(t, 8<<10)
					redistest.Cmd(t, g.admin, "CONFIG", "SET", "maxmemory-policy", policy)
				}
			}})
			updated := gItems("new", 4*gEntries, gBuckets)
			_, err := g.rebuilder(t, hooked, rebuild.Options{TTL: 2 * time.Second}).Run(redistest.Ctx(t), sources.Slice(updated))
			info, _ := redistest.Cmd(t, g.admin, "INFO", "stats").ToString()
			evicted := "?"
			for line := range strings.Lines(info) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "evicted_keys:"); ok {
					evicted = v
				}
			}
			t.Logf("Run: %v; %s keys evicted", err, evicted)
			ptr, _ := redistest.Get(t, g.admin, keys.PointerKey(g.prefix, false))
			switch {
			case err == nil && ptr != "2":
				t.Errorf("Run returned nil, but the pointer names %q", ptr)
			case err == nil:
				g.wantGen(t, 2, updated)
			case ptr == "" && policy == "allkeys-lru":
				// The pointer has no TTL either: allkeys-lru may evict it,
				// and readers then find the index in the plain shape.
				t.Logf("the pointer was evicted")
			case ptr != "1":
				t.Errorf("Run failed, but the pointer names %q", ptr)
			case policy == "volatile-lru":
				// A key without a TTL is never evicted.
				g.wantGen(t, 1, old)
			}
		})
	}
}

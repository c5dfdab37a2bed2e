package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/guards"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// safeKeys are a hash and a SetIndex family, the two shapes a guard, a
// held run and a rollback must handle.
type safeKeys struct{ hash, family string }

func safeNames(d deployment) safeKeys {
	return safeKeys{hash: d.Prefix + "users:by-email", family: d.Prefix + "users:by-country"}
}

func safeRebuilder(t *testing.T, d deployment, k safeKeys, opts rebuild.Options) *rebuild.Rebuilder[user] {
	t.Helper()
	return redistest.Rebuilder(t, d.Client, opts,
		builders.Hash(k.hash, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SetIndex(k.family, func(u user) (string, string, bool) { return u.Country, u.ID, true }),
	)
}

// safeWant fails t unless k's live keys hold exactly what safeRebuilder
// makes of us, with no expiry.
func safeWant(t *testing.T, d deployment, k safeKeys, us []user) {
	t.Helper()
	hash := map[string]string{}
	sets := map[string][]string{}
	for _, u := range us {
		hash[u.Email] = u.ID
		sets[k.family+":"+u.Country] = append(sets[k.family+":"+u.Country], u.ID)
	}
	for _, ms := range sets {
		slices.Sort(ms)
	}
	if len(hash) == 0 {
		redistest.WantAbsent(t, d.Other, k.hash)
	} else {
		redistest.WantHash(t, d.Other, k.hash, hash)
		redistest.WantPTTL(t, d.Other, k.hash, -1, -1)
	}
	got := map[string][]string{}
	for _, b := range redistest.LiveKeys(t, d.Other, k.family+":") {
		got[b] = redistest.SMembers(t, d.Other, b)
		redistest.WantPTTL(t, d.Other, b, -1, -1)
	}
	if diff := cmp.Diff(sets, got); diff != "" {
		t.Errorf("buckets under %s (-want +got):\n%s", k.family+":", diff)
	}
}

// safeUsers returns n users in countries c0..c<countries-1>, with ids and
// emails offset by from (so that two versions differ).
func safeUsers(n, from, countries int) []user {
	us := make([]user, n)
	for i := range us {
		us[i] = user{ID: fmt.Sprintf("u%05d", from+i), Email: fmt.Sprintf("u%05d@example.com", from+i), Country: fmt.Sprintf("c%d", i%countries)}
	}
	return us
}

// TestGuardsRefuseAndLeaveTheLiveKeys (C67): a guard that refuses fails the
// run with ErrRefused; RefuseEmpty and RefuseShrink refuse what they say.
func TestGuardsRefuseAndLeaveTheLiveKeys(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, tc := range []struct {
			name   string
			guards []guards.Guard
			next   []user // what the source yields
			want   string // "" = published; else a part of the refusal
		}{
			{"RefuseEmpty, empty source", []guards.Guard{guards.RefuseEmpty()}, nil, "none (RefuseEmpty)"},
			{"RefuseEmpty, smaller source", []guards.Guard{guards.RefuseEmpty()}, safeUsers(10, 0, 3), ""},
			{"RefuseShrink(0.9), half", []guards.Guard{guards.RefuseShrink(0.9)}, safeUsers(50, 0, 4), "below 90%"},
			{"RefuseShrink(0.9), 95%", []guards.Guard{guards.RefuseShrink(0.9)}, safeUsers(95, 0, 4), ""},
			{"RefuseShrink(0.9), growth", []guards.Guard{guards.RefuseShrink(0.9)}, safeUsers(200, 0, 5), ""},
			{"both, the second refuses", []guards.Guard{guards.RefuseEmpty(), guards.RefuseShrink(1)}, safeUsers(99, 0, 4), "below 100%"},
			{"RefuseShrink(0), bad ratio", []guards.Guard{guards.RefuseShrink(0)}, safeUsers(100, 0, 4), "ratio must be in (0, 1]"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				k := safeNames(d)
				k.hash += ":" + strings.ReplaceAll(tc.name, " ", "_")
				k.family += ":" + strings.ReplaceAll(tc.name, " ", "_")
				old := safeUsers(100, 0, 4)
				if _, err := safeRebuilder(t, d, k, rebuild.Options{}).Run(redistest.Ctx(t), sources.Slice(old)); err != nil {
					t.Fatal(err)
				}
				before := redistest.Snapshot(t, d.Other, d.Prefix)
				_, err := safeRebuilder(t, d, k, rebuild.Options{Guards: tc.guards}).Run(redistest.Ctx(t), sources.Slice(tc.next))
				if tc.want == "" {
					if err != nil {
						t.Fatalf("Run: %v, want published", err)
					}
					safeWant(t, d, k, tc.next)
				} else {
					var e *rebuild.Error
					if !errors.Is(err, guards.ErrRefused) || !errors.As(err, &e) || e.Op != "guard" || !strings.Contains(err.Error(), tc.want) {
						t.Fatalf("Run: got %v, want an error of Op guard matching ErrRefused and saying %q", err, tc.want)
					}
					if errors.Is(err, rebuild.ErrInProgress) {
						t.Error("a refusal matches ErrInProgress")
					}
					redistest.WantUnchanged(t, d.Other, d.Prefix, before)
				}
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

func TestGuardSeesTheReview(t *testing.T) {
	// C67: a guard gets the new and live sizes of each builder: entries and
	// keys, summed over a family's buckets; after the catch-up, so that a
	// change applied during the run counts.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		k := safeNames(d)
		if _, err := safeRebuilder(t, d, k, rebuild.Options{}).Run(redistest.Ctx(t), sources.Slice(safeUsers(30, 0, 3))); err != nil {
			t.Fatal(err)
		}
		var got guards.Review
		r := safeRebuilder(t, d, k, rebuild.Options{Guards: []guards.Guard{func(rv guards.Review) error { got = rv; return nil }}})
		applier := safeRebuilder(t, d, k, rebuild.Options{})
		extra := user{ID: "x1", Email: "x1@example.com", Country: "c9"}
		src := func(yield func(user, error) bool) {
			for _, u := range safeUsers(20, 100, 5) {
				if !yield(u, nil) {
					return
				}
			}
			// Applied during the run: the catch-up adds it before the guard.
			if err := applier.Apply(redistest.Ctx(t), index.Insert(extra)); err != nil {
				t.Error(err)
			}
		}
		if _, err := r.Run(redistest.Ctx(t), sources.Seq2(src)); err != nil {
			t.Fatal(err)
		}
		want := guards.Review{Builders: []guards.BuilderReview{
			{Key: k.hash, New: 21, Live: 31, NewKeys: 1, LiveKeys: 1},
			{Key: k.family, Family: true, New: 21, Live: 31, NewKeys: 6, LiveKeys: 4},
		}}
		// The live figures include the applied change: Apply wrote the live
		// keys too (31 entries, and bucket c9).
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("the guard's review (-want +got):\n%s", diff)
		}
		safeWant(t, d, k, append(safeUsers(20, 100, 5), extra))
	})
}

func TestHeldRunPublishes(t *testing.T) {
	// Build stops short of the publish and keeps the lease, longer than
	// its TTL; Review and Diff describe the result exactly; a change
	// applied while held is published too; Publish publishes.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := safeNames(d)
		old := safeUsers(100, 0, 4)
		if _, err := safeRebuilder(t, d, k, rebuild.Options{}).Run(ctx, sources.Slice(old)); err != nil {
			t.Fatal(err)
		}
		// The new version: users 0..79 (20 removed), 10 of them with
		// another email, and 30 new users; country count 5 (a new bucket).
		next := safeUsers(80, 0, 5)
		for i := range 10 {
			next[i].Email = fmt.Sprintf("changed%d@example.com", i)
		}
		next = append(next, safeUsers(30, 500, 5)...)
		r := safeRebuilder(t, d, k, rebuild.Options{TTL: 2 * time.Second})
		h, _, err := r.Build(ctx, sources.Slice(next))
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		// Held longer than the lease: the heartbeat keeps it.
		lock := keys.LockKey(k.hash, d.Cluster)
		token, _ := redistest.Get(t, d.Other, lock)
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if got, _ := redistest.Get(t, d.Other, lock); got != token || token == "" {
				t.Fatalf("lock %s: got %q while held, want the run's token", lock, got)
			}
			time.Sleep(100 * time.Millisecond) // polling the lock while time passes: that is the test
		}
		// Nothing published yet.
		redistest.WantHash(t, d.Other, k.hash, hashOf(old))
		if info, err := protocol.New(d.Other, nil).Operator.FindRun(ctx, k.hash); err != nil || info.Record["phase"] != "held" {
			t.Errorf("the run's record: phase %q, %v; want held", info.Record["phase"], err)
		}
		wantReview := guards.Review{Builders: []guards.BuilderReview{
			{Key: k.hash, New: 110, Live: 100, NewKeys: 1, LiveKeys: 1},
			{Key: k.family, Family: true, New: 110, Live: 100, NewKeys: 5, LiveKeys: 4},
		}}
		if diff := cmp.Diff(wantReview, h.Review()); diff != "" {
			t.Errorf("Review (-want +got):\n%s", diff)
		}
		df, err := h.Diff(ctx, guards.DiffOptions{})
		if err != nil {
			t.Fatal(err)
		}
		hd := df.Builders[0]
		if len(hd.Keys) != 1 || hd.Added != 40 || hd.Removed != 30 || hd.Changed != 0 || !hd.Exact {
			// Hash fields are emails: 10 changed emails are 10 removed
			// fields and 10 added; 20 users gone, 30 new.
			t.Errorf("hash diff: %+v; want 40 added, 30 removed, 0 changed, exact", hd)
		}
		fd := df.Builders[1]
		if !fd.Family || fd.Buckets != 5 || fd.BucketsAdded != 1 || fd.BucketsRemoved != 0 || !fd.Exact || fd.Added+fd.Removed == 0 {
			t.Errorf("family diff: %+v; want 5 buckets, 1 added, exact", fd)
		}
		// Applied while held: in the published index.
		extra := user{ID: "x1", Email: "x1@example.com", Country: "c7"}
		if err := safeRebuilder(t, d, k, rebuild.Options{}).Apply(ctx, index.Insert(extra)); err != nil {
			t.Fatal(err)
		}
		stats, err := h.Publish(ctx)
		if err != nil {
			t.Fatalf("Publish: %v", err)
		}
		if stats.Changes != 2 || stats.Generations[k.hash] != 2 || stats.Generations[k.family] != 2 {
			t.Errorf("Stats: %d changes, generations %v; want 2 (one per builder) and 2, 2", stats.Changes, stats.Generations)
		}
		safeWant(t, d, k, append(next, extra))
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// wantFieldsOnly fails t unless the hash key holds want, whatever its TTL.
func wantFieldsOnly(t *testing.T, d deployment, key string, want map[string]string) {
	t.Helper()
	if diff := cmp.Diff(want, redistest.HGetAll(t, d.Other, key)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", key, diff)
	}
}

func hashOf(us []user) map[string]string {
	m := map[string]string{}
	for _, u := range us {
		m[u.Email] = u.ID
	}
	return m
}

func TestHeldRunDiscards(t *testing.T) {
	// Discard, an operator's discard, and a cancelled context each leave
	// the live keys byte for byte as they were, and nothing of the run.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, how := range []string{"Discard", "operator", "context"} {
			t.Run(how, func(t *testing.T) {
				k := safeNames(d)
				k.hash += ":" + how
				k.family += ":" + how
				if _, err := safeRebuilder(t, d, k, rebuild.Options{}).Run(redistest.Ctx(t), sources.Slice(safeUsers(40, 0, 3))); err != nil {
					t.Fatal(err)
				}
				before := redistest.Snapshot(t, d.Other, d.Prefix)
				ctx, cancel := context.WithCancel(redistest.Ctx(t))
				defer cancel()
				h, _, err := safeRebuilder(t, d, k, rebuild.Options{}).Build(ctx, sources.Slice(safeUsers(10, 100, 2)))
				if err != nil {
					t.Fatal(err)
				}
				switch how {
				case "Discard":
					if err := h.Discard(redistest.Ctx(t)); err != nil {
						t.Fatalf("Discard: %v", err)
					}
				case "operator":
					c := protocol.New(d.Other, nil)
					info, err := c.Operator.FindRun(redistest.Ctx(t), k.family)
					if err != nil {
						t.Fatal(err)
					}
					if err := c.Operator.Control(redistest.Ctx(t), info, "action", "discard"); err != nil {
						t.Fatal(err)
					}
					if _, err := h.Await(redistest.Ctx(t)); !errors.Is(err, rebuild.ErrDiscarded) {
						t.Fatalf("Await: got %v, want ErrDiscarded", err)
					}
				case "context":
					cancel()
					if _, err := h.Await(redistest.Ctx(t)); !errors.Is(err, context.Canceled) {
						t.Fatalf("Await after cancel: got %v, want context.Canceled", err)
					}
				}
				redistest.WantUnchanged(t, d.Other, d.Prefix, before)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

func TestHeldRunPublishedByOperator(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := safeNames(d)
		next := safeUsers(25, 0, 3)
		h, _, err := safeRebuilder(t, d, k, rebuild.Options{}).Build(ctx, sources.Slice(next))
		if err != nil {
			t.Fatal(err)
		}
		c := protocol.New(d.Other, nil)
		info, err := c.Operator.FindRun(ctx, k.hash)
		if err != nil {
			t.Fatal(err)
		}
		// A request fenced by another token is refused.
		stale := info
		stale.Token = "0123456789abcdef0123456789abcdef"
		if err := c.Operator.Control(ctx, stale, "action", "publish"); !errors.Is(err, protocol.ErrNoRun) {
			t.Errorf("Control with another token: got %v, want ErrNoRun", err)
		}
		if err := c.Operator.Control(ctx, info, "action", "publish"); err != nil {
			t.Fatal(err)
		}
		stats, err := h.Await(ctx)
		if err != nil {
			t.Fatalf("Await: %v", err)
		}
		if stats.Generations[k.hash] != 1 {
			t.Errorf("generation %d, want 1", stats.Generations[k.hash])
		}
		safeWant(t, d, k, next)
		if err := h.Discard(ctx); err == nil || errors.Is(err, rebuild.ErrDiscarded) {
			t.Errorf("Discard after the publish: got %v, want an error saying it was published", err)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestBuildFailsLikeRun(t *testing.T) {
	// A run that fails before it is held returns from Build with Run's
	// error, and a guard refuses before the run is held.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		k := safeNames(d)
		if _, err := safeRebuilder(t, d, k, rebuild.Options{}).Run(redistest.Ctx(t), sources.Slice(safeUsers(10, 0, 2))); err != nil {
			t.Fatal(err)
		}
		before := redistest.Snapshot(t, d.Other, d.Prefix)
		h, _, err := safeRebuilder(t, d, k, rebuild.Options{Guards: []guards.Guard{guards.RefuseEmpty()}}).Build(redistest.Ctx(t), sources.Slice[user](nil))
		if h != nil || !errors.Is(err, guards.ErrRefused) {
			t.Fatalf("Build: got %v, %v; want no Held and ErrRefused", h, err)
		}
		boom := errors.New("boom")
		_, stats, err := safeRebuilder(t, d, k, rebuild.Options{}).Build(redistest.Ctx(t), sources.Seq2(func(yield func(user, error) bool) {
			yield(user{ID: "a", Email: "a@x", Country: "c"}, nil)
			yield(user{}, boom)
		}))
		if !errors.Is(err, boom) || stats.Items != 1 {
			t.Fatalf("Build: got %v, %d items; want the source's error after 1 item", err, stats.Items)
		}
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestRollbackSwapsGenerations(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		k := safeNames(d)
		v1 := safeUsers(60, 0, 4)  // buckets c0..c3
		v2 := safeUsers(50, 30, 6) // other users, buckets c0..c5
		r := safeRebuilder(t, d, k, rebuild.Options{KeepPrevious: time.Minute})
		// Without a kept previous generation: nothing to roll back.
		if _, err := safeRebuilder(t, d, k, rebuild.Options{}).Run(ctx, sources.Slice(v1)); err != nil {
			t.Fatal(err)
		}
		before := redistest.Snapshot(t, d.Other, d.Prefix)
		if _, err := r.Rollback(ctx); !errors.Is(err, rebuild.ErrNothingToRollBack) {
			t.Fatalf("Rollback of a generation kept nowhere: got %v, want ErrNothingToRollBack", err)
		}
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)

		if _, err := r.Run(ctx, sources.Slice(v2)); err != nil {
			t.Fatal(err)
		}
		safeWant(t, d, k, v2)
		// The previous values wait beside, with their TTL.
		wantFieldsOnly(t, d, keys.PrevKey(k.hash, d.Cluster), hashOf(v1))
		redistest.WantPTTL(t, d.Other, keys.PrevKey(k.hash, d.Cluster), 50*time.Second, time.Minute)

		gens, err := r.Rollback(ctx)
		if err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		if want := map[string]int64{k.hash: 1, k.family: 1}; !maps.Equal(gens, want) {
			t.Errorf("generations after the rollback: %v, want %v", gens, want)
		}
		safeWant(t, d, k, v1)
		// v2 is kept in turn, for what was left of the time: roll forward.
		wantFieldsOnly(t, d, keys.PrevKey(k.hash, d.Cluster), hashOf(v2))
		redistest.WantPTTL(t, d.Other, keys.PrevKey(k.hash, d.Cluster), 40*time.Second, time.Minute)
		redistest.WantPTTL(t, d.Other, keys.PrevKey(k.family+":c5", d.Cluster), 40*time.Second, time.Minute)
		meta := redistest.HGetAll(t, d.Other, keys.MetaKey(k.hash, d.Cluster))
		if meta["gen"] != "1" || meta["prev"] != "2" || meta["seq"] != "2" || meta["rolled_back"] == "" {
			t.Errorf("meta after the rollback: %v; want gen 1, prev 2, seq 2, rolled_back set", meta)
		}
		if gens, err := r.Rollback(ctx); err != nil || gens[k.hash] != 2 {
			t.Fatalf("second Rollback: %v, %v; want generation 2 again", gens, err)
		}
		safeWant(t, d, k, v2)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestRollbackFencedByARun(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := safeNames(d)
		r := safeRebuilder(t, d, k, rebuild.Options{KeepPrevious: time.Minute})
		for _, v := range [][]user{safeUsers(20, 0, 2), safeUsers(20, 50, 3)} {
			if _, err := r.Run(ctx, sources.Slice(v)); err != nil {
				t.Fatal(err)
			}
		}
		h, _, err := r.Build(ctx, sources.Slice(safeUsers(5, 90, 1)))
		if err != nil {
			t.Fatal(err)
		}
		before := redistest.Snapshot(t, d.Other, d.Prefix)
		if _, err := safeRebuilder(t, d, k, rebuild.Options{}).Rollback(ctx); !errors.Is(err, rebuild.ErrInProgress) {
			t.Errorf("Rollback during a run: got %v, want ErrInProgress", err)
		}
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)
		if err := h.Discard(ctx); err != nil {
			t.Fatal(err)
		}
		safeWant(t, d, k, safeUsers(20, 50, 3))
	})
}

func TestMaxKeysBoundsThePublish(t *testing.T) {
	// A family that writes more buckets than MaxKeys fails as it writes
	// the one too many; one whose stale buckets push the publish past it
	// fails before the publish. Either way nothing changes.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := safeNames(d)
		if _, err := safeRebuilder(t, d, k, rebuild.Options{}).Run(ctx, sources.Slice(safeUsers(40, 0, 8))); err != nil {
			t.Fatal(err)
		}
		before := redistest.Snapshot(t, d.Other, d.Prefix)
		for _, tc := range []struct {
			name      string
			countries int
			want      string
		}{
			// 1 hash + 10 buckets = 11 keys > 10.
			{"buckets", 10, "the run writes more keys than that"},
			// 1 hash + 2 buckets, and 6 stale buckets: 9 keys > 8.
			{"stale buckets", 2, "would touch 9 (3 rebuilt, 6 stale buckets to delete, 0 old kept values to drop)"},
		} {
			max := 10
			if tc.name == "stale buckets" {
				max = 8
			}
			_, err := safeRebuilder(t, d, k, rebuild.Options{MaxKeys: max}).Run(ctx, sources.Slice(safeUsers(40, 0, tc.countries)))
			if !errors.Is(err, rebuild.ErrTooManyKeys) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: Run: got %v, want ErrTooManyKeys saying %q", tc.name, err, tc.want)
			}
			redistest.WantUnchanged(t, d.Other, d.Prefix, before)
			redistest.WantClean(t, d.Other, d.Prefix)
		}
		// Negative: no bound.
		if _, err := safeRebuilder(t, d, k, rebuild.Options{MaxKeys: -1}).Run(ctx, sources.Slice(safeUsers(40, 0, 12))); err != nil {
			t.Fatalf("Run without a bound: %v", err)
		}
		safeWant(t, d, k, safeUsers(40, 0, 12))
	})
}

func TestRollbackOwnsOnlyItsGeneration(t *testing.T) {
	// A key of another type under a family's prefix is not the family's:
	// a rollback leaves it alone. And the kept previous value of a bucket
	// that an older publish removed belongs to an older generation: the
	// next publish drops it, so that a rollback cannot bring it back.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := safeNames(d)
		notes := k.family + ":notes"
		redistest.SeedHash(t, d.Other, notes, map[string]string{"a": "1"})
		r := safeRebuilder(t, d, k, rebuild.Options{KeepPrevious: time.Minute})
		a := safeUsers(30, 0, 3)  // c0, c1, c2
		b := safeUsers(30, 0, 2)  // c0, c1: c2 removed, kept as a prev
		c := safeUsers(30, 50, 2) // c0, c1 again, other users
		for _, v := range [][]user{a, b, c} {
			if _, err := r.Run(ctx, sources.Slice(v)); err != nil {
				t.Fatal(err)
			}
		}
		redistest.WantAbsent(t, d.Other, keys.PrevKey(k.family+":c2", d.Cluster)) // dropped by c's publish
		if _, err := r.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		// b's index, not a's c2 (safeWant would read notes as a bucket).
		redistest.WantHash(t, d.Other, k.hash, hashOf(b))
		for bucket, want := range map[string][]string{"c0": idsIn(b, "c0"), "c1": idsIn(b, "c1")} {
			if got := redistest.SMembers(t, d.Other, k.family+":"+bucket); !slices.Equal(got, want) {
				t.Errorf("bucket %s: got %v, want %v", bucket, got, want)
			}
		}
		redistest.WantAbsent(t, d.Other, k.family+":c2")
		redistest.WantHash(t, d.Other, notes, map[string]string{"a": "1"})
		redistest.WantAbsent(t, d.Other, keys.PrevKey(notes, d.Cluster))
		meta := redistest.HGetAll(t, d.Other, keys.MetaKey(k.family, d.Cluster))
		if meta["family"] != "set" {
			t.Errorf("the family's meta records family %q, want set", meta["family"])
		}
	})
}

// idsIn returns the sorted ids of us in country c.
func idsIn(us []user, c string) []string {
	var out []string
	for _, u := range us {
		if u.Country == c {
			out = append(out, u.ID)
		}
	}
	slices.Sort(out)
	return out
}

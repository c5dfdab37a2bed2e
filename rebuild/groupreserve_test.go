package rebuild_test

// The reservation (C102): every run in a group raises the field next of
// each index's registry without a group to the generation it allocates,
// before it allocates it, so that a run without the group (or in another
// group) allocates above every generation the group used even once the
// claim is gone.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// TestGroupReserveClaimLost (C102): group a publishes a family n times,
// then its claim L:rebuild-ptr is deleted by hand. A run without the
// group, or in group b, then allocates the generation above every one
// group a used (n+1) and publishes it on keys of its own: every key group
// a had (its control keys, the data keys of its generations) keeps its
// exact contents, none is deleted. Without the reservation the run
// allocated 1, wrote into group a's generation 1 (its current one when n
// is 1) and, failing its size check, removed it.
func TestGroupReserveClaimLost(t *testing.T) {
	for _, n := range []int64{1, 3} {
		for _, other := range []string{"no-group", "group-b"} {
			t.Run(fmt.Sprintf("%s/published-%d", other, n), func(t *testing.T) {
				forEachDeployment(t, func(t *testing.T, d deployment) {
					claimLost(t, d, n, other == "group-b")
				})
			})
		}
	}
}

func claimLost(t *testing.T, d deployment, n int64, inB bool) {
	ctx := redistest.Ctx(t)
	ga, gb, prefix := fenceNames(d)
	usA := genUsers(50, 5)
	for range n {
		publishInGroup(t, d, prefix, ga, usA)
	}
	ptrA := keys.PointerKey(prefix, keys.Names{Cluster: d.Cluster, Group: ga})
	redistest.WantString(t, d.Other, ptrA, strconv.FormatInt(n, 10))
	own := keys.PointerKey(prefix, d.Cluster)
	ownReg := keys.RegistryKey(prefix, d.Cluster)
	// The claim is lost: deleted by hand, or in a failover before it
	// replicated.
	redistest.Do(t, d.Other, d.Other.B().Del().Key(own).Build())
	before := dumps(t, d)
	group := ""
	if inB {
		group = gb
	}
	usB := genUsers(80, 7)
	st, err := genRebuilder(t, d, prefix, rebuild.Options{Group: group}).Run(ctx, sources.Slice(usB))
	if err != nil {
		t.Errorf("Run (group %q) after the claim was lost: %v", group, err)
	}
	if g := st.Generations[prefix]; g != n+1 {
		t.Errorf("the run's generation: got %d, want %d, above every one group a used", g, n+1)
	}
	after := dumps(t, d)
	for k, v := range before {
		switch {
		case k == ownReg:
			// Its next raised: by the run's generation, or group b's
			// reservation.
		case after[k] == "":
			t.Errorf("%s is gone", k)
		case after[k] != v:
			t.Errorf("%s changed", k)
		}
	}
	wantBuckets(t, d, prefix, n, usA)
	wantBuckets(t, d, prefix, n+1, usB)
	redistest.WantString(t, d.Other, ptrA, strconv.FormatInt(n, 10))
	next := strconv.FormatInt(n+1, 10)
	if inB {
		redistest.WantString(t, d.Other, own, keys.GroupMarker(gb))
		redistest.WantHash(t, d.Other, ownReg, map[string]string{keys.RegNext: next})
		redistest.WantString(t, d.Other, keys.PointerKey(prefix, keys.Names{Cluster: d.Cluster, Group: gb}), next)
	} else {
		redistest.WantString(t, d.Other, own, next)
		redistest.WantHash(t, d.Other, ownReg, map[string]string{keys.RegNext: next, next: "current"})
	}
}

// TestGroupReserveEveryRun (C102): each run in a group, not only the one
// that claims, leaves the field next of the registry without a group at
// the generation it published, and nothing else in that registry; a retry
// of the claim script (its reply lost, the script run again) skips a
// number but keeps next at the generation the run allocates.
func TestGroupReserveEveryRun(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, _, prefix := fenceNames(d)
		ownReg := keys.RegistryKey(prefix, d.Cluster)
		claim := redistest.ScriptNamed("claim")
		var twice atomic.Bool
		var ran atomic.Int64
		// Run each claim script twice when twice is set: the first reply
		// is lost, the retry's returned.
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, hctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if twice.Load() && claim.Is(cmd.Commands()) {
					ran.Add(1)
					c.Do(hctx, cmd.Pin())
				}
				return c.Do(hctx, cmd)
			},
			OnDoMulti: func(c rueidis.Client, hctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				if twice.Load() && len(multi) > 0 && claim.Is(multi[0].Commands()) {
					ran.Add(1)
					for i := range multi {
						multi[i] = multi[i].Pin()
					}
					c.DoMulti(hctx, multi...)
				}
				return c.DoMulti(hctx, multi...)
			},
		})
		r := redistest.Rebuilder(t, hooked, rebuild.Options{Publish: rebuild.Generations, BatchSize: 50, Grace: -1, Group: ga}, genSetIndex(prefix))
		want := []int64{1, 2, 3, 5}
		for i, g := range want {
			twice.Store(i == len(want)-1)
			us := genUsers(40+10*i, 5)
			st, err := r.Run(ctx, sources.Slice(us))
			if err != nil {
				t.Fatalf("run %d: %v", i+1, err)
			}
			if st.Generations[prefix] != g {
				t.Errorf("run %d: generation %d, want %d", i+1, st.Generations[prefix], g)
			}
			redistest.WantHash(t, d.Other, ownReg, map[string]string{keys.RegNext: strconv.FormatInt(g, 10)})
			wantBuckets(t, d, prefix, g, us)
		}
		if ran.Load() == 0 {
			t.Fatal("no claim script ran twice")
		}
	})
}

// TestGroupReserveMany (C102): a run of two indexes in a group reserves
// each in its own registry without a group (on a cluster in two slots
// apart from the group's), and a refusal of the second by its claim
// leaves the first's registry without a group as it was: nothing written.
func TestGroupReserveMany(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, gb, prefix := fenceNames(d)
		email, country := prefix+":by-email", prefix+":by-country"
		bs := func(group string) *rebuild.Rebuilder[user] {
			return redistest.Rebuilder(t, d.Client, rebuild.Options{Publish: rebuild.Generations, BatchSize: 50, Grace: -1, Group: group},
				builders.Hash(email, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
				builders.Hash(country, func(u user) (string, string, bool) { return u.ID, u.Country, true }))
		}
		us := genUsers(30, 3)
		for i := range 2 {
			if _, err := bs(ga).Run(ctx, sources.Slice(us)); err != nil {
				t.Fatalf("run %d in group a: %v", i+1, err)
			}
		}
		for _, l := range []string{email, country} {
			redistest.WantHash(t, d.Other, keys.RegistryKey(l, d.Cluster), map[string]string{keys.RegNext: "2"})
		}
		// Group b's run: email's claim lost, country's still group a's.
		redistest.Do(t, d.Other, d.Other.B().Del().Key(keys.PointerKey(email, d.Cluster)).Build())
		before := dumps(t, d)
		_, err := bs(gb).Run(ctx, sources.Slice(us))
		wantGroupConflict(t, "Run in group b", err, fmt.Sprintf("in group %q", ga))
		wantDumps(t, d, before)
	})
}

func TestGroupReserveACL(t *testing.T) {
	// C102, C93: the reservation's HSET of the registry without the group
	// is among the rights the acquire checks: a user who may HSET only the
	// group's keys fails a run in a group at the acquire with
	// ErrNoPermission naming HSET and that registry, before the claim or
	// any other write: the server holds no key.
	t.Parallel()
	family := redistest.Prefix(t) + "users:by-bucket"
	// HSET on every key but the registry without the group: the group's
	// keys ({group}:rebuild-group:...) and the family's live and data keys.
	wantClaimRefused(t, family, genSetIndex(family), "HSET", "~*", "+@all", "-hset", "(~{* ~*:rebuild-g:* ~*:keyswap-rights +hset)")
}

// TestGroupClaimGoneBeforeFlip (C102): a run in a group checks, before its
// flip, that the claim and the reservation it wrote at its allocation are
// still there. Deleted by hand during the run, or the reservation set
// back below the run's generation (as a failover of the master of the
// index's own base could leave them, after the durability wait counted on
// its replica), the flip is refused with ErrTampered naming the key: the
// group's pointer stays at its generation, whose data keep their exact
// contents, the run's generation is removed and its lock released.
func TestGroupClaimGoneBeforeFlip(t *testing.T) {
	for _, what := range []string{"claim deleted", "reservation set back"} {
		t.Run(what, func(t *testing.T) {
			forEachDeployment(t, func(t *testing.T, d deployment) {
				ctx := redistest.Ctx(t)
				ga, _, prefix := fenceNames(d)
				us := genUsers(50, 5)
				publishInGroup(t, d, prefix, ga, us)
				own := keys.PointerKey(prefix, d.Cluster)
				ownReg := keys.RegistryKey(prefix, d.Cluster)
				ptrA := keys.PointerKey(prefix, keys.Names{Cluster: d.Cluster, Group: ga})
				names := []string{own, keys.GroupMarker(ga)}
				if what != "claim deleted" {
					names = []string{ownReg, "below generation 2"}
				}
				// The source loses the claim, or sets the reservation
				// back, once the run has allocated and written a batch.
				next := genUsers(60, 5)
				src := func(yield func(user) bool) {
					for i, u := range next {
						if i == 55 {
							if what == "claim deleted" {
								redistest.Do(t, d.Other, d.Other.B().Del().Key(own).Build())
							} else {
								redistest.Do(t, d.Other, d.Other.B().Hset().Key(ownReg).FieldValue().FieldValue(keys.RegNext, "1").Build())
							}
						}
						if !yield(u) {
							return
						}
					}
				}
				_, err := genRebuilder(t, d, prefix, rebuild.Options{Group: ga}).Run(ctx, sources.Seq(src))
				if !errors.Is(err, rebuild.ErrTampered) {
					t.Fatalf("Run after the %s: got %v, want ErrTampered", what, err)
				}
				for _, s := range names {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("the error does not name %q: %v", s, err)
					}
				}
				redistest.WantString(t, d.Other, ptrA, "1")
				wantBuckets(t, d, prefix, 1, us)
				wantNoGeneration(t, d, prefix, 2)
				redistest.WantAbsent(t, d.Other, keys.LockKey(prefix, keys.Names{Cluster: d.Cluster, Group: ga}))
			})
		})
	}
}

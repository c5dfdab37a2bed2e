package rebuild_test

// The group's claim (C102): a run in a group first claims each index in
// the pointer of the index without a group; every run and reader without
// the group, or in another, refuses a claimed index, and a run in a group
// refuses an index with generations of runs without one, each before it
// writes anything.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/reader"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// fenceNames returns two groups and the prefix of a family without a hash
// tag of one test in d. Every key of the test starts with one of
// fencePrefixes(d).
func fenceNames(d deployment) (ga, gb, prefix string) {
	p := strings.Trim(d.Prefix, "{}")
	return p + "a", p + "b", p + "users:by-bucket"
}

// taggedFencePrefix is fenceNames' prefix with a hash tag of its own, so
// that a run or an Apply in RenameInPlace mode finds its keys in one slot
// on a cluster too.
func taggedFencePrefix(d deployment) string {
	return "{" + strings.Trim(d.Prefix, "{}") + "}users:by-bucket"
}

// publishInGroup publishes us as the family prefix in group g (which
// claims it), failing the test when the run fails.
func publishInGroup(t *testing.T, d deployment, prefix, g string, us []user) {
	t.Helper()
	if _, err := genRebuilder(t, d, prefix, rebuild.Options{Group: g}).Run(redistest.Ctx(t), sources.Slice(us)); err != nil {
		t.Fatalf("Run in group %s: %v", g, err)
	}
}

// fencePrefixes returns the prefixes of every key of a test in d: its
// data keys and its control keys without a group start with the first,
// on a cluster its control keys without a group and the groups' keys with
// the second.
func fencePrefixes(d deployment) []string {
	p := strings.Trim(d.Prefix, "{}")
	return []string{p, "{" + p}
}

// dumps returns the exact contents (DUMP) of every key of a test in d,
// and of every key that starts with one of more, without TTLs: a held
// run's lease renews its own keys' while a test compares.
func dumps(t *testing.T, d deployment, more ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range append(fencePrefixes(d), more...) {
		for k, s := range redistest.Snapshot(t, d.Other, p) {
			out[k] = s.Dump
		}
	}
	return out
}

// wantDumps checks that every key of a test in d (and of more, as dumps
// reads them) holds what before says, and that no key came or went.
func wantDumps(t *testing.T, d deployment, before map[string]string, more ...string) {
	t.Helper()
	after := dumps(t, d, more...)
	for k := range before {
		if _, ok := after[k]; !ok {
			t.Errorf("%s is gone", k)
		} else if after[k] != before[k] {
			t.Errorf("%s changed", k)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("%s was written", k)
		}
	}
}

// wantGroupConflict checks that err matches ErrGroupConflict and says each
// of says.
func wantGroupConflict(t *testing.T, what string, err error, says ...string) {
	t.Helper()
	if !errors.Is(err, rebuild.ErrGroupConflict) {
		t.Fatalf("%s: got %v, want ErrGroupConflict", what, err)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: got %v, want it to say %q", what, err, s)
		}
	}
}

func TestGroupClaimRefusesOtherRuns(t *testing.T) {
	// C102: group a publishes a family; a run of it without a group, and
	// a run of it in group b, are refused with ErrGroupConflict naming
	// group a, before they write anything: every key of the test holds
	// what it held, none came, no lock is left.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, gb, prefix := fenceNames(d)
		us := genUsers(50, 5)
		publishInGroup(t, d, prefix, ga, us)
		redistest.WantString(t, d.Other, keys.PointerKey(prefix, d.Cluster), keys.GroupMarker(ga))
		for _, tc := range []struct{ name, group string }{{"no group", ""}, {"group b", gb}} {
			before := dumps(t, d)
			_, err := genRebuilder(t, d, prefix, rebuild.Options{Group: tc.group}).Run(ctx, sources.Slice(genUsers(80, 7)))
			wantGroupConflict(t, tc.name, err, fmt.Sprintf("in group %q", ga), fmt.Sprintf("pass the group %q", ga))
			wantDumps(t, d, before)
		}
		wantBuckets(t, d, prefix, 1, us)
		redistest.WantString(t, d.Other, keys.PointerKey(prefix, keys.Names{Cluster: d.Cluster, Group: ga}), "1")
	})
}

func TestGroupClaimRefusedByUngroupedGenerations(t *testing.T) {
	// C102: a run in a group is refused, nothing written, while the index
	// has generations of runs without a group: a pointer; only a retired
	// generation in the registry (the index went back to rename-in-place,
	// its generations not yet removed); a generation a run without a group
	// is building (the run holds, allocated and not flipped: it then
	// publishes as if nothing happened). The family has a hash tag, which
	// a RenameInPlace run of it needs on a cluster.
	for _, tc := range []string{"pointer", "retired", "building"} {
		t.Run(tc, func(t *testing.T) {
			forEachDeployment(t, func(t *testing.T, d deployment) {
				ctx := redistest.Ctx(t)
				ga, _, _ := fenceNames(d)
				prefix := "{" + strings.Trim(d.Prefix, "{}") + "}users:by-bucket"
				reg := keys.RegistryKey(prefix, d.Cluster)
				us := genUsers(50, 5)
				own := genRebuilder(t, d, prefix, rebuild.Options{})
				var held *rebuild.Held[user]
				says := reg
				switch tc {
				case "pointer":
					if _, err := own.Run(ctx, sources.Slice(us)); err != nil {
						t.Fatal(err)
					}
					says = keys.PointerKey(prefix, d.Cluster)
				case "retired":
					if _, err := own.Run(ctx, sources.Slice(us)); err != nil {
						t.Fatal(err)
					}
					inPlace := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 50}, genSetIndex(prefix))
					if _, err := inPlace.Run(ctx, sources.Slice(us)); err != nil {
						t.Fatal(err)
					}
					redistest.WantAbsent(t, d.Other, keys.PointerKey(prefix, d.Cluster))
					if st := redistest.HGetAll(t, d.Other, reg)["1"]; !strings.HasPrefix(st, keys.RegRetired) {
						t.Fatalf("registry field 1 = %q, want retired", st)
					}
				case "building":
					var err error
					if held, _, err = own.Build(ctx, sources.Slice(us)); err != nil {
						t.Fatal(err)
					}
					if st := redistest.HGetAll(t, d.Other, reg)["1"]; !strings.HasPrefix(st, keys.RegBuilding) {
						t.Fatalf("registry field 1 = %q, want building", st)
					}
				}
				before := dumps(t, d)
				_, err := genRebuilder(t, d, prefix, rebuild.Options{Group: ga}).Run(ctx, sources.Slice(genUsers(80, 7)))
				wantGroupConflict(t, "Run in a group", err, "generations of runs without a group", says, "under a new key", "once their grace is over")
				wantDumps(t, d, before)
				if held != nil {
					if _, err := held.Publish(ctx); err != nil {
						t.Fatalf("Publish of the held run: %v", err)
					}
					redistest.WantString(t, d.Other, keys.PointerKey(prefix, d.Cluster), "1")
					wantBuckets(t, d, prefix, 1, us)
				}
			})
		})
	}
}

func TestGroupClaimBeforeAllocation(t *testing.T) {
	// C102: a run without a group took its lock; before it allocates, a
	// run in a group claims the index and publishes. The allocation is
	// refused (genalloc reads the claim in the same slot): ErrGroupConflict
	// naming the group, the group's generation intact, the run's lock
	// released, the registry without the group holding only the group's
	// reservation of its generation 1.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, _, prefix := fenceNames(d)
		usA := genUsers(50, 5)
		grouped := genRebuilder(t, d, prefix, rebuild.Options{Group: ga})
		genalloc := redistest.ScriptNamed("genalloc")
		var claimed atomic.Bool
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, hctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if genalloc.Is(cmd.Commands()) && claimed.CompareAndSwap(false, true) {
					if _, err := grouped.Run(ctx, sources.Slice(usA)); err != nil {
						t.Errorf("Run in the group before the allocation: %v", err)
					}
				}
				return c.Do(hctx, cmd)
			},
		})
		own := redistest.Rebuilder(t, hooked, rebuild.Options{Publish: rebuild.Generations, BatchSize: 50, Grace: 50 * time.Millisecond}, genSetIndex(prefix))
		_, err := own.Run(ctx, sources.Slice(genUsers(80, 7)))
		if !claimed.Load() {
			t.Fatal("the run without a group never allocated")
		}
		wantGroupConflict(t, "Run without a group", err, fmt.Sprintf("in group %q", ga))
		wantBuckets(t, d, prefix, 1, usA)
		redistest.WantString(t, d.Other, keys.PointerKey(prefix, keys.Names{Cluster: d.Cluster, Group: ga}), "1")
		redistest.WantString(t, d.Other, keys.PointerKey(prefix, d.Cluster), keys.GroupMarker(ga))
		redistest.WantAbsent(t, d.Other, keys.LockKey(prefix, d.Cluster))
		redistest.WantHash(t, d.Other, keys.RegistryKey(prefix, d.Cluster), map[string]string{keys.RegNext: "1"})
	})
}

func TestGroupClaimReadersRefuse(t *testing.T) {
	// C102: on an index group a claimed, a reader without the group, Apply
	// and Rollback without it are refused with an
	// error matching ErrGroupConflict that names the group, and write
	// nothing; the group's own reader, Apply and rollback go on.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, _, prefix := fenceNames(d)
		us := genUsers(50, 5)
		a := genRebuilder(t, d, prefix, rebuild.Options{Group: ga, KeepPrevious: time.Minute})
		for range 2 {
			if _, err := a.Run(ctx, sources.Slice(us)); err != nil {
				t.Fatalf("Run in group a: %v", err)
			}
		}
		before := dumps(t, d)
		plain, err := reader.New(d.Other, reader.Options{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = plain.Bucket(ctx, prefix, "b00")
		wantGroupConflict(t, "reader without the group", err, fmt.Sprintf("Options.Group %q", ga))
		if !errors.Is(err, reader.ErrGroupConflict) {
			t.Errorf("reader without the group: %v, want reader.ErrGroupConflict", err)
		}
		_, _, err = plain.Recheck(ctx, reader.InBucket(prefix, "b00"), prefix+":b00")
		wantGroupConflict(t, "Recheck without the group", err, fmt.Sprintf("Options.Group %q", ga))

		own := genRebuilder(t, d, prefix, rebuild.Options{})
		extra := genUsers(52, 5)[51]
		wantGroupConflict(t, "Apply without the group", own.Apply(ctx, index.Insert(extra)), fmt.Sprintf("in group %q", ga))
		_, err = own.Rollback(ctx)
		wantGroupConflict(t, "Rollback without the group", err, fmt.Sprintf("in group %q", ga))
		wantDumps(t, d, before)

		grouped, err := reader.New(d.Other, reader.Options{Group: ga})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := grouped.Bucket(ctx, prefix, "b00"); err != nil || got != keys.GenBucketKey(prefix, 2, "b00") {
			t.Errorf("reader in the group: Bucket = %q, %v; want generation 2's", got, err)
		}
		if err := a.Apply(ctx, index.Insert(extra)); err != nil {
			t.Fatalf("Apply in the group: %v", err)
		}
		wantBuckets(t, d, prefix, 2, append(us, extra))
		if _, err := a.Rollback(ctx); err != nil {
			t.Fatalf("Rollback in the group: %v", err)
		}
		redistest.WantString(t, d.Other, keys.PointerKey(prefix, keys.Names{Cluster: d.Cluster, Group: ga}), "1")
	})
}

func TestGroupClaimACL(t *testing.T) {
	// C102, C93: the rights the acquire checks include the claim's (HKEYS
	// of the registry without the group): a user without one fails a run
	// in a group at the acquire with ErrNoPermission naming it, before the
	// claim or any other write: the server holds no key.
	t.Parallel()
	email := redistest.Prefix(t) + "users:by-email"
	wantClaimRefused(t, email, builders.Hash(email, func(u user) (string, string, bool) { return u.Email, u.ID, true }), "HKEYS", "~*", "+@all", "-hkeys")
}

// wantClaimRefused runs b, whose index is live, in a group on a server of
// its own as a user with rules, and checks that the acquire refuses it
// with ErrNoPermission naming cmd on the registry without the group, and
// that the server holds no key.
func wantClaimRefused(t *testing.T, live string, b index.Builder[user], cmd string, rules ...string) {
	t.Helper()
	srv := redistest.OwnServer(t)
	c := srv.ClientAs(t, "ks-"+strings.ReplaceAll(t.Name(), "/", "-"), rules...)
	r := redistest.Rebuilder(t, c, rebuild.Options{Publish: rebuild.Generations, Group: redistest.Prefix(t) + "g", Grace: -1}, b)
	_, err := r.Run(redistest.Ctx(t), sources.Slice(users(8)))
	redistest.WantErr(t, err, rebuild.ErrNoPermission)
	var e *rebuild.Error
	if !errors.As(err, &e) || e.Op != "acquire" || !strings.Contains(err.Error(), cmd) || !strings.Contains(err.Error(), keys.RegistryKey(live, false)) {
		t.Errorf("Run: %v, want an *Error of op acquire naming %s and %s", err, cmd, keys.RegistryKey(live, false))
	}
	if left := redistest.Keys(t, srv.Client(t), ""); len(left) > 0 {
		t.Errorf("the refused run left %v", left)
	}
}

func TestGroupClaimRenameInPlace(t *testing.T) {
	// C102: a RenameInPlace run (which has no group) of an index a group
	// claimed is refused at its publish with ErrGroupConflict naming the
	// group: publish.lua keeps the claim, which it would otherwise delete
	// as it deletes a pointer without a group, since the group's
	// generations have the names a later run without the group would
	// allocate. Its live keys are not written, the group's data stays,
	// and no temp key or lock is left.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, _, _ := fenceNames(d)
		prefix := taggedFencePrefix(d)
		us := genUsers(50, 5)
		publishInGroup(t, d, prefix, ga, us)
		before := dumps(t, d)
		inPlace := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 50}, genSetIndex(prefix))
		_, err := inPlace.Run(ctx, sources.Slice(genUsers(80, 7)))
		wantGroupConflict(t, "RenameInPlace run", err, fmt.Sprintf("in group %q", ga), "rename-in-place")
		wantDumps(t, d, before)
		wantBuckets(t, d, prefix, 1, us)
	})
}

func TestGroupClaimBeforeFlip(t *testing.T) {
	// C102: a claim that reaches the pointer of a run without a group
	// between its allocation and its flip (a SET by hand: a run in a group
	// is refused while the run's generation is building) refuses the flip
	// (flip.lua): ErrGroupConflict naming the group, the claim kept, the
	// run's generation removed, its lock released.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, _, prefix := fenceNames(d)
		ptr := keys.PointerKey(prefix, d.Cluster)
		flip := redistest.ScriptNamed("flip")
		var set atomic.Bool
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, hctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if flip.Is(cmd.Commands()) && set.CompareAndSwap(false, true) {
					redistest.Cmd(t, d.Other, "SET", ptr, keys.GroupMarker(ga))
				}
				return c.Do(hctx, cmd)
			},
		})
		own := redistest.Rebuilder(t, hooked, rebuild.Options{Publish: rebuild.Generations, BatchSize: 50, Grace: 50 * time.Millisecond}, genSetIndex(prefix))
		_, err := own.Run(ctx, sources.Slice(genUsers(50, 5)))
		if !set.Load() {
			t.Fatal("the run never flipped")
		}
		wantGroupConflict(t, "Run", err, fmt.Sprintf("in group %q", ga))
		redistest.WantString(t, d.Other, ptr, keys.GroupMarker(ga))
		wantNoGeneration(t, d, prefix, 1)
		redistest.WantAbsent(t, d.Other, keys.LockKey(prefix, d.Cluster))
	})
}

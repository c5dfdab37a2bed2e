package rebuild_test

// Groups (C100, C101): the control keys of a Rebuilder's indexes hang off
// the group's hash tag, and their data keys spread.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/reader"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// groupNames returns a group and the keys of three indexes of one test in
// d, none with a hash tag: a family by the last two digits of the id, a family by bucket and a
// hash of emails.
func groupNames(d deployment) (group, byDigits, byBucket, emails string) {
	p := strings.Trim(d.Prefix, "{}")
	return p, p + "users:by-digits", p + "users:by-bucket", p + "users:emails"
}

// groupRebuilder returns a Rebuilder in Generations mode, in group, of the
// three indexes of groupNames.
func groupRebuilder(t *testing.T, c rueidis.Client, d deployment, opts rebuild.Options) *rebuild.Rebuilder[user] {
	t.Helper()
	group, byDigits, byBucket, emails := groupNames(d)
	opts.Publish, opts.Group, opts.BatchSize, opts.KeepPrevious = rebuild.Generations, group, 50, time.Minute
	if opts.Grace == 0 {
		opts.Grace = 50 * time.Millisecond
	}
	return redistest.Rebuilder(t, c, opts,
		builders.SetIndex(byDigits, func(u user) (string, string, bool) { return u.ID[len(u.ID)-2:], u.ID, true }),
		builders.SetIndex(byBucket, func(u user) (string, string, bool) { return u.Country, u.ID, true }),
		builders.Hash(emails, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
}

// pointersAtOnce reads the pointers ptrs in one script, so that it sees
// them all at one moment; a pointer absent reads "".
func pointersAtOnce(ctx context.Context, c rueidis.Client, ptrs []string) ([]string, error) {
	const script = `local out = {} for i, k in ipairs(KEYS) do out[i] = redis.call('GET', k) or '' end return out`
	return c.Do(ctx, c.B().Eval().Script(script).Numkeys(int64(len(ptrs))).Key(ptrs...).Build()).AsStrSlice()
}

// mastersHolding returns the masters of c's deployment that hold a key
// starting with prefix.
func mastersHolding(t *testing.T, c rueidis.Client, prefix string) []string {
	t.Helper()
	ctx := redistest.Ctx(t)
	var out []string
	for addr, node := range c.Nodes() {
		role, err := node.Do(ctx, node.B().Role().Build()).ToArray()
		if err != nil {
			t.Fatalf("ROLE on %s: %v", addr, err)
		}
		if r, _ := role[0].ToString(); r != "master" {
			continue
		}
		e, err := node.Do(ctx, node.B().Scan().Cursor(0).Match(keys.GlobEscape(prefix)+"*").Count(100000).Build()).AsScanEntry()
		if err != nil {
			t.Fatalf("SCAN on %s: %v", addr, err)
		}
		if len(e.Elements) > 0 {
			out = append(out, addr)
		}
	}
	slices.Sort(out)
	return out
}

func TestGenerationsGroupSpreads(t *testing.T) {
	// C100: three indexes without a common hash tag in one Rebuilder with a
	// group: on the cluster their control keys share the group's slot, and
	// the data keys of their generations spread over every master; each
	// flip (a run, a rollback, a roll forward) moves every pointer at once,
	// as one script reading them all sees; Apply writes the current
	// generation; a reader with the group reads it, one without is refused
	// naming the group (C102: the pointer without a group holds the
	// group's claim); nothing else is left.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		group, byDigits, byBucket, emails := groupNames(d)
		lives := []string{byDigits, byBucket, emails}
		names := keys.Names{Cluster: d.Cluster, Group: group}
		ptrs := make([]string, len(lives))
		for i, l := range lives {
			ptrs[i] = keys.PointerKey(l, names)
			if want := "{" + group + "}" + keys.GroupInfix + l + keys.PointerSuffix; ptrs[i] != want {
				t.Fatalf("pointer of %s = %q, want %q", l, ptrs[i], want)
			}
		}
		us := genUsers(300, 10)
		// On the cluster, the run's per-slot counters are named after the
		// group's base of its first index, as its other control keys are.
		var counted sync.Once
		var named []string
		progress := func(rebuild.Progress) {
			if d.Cluster {
				counted.Do(func() { named = counters(t, d.Other, keys.Base(byDigits, names)) })
			}
		}
		r := groupRebuilder(t, d.Client, d, rebuild.Options{Progress: progress})
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("first Run: %v", err)
		}
		wantPointers(t, d, ptrs, "1")
		if d.Cluster && len(named) == 0 {
			t.Error("no per-slot counter named after the group's base during the run")
		}
		if left := counters(t, d.Other, keys.Base(byDigits, names)); len(left) > 0 {
			t.Errorf("counters left: %v", left)
		}
		if d.Cluster {
			all := mastersHolding(t, d.Other, strings.Trim(d.Prefix, "{}")+"users:")
			if len(all) != 3 {
				t.Errorf("the data keys are on masters %v, want all 3", all)
			}
			for _, l := range lives {
				if k := keys.GenKey(l, 1); keys.Slot(k) == keys.Slot(ptrs[0]) {
					t.Errorf("%s is in the group's slot %d", k, keys.Slot(k))
				}
			}
		}
		for _, l := range lives {
			// C102: outside the group, the group's claim, and its
			// reservation of generation 1, alone.
			redistest.WantString(t, d.Other, keys.PointerKey(l, d.Cluster), keys.GroupMarker(group))
			redistest.WantHash(t, d.Other, keys.RegistryKey(l, d.Cluster), map[string]string{keys.RegNext: "1"})
		}

		// A second run, while a reader of the pointers at one moment
		// watches: it sees 1, 1, 1 then 2, 2, 2, never a mix.
		var stop atomic.Bool
		var wg sync.WaitGroup
		var seen sync.Map
		var readErr error
		wg.Go(func() {
			for !stop.Load() {
				got, err := pointersAtOnce(ctx, d.Other, ptrs)
				if err != nil {
					readErr = err
					return
				}
				seen.Store(strings.Join(got, ","), true)
			}
		})
		us2 := genUsers(301, 10)
		_, err := r.Run(ctx, sources.Slice(us2))
		stop.Store(true)
		wg.Wait()
		if err != nil || readErr != nil {
			t.Fatalf("second Run: %v; reading the pointers: %v", err, readErr)
		}
		seen.Range(func(k, _ any) bool {
			if s := k.(string); s != "1,1,1" && s != "2,2,2" {
				t.Errorf("the pointers read at one moment were %s: not one flip", s)
			}
			return true
		})
		wantPointers(t, d, ptrs, "2")
		redistest.WantHash(t, d.Other, keys.RegistryKey(byBucket, names), map[string]string{keys.RegNext: "2", "1": keys.RegPrevious, "2": keys.RegCurrent})

		// Apply writes the current generation; the readers.
		extra := genUsers(302, 10)[301]
		if err := r.Apply(ctx, index.Insert(extra)); err != nil {
			t.Fatalf("Apply: %v", err)
		}
		if !slices.Contains(redistest.SMembers(t, d.Other, keys.GenBucketKey(byBucket, 2, extra.Country)), extra.ID) {
			t.Errorf("Apply: %s not in generation 2's bucket %s", extra.ID, extra.Country)
		}
		grouped, err := reader.New(d.Other, reader.Options{Group: group})
		if err != nil {
			t.Fatalf("reader.New: %v", err)
		}
		if got, err := grouped.Bucket(ctx, byBucket, extra.Country); err != nil || got != keys.GenBucketKey(byBucket, 2, extra.Country) {
			t.Errorf("grouped reader: Bucket = %q, %v; want generation 2's", got, err)
		}
		if got, err := grouped.Key(ctx, emails); err != nil || got != keys.GenKey(emails, 2) {
			t.Errorf("grouped reader: Key = %q, %v; want generation 2's", got, err)
		}
		plain, err := reader.New(d.Other, reader.Options{})
		if err != nil {
			t.Fatalf("reader.New: %v", err)
		}
		if got, err := plain.Key(ctx, emails); !errors.Is(err, reader.ErrGroupConflict) || !strings.Contains(err.Error(), fmt.Sprintf("Options.Group %q", group)) {
			t.Errorf("reader without the group: Key = %q, %v; want ErrGroupConflict naming group %q", got, err, group)
		}

		// Rollback and roll forward: one flip each.
		gens, err := r.Rollback(ctx)
		if err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		for _, l := range lives {
			if gens[l] != 1 {
				t.Errorf("Rollback: %s at generation %d, want 1", l, gens[l])
			}
		}
		wantPointers(t, d, ptrs, "1")
		if _, err := r.Rollback(ctx); err != nil {
			t.Fatalf("roll forward: %v", err)
		}
		wantPointers(t, d, ptrs, "2")

		// A third run retires generation 1, removed after Grace through
		// the group's registry.
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("third Run: %v", err)
		}
		wantPointers(t, d, ptrs, "3")
		for _, l := range lives {
			if left := redistest.Keys(t, d.Other, l+keys.GenInfix+"1"); len(left) > 0 {
				t.Errorf("retired generation 1 of %s left %v", l, left)
			}
		}

		// Nothing left but each index's pointer, registry and meta, in the
		// group's slot, and its generations 2 (kept) and 3, with, on a
		// standalone server, the manifests of the families' (C99; on the
		// cluster their keys leave the group's slot: no manifest).
		for _, k := range redistest.Keys(t, d.Other, "{"+group+"}") {
			ok := false
			for _, l := range lives {
				ok = ok || k == keys.PointerKey(l, names) || k == keys.RegistryKey(l, names) || k == keys.MetaKey(l, names)
				if l != emails && !d.Cluster {
					for _, g := range []int64{2, 3} {
						ok = ok || k == keys.ManifestKey(l, names, g) || k == keys.ManifestListKey(l, names, g)
					}
				}
			}
			if !ok {
				t.Errorf("left behind: %s", k)
			}
			if d.Cluster && keys.Slot(k) != keys.Slot(ptrs[0]) {
				t.Errorf("%s is not in the group's slot", k)
			}
		}
		for _, l := range lives {
			for _, k := range redistest.Keys(t, d.Other, l) {
				if k == keys.PointerKey(l, d.Cluster) || k == keys.RegistryKey(l, d.Cluster) || slices.Contains(redistest.OwnerStamps(d.Cluster, l), k) {
					continue // the group's claim and reservation (C102), the base's stamp (C104)
				}
				if !strings.HasPrefix(k, l+keys.GenInfix+"2") && !strings.HasPrefix(k, l+keys.GenInfix+"3") {
					t.Errorf("left behind: %s", k)
				}
			}
		}
	})
}

// wantPointers checks that every pointer of ptrs names gen.
func wantPointers(t *testing.T, d deployment, ptrs []string, gen string) {
	t.Helper()
	for _, p := range ptrs {
		redistest.WantString(t, d.Other, p, gen)
	}
}

func TestGenerationsGroupRefused(t *testing.T) {
	// C100: a group with a brace, or a group in RenameInPlace mode, is
	// refused by New with an error matching reader.ErrBadGroup, naming the problem; so is a bad
	// group by reader.New.
	d := env.Deployments(t)[0]
	b := builders.Hash("k", func(u user) (string, string, bool) { return u.ID, u.Email, true })
	for _, tc := range []struct {
		name string
		opts rebuild.Options
		want string
	}{
		{"open brace", rebuild.Options{Publish: rebuild.Generations, Group: "a{b"}, "holds a brace"},
		{"close brace", rebuild.Options{Publish: rebuild.Generations, Group: "a}"}, "holds a brace"},
		{"rename in place", rebuild.Options{Group: "g"}, "RenameInPlace mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rebuild.New(d.Client, tc.opts, b)
			if !errors.Is(err, reader.ErrBadGroup) || !strings.Contains(fmt.Sprint(err), tc.want) {
				t.Errorf("New: got %v, want reader.ErrBadGroup saying %q", err, tc.want)
			}
			if tc.opts.Publish == rebuild.Generations {
				if _, err := reader.New(d.Client, reader.Options{Group: tc.opts.Group}); !errors.Is(err, reader.ErrBadGroup) {
					t.Errorf("reader.New: got %v, want ErrBadGroup", err)
				}
			}
		})
	}
}

func TestGenerationsGroupConflict(t *testing.T) {
	// C101, C102: an index with a pointer outside the group (from runs
	// without it) makes a run with the group fail with ErrGroupConflict,
	// naming the pointer, before it writes anything.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		group, _, byBucket, _ := groupNames(d)
		us := genUsers(50, 5)
		own := genRebuilder(t, d, byBucket, rebuild.Options{})
		if _, err := own.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("Run without a group: %v", err)
		}
		before := redistest.Snapshot(t, d.Other, strings.Trim(d.Prefix, "{}"))
		grouped := genRebuilder(t, d, byBucket, rebuild.Options{Group: group})
		_, err := grouped.Run(ctx, sources.Slice(us))
		if !errors.Is(err, rebuild.ErrGroupConflict) || !strings.Contains(err.Error(), keys.PointerKey(byBucket, d.Cluster)) {
			t.Fatalf("Run with a group: got %v, want ErrGroupConflict naming %s", err, keys.PointerKey(byBucket, d.Cluster))
		}
		redistest.WantUnchanged(t, d.Other, strings.Trim(d.Prefix, "{}"), before)
		if left := redistest.Keys(t, d.Other, "{"+group+"}"); len(left) > 0 {
			t.Errorf("the refused run left %v", left)
		}
	})
}

func TestGenerationsGroupDropPlain(t *testing.T) {
	// C100: an index moved from rename-in-place into a group. Its plain
	// key stays beside the group's pointer: DropPlain deletes it on the
	// standalone server; on the cluster, where it is outside the group's
	// slot, it refuses, naming both slots, and deletes nothing.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		group, _, _, emails := groupNames(d)
		hash := func(opts rebuild.Options) *rebuild.Rebuilder[user] {
			return redistest.Rebuilder(t, d.Client, opts,
				builders.Hash(emails, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
		}
		us := users(20)
		if _, err := hash(rebuild.Options{}).Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("Run in place: %v", err)
		}
		r := hash(rebuild.Options{Publish: rebuild.Generations, Group: group, Grace: time.Millisecond})
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("Run in the group: %v", err)
		}
		_, err := r.DropPlain(ctx)
		if d.Cluster {
			if err == nil || !strings.Contains(err.Error(), "cannot be deleted in one step") {
				t.Errorf("DropPlain: got %v, want a refusal naming the slots", err)
			}
			if !redistest.Exists(t, d.Other, emails) {
				t.Error("DropPlain deleted the plain key on the cluster")
			}
			return
		}
		if err != nil {
			t.Fatalf("DropPlain: %v", err)
		}
		redistest.WantAbsent(t, d.Other, emails)
		redistest.WantString(t, d.Other, keys.PointerKey(emails, keys.Names{Group: group}), "1")
	})
}

func TestGenerationsGroupTagged(t *testing.T) {
	// C100, C96, C97, C98, C99: a family with a hash tag of its own in a
	// group. Its buckets stay in the tag's slot, apart from its lock and
	// pointer in the group's: changes applied while the run builds go
	// across slots, and the generation the run flips to has them all. A
	// change applied just before the first flip is a tail: on a standalone
	// server the flip replays it (one attempt); on the cluster the run
	// spreads, so its flip refuses the tail (BEHIND) and the run cuts over
	// and flips again (a flip replaying it would write keys outside its
	// slot). On the cluster the family has no manifest (its keys and its
	// registry are in different slots): the run and Apply create none,
	// and the removal of a retired generation, with a key Apply wrote in
	// it, finds its keys by SCAN.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		group := strings.Trim(d.Prefix, "{}") + "g"
		prefix := "{" + strings.Trim(d.Prefix, "{}") + "}users:by-bucket"
		names := keys.Names{Cluster: d.Cluster, Group: group}
		const buckets = 10
		us := genUsers(300, buckets)
		changes, after := genChanges(us, buckets)
		extra := genUsers(len(us)+22, buckets)[len(us)+20:]
		tail, late := extra[0], extra[1]
		opts := rebuild.Options{Publish: rebuild.Generations, Group: group, BatchSize: 50, Grace: 50 * time.Millisecond}
		applier := redistest.Rebuilder(t, d.Other, opts, genSetIndex(prefix))
		flip := redistest.ScriptNamed("flip")
		var mu sync.Mutex
		var codes []int64
		var armed atomic.Bool // the second run's first flip applies tail
		runner := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, hctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if !flip.Is(cmd.Commands()) {
					return c.Do(hctx, cmd)
				}
				if armed.CompareAndSwap(true, false) {
					if err := applier.Apply(ctx, index.Change[user]{New: &tail}); err != nil {
						t.Errorf("Apply before the flip: %v", err)
					}
				}
				res := c.Do(hctx, cmd)
				if code, ok := publishCode(res); ok {
					mu.Lock()
					codes = append(codes, code)
					mu.Unlock()
				}
				return res
			},
		})
		r := redistest.Rebuilder(t, runner, opts, genSetIndex(prefix))
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("first Run: %v", err)
		}
		mu.Lock()
		codes = nil
		mu.Unlock()
		a := &applying{r: applier, changes: changes}
		armed.Store(true)
		stats, err := r.Run(ctx, pausedSource(us, 50, 250, func() { a.start(ctx) }, a.wg.Wait))
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if a.err != nil {
			t.Fatalf("Apply during the run: %v", a.err)
		}
		after = append(after, tail)
		redistest.WantString(t, d.Other, keys.PointerKey(prefix, names), "2")
		wantBuckets(t, d, prefix, 2, after)
		wantNoGeneration(t, d, prefix, 1)
		if stats.Changes != int64(len(changes)+1) {
			t.Errorf("Stats.Changes = %d, want %d", stats.Changes, len(changes)+1)
		}
		mu.Lock()
		got := slices.Clone(codes)
		mu.Unlock()
		behind := protocol.Code("BEHIND")
		if d.Cluster {
			if keys.Slot(keys.GenBucketKey(prefix, 2, "b00")) == keys.Slot(keys.PointerKey(prefix, names)) {
				t.Fatal("the test needs the buckets outside the group's slot")
			}
			if len(got) != 2 || got[0] != behind || got[1] == behind {
				t.Errorf("flip replies: got codes %v, want [%d, published]: the tail refused, then a flip after the cut-over", got, behind)
			}
		} else if len(got) != 1 || got[0] == behind {
			t.Errorf("flip replies: got codes %v, want one that published, replaying the tail", got)
		}
		// A change after the flip lands in generation 2, then a third run
		// retires it and removes it.
		if err := applier.Apply(ctx, index.Change[user]{New: &late}); err != nil {
			t.Fatalf("Apply after the flip: %v", err)
		}
		manifests := func(g int64) []string {
			var out []string
			for _, m := range []string{keys.ManifestKey(prefix, names, g), keys.ManifestListKey(prefix, names, g),
				keys.ManifestKey(prefix, d.Cluster, g), keys.ManifestListKey(prefix, d.Cluster, g)} {
				out = append(out, redistest.Keys(t, d.Other, m)...)
			}
			return out
		}
		if m := manifests(2); d.Cluster && len(m) > 0 {
			t.Errorf("generation 2 of a grouped family on the cluster has a manifest: %v", m)
		} else if !d.Cluster && !slices.Contains(m, keys.ManifestListKey(prefix, names, 2)) {
			t.Errorf("generation 2 on a standalone server: manifest keys %v, want its list %s", m, keys.ManifestListKey(prefix, names, 2))
		}
		wantBuckets(t, d, prefix, 2, append(slices.Clone(after), late))
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("third Run: %v", err)
		}
		redistest.WantString(t, d.Other, keys.PointerKey(prefix, names), "3")
		wantBuckets(t, d, prefix, 3, us)
		wantNoGeneration(t, d, prefix, 2)
		if m := manifests(2); len(m) > 0 {
			t.Errorf("generation 2 removed, its manifest left: %v", m)
		}
		if m := manifests(3); d.Cluster && len(m) > 0 {
			t.Errorf("generation 3 of a grouped family on the cluster has a manifest: %v", m)
		}
	})
}

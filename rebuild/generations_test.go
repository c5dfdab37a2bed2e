package rebuild_test

// Generations mode (C82-C88): runs that publish by a flip of a pointer,
// against a standalone server and a 3-master cluster, where a family's keys
// spread over the masters; the old generation removed after the grace
// period; rollback by a flip; and every failure made to happen, after which
// the pointer, the registry and every data key are as before and nothing of
// the failed run is left.

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/guards"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// genPrefix is the family prefix of a Generations test: without a hash tag
// on the cluster, so that its buckets spread over every slot.
func genPrefix(d deployment) string {
	return strings.Trim(d.Prefix, "{}") + "users:by-bucket"
}

// genUsers returns n users in buckets b00..b<buckets-1>.
func genUsers(n, buckets int) []user {
	us := users(n)
	for i := range us {
		us[i].Country = fmt.Sprintf("b%02d", i%buckets)
	}
	return us
}

// genRebuilder returns a Rebuilder in Generations mode of a SetIndex of
// users by bucket under prefix.
func genRebuilder(t *testing.T, d deployment, prefix string, opts rebuild.Options) *rebuild.Rebuilder[user] {
	t.Helper()
	opts.Publish = rebuild.Generations
	if opts.BatchSize == 0 {
		opts.BatchSize = 50
	}
	if opts.Grace == 0 {
		opts.Grace = 50 * time.Millisecond
	}
	return redistest.Rebuilder(t, d.Client, opts,
		builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
}

// wantGeneration checks that prefix's pointer names gen, that its registry
// holds exactly reg (and next), and that generation gen holds exactly the
// buckets of us, without a TTL.
func wantGeneration(t *testing.T, d deployment, prefix string, gen, next int64, reg map[string]string, us []user) {
	t.Helper()
	c := d.Other
	redistest.WantString(t, c, keys.PointerKey(prefix, d.Cluster), strconv.FormatInt(gen, 10))
	want := maps.Clone(reg)
	want[keys.RegNext] = strconv.FormatInt(next, 10)
	redistest.WantHash(t, c, keys.RegistryKey(prefix, d.Cluster), want)
	wantBuckets(t, d, prefix, gen, us)
}

// wantBuckets checks that generation gen of prefix holds exactly the
// buckets of us, without a TTL, whatever the pointer names.
func wantBuckets(t *testing.T, d deployment, prefix string, gen int64, us []user) {
	t.Helper()
	c := d.Other
	buckets := map[string]map[string]bool{}
	for _, u := range us {
		k := keys.GenBucketKey(prefix, gen, u.Country)
		if buckets[k] == nil {
			buckets[k] = map[string]bool{}
		}
		buckets[k][u.ID] = true
	}
	got := redistest.Keys(t, c, keys.GenPrefix(prefix, gen))
	if !slices.Equal(got, slices.Sorted(maps.Keys(buckets))) {
		t.Errorf("generation %d holds %v, want %v", gen, got, slices.Sorted(maps.Keys(buckets)))
	}
	for k, members := range sortedSets(buckets) {
		if have := redistest.SMembers(t, c, k); !slices.Equal(have, members) {
			t.Errorf("%s holds %d members, want %d", k, len(have), len(members))
		}
		if ttl := redistest.PTTL(t, c, k); ttl != -1 {
			t.Errorf("%s has a TTL of %v, want none", k, ttl)
		}
	}
}

// wantNoGeneration checks that no key of generation gen of prefix is left.
func wantNoGeneration(t *testing.T, d deployment, prefix string, gen int64) {
	t.Helper()
	if left := redistest.Keys(t, d.Other, keys.GenPrefix(prefix, gen)); len(left) > 0 {
		t.Errorf("generation %d left %d keys: %v", gen, len(left), left[:min(len(left), 5)])
	}
	for _, m := range []string{keys.ManifestKey(prefix, d.Cluster, gen), keys.ManifestListKey(prefix, d.Cluster, gen)} {
		if left := redistest.Keys(t, d.Other, m); len(left) > 0 {
			t.Errorf("generation %d left its manifest %v", gen, left)
		}
	}
}

// wantGenClean checks that, under prefix, nothing is left but the pointer,
// the registry, the meta and the data keys and manifests of the
// generations in gens:
// no lock, record, log, receipt, temp key, other generation; and no per-slot
// counter anywhere.
func wantGenClean(t *testing.T, d deployment, prefix string, gens ...int64) {
	t.Helper()
	allowed := func(k string) bool {
		switch k {
		case keys.PointerKey(prefix, d.Cluster), keys.RegistryKey(prefix, d.Cluster), keys.MetaKey(prefix, d.Cluster):
			return true
		}
		if slices.Contains(redistest.OwnerStamps(d.Cluster, prefix), k) {
			return true // the base's owner stamp (C104)
		}
		for _, g := range gens {
			if strings.HasPrefix(k, keys.GenPrefix(prefix, g)) || k == keys.ManifestKey(prefix, d.Cluster, g) || k == keys.ManifestListKey(prefix, d.Cluster, g) {
				return true
			}
		}
		return false
	}
	var base string
	for _, k := range redistest.Keys(t, d.Other, strings.Trim(d.Prefix, "{}")) {
		if !allowed(k) {
			t.Errorf("left behind: %s", k)
		}
	}
	base = keys.Base(prefix, d.Cluster)
	for _, k := range redistest.Keys(t, d.Other, keys.LockKey(prefix, d.Cluster)) {
		t.Errorf("left behind: %s", k)
	}
	if d.Cluster {
		if left := counters(t, d.Other, base); len(left) > 0 {
			t.Errorf("per-slot counters left behind: %v", left)
		}
	}
}

// counters returns the per-slot counters of runs of base, on every master.
func counters(t *testing.T, c rueidis.Client, base string) []string {
	t.Helper()
	var out []string
	ctx := context.Background()
	for _, node := range c.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match("{rb*}"+keys.GlobEscape(base)+":rebuild-n:*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				// A replica or an unreachable node: the masters answer.
				break
			}
			out = append(out, e.Elements...)
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func TestGenerationsRunFlips(t *testing.T) {
	// C82, C83, C86: a run writes its generation's keys without a TTL and
	// publishes by a flip of the pointer; a second run flips again, and the
	// first generation is removed after the grace period; on a cluster the
	// family's keys spread over more than one master.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		prefix := genPrefix(d)
		r := genRebuilder(t, d, prefix, rebuild.Options{})
		first := genUsers(300, 30)
		stats, err := r.Run(ctx, sources.Slice(first))
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if stats.Generations[prefix] != 1 {
			t.Errorf("Stats.Generations = %v, want %s: 1", stats.Generations, prefix)
		}
		wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, first)
		wantGenClean(t, d, prefix, 1)
		if live := redistest.Keys(t, d.Other, prefix+":b"); len(live) > 0 {
			t.Errorf("plain-shape keys written: %v", live)
		}
		if d.Cluster {
			masters := map[string]bool{}
			for _, k := range redistest.Keys(t, d.Other, keys.GenPrefix(prefix, 1)) {
				masters[env.Cluster.NodeFor(t, k).Addr] = true
			}
			if len(masters) < 2 {
				t.Errorf("the family's 30 buckets are on %d master(s), want them spread", len(masters))
			}
		}

		second := genUsers(200, 20)
		stats, err = r.Run(ctx, sources.Slice(second))
		if err != nil {
			t.Fatalf("second Run: %v", err)
		}
		if stats.Generations[prefix] != 2 {
			t.Errorf("Stats.Generations = %v, want %s: 2", stats.Generations, prefix)
		}
		// Run returns after the grace period and the removal.
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, second)
		wantNoGeneration(t, d, prefix, 1)
		wantGenClean(t, d, prefix, 2)
	})
}

func TestGenerationsGraceCancelled(t *testing.T) {
	// C86: a run whose ctx is cancelled during the grace period still
	// succeeds, and leaves the old generation retired, for a sweep.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		prefix := genPrefix(d)
		r := genRebuilder(t, d, prefix, rebuild.Options{Grace: time.Hour})
		us := genUsers(60, 6)
		if _, err := r.Run(redistest.Ctx(t), sources.Slice(us)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		ctx, cancel := context.WithCancel(redistest.Ctx(t))
		defer cancel()
		// Cancel once the pointer names the second generation: the flip
		// happened, and the run waits out its grace period of an hour.
		ptr := keys.PointerKey(prefix, d.Cluster)
		go func() {
			defer cancel()
			for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if v, err := d.Other.Do(ctx, d.Other.B().Get().Key(ptr).Build()).ToString(); err == nil && v == "2" {
					return
				}
			}
		}()
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("second Run: %v", err)
		}
		reg := redistest.HGetAll(t, d.Other, keys.RegistryKey(prefix, d.Cluster))
		if reg["2"] != keys.RegCurrent || !strings.HasPrefix(reg["1"], keys.RegRetired) {
			t.Errorf("registry %v: want 2 current, 1 retired", reg)
		}
		if n := len(redistest.Keys(t, d.Other, keys.GenPrefix(prefix, 1))); n != 6 {
			t.Errorf("retired generation holds %d keys, want its 6 until a sweep", n)
		}
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent, "1": reg["1"]}, us)
	})
}

func TestGenerationsRollback(t *testing.T) {
	// C84: with KeepPrevious the old generation stays previous; Rollback
	// flips back, and again forward; with none it is refused.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		prefix := genPrefix(d)
		r := genRebuilder(t, d, prefix, rebuild.Options{KeepPrevious: time.Second})
		_, err := r.Rollback(ctx)
		redistest.WantErr(t, err, rebuild.ErrNothingToRollBack)
		a, b, c := genUsers(30, 3), genUsers(40, 4), genUsers(50, 5)
		for _, us := range [][]user{a, b} {
			if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
				t.Fatalf("Run: %v", err)
			}
		}
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"1": keys.RegPrevious, "2": keys.RegCurrent}, b)
		gens, err := r.Rollback(ctx)
		if err != nil || gens[prefix] != 1 {
			t.Fatalf("Rollback = %v, %v; want %s: 1", gens, err, prefix)
		}
		wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent, "2": keys.RegPrevious}, a)
		if gens, err = r.Rollback(ctx); err != nil || gens[prefix] != 2 {
			t.Fatalf("second Rollback = %v, %v; want %s: 2", gens, err, prefix)
		}
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"1": keys.RegPrevious, "2": keys.RegCurrent}, b)
		if _, err := r.Run(ctx, sources.Slice(c)); err != nil {
			t.Fatalf("third Run: %v", err)
		}
		wantGeneration(t, d, prefix, 3, 3, map[string]string{"2": keys.RegPrevious, "3": keys.RegCurrent}, c)
		wantNoGeneration(t, d, prefix, 1)
		wantGenClean(t, d, prefix, 2, 3)

		// While a run holds the locks a rollback is refused.
		h, _, err := r.Build(ctx, sources.Slice(a))
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		_, err = r.Rollback(ctx)
		redistest.WantErr(t, err, rebuild.ErrInProgress)
		if err := h.Discard(ctx); err != nil {
			t.Fatalf("Discard: %v", err)
		}
		wantGeneration(t, d, prefix, 3, 4, map[string]string{"2": keys.RegPrevious, "3": keys.RegCurrent}, c)
		wantNoGeneration(t, d, prefix, 4)

		// Without KeepPrevious the previous generation retires.
		plain := genRebuilder(t, d, prefix, rebuild.Options{})
		if _, err := plain.Run(ctx, sources.Slice(a)); err != nil {
			t.Fatalf("fourth Run: %v", err)
		}
		wantGeneration(t, d, prefix, 5, 5, map[string]string{"5": keys.RegCurrent}, a)
		_, err = plain.Rollback(ctx)
		redistest.WantErr(t, err, rebuild.ErrNothingToRollBack)
		wantGeneration(t, d, prefix, 5, 5, map[string]string{"5": keys.RegCurrent}, a)
		wantGenClean(t, d, prefix, 5)
	})
}

// errGenSource is the error of a failing source.
var errGenSource = errors.New("the source failed")

// genSource yields us, calling at after the item at index i (once).
func genSource(us []user, i int, at func() error) sources.Source[user] {
	return func(ctx context.Context) iter.Seq2[user, error] {
		return func(yield func(user, error) bool) {
			for j, u := range us {
				if !yield(u, nil) {
					return
				}
				if j == i {
					if err := at(); err != nil {
						yield(user{}, err)
						return
					}
				}
			}
		}
	}
}

func TestGenerationsFailures(t *testing.T) {
	// C85: every failure leaves the pointer and the current generation as
	// they were, removes the failed run's generation and its registry
	// field, and leaves no lock, record or counter.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		prefix := genPrefix(d)
		first := genUsers(90, 9)
		next := int64(1)
		r := genRebuilder(t, d, prefix, rebuild.Options{})
		if _, err := r.Run(redistest.Ctx(t), sources.Slice(first)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		lock := keys.LockKey(prefix, d.Cluster)
		cases := []struct {
			name string
			want error
			run  func(t *testing.T, ctx context.Context) error
		}{
			{"source error", errGenSource, func(t *testing.T, ctx context.Context) error {
				_, err := r.Run(ctx, genSource(genUsers(200, 20), 120, func() error { return errGenSource }))
				return err
			}},
			{"cancelled", context.Canceled, func(t *testing.T, ctx context.Context) error {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				_, err := r.Run(ctx, genSource(genUsers(200, 20), 120, func() error { cancel(); return nil }))
				return err
			}},
			{"lock stolen", rebuild.ErrLockLost, func(t *testing.T, ctx context.Context) error {
				defer redistest.Clean(t, d.Other, lock)
				_, err := r.Run(ctx, genSource(genUsers(200, 20), 199, func() error {
					redistest.Cmd(t, d.Other, "SET", lock, "thief")
					return nil
				}))
				return err
			}},
			{"operator cancel", rebuild.ErrAborted, func(t *testing.T, ctx context.Context) error {
				_, err := r.Run(ctx, genSource(genUsers(200, 20), 199, func() error {
					tok, _ := redistest.Get(t, d.Other, lock)
					redistest.Cmd(t, d.Other, "HSET", keys.CtlKey(lock), "token", tok, "cancel", "1")
					return nil
				}))
				return err
			}},
			{"writes lost", rebuild.ErrWritesLost, func(t *testing.T, ctx context.Context) error {
				h, _, err := r.Build(ctx, sources.Slice(genUsers(200, 20)))
				if err != nil {
					t.Fatalf("Build: %v", err)
				}
				if d.Cluster {
					cs := counters(t, d.Other, keys.Base(prefix, true))
					if len(cs) < 2 {
						t.Fatalf("per-slot counters %v: want several", cs)
					}
					redistest.Cmd(t, d.Other, "DEL", cs[len(cs)/2])
				} else {
					redistest.Cmd(t, d.Other, "HSET", keys.RecordKey(lock), "batches", "0")
				}
				_, err = h.Publish(ctx)
				return err
			}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before := redistest.Snapshot(t, d.Other, keys.GenPrefix(prefix, 1))
				err := tc.run(t, redistest.Ctx(t))
				redistest.WantErr(t, err, tc.want)
				next++
				wantGeneration(t, d, prefix, 1, next, map[string]string{"1": keys.RegCurrent}, first)
				redistest.WantUnchanged(t, d.Other, keys.GenPrefix(prefix, 1), before)
				wantNoGeneration(t, d, prefix, next)
				wantGenClean(t, d, prefix, 1)
			})
		}
	})
}

func TestGenerationsOptions(t *testing.T) {
	// C82: New refuses a Publish mode it does not know, naming it.
	c := env.Standalone.Client(t)
	p := redistest.Prefix(t)
	set := builders.Set(p+"ids", func(u user) (string, bool) { return u.ID, true })
	_, err := rebuild.New(c, rebuild.Options{Publish: 7}, index.Builder[user](set))
	if err == nil || !strings.Contains(err.Error(), "Publish PublishMode(7)") {
		t.Errorf("New with Publish 7: %v", err)
	}
}

func TestGenerationsApply(t *testing.T) {
	// C88, C95: Apply writes the current generation, or the plain shape of
	// an index without a pointer; during a run it also logs the change,
	// which the run replays onto its generation; on a cluster a family
	// without a hash tag takes it too (C96).
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		prefix := d.Prefix + "users:by-bucket" // with the hash tag on the cluster
		r := genRebuilder(t, d, prefix, rebuild.Options{})
		us := genUsers(30, 3)
		moved := us[0]
		moved.Country = "b01"
		change := index.Change[user]{Old: &us[0], New: &moved}

		// No pointer yet: the plain shape.
		if err := r.Apply(ctx, index.Change[user]{New: &us[0]}); err != nil {
			t.Fatalf("Apply without a pointer: %v", err)
		}
		if got := redistest.SMembers(t, d.Other, prefix+":b00"); !slices.Equal(got, []string{us[0].ID}) {
			t.Errorf("plain bucket holds %v", got)
		}
		redistest.Clean(t, d.Other, prefix+":b00")

		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if err := r.Apply(ctx, change); err != nil {
			t.Fatalf("Apply: %v", err)
		}
		after := slices.Clone(us)
		after[0] = moved
		wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, after)
		if left := redistest.Keys(t, d.Other, prefix+":b"); len(left) > 0 {
			t.Errorf("plain keys written: %v", left)
		}

		// During a run: applied to the current generation, and logged
		// for the run, which replays it onto its own before its flip.
		h, _, err := r.Build(ctx, sources.Slice(after))
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		back := index.Change[user]{Old: &moved, New: &us[0]}
		if err := r.Apply(ctx, back); err != nil {
			t.Fatalf("Apply during a run: %v", err)
		}
		wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent, "2": keys.RegBuilding + heldToken(t, d, prefix)}, us)
		if _, err := h.Publish(ctx); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, us)
		wantNoGeneration(t, d, prefix, 1)
		wantGenClean(t, d, prefix, 2)

		if d.Cluster {
			spread := genPrefix(d)
			s := genRebuilder(t, d, spread, rebuild.Options{})
			if _, err := s.Run(ctx, sources.Slice(us)); err != nil {
				t.Fatalf("Run: %v", err)
			}
			// C96: a family without a hash tag takes the change too, in
			// steps across its buckets' slots.
			if err := s.Apply(ctx, change); err != nil {
				t.Fatalf("Apply to a family without a hash tag: %v", err)
			}
			wantGeneration(t, d, spread, 1, 1, map[string]string{"1": keys.RegCurrent}, after)
			wantGenClean(t, d, spread, 1)
		}
	})
}

func TestGenerationsHeld(t *testing.T) {
	// C87: a held run in Generations mode reviews and diffs its generation
	// against the current one, and its publish is a flip.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		prefix := genPrefix(d)
		r := genRebuilder(t, d, prefix, rebuild.Options{})
		first, second := genUsers(300, 30), genUsers(200, 20)
		if _, err := r.Run(ctx, sources.Slice(first)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		h, _, err := r.Build(ctx, sources.Slice(second))
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		b := h.Review().Builders[0]
		if b.Live != 300 || b.LiveKeys != 30 || b.New != 200 || b.NewKeys != 20 {
			t.Errorf("review: live %d entries in %d keys, new %d in %d; want 300 in 30, 200 in 20", b.Live, b.LiveKeys, b.New, b.NewKeys)
		}
		df, err := h.Diff(ctx, guards.DiffOptions{MaxKeys: 100})
		if err != nil {
			t.Fatalf("Diff: %v", err)
		}
		if bd := df.Builders[0]; bd.BucketsRemoved != 10 || bd.BucketsAdded != 0 || bd.Buckets != 30 {
			t.Errorf("diff: %d buckets, %d added, %d removed; want 30, 0, 10", bd.Buckets, bd.BucketsAdded, bd.BucketsRemoved)
		}
		wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent, "2": keys.RegBuilding + heldToken(t, d, prefix)}, first)
		stats, err := h.Publish(ctx)
		if err != nil {
			t.Fatalf("Publish: %v", err)
		}
		if stats.Generations[prefix] != 2 {
			t.Errorf("Stats.Generations = %v, want %s: 2", stats.Generations, prefix)
		}
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, second)
		wantNoGeneration(t, d, prefix, 1)
		wantGenClean(t, d, prefix, 2)
	})
}

// heldToken returns the token of the lock of prefix.
func heldToken(t *testing.T, d deployment, prefix string) string {
	t.Helper()
	tok, ok := redistest.Get(t, d.Other, keys.LockKey(prefix, d.Cluster))
	if !ok {
		t.Fatalf("no lock held on %s", prefix)
	}
	return tok
}

func TestGenerationsPlainKeys(t *testing.T) {
	// C82, C83, C86: plain keys (a Hash, a SortedSet) next to a family:
	// each index has its pointer and registry, all flip in one step, and
	// a plain key's old generation goes after the grace period; with a
	// negative Grace it stays, retired.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		email, score, bucket := d.Prefix+"users:by-email", d.Prefix+"users:by-score", d.Prefix+"users:by-bucket"
		bs := func() []index.Builder[user] {
			return []index.Builder[user]{
				builders.Hash(email, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
				builders.SortedSet(score, func(u user) (string, float64, bool) { return u.ID, u.Score, true }),
				builders.SetIndex(bucket, func(u user) (string, string, bool) { return u.Country, u.ID, true }),
			}
		}
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{Publish: rebuild.Generations, Grace: time.Millisecond}, bs()...)
		check := func(gen int64, us []user) {
			t.Helper()
			wantEmailScore(t, d, email, score, gen, us)
			for _, k := range []string{keys.GenKey(email, gen), keys.GenKey(score, gen)} {
				if ttl := redistest.PTTL(t, d.Other, k); ttl != -1 {
					t.Errorf("%s has a TTL of %v, want none", k, ttl)
				}
			}
			for _, l := range []string{email, score} {
				redistest.WantString(t, d.Other, keys.PointerKey(l, d.Cluster), strconv.FormatInt(gen, 10))
				redistest.WantAbsent(t, d.Other, l)
			}
			wantGeneration(t, d, bucket, gen, gen, map[string]string{strconv.FormatInt(gen, 10): keys.RegCurrent}, us)
		}
		first, second := genUsers(40, 4), genUsers(25, 5)
		stats, err := r.Run(ctx, sources.Slice(first))
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if want := map[string]int64{email: 1, score: 1, bucket: 1}; !maps.Equal(stats.Generations, want) {
			t.Errorf("Stats.Generations = %v, want %v", stats.Generations, want)
		}
		check(1, first)
		if _, err := r.Run(ctx, sources.Slice(second)); err != nil {
			t.Fatalf("second Run: %v", err)
		}
		check(2, second)
		for _, k := range []string{keys.GenKey(email, 1), keys.GenKey(score, 1)} {
			redistest.WantAbsent(t, d.Other, k)
		}
		wantNoGeneration(t, d, bucket, 1)

		// A negative Grace leaves the retired generation to a sweep.
		keep := redistest.Rebuilder(t, d.Client, rebuild.Options{Publish: rebuild.Generations, Grace: -1}, bs()...)
		if _, err := keep.Run(ctx, sources.Slice(first)); err != nil {
			t.Fatalf("third Run: %v", err)
		}
		reg := redistest.HGetAll(t, d.Other, keys.RegistryKey(email, d.Cluster))
		if reg["3"] != keys.RegCurrent || !strings.HasPrefix(reg["2"], keys.RegRetired) {
			t.Errorf("registry %v: want 3 current, 2 retired", reg)
		}
		if !redistest.Exists(t, d.Other, keys.GenKey(email, 2)) {
			t.Errorf("%s removed, want it left to a sweep", keys.GenKey(email, 2))
		}
		if n := len(redistest.Keys(t, d.Other, keys.GenPrefix(bucket, 2))); n != 5 {
			t.Errorf("retired generation 2 of %s holds %d keys, want its 5 until a sweep", bucket, n)
		}
	})
}

func TestGenerationsFlipAllOrNothing(t *testing.T) {
	// C83, C85: a flip that fails on its second index (a pointer of
	// another type, written during the run) flips none: the first index's
	// pointer is untouched, and the run's generation is removed.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		email, bucket := d.Prefix+"users:by-email", d.Prefix+"users:by-bucket"
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{Publish: rebuild.Generations, Grace: time.Millisecond},
			builders.Hash(email, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
			builders.SetIndex(bucket, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
		us := genUsers(30, 3)
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		ptr := keys.PointerKey(bucket, d.Cluster)
		_, err := r.Run(ctx, genSource(genUsers(20, 2), 19, func() error {
			redistest.Cmd(t, d.Other, "DEL", ptr)
			redistest.Cmd(t, d.Other, "HSET", ptr, "not", "a pointer")
			return nil
		}))
		if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("Run with a pointer of another type: %v, want WRONGTYPE", err)
		}
		redistest.WantString(t, d.Other, keys.PointerKey(email, d.Cluster), "1")
		redistest.WantHash(t, d.Other, keys.RegistryKey(email, d.Cluster), map[string]string{keys.RegNext: "2", "1": keys.RegCurrent})
		redistest.WantAbsent(t, d.Other, keys.GenKey(email, 2))
		wantNoGeneration(t, d, bucket, 2)
		redistest.Cmd(t, d.Other, "DEL", ptr)
		redistest.Cmd(t, d.Other, "SET", ptr, "1")
		wantGeneration(t, d, bucket, 1, 2, map[string]string{"1": keys.RegCurrent}, us)
		// The first lock's record, log, receipt and requests are named
		// after it.
		if left := redistest.Keys(t, d.Other, keys.LockKey(email, d.Cluster)); len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
		if d.Cluster {
			if left := counters(t, d.Other, keys.Base(email, true)); len(left) > 0 {
				t.Errorf("per-slot counters left behind: %v", left)
			}
		}
	})
}

func TestGenerationsAllocRefusesBadRegistry(t *testing.T) {
	// C82: a registry or pointer in a state no run leaves fails the run at
	// its allocation, before it writes anything: above all a registry
	// lost while its pointer stayed, where `next` would start again at 1
	// and hand the run the generation readers read.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		prefix := genPrefix(d) + ":alloc"
		us := genUsers(30, 3)
		if _, err := genRebuilder(t, d, prefix, rebuild.Options{}).Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		reg, ptr := keys.RegistryKey(prefix, d.Cluster), keys.PointerKey(prefix, d.Cluster)
		for _, tc := range []struct {
			name  string
			setup []string // a command that leaves the registry or pointer so
			why   string
		}{
			{"registry deleted", []string{"DEL", reg}, "does not mark the pointer's generation 1 current"},
			{"pointer not a generation", []string{"SET", ptr, "01"}, `the pointer holds "01"`},
			{"next not a number", []string{"HSET", reg, "next", "x"}, `its field next holds "x"`},
			{"next generation left over", []string{"HSET", reg, "next", "0", "2", "retired:1"}, "generation 2, the next one, is in the registry already"},
			{"registry of another type", []string{"DEL", reg}, "the registry is a string"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				state := func() string {
					dump := func(k string) string {
						v, _ := redistest.Cmd(t, d.Other, "DUMP", k).ToString()
						return v
					}
					return fmt.Sprint(redistest.Snapshot(t, d.Other, prefix), dump(reg), dump(ptr))
				}
				redistest.Cmd(t, d.Other, tc.setup...)
				if tc.name == "registry of another type" {
					redistest.Cmd(t, d.Other, "SET", reg, "x")
				}
				before := state()
				_, err := genRebuilder(t, d, prefix, rebuild.Options{}).Run(ctx, sources.Slice(genUsers(20, 2)))
				if !errors.Is(err, rebuild.ErrTampered) || !strings.Contains(err.Error(), tc.why) {
					t.Fatalf("Run = %v, want ErrTampered saying %q", err, tc.why)
				}
				if state() != before {
					t.Errorf("the refused run changed the index's keys")
				}
				if tc.name == "pointer not a generation" {
					// Apply refuses to write where such a pointer seems to
					// point, as readers refuse to read there.
					u := genUsers(1, 1)[0]
					if err := genRebuilder(t, d, prefix, rebuild.Options{}).Apply(ctx, index.Change[user]{New: &u}); !errors.Is(err, rebuild.ErrTampered) || !strings.Contains(err.Error(), `"01", not a generation`) {
						t.Errorf("Apply = %v, want ErrTampered naming the pointer's value", err)
					}
					if state() != before {
						t.Errorf("the refused Apply changed the index's keys")
					}
				}
				// Back to what the first run left.
				redistest.Cmd(t, d.Other, "DEL", reg)
				redistest.Cmd(t, d.Other, "HSET", reg, "next", "1", "1", keys.RegCurrent)
				redistest.Cmd(t, d.Other, "SET", ptr, "1")
			})
		}
		// A rollback flips only between generations the registry marks
		// as runs leave them: never to one of two "previous".
		redistest.Cmd(t, d.Other, "HSET", reg, "5", keys.RegPrevious, "6", keys.RegPrevious)
		if _, err := genRebuilder(t, d, prefix, rebuild.Options{}).Rollback(ctx); !errors.Is(err, rebuild.ErrTampered) || !strings.Contains(err.Error(), "2 previous generations") {
			t.Errorf("Rollback = %v, want ErrTampered naming the 2 previous generations", err)
		}
		redistest.WantString(t, d.Other, ptr, "1")
		redistest.Cmd(t, d.Other, "HDEL", reg, "5", "6")
		wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
	})
}

func TestGenerationsManifest(t *testing.T) {
	// C99: a family whose keys share the registry's slot has a manifest per
	// generation: the run lists the keys it writes (the list) and marks it
	// listed (the set), Apply adds the keys it writes to the set. The
	// removal of the retired generation reads it: the bucket only Apply
	// created and the buckets the new data no longer has go with the rest,
	// and the manifest with the registry field. A family spread over a
	// cluster has none, and is scanned.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		for _, prefix := range []string{d.Prefix + "users:by-bucket", strings.Trim(d.Prefix, "{}") + "spread:by-bucket"} {
			d.Clear(t)
			_, tagged := keys.HashTag(prefix)
			listed := !d.Cluster || tagged
			r := genRebuilder(t, d, prefix, rebuild.Options{})
			us := genUsers(30, 3)
			if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
				t.Fatalf("Run: %v", err)
			}
			moved := us[0]
			moved.Country = "b07"
			if err := r.Apply(ctx, index.Change[user]{Old: &us[0], New: &moved}); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			set, list := keys.ManifestKey(prefix, d.Cluster, 1), keys.ManifestListKey(prefix, d.Cluster, 1)
			if listed {
				// The move removed the user from b00 and added it to b07.
				want := []string{keys.GenBucketKey(prefix, 1, "b00"), keys.GenBucketKey(prefix, 1, "b07"), keys.ManifestListed}
				slices.Sort(want)
				if got := redistest.SMembers(t, d.Other, set); !slices.Equal(got, want) {
					t.Errorf("%s = %q, want %q", set, got, want)
				}
				got, err := redistest.Cmd(t, d.Other, "LRANGE", list, "0", "-1").AsStrSlice()
				slices.Sort(got)
				if want := []string{keys.GenBucketKey(prefix, 1, "b00"), keys.GenBucketKey(prefix, 1, "b01"), keys.GenBucketKey(prefix, 1, "b02")}; err != nil || !slices.Equal(got, want) {
					t.Errorf("%s = %q, %v; want %q", list, got, err, want)
				}
			} else {
				redistest.WantAbsent(t, d.Other, set)
				redistest.WantAbsent(t, d.Other, list)
			}
			// The new data has no b02 (nor b07).
			next := genUsers(20, 2)
			if _, err := r.Run(ctx, sources.Slice(next)); err != nil {
				t.Fatalf("Run: %v", err)
			}
			wantNoGeneration(t, d, prefix, 1)
			wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, next)
			wantGenClean(t, d, prefix, 2)
			if listed {
				// A manifest that is not a set: Apply refuses, writing
				// nothing.
				m := keys.ManifestKey(prefix, d.Cluster, 2)
				redistest.Cmd(t, d.Other, "DEL", m)
				redistest.Cmd(t, d.Other, "SET", m, "x")
				before := redistest.Snapshot(t, d.Other, keys.GenPrefix(prefix, 2))
				moved := next[0]
				moved.Country = "b07"
				redistest.WantErr(t, r.Apply(ctx, index.Change[user]{Old: &next[0], New: &moved}), rebuild.ErrTampered)
				redistest.WantUnchanged(t, d.Other, keys.GenPrefix(prefix, 2), before)
				redistest.WantString(t, d.Other, m, "x")
				redistest.Cmd(t, d.Other, "DEL", m)

				// A flip that replays a tail lists the keys it writes in
				// the set (here a bucket only the tail's change
				// creates): the run marks the manifest listed, and the
				// generation's removal deletes that bucket without SCAN.
				flip := redistest.ScriptNamed("flip")
				var once sync.Once
				hooked := rueidishook.WithHook(d.Client, redistest.Hook{OnDo: func(c rueidis.Client, hctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
					if flip.Is(cmd.Commands()) {
						once.Do(func() {
							late := user{ID: "late", Country: "b09"}
							if err := r.Apply(ctx, index.Change[user]{New: &late}); err != nil {
								t.Errorf("Apply before the flip: %v", err)
							}
						})
					}
					return c.Do(hctx, cmd)
				}})
				tailed := redistest.Rebuilder(t, hooked, rebuild.Options{Publish: rebuild.Generations, BatchSize: 50, Grace: 50 * time.Millisecond},
					builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
				stats, err := tailed.Run(ctx, sources.Slice(next))
				if err != nil {
					t.Fatalf("Run with a tail: %v", err)
				}
				if stats.Changes != 1 {
					t.Errorf("Stats.Changes = %d, want the tail's 1", stats.Changes)
				}
				want := []string{keys.GenBucketKey(prefix, 3, "b09"), keys.ManifestListed}
				slices.Sort(want)
				if got := redistest.SMembers(t, d.Other, keys.ManifestKey(prefix, d.Cluster, 3)); !slices.Equal(got, want) {
					t.Errorf("%s = %q, want %q", keys.ManifestKey(prefix, d.Cluster, 3), got, want)
				}
				if got := redistest.SMembers(t, d.Other, keys.GenBucketKey(prefix, 3, "b09")); !slices.Equal(got, []string{"late"}) {
					t.Errorf("the tail's bucket holds %q, want [late]", got)
				}
				var scans atomic.Int32
				counted := rueidishook.WithHook(d.Client, redistest.Hook{OnDo: func(c rueidis.Client, hctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
					if strings.EqualFold(cmd.Commands()[0], "SCAN") {
						scans.Add(1)
					}
					return c.Do(hctx, cmd)
				}})
				after := redistest.Rebuilder(t, counted, rebuild.Options{Publish: rebuild.Generations, BatchSize: 50, Grace: 50 * time.Millisecond},
					builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
				if _, err := after.Run(ctx, sources.Slice(next)); err != nil {
					t.Fatalf("Run after the tail: %v", err)
				}
				wantNoGeneration(t, d, prefix, 3)
				if n := scans.Load(); n != 0 {
					t.Errorf("%d SCAN calls removing generation 3, want none (its manifest lists the tail's bucket)", n)
				}
			}
		}
	})
}

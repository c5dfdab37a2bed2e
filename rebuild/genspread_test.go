package rebuild_test

// Apply in Generations mode to indexes whose keys are not all in their
// locks' slot (C96): on the cluster, a family without a hash tag, whose
// buckets spread over every slot, and plain indexes without a hash tag,
// whose generation keys leave their locks' slot. On the standalone server
// the same tests run the one-script path (genapply.lua), as a reference
// for the same outcome.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// ownPrefix returns d with a prefix of t's own, with a hash tag on the
// cluster as redistest.Deployments gives one.
func ownPrefix(t *testing.T, d deployment) deployment {
	d.Prefix = redistest.Prefix(t)
	if d.Cluster {
		d.Prefix = "{" + d.Prefix + "}"
	}
	return d
}

// beforeWrite returns a client of d that calls f once, before the first
// command that writes a change's data: genwrite.lua across slots on the
// cluster (after genlog.lua resolved the pointer and logged the change),
// genapply.lua on the standalone server (after Apply resolved the
// pointer).
func beforeWrite(d deployment, f func()) rueidis.Client {
	name := "genapply"
	if d.Cluster {
		name = "genwrite"
	}
	script := redistest.ScriptNamed(name)
	var once sync.Once
	return rueidishook.WithHook(d.Client, redistest.Hook{OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
		if script.Is(cmd.Commands()) {
			once.Do(f)
		}
		return c.Do(ctx, cmd)
	}})
}

// published publishes genUsers(30, 3) under a prefix of t's own in d
// (genPrefix: without a hash tag), and returns a ctx, d with that prefix,
// the index's prefix and the users.
func published(t *testing.T, d deployment) (context.Context, deployment, string, []user) {
	t.Helper()
	ctx := redistest.Ctx(t)
	d = ownPrefix(t, d)
	prefix := genPrefix(d)
	us := genUsers(30, 3)
	if _, err := genRebuilder(t, d, prefix, rebuild.Options{}).Run(ctx, sources.Slice(us)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return ctx, d, prefix, us
}

// clientAs returns a client of d's server (or cluster) as an ACL user of
// t's own with rules (redistest.Server.ClientAs).
func clientAs(t *testing.T, d deployment, rules ...string) rueidis.Client {
	t.Helper()
	name := "ks-" + strings.ReplaceAll(t.Name(), "/", "-")
	if d.Cluster {
		return env.Cluster.ClientAs(t, name, rules...)
	}
	return env.Standalone.ClientAs(t, name, rules...)
}

// spreadRebuilder returns a Rebuilder in Generations mode, on client c, of
// the SetIndex of genRebuilder under prefix.
func spreadRebuilder(t *testing.T, c rueidis.Client, prefix string, opts rebuild.Options) *rebuild.Rebuilder[user] {
	t.Helper()
	opts.Publish, opts.BatchSize = rebuild.Generations, 50
	return redistest.Rebuilder(t, c, opts,
		builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
}

func TestGenerationsSpreadApplyDuringRun(t *testing.T) {
	// C96, C95: on a family without a hash tag, changes applied from a
	// goroutine while a Generations run builds (inserts, moves to another
	// bucket, deletes) are logged in the locks' slot, then written to
	// the current generation slot by slot; the run replays them onto its
	// own and flips; the published generation is the source plus the
	// changes, exactly, and nothing else is left.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		prefix := genPrefix(d) // no hash tag: the buckets spread on the cluster
		const buckets = 10
		us := genUsers(300, buckets)
		changes, after := genChanges(us, buckets)
		r := genRebuilder(t, d, prefix, rebuild.Options{})
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("first Run: %v", err)
		}
		a := &applying{r: r, changes: changes}
		stats, err := r.Run(ctx, pausedSource(us, 50, 250, func() { a.start(ctx) }, a.wg.Wait))
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if a.err != nil {
			t.Fatalf("Apply during the run: %v", a.err)
		}
		if stats.Changes != int64(len(changes)) {
			t.Errorf("Stats.Changes = %d, want %d", stats.Changes, len(changes))
		}
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, after)
		wantNoGeneration(t, d, prefix, 1)
		wantGenClean(t, d, prefix, 2)

		// Outside a run: the current generation, nothing logged.
		gone := after[0]
		if err := r.Apply(ctx, index.Change[user]{Old: &gone}); err != nil {
			t.Fatalf("Apply after the run: %v", err)
		}
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, after[1:])
		wantGenClean(t, d, prefix, 2)
	})
}

// sameSlotNames returns two keys that start with base, have no hash tag
// and hash to one slot: a Rebuilder's indexes share their locks' slot,
// while their generation keys spread.
func sameSlotNames(base string) (string, string) {
	a := base + "a"
	for n := 0; ; n++ {
		b := fmt.Sprintf("%sb%d", base, n)
		if keys.Slot(b) == keys.Slot(a) {
			return a, b
		}
	}
}

func TestGenerationsSpreadApplySeveralIndexes(t *testing.T) {
	// C96, C95: a Rebuilder of two plain indexes without a hash tag whose
	// keys share a slot (so their locks do), a Hash and a SortedSet whose
	// Diffs write conditional removals (HDELIF, ZREMIF): their generation
	// keys are in other slots, each written by a script of its own; the
	// changes applied during a run are logged and replayed, and the
	// published generation holds the source plus the changes.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		email, score := sameSlotNames(genPrefix(d) + ":")
		if d.Cluster && keys.Slot(keys.GenKey(email, 1)) == keys.Slot(keys.GenKey(score, 1)) {
			t.Fatalf("%s and %s share a slot: pick other names", keys.GenKey(email, 1), keys.GenKey(score, 1))
		}
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{Publish: rebuild.Generations, Grace: time.Millisecond, BatchSize: 50},
			builders.Hash(email, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
			builders.SortedSet(score, func(u user) (string, float64, bool) { return u.ID, u.Score, true }))
		us := users(200)
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("first Run: %v", err)
		}
		changes, after := movesAndDeletes(us)
		a := &applying{r: r, changes: changes}
		stats, err := r.Run(ctx, pausedSource(us, 10, 150, func() { a.start(ctx) }, a.wg.Wait))
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if a.err != nil {
			t.Fatalf("Apply during the run: %v", a.err)
		}
		if stats.Changes != int64(2*len(changes)) {
			t.Errorf("Stats.Changes = %d, want %d", stats.Changes, 2*len(changes))
		}
		wantEmailScore(t, d, email, score, 2, slices.Collect(maps.Values(after)))
		for _, l := range []string{email, score} {
			redistest.WantString(t, d.Other, keys.PointerKey(l, d.Cluster), "2")
			redistest.WantHash(t, d.Other, keys.RegistryKey(l, d.Cluster), map[string]string{keys.RegNext: "2", "2": keys.RegCurrent})
			if left := redistest.Keys(t, d.Other, keys.GenKey(l, 1)); len(left) > 0 {
				t.Errorf("generation 1 left: %v", left)
			}
			for _, k := range redistest.Keys(t, d.Other, keys.LockKey(l, d.Cluster)) {
				t.Errorf("left behind: %s", k)
			}
		}
	})
}

func TestGenerationsSpreadApplyFlipBetweenSteps(t *testing.T) {
	// C96: a flip comes after Apply resolved the pointer to generation 1
	// and before its writes. On the cluster the writes land in generation
	// 1 all the same: kept there while it is previous, removed at once
	// once it is retired (still present, or already removed by the sweep
	// with its registry field, where nothing would ever remove them);
	// the new generation has the change, from the source of its run, or
	// replayed from the log when a run held the lock as the change was
	// logged. On the standalone server the one script sees the pointer
	// moved and writes the new generation. Either way the current
	// generation is exact and nothing is left but what the registry
	// keeps.
	const buckets = 6
	for _, tc := range []struct {
		name   string
		opts   rebuild.Options // of the run that flips
		logged bool            // the change is logged for a held run, which the flip publishes
		state  string          // of generation 1 after the flip ("" removed)
	}{
		{name: "kept as previous", opts: rebuild.Options{KeepPrevious: time.Hour}, state: keys.RegPrevious},
		{name: "retired", opts: rebuild.Options{Grace: -1}, state: "retired"},
		{name: "removed by the sweep", opts: rebuild.Options{Grace: time.Millisecond}},
		{name: "logged, then removed", opts: rebuild.Options{Grace: time.Millisecond}, logged: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachDeployment(t, func(t *testing.T, d deployment) {
				ctx := redistest.Ctx(t)
				d = ownPrefix(t, d)
				prefix := genPrefix(d)
				us := genUsers(30, buckets)
				flipper := spreadRebuilder(t, d.Client, prefix, tc.opts)
				if _, err := flipper.Run(ctx, sources.Slice(us)); err != nil {
					t.Fatalf("first Run: %v", err)
				}
				moved, added := us[0], genUsers(31, buckets)[30]
				moved.Country = "b01" // from b00
				added.Country = "b02"
				change := []index.Change[user]{{Old: &us[0], New: &moved}, {New: &added}}
				after := append(slices.Clone(us), added)
				after[0] = moved

				var h *rebuild.Held[user]
				if tc.logged {
					var err error
					if h, _, err = flipper.Build(ctx, sources.Slice(us)); err != nil {
						t.Fatalf("Build: %v", err)
					}
				}
				var flipErr error
				flipped := false
				c := beforeWrite(d, func() {
					flipped = true
					if h != nil {
						_, flipErr = h.Publish(ctx)
						return
					}
					// The application committed the change to its source
					// before it called Apply: the run reads it.
					_, flipErr = flipper.Run(ctx, sources.Slice(after))
				})
				rec := newLogRecorder()
				applier := spreadRebuilder(t, c, prefix, rebuild.Options{Logger: slog.New(rec)})
				if err := applier.Apply(ctx, change...); err != nil {
					t.Fatalf("Apply: %v", err)
				}
				if !flipped || flipErr != nil {
					t.Fatalf("the flip between the steps: ran %v, %v", flipped, flipErr)
				}
				reg := map[string]string{"2": keys.RegCurrent}
				if tc.state != "" {
					reg["1"] = tc.state
				}
				if tc.state == "retired" {
					st := redistest.HGetAll(t, d.Other, keys.RegistryKey(prefix, d.Cluster))["1"]
					if !strings.HasPrefix(st, keys.RegRetired) {
						t.Fatalf("generation 1 is %q, want retired", st)
					}
					reg["1"] = st
				}
				wantGeneration(t, d, prefix, 2, 2, reg, after)
				removed := rec.matching("a flip retired the generation a change was written to")
				switch {
				case tc.state == keys.RegPrevious && d.Cluster:
					// The writes stay in the previous generation, which a
					// rollback makes current again.
					wantBuckets(t, d, prefix, 1, after)
				case tc.state == keys.RegPrevious:
					wantBuckets(t, d, prefix, 1, us)
				case tc.state == "retired" && d.Cluster:
					// The buckets written (b00, b01, b02) are removed; the
					// others wait for the sweep.
					var rest []user
					for _, u := range us {
						if u.Country >= "b03" {
							rest = append(rest, u)
						}
					}
					wantBuckets(t, d, prefix, 1, rest)
				case tc.state == "retired":
					wantBuckets(t, d, prefix, 1, us)
				default:
					wantNoGeneration(t, d, prefix, 1)
				}
				wantRemoved := d.Cluster && tc.state != keys.RegPrevious
				if wantRemoved != (len(removed) == 1) || len(removed) > 1 {
					t.Errorf("logged %q; want the removal logged: %v", removed, wantRemoved)
				}
				if tc.state == "" {
					wantGenClean(t, d, prefix, 2)
				}
			})
		})
	}
}

func TestGenerationsSpreadApplyRollbackBetweenSteps(t *testing.T) {
	// C96: a rollback comes after Apply resolved the pointer to
	// generation 2 and before its writes, making generation 1 current
	// again: built before the change, it has it from nowhere else (no log,
	// no run reading the source). On the cluster step 3 finds the pointer
	// moved, and the steps run again on generation 1; on the standalone
	// server the one script sees the pointer moved and writes generation 1.
	// Either way the current generation holds the change, and the call
	// succeeds.
	const buckets = 6
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		d = ownPrefix(t, d)
		d.Clear(t)
		prefix := genPrefix(d)
		us := genUsers(30, buckets)
		roller := spreadRebuilder(t, d.Client, prefix, rebuild.Options{KeepPrevious: time.Hour})
		for i := range 2 {
			if _, err := roller.Run(ctx, sources.Slice(us)); err != nil {
				t.Fatalf("Run %d: %v", i+1, err)
			}
		}
		moved, added := us[0], genUsers(31, buckets)[30]
		moved.Country = "b01" // from b00
		added.Country = "b02"
		change := []index.Change[user]{{Old: &us[0], New: &moved}, {New: &added}}
		after := append(slices.Clone(us), added)
		after[0] = moved

		var rollErr error
		rolled := false
		c := beforeWrite(d, func() {
			rolled = true
			_, rollErr = roller.Rollback(ctx)
		})
		applier := spreadRebuilder(t, c, prefix, rebuild.Options{})
		if err := applier.Apply(ctx, change...); err != nil {
			t.Fatalf("Apply: %v", err)
		}
		if !rolled || rollErr != nil {
			t.Fatalf("the rollback between the steps: ran %v, %v", rolled, rollErr)
		}
		wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent, "2": keys.RegPrevious}, after)
		if d.Cluster {
			// Written before the steps ran again; a roll forward finds it.
			wantBuckets(t, d, prefix, 2, after)
		} else {
			wantBuckets(t, d, prefix, 2, us)
		}
		wantGenClean(t, d, prefix, 1, 2)
	})
}

func TestGenerationsSpreadApplyConnectionCut(t *testing.T) {
	// C96: on the cluster, the connection to the master of a bucket the
	// change writes (not the locks' master) breaks as the write goes out
	// (the write lost) or as its reply comes back (the write done, its
	// reply lost): Apply returns an error matching ErrOutcomeUnknown that
	// names the key; applying the change again leaves the generation
	// exact, and nothing else is left. (On a standalone server the change
	// is one script: TestApplyReplyLost.)
	d := deployment{Name: "cluster", Cluster: true, Client: env.Cluster.Client(t), Other: env.Cluster.Client(t)}
	for _, tt := range []struct {
		name string
		dir  faultproxy.Direction
		ran  bool
	}{
		{"reply lost", faultproxy.ToClient, true},
		{"write lost", faultproxy.ToServer, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := redistest.Ctx(t)
			d := ownPrefix(t, d)
			prefix := genPrefix(d)
			// A bucket whose master is not the locks', so that the
			// cut hits the write alone.
			lock := keys.LockKey(prefix, d.Cluster)
			bucket := "b00"
			for n := 0; env.Cluster.NodeFor(t, keys.GenBucketKey(prefix, 1, bucket)) == env.Cluster.NodeFor(t, lock); n++ {
				bucket = fmt.Sprintf("c%02d", n)
			}
			us := genUsers(20, 2)
			r := genRebuilder(t, d, prefix, rebuild.Options{})
			if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
				t.Fatalf("Run: %v", err)
			}
			proxy, c := proxied(t, d, keys.GenBucketKey(prefix, 1, bucket))
			applier := spreadRebuilder(t, c, prefix, rebuild.Options{})
			more := genUsers(22, 2)[20:]
			for i := range more {
				more[i].Country = bucket
			}
			change := index.Change[user]{New: &more[1]}
			before, err := cutApply(ctx, t, d, applier, proxy, tt.dir, prefix, more[0], change)
			after := append(slices.Clone(us), more[0])
			redistest.WantErr(t, err, rebuild.ErrOutcomeUnknown)
			if !strings.Contains(err.Error(), keys.GenBucketKey(prefix, 1, bucket)) {
				t.Errorf("Apply: %v; want the key it may not have written named", err)
			}
			t.Logf("Apply: %v", err)
			after = append(after, more[1])
			if tt.ran {
				waitFor(t, "the write to reach the server", func() bool {
					return slices.Contains(redistest.SMembers(t, d.Other, keys.GenBucketKey(prefix, 1, bucket)), more[1].ID)
				})
				wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, after)
			} else {
				redistest.WantUnchanged(t, d.Other, keys.GenPrefix(prefix, 1), before)
			}
			applyUntilDone(ctx, t, applier, change)
			wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, after)
			wantGenClean(t, d, prefix, 1)
		})
	}
}

func TestGenerationsSpreadApplyNoRight(t *testing.T) {
	// C96, C95: a Redis user without the right to write one bucket of the
	// current generation (on the cluster, in a slot of its own) has a
	// change to it refused with ErrNoPermission naming the command and
	// the key, before anything is written or logged for the run in
	// progress; a change to the buckets it may write is applied and
	// logged, and the run publishes it.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		prefix := genPrefix(d)
		us := genUsers(30, 3)
		r := genRebuilder(t, d, prefix, rebuild.Options{})
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		lock := keys.LockKey(prefix, d.Cluster)
		rules := []string{"~" + lock + "*", "~" + keys.PointerKey(prefix, d.Cluster), "~" + keys.RegistryKey(prefix, d.Cluster),
			"~" + keys.ManifestKey(prefix, d.Cluster, 1), "~" + keys.ManifestListKey(prefix, d.Cluster, 1)}
		for _, k := range redistest.OwnerStamps(d.Cluster, prefix) {
			rules = append(rules, "~"+k) // C104: Apply checks the base's stamp
		}
		for _, b := range []string{"b00", "b01"} {
			rules = append(rules, "~"+prefix+keys.GenInfix+"*:"+b)
		}
		for _, c := range redistest.ApplyCommands {
			rules = append(rules, "+"+c)
		}
		if d.Cluster {
			// The last step across slots removes its writes from a
			// generation retired meanwhile: the first checks UNLINK.
			noUnlink := env.Cluster.ClientAs(t, "ks-"+strings.ReplaceAll(t.Name(), "/", "-")+"-nounlink", rules...)
			moved := us[0]
			moved.Country = "b01"
			err := spreadRebuilder(t, noUnlink, prefix, rebuild.Options{}).Apply(ctx, index.Change[user]{Old: &us[0], New: &moved})
			redistest.WantErr(t, err, rebuild.ErrNoPermission)
			if !strings.Contains(err.Error(), "UNLINK") {
				t.Errorf("Apply without UNLINK: %v; want UNLINK named", err)
			}
			t.Logf("Apply without UNLINK: %v", err)
			wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
			rules = append(rules, "+unlink")
		}
		c := clientAs(t, d, rules...)
		applier := spreadRebuilder(t, c, prefix, rebuild.Options{})

		h, _, err := r.Build(ctx, sources.Slice(us))
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		before := redistest.Snapshot(t, d.Other, keys.GenPrefix(prefix, 1))
		denied := us[0]
		denied.Country = "b02"
		err = applier.Apply(ctx, index.Change[user]{Old: &us[0], New: &denied})
		redistest.WantErr(t, err, rebuild.ErrNoPermission)
		// On the cluster the refusal names the key (the first step checks
		// the rights of the writes in other slots); on the standalone
		// server the key is one of the script's, which Redis refuses
		// naming none.
		if d.Cluster && !strings.Contains(err.Error(), keys.GenBucketKey(prefix, 1, "b02")) {
			t.Errorf("Apply: %v; want the key named", err)
		}
		t.Logf("Apply: %v", err)
		redistest.WantUnchanged(t, d.Other, keys.GenPrefix(prefix, 1), before)
		if n, err := redistest.Cmd(t, d.Other, "LLEN", keys.LogKey(lock)).AsInt64(); err != nil || n != 0 {
			t.Errorf("LLEN %s = %d, %v; want 0", keys.LogKey(lock), n, err)
		}

		moved := us[0]
		moved.Country = "b01"
		if err := applier.Apply(ctx, index.Change[user]{Old: &us[0], New: &moved}); err != nil {
			t.Fatalf("Apply within the user's rights: %v", err)
		}
		if _, err := h.Publish(ctx); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		after := slices.Clone(us)
		after[0] = moved
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, after)
		wantNoGeneration(t, d, prefix, 1)
		wantGenClean(t, d, prefix, 2)
	})
}

func TestGenerationsSpreadApplyFailures(t *testing.T) {
	// C96: on the cluster, each step of a change across slots fails on its
	// own, and the error says what was logged, what was written and what
	// is left: the first step's reply lost (written nowhere: the data
	// unchanged, and applying it again works); a slot that refuses its
	// writes (a bucket of the generation of another type: the other
	// slots written, that one not, ErrTampered); the last step failing
	// (the writes done, their keys named); the caller's ctx ending before
	// the last step (which runs all the same).
	d := deployment{Name: "cluster", Cluster: true, Client: env.Cluster.Client(t), Other: env.Cluster.Client(t)}
	setup := func(t *testing.T) (context.Context, deployment, string, []user) { return published(t, d) }
	t.Run("first step's reply lost", func(t *testing.T) {
		ctx, d, prefix, us := setup(t)
		proxy, c := proxied(t, d, keys.LockKey(prefix, true))
		applier := spreadRebuilder(t, c, prefix, rebuild.Options{})
		added := genUsers(32, 3)[30:]
		change := index.Change[user]{New: &added[1]}
		before, err := cutApply(ctx, t, d, applier, proxy, faultproxy.ToClient, prefix, added[0], change)
		after := append(slices.Clone(us), added[0])
		redistest.WantErr(t, err, rebuild.ErrOutcomeUnknown)
		if !strings.Contains(err.Error(), "written nowhere") {
			t.Errorf("Apply: %v; want it to say that nothing was written", err)
		}
		t.Logf("Apply: %v", err)
		redistest.WantUnchanged(t, d.Other, keys.GenPrefix(prefix, 1), before)
		applyUntilDone(ctx, t, applier, change)
		wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, append(after, added[1]))
		wantGenClean(t, d, prefix, 1)
	})
	t.Run("a slot refuses", func(t *testing.T) {
		ctx, d, prefix, us := setup(t)
		from, to := keys.GenBucketKey(prefix, 1, "b00"), keys.GenBucketKey(prefix, 1, "b01")
		if keys.Slot(from) == keys.Slot(to) {
			t.Fatalf("%s and %s share a slot", from, to)
		}
		redistest.Cmd(t, d.Other, "DEL", to)
		redistest.Cmd(t, d.Other, "SET", to, "not a set")
		moved := us[0]
		moved.Country = "b01"
		err := spreadRebuilder(t, d.Client, prefix, rebuild.Options{}).Apply(ctx, index.Change[user]{Old: &us[0], New: &moved})
		redistest.WantErr(t, err, rebuild.ErrTampered)
		if errors.Is(err, rebuild.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "written to "+strconv.Quote(from)) ||
			!strings.Contains(err.Error(), "not written to "+strconv.Quote(to)) {
			t.Errorf("Apply: %v; want it to name %s written and %s not", err, from, to)
		}
		t.Logf("Apply: %v", err)
		var rest []user
		for _, u := range us[1:] {
			if u.Country != "b01" {
				rest = append(rest, u)
			}
		}
		redistest.Cmd(t, d.Other, "DEL", to)
		wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, rest)
		wantGenClean(t, d, prefix, 1)
	})
	t.Run("caller's ctx ends before the last step", func(t *testing.T) {
		// The last step runs all the same: what the writes left in a
		// generation a flip retired would otherwise stay.
		ctx, d, prefix, us := setup(t)
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		genkept := redistest.ScriptNamed("genkept")
		ran := false
		c := rueidishook.WithHook(d.Client, redistest.Hook{OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			if genkept.Is(cmd.Commands()) {
				cancel()
				ran = ctx.Err() == nil
			}
			return c.Do(ctx, cmd)
		}})
		moved := us[0]
		moved.Country = "b01"
		if err := spreadRebuilder(t, c, prefix, rebuild.Options{}).Apply(actx, index.Change[user]{Old: &us[0], New: &moved}); err != nil {
			t.Fatalf("Apply: %v", err)
		}
		if !ran {
			t.Errorf("the last step ran on the caller's ended ctx; want a cleanup context of its own")
		}
		after := slices.Clone(us)
		after[0] = moved
		wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, after)
		wantGenClean(t, d, prefix, 1)
	})
	t.Run("last step fails", func(t *testing.T) {
		ctx, d, prefix, us := setup(t)
		genkept := redistest.ScriptNamed("genkept")
		c := rueidishook.WithHook(d.Client, redistest.Hook{OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			if genkept.Is(cmd.Commands()) {
				// Its command fails before it is sent, as on a connection
				// that broke.
				failed, cancel := context.WithCancel(ctx)
				cancel()
				return c.Do(failed, cmd)
			}
			return c.Do(ctx, cmd)
		}})
		moved := us[0]
		moved.Country = "b01"
		err := spreadRebuilder(t, c, prefix, rebuild.Options{}).Apply(ctx, index.Change[user]{Old: &us[0], New: &moved})
		redistest.WantErr(t, err, rebuild.ErrOutcomeUnknown)
		redistest.WantErr(t, err, context.Canceled)
		for _, b := range []string{"b00", "b01"} {
			if k := keys.GenBucketKey(prefix, 1, b); !strings.Contains(err.Error(), strconv.Quote(k)) {
				t.Errorf("Apply: %v; want %s named", err, k)
			}
		}
		t.Logf("Apply: %v", err)
		after := slices.Clone(us)
		after[0] = moved
		wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, after)
		wantGenClean(t, d, prefix, 1)
	})
}

// cutApply inserts first with r, which caches the scripts and opens the
// connections, so that a cut hits a script itself; then arms proxy to cut
// at the next byte in direction dir and applies change. It returns
// change's error and generation 1 of prefix as it was before change.
func cutApply(ctx context.Context, t *testing.T, d deployment, r *rebuild.Rebuilder[user], proxy *faultproxy.Proxy, dir faultproxy.Direction,
	prefix string, first user, change index.Change[user]) (map[string]redistest.KeyState, error) {
	t.Helper()
	if err := r.Apply(ctx, index.Change[user]{New: &first}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	before := redistest.Snapshot(t, d.Other, keys.GenPrefix(prefix, 1))
	proxy.CutAfter(dir, 0)
	return before, r.Apply(ctx, change)
}

func TestGenerationsApplyTamperedPointer(t *testing.T) {
	// C96, C88: a pointer that is not a generation, or that names one the
	// registry does not mark current (the registry written by hand, or
	// lost while the pointer stayed), is a state no run leaves: Apply
	// refuses the change with ErrTampered naming the index, writing and
	// logging nothing, in the one script (tagged, standalone) as in the
	// first step across slots (the cluster's family without a hash tag).
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		prefix := genPrefix(d)
		us := genUsers(30, 3)
		r := genRebuilder(t, d, prefix, rebuild.Options{})
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		ptr, reg := keys.PointerKey(prefix, d.Cluster), keys.RegistryKey(prefix, d.Cluster)
		added := genUsers(31, 3)[30]
		for _, tc := range []struct {
			name         string
			tamper, heal [][]string
			want         string
		}{
			{"pointer not a generation", [][]string{{"SET", ptr, "01"}}, [][]string{{"SET", ptr, "1"}}, "not a generation"},
			{"generation retired", [][]string{{"HSET", reg, "1", "retired:5"}}, [][]string{{"HSET", reg, "1", keys.RegCurrent}}, `marks "retired:5", not current`},
			{"registry lost", [][]string{{"DEL", reg}}, [][]string{{"HSET", reg, keys.RegNext, "1", "1", keys.RegCurrent}}, "does not hold"},
		} {
			for _, c := range tc.tamper {
				redistest.Cmd(t, d.Other, c...)
			}
			before := redistest.Snapshot(t, d.Other, keys.GenPrefix(prefix, 1))
			err := r.Apply(ctx, index.Change[user]{New: &added})
			redistest.WantErr(t, err, rebuild.ErrTampered)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: Apply: %v; want %q in it", tc.name, err, tc.want)
			}
			t.Logf("%s: Apply: %v", tc.name, err)
			redistest.WantUnchanged(t, d.Other, keys.GenPrefix(prefix, 1), before)
			for _, c := range tc.heal {
				redistest.Cmd(t, d.Other, c...)
			}
		}
		if err := r.Apply(ctx, index.Change[user]{New: &added}); err != nil {
			t.Fatalf("Apply once healed: %v", err)
		}
		wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, append(us, added))
		wantGenClean(t, d, prefix, 1)
	})
}

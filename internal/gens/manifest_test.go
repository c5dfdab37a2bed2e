package gens_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// trusts reports whether the sweep reads the manifest of f's index rather
// than SCANning: a family whose keys share the registry's slot.
func (f *fixture) trusts() bool {
	_, tagged := keys.HashTag(f.idx.Live)
	return f.idx.Family && (!f.cluster || tagged)
}

// strangers writes keys a manifest of generation 1 may name that are not
// generation 1's, and returns them: a key outside the index, a key of
// generation 2, one of generation 10 and one of another index's
// generation 1.
func (f *fixture) strangers() []string {
	f.t.Helper()
	p := f.idx.Live
	out := []string{f.root + "foreign", keys.GenBucketKey(p, 2, "b0"), keys.GenBucketKey(p, 10, "b0"), keys.GenBucketKey(p+"x", 1, "b0")}
	for _, k := range out {
		f.sadd(k, "not generation 1's")
	}
	return out
}

// retiredOne writes generation 1 in state (n keys for a family) and
// generation 2 current, as the pointer names it, and returns generation
// 1's keys.
func (f *fixture) retiredOne(state string, n int) []string {
	f.t.Helper()
	f.registry(keys.RegNext, "2", "1", state, "2", keys.RegCurrent)
	f.set(f.pointerKey(), "2")
	old := f.gen(1, n)
	f.gen(2, 3)
	return old
}

// wantOneRemoved fails the test unless res removed generation 1 with
// exactly the keys deleted, and the keys left are those expected but
// deleted and generation 1's manifest.
func (f *fixture) wantOneRemoved(res gens.Result, deleted []string) {
	f.t.Helper()
	wantResult(f.t, res, []int64{1}, map[int64]gens.Reason{2: gens.SkipCurrent})
	if res.Keys != int64(len(deleted)) {
		f.t.Errorf("Keys = %d, want %d", res.Keys, len(deleted))
	}
	f.forget(deleted...)
	f.forgetManifest(1)
	f.check(map[string]string{keys.RegNext: "2", "2": keys.RegCurrent})
}

// TestSweepReadsListedManifest removes a retired generation whose manifest
// its run listed (keys.ManifestListed). Where the keys share the
// registry's slot the sweep reads the manifest and makes no SCAN: it
// deletes the listed keys of the generation, and none of the members that
// name another key (outside the index, of another generation, of another
// index), and a key of the generation the manifest does not list stays,
// as no keyswap writer made it (C99). Elsewhere (a family spread over a
// cluster, a plain key) the sweep SCANs or names the key, and the
// unlisted key goes too. The manifest goes with the registry field.
//
// The caller names buckets (Options.Buckets), one of them a bucket
// generation 1 does not hold. A sweep that reads the manifest ignores the
// names: it sends no key to delete that the manifest does not list, the
// absent bucket's included, and a key both in the list and in the set is
// counted once.
func TestSweepReadsListedManifest(t *testing.T) {
	forShapes(t, func(t *testing.T, f *fixture) {
		old := f.retiredOne(retired(time.Unix(1, 0)), 600) // more than two chunks of MaxUnlink
		// The last key of generation 1 is listed nowhere.
		// The run's writes in the list, Apply's in the set (some in
		// both), and members that are no key of generation 1 in each.
		strangers := f.strangers()
		cut := len(old) * 5 / 6
		f.manifest(1, true, append(slices.Clone(old[:cut]), strangers[:2]...)...)
		f.sadd(keys.ManifestKey(f.idx.Live, f.cluster, 1), append(slices.Clone(old[max(0, cut-10):len(old)-1]), strangers[2:]...)...)
		var scans atomic.Int32
		var mu sync.Mutex
		sent := map[string]bool{} // keys sent to be deleted
		c := redistest.Watch(f.c, func(cmds ...rueidis.Completed) {
			mu.Lock()
			defer mu.Unlock()
			for _, cmd := range cmds {
				args := cmd.Commands()
				switch strings.ToUpper(args[0]) {
				case "SCAN":
					scans.Add(1)
				case "UNLINK":
					for _, k := range args[1:] {
						sent[k] = true
					}
				case "EVALSHA", "EVAL":
					// The unlink script: the generation's keys after
					// five control keys.
					if n, err := strconv.Atoi(args[2]); err == nil && n > 5 {
						for _, k := range args[3+5 : 3+n] {
							sent[k] = true
						}
					}
				}
			}
		})
		// Buckets names a tenth of the keys, and a bucket generation 1
		// does not hold.
		var named []string
		for i := range 60 {
			named = append(named, "b"+strconv.Itoa(i))
		}
		absent := keys.GenBucketKey(f.idx.Live, 1, "absent")
		named = append(named, "absent")
		res, err := gens.Sweep(redistest.Ctx(t), c, f.idx, gens.Options{Buckets: named})
		if err != nil {
			t.Fatal(err)
		}
		deleted := old
		if f.trusts() {
			deleted = old[:len(old)-1]
			if n := scans.Load(); n != 0 {
				t.Errorf("%d SCAN calls, want none", n)
			}
			listed := map[string]bool{}
			for _, k := range deleted {
				listed[k] = true
			}
			mu.Lock()
			for k := range sent {
				if !listed[k] {
					t.Errorf("sent %s to be deleted, which the manifest does not list (absent bucket %s)", k, absent)
				}
			}
			mu.Unlock()
		}
		f.wantOneRemoved(res, deleted)
	})
}

// TestSweepScansUnprovenManifest removes generations whose manifest does
// not prove it lists every key (C99): one not marked listed (made by a run
// that did not list, or only Apply's writes), one of a run that crashed
// before its flip (building, its lock gone: the crash may have come
// between writes and marking anything), a manifest that is not a set, and
// a list that is not a list, a list that is gone while the set keeps its
// mark (evicted, or deleted: the run's keys would be found by nothing
// else), and the generation of a run that failed and disowned it
// (retired:0) whose set holds the mark (only another process writes that).
// Each misses a key, which the SCAN finds; members naming other keys stay
// untouched.
func TestSweepScansUnprovenManifest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state string
		write func(f *fixture, ks []string)
	}{
		{"unlisted", retired(time.Unix(1, 0)), func(f *fixture, ks []string) { f.manifest(1, false, ks...) }},
		{"crashed run", keys.RegBuilding + gone, func(f *fixture, ks []string) { f.manifest(1, true, ks...) }},
		{"not a set", retired(time.Unix(1, 0)), func(f *fixture, ks []string) {
			f.set(keys.ManifestKey(f.idx.Live, f.cluster, 1), keys.ManifestListed)
		}},
		{"list not a list", retired(time.Unix(1, 0)), func(f *fixture, ks []string) {
			f.sadd(keys.ManifestListKey(f.idx.Live, f.cluster, 1), ks...)
			f.sadd(keys.ManifestKey(f.idx.Live, f.cluster, 1), keys.ManifestListed)
		}},
		{"list gone", retired(time.Unix(1, 0)), func(f *fixture, ks []string) {
			f.sadd(keys.ManifestKey(f.idx.Live, f.cluster, 1), append(ks, keys.ManifestListed)...)
		}},
		{"disowned", retired(time.UnixMilli(0)), func(f *fixture, ks []string) { f.manifest(1, true, ks...) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forShapes(t, func(t *testing.T, f *fixture) {
				old := f.retiredOne(tc.state, 300)
				tc.write(f, append(slices.Clone(old[:len(old)/2]), f.strangers()...))
				res, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{})
				if err != nil {
					t.Fatal(err)
				}
				f.wantOneRemoved(res, old)
			})
		})
	}
}

// TestSweepWatchedChunkRaced writes the registry between the WATCH of a
// chunk and its EXEC, as another run's allocation would: the EXEC runs
// nothing, and the chunk goes by the unlink script instead, which checks
// the state in the same step. Every key of the generation goes; none is
// deleted twice or left.
func TestSweepWatchedChunkRaced(t *testing.T) {
	forShapes(t, func(t *testing.T, f *fixture) {
		old := f.retiredOne(retired(time.Unix(1, 0)), 300)
		f.manifest(1, true, old...)
		var raced, aborted atomic.Int32
		c := rueidishook.WithHook(f.c, redistest.Hook{OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			if !strings.EqualFold(multi[0].Commands()[0], "MULTI") || raced.Add(1) > 2 {
				return c.DoMulti(ctx, multi...)
			}
			// The first two chunks: a write to the registry that changes
			// nothing the sweep checks.
			if err := f.c.Do(ctx, f.c.B().Hset().Key(f.registryKey()).FieldValue().FieldValue(keys.RegNext, "2").Build()).Error(); err != nil {
				t.Error(err)
			}
			exec := slices.IndexFunc(multi, func(cmd rueidis.Completed) bool { return strings.EqualFold(cmd.Commands()[0], "EXEC") })
			res := c.DoMulti(ctx, multi...)
			if rueidis.IsRedisNil(res[exec].Error()) {
				aborted.Add(1)
			}
			return res
		}})
		res, err := gens.Sweep(redistest.Ctx(t), c, f.idx, gens.Options{Unlink: 100})
		if err != nil {
			t.Fatal(err)
		}
		// Only a family's chunks in the registry's slot go in WATCH ...
		// EXEC.
		if got := aborted.Load(); f.trusts() && got != 2 {
			t.Errorf("%d EXEC aborted, want 2", got)
		}
		f.wantOneRemoved(res, old)
	})
}

// TestSweepLeavesNoWatch: the WATCH a family's removal sends behind each
// chunk's EXEC, for the next chunk, is ended before the connection goes
// back to the client's pool, where another caller's transaction would
// otherwise fail for a key the sweep watched: when the removal ends, and
// when its context is cancelled after a chunk.
func TestSweepLeavesNoWatch(t *testing.T) {
	for _, cancel := range []bool{false, true} {
		t.Run(map[bool]string{false: "done", true: "cancelled"}[cancel], func(t *testing.T) {
			forShapes(t, func(t *testing.T, f *fixture) {
				old := f.retiredOne(retired(time.Unix(1, 0)), 300)
				f.manifest(1, true, old...)
				ctx, stop := context.WithCancel(redistest.Ctx(t))
				defer stop()
				var execs atomic.Int32
				c := rueidishook.WithHook(f.c, redistest.Hook{OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
					watched := strings.EqualFold(multi[0].Commands()[0], "MULTI")
					res := c.DoMulti(ctx, multi...)
					if watched && execs.Add(1) == 1 && cancel {
						stop()
					}
					return res
				}})
				_, err := gens.Sweep(ctx, c, f.idx, gens.Options{Unlink: 100})
				switch {
				case cancel && f.trusts() && !errors.Is(err, context.Canceled):
					t.Fatalf("sweep cancelled after a chunk: %v, want context.Canceled", err)
				case (!cancel || !f.trusts()) && err != nil:
					t.Fatal(err)
				}
				if f.trusts() != (execs.Load() > 0) {
					t.Fatalf("%d chunks in WATCH ... EXEC; want them exactly for a family in the registry's slot", execs.Load())
				}
				f.wantNoWatch()
			})
		})
	}
}

// TestSweepLeavesNoWatchAfterPanic: a Progress callback that panics after
// a chunk, whose EXEC armed the next chunk's WATCH, leaves no WATCH on the
// connection, which goes back to the pool as the panic unwinds the sweep.
func TestSweepLeavesNoWatchAfterPanic(t *testing.T) {
	forShapes(t, func(t *testing.T, f *fixture) {
		old := f.retiredOne(retired(time.Unix(1, 0)), 300)
		f.manifest(1, true, old...)
		var execs atomic.Int32
		c := rueidishook.WithHook(f.c, redistest.Hook{OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			if strings.EqualFold(multi[0].Commands()[0], "MULTI") {
				execs.Add(1)
			}
			return c.DoMulti(ctx, multi...)
		}})
		const boom = "progress callback panicked"
		got := func() (v any) {
			defer func() { v = recover() }()
			_, err := gens.Sweep(redistest.Ctx(t), c, f.idx, gens.Options{Unlink: 100, Progress: func(gens.Progress) { panic(boom) }})
			t.Fatalf("Sweep returned %v, want the callback's panic", err)
			return nil
		}()
		if got != boom {
			t.Fatalf("Sweep panicked with %v, want %q", got, boom)
		}
		if f.trusts() != (execs.Load() > 0) {
			t.Fatalf("%d chunks in WATCH ... EXEC; want them exactly for a family in the registry's slot", execs.Load())
		}
		f.wantNoWatch()
	})
}

// wantNoWatch fails unless the connection a sweep's chunks went on, from
// the pool again, has no WATCH left: one would fail this EXEC once the
// registry changes.
func (f *fixture) wantNoWatch() {
	t := f.t
	t.Helper()
	ctx := redistest.Ctx(t)
	dc, release := f.c.Dedicate()
	defer release()
	redistest.Cmd(t, f.c, "HSET", f.registryKey(), keys.RegNext, "9")
	res := dc.DoMulti(ctx, dc.B().Multi().Build(), dc.B().Hget().Key(f.registryKey()).Field(keys.RegNext).Build(), dc.B().Exec().Build())
	got, err := res[2].ToArray()
	if err != nil {
		t.Fatalf("EXEC on the sweep's connection after it: %v (a WATCH the sweep sent is still on it)", err)
	}
	if v, _ := got[0].ToString(); v != "9" {
		t.Fatalf("EXEC read next %q, want 9", v)
	}
}

// TestSweepLeavesNoWatchAfterFirstWatch: the WATCH of a removal's first
// chunk, sent on its own connection, is ended before the connection goes
// back to the pool also when the chunk never reaches its EXEC: its
// replies lost to a cancelled context (the server ran the WATCH), or the
// chunk refused by the reads (the registry's field changed) after the
// context was cancelled, so that the refusal's own UNWATCH is not sent.
func TestSweepLeavesNoWatchAfterFirstWatch(t *testing.T) {
	for _, lost := range []bool{true, false} {
		t.Run(map[bool]string{true: "reply lost", false: "refused"}[lost], func(t *testing.T) {
			forShapes(t, func(t *testing.T, f *fixture) {
				old := f.retiredOne(retired(time.Unix(1, 0)), 300)
				f.manifest(1, true, old...)
				ctx, stop := context.WithCancel(redistest.Ctx(t))
				defer stop()
				var watches atomic.Int32
				c := rueidishook.WithHook(f.c, redistest.Hook{OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
					if !strings.EqualFold(multi[0].Commands()[0], "WATCH") || watches.Add(1) != 1 {
						return c.DoMulti(ctx, multi...)
					}
					if !lost {
						redistest.Cmd(t, f.c, "HSET", f.registryKey(), "1", retired(time.Unix(2, 0)))
					}
					res := c.DoMulti(ctx, multi...)
					stop()
					if lost {
						for i := range res {
							res[i] = rueidis.NewErrorResult(ctx.Err())
						}
					}
					return res
				}})
				_, err := gens.Sweep(ctx, c, f.idx, gens.Options{Unlink: 100})
				if !f.trusts() {
					if err != nil {
						t.Fatal(err)
					}
					return // no chunk in WATCH ... EXEC
				}
				if watches.Load() == 0 || !errors.Is(err, context.Canceled) {
					t.Fatalf("sweep with its first WATCH's context cancelled: %v (%d WATCHes), want context.Canceled", err, watches.Load())
				}
				f.wantNoWatch()
			})
		})
	}
}

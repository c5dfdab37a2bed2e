package gens_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

// TestSweepRemovesOnlyDeadGenerations builds an index with a generation in
// every state, and keys that look like a generation's but are not, then
// sweeps: only the generation retired long ago, the empty one, and the one
// building whose lock holds another token go, keys and registry fields;
// every other key is left with its contents. A second sweep past the grace
// removes the recently retired one too.
func TestSweepRemovesOnlyDeadGenerations(t *testing.T) {
	forShapes(t, func(t *testing.T, f *fixture) {
		ctx := redistest.Ctx(t)
		now := time.Now()
		// Generation 1 holds more than two chunks of MaxUnlink.
		fields, data := f.everyGeneration(now, 600, 3, 3, 3, 3, 300)
		old, recent, abandoned := data[1], data[2], data[6]
		// Keys that look like a generation's and are not: a user's key
		// under the prefix, "7x" (not a generation), generation 10
		// (whose pattern "1:" must not catch), the other shape (a
		// family's under a plain key, a plain key's under a prefix).
		p := f.idx.Live
		f.sadd(p+":b0", "user")
		f.sadd(p+keys.GenInfix+"7x", "user")
		f.sadd(p+keys.GenInfix+"7x:b0", "user")
		f.sadd(keys.GenBucketKey(p, 10, "b0"), "user")
		f.sadd(keys.GenKey(p, 10), "user")
		if f.idx.Family {
			f.sadd(keys.GenKey(p, 1), "user")
		} else {
			f.sadd(keys.GenBucketKey(p, 1, "b0"), "user")
		}
		f.sadd(p, "the live key of the plain shape")
		if f.idx.Family {
			// A bucket with an empty name is a key of the generation.
			f.sadd(keys.GenBucketKey(p, 1, ""), "empty bucket")
			old = append(old, keys.GenBucketKey(p, 1, ""))
		}

		var progress []gens.Progress
		res, err := gens.Sweep(ctx, f.c, f.idx, gens.Options{Now: now, Progress: func(p gens.Progress) { progress = append(progress, p) }})
		if err != nil {
			t.Fatal(err)
		}
		wantResult(t, res, []int64{1, 6, 7}, map[int64]gens.Reason{
			2: gens.SkipGrace, 3: gens.SkipPrevious, 4: gens.SkipCurrent, 5: gens.SkipRunning,
		})
		if want := int64(len(old) + len(abandoned)); res.Keys != want {
			t.Errorf("Keys = %d, want %d", res.Keys, want)
		}
		for _, r := range res.Removed {
			if want := map[int64]int64{1: int64(len(old)), 6: int64(len(abandoned)), 7: 0}[r.Gen]; r.Keys != want {
				t.Errorf("generation %d: %d keys removed, want %d", r.Gen, r.Keys, want)
			}
		}
		if len(progress) == 0 || progress[len(progress)-1].Total != res.Keys {
			t.Errorf("progress %v: want it to end at %d keys", progress, res.Keys)
		}
		f.forget(old...)
		f.forget(abandoned...)
		delete(fields, "1")
		delete(fields, "6")
		delete(fields, "7")
		f.check(fields)

		// Past the grace, generation 2 goes too; the rest stays.
		res, err = gens.Sweep(ctx, f.c, f.idx, gens.Options{Now: now.Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		wantResult(t, res, []int64{2}, map[int64]gens.Reason{3: gens.SkipPrevious, 4: gens.SkipCurrent, 5: gens.SkipRunning})
		f.forget(recent...)
		delete(fields, "2")
		f.check(fields)
	})
}

// TestSweepGrace checks the edge of the grace period: a generation retired
// exactly Grace ago is kept, one a millisecond earlier is removed.
func TestSweepGrace(t *testing.T) {
	t.Parallel()
	f := newFixture(t, shape{family: true})
	now := time.UnixMilli(time.Now().UnixMilli())
	grace := 30 * time.Second
	f.registry(keys.RegNext, "2", "1", retired(now.Add(-grace)), "2", retired(now.Add(-grace-time.Millisecond)))
	f.gen(1, 2) // kept, with its contents (check)
	gone := f.gen(2, 2)
	var log bytes.Buffer
	res, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{Now: now, Grace: grace, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	wantResult(t, res, []int64{2}, map[int64]gens.Reason{1: gens.SkipGrace})
	if !contains(log.String(), "generation kept", "generation=1", string(gens.SkipGrace), "generation removed", "generation=2", "keys=2") {
		t.Errorf("log:\n%s\nwant a line for generation 1 kept (and why) and one for generation 2 removed", log.String())
	}
	f.forget(gone...)
	f.check(map[string]string{keys.RegNext: "2", "1": retired(now.Add(-grace))})
}

// TestSweepServerClock sweeps without Options.Now: the grace is measured
// on the server's clock, which Read returns.
func TestSweepServerClock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, shape{family: true})
	snap, err := gens.Read(redistest.Ctx(t), f.c, f.idx)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(snap.Time); d < -time.Minute || d > time.Minute {
		t.Fatalf("server time %v, %v from the test's clock", snap.Time, d)
	}
	f.registry(keys.RegNext, "2", "1", retired(snap.Time.Add(-time.Minute)), "2", retired(snap.Time))
	gone := f.gen(1, 2)
	f.gen(2, 2)
	res, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantResult(t, res, []int64{1}, map[int64]gens.Reason{2: gens.SkipGrace})
	f.forget(gone...)
	f.check(map[string]string{keys.RegNext: "2", "2": retired(snap.Time)})
}

// TestSweepRefusesCorruptRegistry writes registries and pointers no run
// writes: the sweep fails with an error that names the key, the field and
// the value, and deletes nothing, not even the generation it could have
// removed.
func TestSweepRefusesCorruptRegistry(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name         string
		field, value string // written to the registry; field "" = the pointer
		pointer      bool
		// wantField is the field the error names, when not field.
		wantField string
	}{
		{name: "unknown state", field: "2", value: "bogus"},
		{name: "not a generation", field: "x2", value: keys.RegCurrent},
		{name: "leading zero", field: "02", value: retired(time.Unix(0, 0))},
		{name: "zero", field: "0", value: retired(time.Unix(0, 0))},
		{name: "above next", field: "9", value: retired(time.Unix(0, 0))},
		{name: "two current", field: "2", value: keys.RegCurrent, wantField: "3"},
		{name: "retired when", field: "2", value: keys.RegRetired + "soon"},
		{name: "building no token", field: "2", value: keys.RegBuilding},
		{name: "next", field: keys.RegNext, value: "-1"},
		{name: "pointer not current", value: "1", pointer: true},
		{name: "pointer not a number", value: "three", pointer: true},
	}
	for _, sh := range []shape{{name: "standalone", family: true}, {name: "cluster", cluster: true, family: true}} {
		for _, tc := range cases {
			t.Run(sh.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, sh)
				fields := map[string]string{keys.RegNext: "3", "1": retired(time.Unix(1, 0)), "3": keys.RegCurrent}
				f.set(f.pointerKey(), "3")
				f.gen(1, 3)
				f.gen(3, 3)
				key := f.registryKey()
				if tc.pointer {
					f.set(f.pointerKey(), tc.value)
					key = f.pointerKey()
				} else {
					fields[tc.field] = tc.value
				}
				for k, v := range fields {
					f.registry(k, v)
				}
				_, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{})
				var corrupt *gens.CorruptError
				if !errors.As(err, &corrupt) || !errors.Is(err, gens.ErrCorrupt) {
					t.Fatalf("err = %v, want a CorruptError", err)
				}
				var kerr *protocol.Error
				if !errors.As(err, &kerr) || kerr.Key != f.idx.Live || kerr.Op != "sweep" {
					t.Errorf("err = %#v, want a protocol.Error of sweep on %q", err, f.idx.Live)
				}
				field := tc.field
				if tc.wantField != "" {
					field = tc.wantField
				}
				if corrupt.Key != key || corrupt.Field != field || corrupt.Value != tc.value {
					t.Errorf("CorruptError %+v, want key %q field %q value %q", corrupt, key, field, tc.value)
				}
				if !contains(err.Error(), key, strconv.Quote(tc.value)) || !tc.pointer && !contains(err.Error(), strconv.Quote(field)) {
					t.Errorf("error %q does not name the key, the field and the value", err)
				}
				t.Log(err)
				f.check(fields)
			})
		}
	}
}

// TestSweepCancelledFinishesLater cancels the sweep's context after its
// first chunk: the sweep fails, the generation keeps its registry field and
// the keys not reached, and a second sweep removes them and the field.
func TestSweepCancelledFinishesLater(t *testing.T) {
	t.Parallel()
	for _, sh := range shapes() {
		if !sh.family {
			continue // one key: nothing to interrupt
		}
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, sh)
			f.registry(keys.RegNext, "2", "1", retired(time.Unix(1, 0)), "2", keys.RegCurrent)
			f.set(f.pointerKey(), "2")
			doomed := f.gen(1, 500)
			f.gen(2, 3)
			ctx, cancel := context.WithCancel(redistest.Ctx(t))
			defer cancel()
			// The first chunk holds at most 100 keys: fewer when a SCAN page
			// (COUNT 100, a hint) returned fewer.
			var first int64
			res, err := gens.Sweep(ctx, f.c, f.idx, gens.Options{Unlink: 100, Progress: func(p gens.Progress) {
				if first == 0 {
					first = p.Total
				}
				cancel()
			}})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			if first < 1 || first > 100 || res.Keys != first || len(res.Removed) != 0 {
				t.Errorf("result %+v after a first chunk of %d, want 1 to 100 keys deleted, that chunk's, and no generation removed", res, first)
			}
			left := 0
			for _, k := range doomed {
				if redistest.Exists(t, f.c, k) {
					left++
				}
			}
			if left != len(doomed)-int(first) {
				t.Errorf("%d keys of generation 1 left, want %d", left, len(doomed)-int(first))
			}
			redistest.WantHash(t, f.c, f.registryKey(), map[string]string{keys.RegNext: "2", "1": retired(time.Unix(1, 0)), "2": keys.RegCurrent})

			res, err = gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{})
			if err != nil {
				t.Fatal(err)
			}
			wantResult(t, res, []int64{1}, map[int64]gens.Reason{2: gens.SkipCurrent})
			if res.Keys != int64(len(doomed))-first {
				t.Errorf("second sweep deleted %d keys, want %d", res.Keys, int64(len(doomed))-first)
			}
			f.forget(doomed...)
			f.check(map[string]string{keys.RegNext: "2", "2": keys.RegCurrent})
		})
	}
}

// TestSweepStopsWhenStateChanges changes a generation's registry field
// while the sweep removes it: made previous again (as a rollback would), or
// removed (by its run's own cleanup, or another sweep). The sweep deletes
// no further chunk, leaves the field as it found it, and says why.
func TestSweepStopsWhenStateChanges(t *testing.T) {
	t.Parallel()
	for _, sh := range shapes() {
		if !sh.family {
			continue
		}
		for _, tc := range []struct {
			name   string
			change func(f *fixture) rueidis.Completed
			reason gens.Reason
			fields map[string]string
		}{
			{"previous", func(f *fixture) rueidis.Completed {
				return f.c.B().Hset().Key(f.registryKey()).FieldValue().FieldValue("1", keys.RegPrevious).Build()
			}, gens.SkipChanged, map[string]string{keys.RegNext: "1", "1": keys.RegPrevious}},
			{"removed", func(f *fixture) rueidis.Completed {
				return f.c.B().Hdel().Key(f.registryKey()).Field("1").Build()
			}, gens.SkipGone, map[string]string{keys.RegNext: "1"}},
		} {
			for _, listed := range []bool{false, true} {
				name := sh.name + "/" + tc.name
				if listed {
					name += "/listed"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					f := newFixture(t, sh)
					f.registry(keys.RegNext, "1", "1", retired(time.Unix(1, 0)))
					ks := f.gen(1, 500)
					if listed {
						// The sweep reads the manifest, and stops as it stops
						// a SCAN; the manifest stays with the field.
						f.manifest(1, true, ks...)
					}
					var calls atomic.Int32
					// The first chunk holds at most 100 keys: fewer when a SCAN
					// page (COUNT 100, a hint) returned fewer.
					var first int
					pace := func(ctx context.Context, n int) error {
						switch calls.Add(1) {
						case 1:
							first = n
						case 2:
							return f.c.Do(ctx, tc.change(f)).Error()
						}
						return nil
					}
					res, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{Unlink: 100, Pace: pace})
					if err != nil {
						t.Fatal(err)
					}
					wantResult(t, res, nil, map[int64]gens.Reason{1: tc.reason})
					if first < 1 || first > 100 || res.Keys != int64(first) || res.Skipped[0].Keys != int64(first) {
						t.Errorf("result %+v, want the first chunk of %d keys (1 to 100) deleted", res, first)
					}
					left := 0
					for _, k := range ks {
						if redistest.Exists(t, f.c, k) {
							left++
						} else {
							f.forget(k)
						}
					}
					if left != len(ks)-first {
						t.Errorf("%d keys left, want %d", left, len(ks)-first)
					}
					f.check(tc.fields)
				})
			}
		}
	}
}

// TestSweepGivesUpOnKeysStillWritten writes a key of the generation before
// every chunk the sweep deletes, as a run that lost its lock and still
// writes would: every pass finds keys, and after its last pass the sweep
// keeps the registry field, so that a later sweep finds the generation.
func TestSweepGivesUpOnKeysStillWritten(t *testing.T) {
	t.Parallel()
	for _, sh := range shapes() {
		if !sh.family {
			continue
		}
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, sh)
			f.registry(keys.RegNext, "1", "1", keys.RegBuilding+"lost")
			ks := f.gen(1, 300)
			var late atomic.Int32
			pace := func(ctx context.Context, n int) error {
				k := keys.GenBucketKey(f.idx.Live, 1, "late"+strconv.Itoa(int(late.Add(1))))
				return f.c.Do(ctx, f.c.B().Set().Key(k).Value("x").Build()).Error()
			}
			res, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{Unlink: 100, Pace: pace})
			if err != nil {
				t.Fatal(err)
			}
			wantResult(t, res, nil, map[int64]gens.Reason{1: gens.SkipWritten})
			f.forget(ks...)
			for _, k := range f.keys() {
				if k != f.registryKey() && !strings.HasPrefix(k, keys.GenBucketKey(f.idx.Live, 1, "late")) {
					t.Errorf("%s left, want only keys written during the sweep", k)
				}
			}
			redistest.WantHash(t, f.c, f.registryKey(), map[string]string{keys.RegNext: "1", "1": keys.RegBuilding + "lost"})

			// Once nothing writes any more, a sweep finishes it.
			if res, err = gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{}); err != nil {
				t.Fatal(err)
			}
			wantResult(t, res, []int64{1}, nil)
			f.check(map[string]string{keys.RegNext: "1"})
		})
	}
}

// TestSweepOptions checks that bad options and indexes are refused before anything is
// read or deleted.
func TestSweepOptions(t *testing.T) {
	t.Parallel()
	f := newFixture(t, shape{family: true})
	f.registry(keys.RegNext, "1", "1", retired(time.Unix(1, 0)))
	f.gen(1, 2)
	for _, o := range []gens.Options{{Grace: -time.Second}, {Unlink: gens.MaxUnlink + 1}, {Unlink: -1}, {ScanCount: -1}} {
		if _, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, o); err == nil {
			t.Errorf("Sweep(%+v) = nil error", o)
		} else {
			t.Log(err)
		}
	}
	for _, idx := range []gens.Index{{Family: true}, {Live: keys.LockKey(f.idx.Live, false), Family: true}, {Live: keys.GenKey(f.idx.Live, 1)}} {
		if _, err := gens.Sweep(redistest.Ctx(t), f.c, idx, gens.Options{}); err == nil {
			t.Errorf("Sweep(%+v) = nil error", idx)
		} else {
			t.Log(err)
		}
		if _, err := gens.DropPlain(redistest.Ctx(t), f.c, idx, gens.Options{}); err == nil {
			t.Errorf("DropPlain(%+v) = nil error", idx)
		}
	}
	f.check(map[string]string{keys.RegNext: "1", "1": retired(time.Unix(1, 0))})
}

// TestSweepAbandonedWithoutLock removes a building generation whose lock
// is gone (it expired with its run), and keeps one whose lock holds its
// token.
func TestSweepAbandonedWithoutLock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, shape{family: true})
	f.registry(keys.RegNext, "1", "1", keys.RegBuilding+"tok")
	gone := f.gen(1, 3)
	f.lock("tok")
	res, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantResult(t, res, nil, map[int64]gens.Reason{1: gens.SkipRunning})
	f.check(map[string]string{keys.RegNext: "1", "1": keys.RegBuilding + "tok"})

	redistest.Cmd(t, f.c, "DEL", f.lockKey())
	f.forget(f.lockKey())
	if res, err = gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{}); err != nil {
		t.Fatal(err)
	}
	wantResult(t, res, []int64{1}, nil)
	f.forget(gone...)
	f.check(map[string]string{keys.RegNext: "1"})
}

// TestRemoveOwn removes the generation a failed run built, while the run
// still holds the lock (Sweep would keep it), and one of its generations
// whose field a sweep removed; it refuses a generation in any other state:
// the current one, or one another run builds.
func TestRemoveOwn(t *testing.T) {
	t.Parallel()
	for _, sh := range shapes() {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, sh)
			ctx := redistest.Ctx(t)
			f.registry(keys.RegNext, "4", "1", keys.RegCurrent, "2", keys.RegBuilding+"tok", "3", keys.RegBuilding+"other")
			f.set(f.pointerKey(), "1")
			f.lock("tok")
			f.gen(1, 300)
			mine := f.gen(2, 300)
			f.gen(3, 3)
			// Generation 4 was the run's too, and a sweep removed its field
			// while the run, which had lost its lock, still wrote.
			late := f.gen(4, 3)
			for _, g := range []int64{1, 3} {
				res, err := gens.RemoveOwn(ctx, f.c, f.idx, g, "tok", gens.Options{})
				if err != nil {
					t.Fatal(err)
				}
				// The current generation, which the pointer names; one of
				// another run.
				want := map[int64]gens.Reason{1: gens.SkipPointer, 3: gens.SkipChanged}[g]
				wantResult(t, res, nil, map[int64]gens.Reason{g: want})
			}
			// From its first deletion on, the generation is no longer the
			// run's: a flip of the run still on its way would find it
			// retired, and refuse (C89).
			var during []string
			res, err := gens.RemoveOwn(ctx, f.c, f.idx, 2, "tok", gens.Options{Pace: func(ctx context.Context, n int) error {
				v, err := f.c.Do(ctx, f.c.B().Hget().Key(f.registryKey()).Field("2").Build()).ToString()
				during = append(during, v)
				return err
			}})
			if err != nil {
				t.Fatal(err)
			}
			if len(during) == 0 || slices.ContainsFunc(during, func(v string) bool { return v != keys.RegRetired+"0" }) {
				t.Errorf("generation 2's state while its keys went: %q, want %q throughout", during, keys.RegRetired+"0")
			}
			wantResult(t, res, []int64{2}, nil)
			if res.Keys != int64(len(mine)) {
				t.Errorf("%d keys deleted, want %d", res.Keys, len(mine))
			}
			if res, err = gens.RemoveOwn(ctx, f.c, f.idx, 4, "tok", gens.Options{}); err != nil {
				t.Fatal(err)
			}
			wantResult(t, res, []int64{4}, nil)
			f.forget(mine...)
			f.forget(late...)
			f.check(map[string]string{keys.RegNext: "4", "1": keys.RegCurrent, "3": keys.RegBuilding + "other"})
		})
	}
}

// TestRemoveOwnNeverRemovesWhatThePointerNames drives RemoveOwn as a run
// whose flip reply was lost does: the flip ran, and the pointer names the
// run's generation. Whether the registry says so (current), still says
// building (a registry that lost the flip's write) or lost the field, the
// generation stays, whole (C89).
func TestRemoveOwnNeverRemovesWhatThePointerNames(t *testing.T) {
	t.Parallel()
	for _, sh := range shapes() {
		for _, tc := range []struct {
			name, state string
			want        gens.Reason
		}{
			{"current", keys.RegCurrent, gens.SkipPointer},
			{"building", keys.RegBuilding + "tok", gens.SkipPointer},
			{"no-field", "", gens.SkipPointer},
		} {
			t.Run(sh.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, sh)
				ctx := redistest.Ctx(t)
				old := retired(time.Now())
				fields := map[string]string{keys.RegNext: "2", "1": old}
				pairs := []string{keys.RegNext, "2", "1", old}
				if tc.state != "" {
					pairs = append(pairs, "2", tc.state)
					fields["2"] = tc.state
				}
				f.registry(pairs...)
				f.set(f.pointerKey(), "2")
				f.lock("tok")
				f.gen(1, 3)
				f.gen(2, 300)
				res, err := gens.RemoveOwn(ctx, f.c, f.idx, 2, "tok", gens.Options{})
				if err != nil {
					t.Fatal(err)
				}
				wantResult(t, res, nil, map[int64]gens.Reason{2: tc.want})
				if res.Keys != 0 {
					t.Errorf("%d keys deleted, want none", res.Keys)
				}
				f.check(fields)
			})
		}
	}
}

// TestRemoveOwnKeepsAClaimedIndex drives RemoveOwn as a run without a
// group that allocated generation 2, lost its lock and had its field
// removed by a sweep, after which a group claimed the index (C102): the
// group may have allocated generation 2 itself (its registry lost the
// floor), so the keys stay, whole, whatever their number.
func TestRemoveOwnKeepsAClaimedIndex(t *testing.T) {
	t.Parallel()
	for _, sh := range shapes() {
		for _, n := range []int{3, 300} {
			t.Run(sh.name+"/"+strconv.Itoa(n)+"-keys", func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, sh)
				ctx := redistest.Ctx(t)
				f.registry(keys.RegNext, "2")
				f.set(f.pointerKey(), keys.GroupMarker("a"))
				f.lock("tok")
				f.gen(2, n)
				res, err := gens.RemoveOwn(ctx, f.c, f.idx, 2, "tok", gens.Options{})
				if err != nil {
					t.Fatal(err)
				}
				wantResult(t, res, nil, map[int64]gens.Reason{2: gens.SkipClaimed})
				if res.Keys != 0 {
					t.Errorf("%d keys deleted, want none", res.Keys)
				}
				f.check(map[string]string{keys.RegNext: "2"})
			})
		}
	}
}

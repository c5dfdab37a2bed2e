package gens_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
)

// familyShapes returns the layouts of shapes that are families.
func familyShapes() []shape {
	var out []shape
	for _, sh := range shapes() {
		if sh.family {
			out = append(out, sh)
		}
	}
	return out
}

// chunkSizes returns a pacer that records the size of every deleting
// command, and the sizes recorded.
func chunkSizes() (func(context.Context, int) error, func() []int) {
	var mu sync.Mutex
	var sizes []int
	return func(_ context.Context, n int) error {
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, n)
			return nil
		}, func() []int {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(sizes)
		}
}

// bucketNames returns the names of buckets b0..b<n-1>, as fixture.gen
// names them.
func bucketNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "b" + strconv.Itoa(i)
	}
	return out
}

// oneRetired returns an index of shape sh with one generation, retired
// long ago, of 10 buckets, and their keys.
func oneRetired(t *testing.T, sh shape) (*fixture, []string) {
	f := newFixture(t, sh)
	f.registry(keys.RegNext, "1", "1", retired(time.Unix(1, 0)))
	return f, f.gen(1, 10)
}

// TestSweepBuckets removes a retired generation whose buckets the caller
// names, as a run names those it wrote: the named buckets go first, by
// name, in chunks of at most Unlink keys; the buckets it does not name
// (written by Apply while the generation was current, or an orphan the
// new data no longer has) are found by the SCAN that follows. The current
// and the previous generation hold the same bucket names and stay whole,
// and so do keys of other shapes.
func TestSweepBuckets(t *testing.T) {
	t.Parallel()
	for _, sh := range familyShapes() {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, sh)
			ctx := redistest.Ctx(t)
			fields := map[string]string{keys.RegNext: "3", "1": retired(time.Unix(1, 0)), "2": keys.RegPrevious, "3": keys.RegCurrent}
			for k, v := range fields {
				f.registry(k, v)
			}
			f.set(f.pointerKey(), "3")
			old := f.gen(1, 10)
			f.gen(2, 10)
			f.gen(3, 10)
			p := f.idx.Live
			applied := keys.GenBucketKey(p, 1, "applied")
			f.sadd(applied, "written by Apply")
			f.sadd(p+":b0", "user") // the plain shape's bucket
			f.sadd(keys.GenBucketKey(p, 10, "b0"), "user")
			names := append([]string{"b9", "absent"}, bucketNames(9)...)
			pace, sizes := chunkSizes()
			res, err := gens.Sweep(ctx, f.c, f.idx, gens.Options{Unlink: 3, Pace: pace, Buckets: names})
			if err != nil {
				t.Fatal(err)
			}
			wantResult(t, res, []int64{1}, map[int64]gens.Reason{2: gens.SkipPrevious, 3: gens.SkipCurrent})
			if res.Keys != 11 || res.Removed[0].Keys != 11 {
				t.Errorf("result %+v: want 11 keys removed", res)
			}
			// 11 names in chunks of 3, then the SCAN's one key left.
			if diff := cmp.Diff([]int{3, 3, 3, 2, 1}, sizes()); diff != "" {
				t.Errorf("chunk sizes (-want +got):\n%s", diff)
			}
			f.forget(old...)
			f.forget(applied)
			delete(fields, "1")
			f.check(fields)
		})
	}
}

// TestSweepBucketsStopsWhenStateChanges changes the generation's state
// between two chunks of its named buckets: the sweep deletes nothing more,
// and keeps the field.
func TestSweepBucketsStopsWhenStateChanges(t *testing.T) {
	t.Parallel()
	for _, sh := range familyShapes() {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			f, ks := oneRetired(t, sh)
			names := bucketNames(10)
			calls := 0
			pace := func(ctx context.Context, n int) error {
				if calls++; calls == 2 {
					return f.c.Do(ctx, f.c.B().Hset().Key(f.registryKey()).FieldValue().FieldValue("1", keys.RegPrevious).Build()).Error()
				}
				return nil
			}
			res, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{Unlink: 4, Pace: pace, Buckets: names})
			if err != nil {
				t.Fatal(err)
			}
			wantResult(t, res, nil, map[int64]gens.Reason{1: gens.SkipChanged})
			if res.Keys != 4 {
				t.Errorf("result %+v: want the first chunk of 4 keys deleted", res)
			}
			gone := 0
			for _, k := range ks {
				if !redistest.Exists(t, f.c, k) {
					gone++
					f.forget(k)
				}
			}
			if gone != 4 {
				t.Errorf("%d keys deleted, want 4", gone)
			}
			f.check(map[string]string{keys.RegNext: "1", "1": keys.RegPrevious})
		})
	}
}

// TestSweepChunksAcrossPages gives the SCAN a COUNT of 2: the keys of
// several pages make one chunk, of exactly Unlink keys but the last.
func TestSweepChunksAcrossPages(t *testing.T) {
	t.Parallel()
	for _, sh := range familyShapes() {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			f, ks := oneRetired(t, sh)
			pace, sizes := chunkSizes()
			res, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{Unlink: 4, ScanCount: 2, Pace: pace})
			if err != nil {
				t.Fatal(err)
			}
			wantResult(t, res, []int64{1}, nil)
			if diff := cmp.Diff([]int{4, 4, 2}, sizes()); diff != "" {
				t.Errorf("chunk sizes (-want +got):\n%s", diff)
			}
			f.forget(ks...)
			f.check(map[string]string{keys.RegNext: "1"})
		})
	}
}

package gens_test

import (
	"context"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
)

// TestReviewManifestShrinks: the list changes while the sweep pages it.
func TestReviewManifestShrinks(t *testing.T) {
	for _, tc := range []struct {
		name string
		act  func(f *fixture, ctx context.Context) error
	}{
		{"list deleted mid-read", func(f *fixture, ctx context.Context) error {
			return f.c.Do(ctx, f.c.B().Del().Key(keys.ManifestListKey(f.idx.Live, f.cluster, 1)).Build()).Error()
		}},
		{"set deleted mid-read", func(f *fixture, ctx context.Context) error {
			return f.c.Do(ctx, f.c.B().Del().Key(keys.ManifestKey(f.idx.Live, f.cluster, 1)).Build()).Error()
		}},
		{"LPOP 10 mid-read", func(f *fixture, ctx context.Context) error {
			return f.c.Do(ctx, f.c.B().Lpop().Key(keys.ManifestListKey(f.idx.Live, f.cluster, 1)).Count(10).Build()).Error()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forShapes(t, func(t *testing.T, f *fixture) {
				if !f.trusts() {
					return
				}
				old := f.retiredOne(retired(time.Unix(1, 0)), 600)
				f.manifest(1, true, old[:300]...)
				f.sadd(keys.ManifestKey(f.idx.Live, f.cluster, 1), old[300:]...)
				calls := 0
				res, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{Pace: func(ctx context.Context, n int) error {
					calls++
					if calls == 1 {
						return tc.act(f, ctx)
					}
					return nil
				}})
				if err != nil {
					t.Fatal(err)
				}
				left := 0
				for _, k := range old {
					n, err := f.c.Do(context.Background(), f.c.B().Exists().Key(k).Build()).AsInt64()
					if err != nil {
						t.Fatal(err)
					}
					left += int(n)
				}
				field, _ := f.c.Do(context.Background(), f.c.B().Hexists().Key(f.registryKey()).Field("1").Build()).AsBool()
				t.Logf("removed=%v skipped=%v keys=%d; generation 1 keys left %d, field present %v", res.Removed, res.Skipped, res.Keys, left, field)
				if left > 0 && !field {
					t.Errorf("registry field of generation 1 removed while %d of its keys remain", left)
				}
			})
		})
	}
}

// TestReviewManifestCancelled: a pacer error after the first chunk leaves
// the field and the manifest, and the next sweep finishes with exact counts.
func TestReviewManifestCancelled(t *testing.T) {
	forShapes(t, func(t *testing.T, f *fixture) {
		if !f.trusts() {
			return
		}
		old := f.retiredOne(retired(time.Unix(1, 0)), 600)
		f.manifest(1, true, old...)
		f.sadd(keys.ManifestKey(f.idx.Live, f.cluster, 1), old[100:400]...)
		calls := 0
		_, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{Pace: func(ctx context.Context, n int) error {
			calls++
			if calls == 2 {
				return context.Canceled
			}
			return nil
		}})
		if err == nil {
			t.Fatal("no error")
		}
		field, _ := f.c.Do(context.Background(), f.c.B().Hexists().Key(f.registryKey()).Field("1").Build()).AsBool()
		ln, _ := f.c.Do(context.Background(), f.c.B().Llen().Key(keys.ManifestListKey(f.idx.Live, f.cluster, 1)).Build()).AsInt64()
		if !field || ln != 600 {
			t.Errorf("field %v list %d after the error", field, ln)
		}
		res, err := gens.Sweep(redistest.Ctx(t), f.c, f.idx, gens.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Keys != 600-256 {
			t.Errorf("second sweep Keys %d, want %d", res.Keys, 600-256)
		}
		f.forget(old[:256]...)
		f.wantOneRemoved(res, old[256:])
	})
}

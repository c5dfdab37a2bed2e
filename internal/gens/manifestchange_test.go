package gens_test

import (
	"context"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
)

// TestSweepManifestChangedWhileRead: the manifest of a retired generation
// changes while the sweep reads it (its list or its set evicted or
// deleted, members popped so that the pages shift): the last step, which
// removes the registry field, sees the list's length or the set's mark
// changed, and the sweep SCANs the generation instead, so that no key of
// it is left without the field that finds it (C99).
func TestSweepManifestChangedWhileRead(t *testing.T) {
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
				if left > 0 || field {
					t.Errorf("after the sweep (removed %v, skipped %v, %d keys): %d of generation 1's 600 keys left, its registry field present: %v; want every key and the field gone", res.Removed, res.Skipped, res.Keys, left, field)
				}
			})
		})
	}
}

// TestSweepManifestInterrupted: a pacer error after the first chunk leaves
// the field and the manifest, and the next sweep finishes, counting exactly
// the keys left (C99).
func TestSweepManifestInterrupted(t *testing.T) {
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
			t.Fatal("the sweep whose pacer failed returned no error")
		}
		field, _ := f.c.Do(context.Background(), f.c.B().Hexists().Key(f.registryKey()).Field("1").Build()).AsBool()
		ln, _ := f.c.Do(context.Background(), f.c.B().Llen().Key(keys.ManifestListKey(f.idx.Live, f.cluster, 1)).Build()).AsInt64()
		if !field || ln != 600 {
			t.Errorf("after the pacer's error: registry field present %v, list of %d; want the field and the list of 600 kept", field, ln)
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

package gens_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
)

// plainFamily writes, next to generation 1 of f's family, the family's
// buckets of the rename-in-place shape (n sets "<prefix>:p<i>") and keys
// under the prefix that are not its buckets: a string (another type),
// keyswap's own sets (a kept previous value, a generation's bucket), and a
// set under a longer prefix. It returns the plain buckets.
func plainFamily(f *fixture, n int) []string {
	f.t.Helper()
	p := f.idx.Live
	var plain []string
	for i := range n {
		k := p + ":p" + strconv.Itoa(i)
		f.sadd(k, "old")
		plain = append(plain, k)
	}
	f.set(p+":str", "another type")
	f.sadd(p+":p0"+keys.PrevSuffix, "kept for a rollback")
	f.sadd(p+"x:p0", "another prefix")
	f.sadd(p, "not a bucket")
	return plain
}

// TestDropPlainFamily switches a family to generations: without a pointer
// DropPlain refuses and deletes nothing; with one, it deletes exactly the
// family's plain buckets of its type, in chunks, and none of keyswap's own
// keys nor of another type or prefix.
func TestDropPlainFamily(t *testing.T) {
	t.Parallel()
	for _, sh := range []shape{{name: "standalone", family: true}, {name: "cluster", cluster: true, family: true, tagged: true}} {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, sh)
			ctx := redistest.Ctx(t)
			plain := plainFamily(f, 600)
			_, err := gens.DropPlain(ctx, f.c, f.idx, gens.Options{})
			redistest.WantErr(t, err, gens.ErrNoPointer)
			var kerr *protocol.Error
			if !errors.As(err, &kerr) || kerr.Key != f.idx.Live {
				t.Errorf("err = %v, want a protocol.Error naming %q", err, f.idx.Live)
			}
			f.check(nil)

			f.registry(keys.RegNext, "1", "1", keys.RegCurrent)
			f.set(f.pointerKey(), "1")
			f.gen(1, 3)
			var calls int
			res, err := gens.DropPlain(ctx, f.c, f.idx, gens.Options{Pace: func(ctx context.Context, n int) error {
				if n > gens.MaxUnlink {
					t.Errorf("a chunk of %d keys", n)
				}
				calls++
				return nil
			}})
			if err != nil {
				t.Fatal(err)
			}
			// The generation's buckets and the kept previous value are sets
			// under the prefix, and keyswap's own.
			if res.Keys != int64(len(plain)) || res.Kept != 4 || calls < 3 {
				t.Errorf("result %+v in %d chunks, want %d keys deleted, 4 kept, at least 3 chunks", res, calls, len(plain))
			}
			f.forget(plain...)
			f.check(map[string]string{keys.RegNext: "1", "1": keys.RegCurrent})
		})
	}
}

// TestDropPlainStopsWithoutPointer deletes the pointer while DropPlain
// runs, as a rename-in-place publish switching back would: the chunks
// after it are refused, and their keys stay.
func TestDropPlainStopsWithoutPointer(t *testing.T) {
	t.Parallel()
	f := newFixture(t, shape{family: true})
	plain := plainFamily(f, 500)
	f.registry(keys.RegNext, "1", "1", keys.RegCurrent)
	f.set(f.pointerKey(), "1")
	var calls atomic.Int32
	var first atomic.Int64 // the first chunk's keys: at most 100, as many as SCAN's pages gave
	res, err := gens.DropPlain(redistest.Ctx(t), f.c, f.idx, gens.Options{Unlink: 100, Pace: func(ctx context.Context, n int) error {
		switch calls.Add(1) {
		case 1:
			first.Store(int64(n))
		case 2:
			return f.c.Do(ctx, f.c.B().Del().Key(f.pointerKey()).Build()).Error()
		}
		return nil
	}})
	redistest.WantErr(t, err, gens.ErrNoPointer)
	if n := first.Load(); n < 1 || n > 100 || res.Keys != n {
		t.Errorf("%d keys deleted, want the first chunk's %d (1 to 100)", res.Keys, n)
	}
	f.forget(f.pointerKey())
	for _, k := range plain {
		if !redistest.Exists(t, f.c, k) {
			f.forget(k)
		}
	}
	if left, want := len(f.want), len(plain)-int(first.Load())+4; left != want {
		t.Errorf("%d keys left, want %d", left, want)
	}
	f.check(map[string]string{keys.RegNext: "1", "1": keys.RegCurrent})
}

// TestDropPlainKey deletes a plain index's live key only once its pointer
// exists.
func TestDropPlainKey(t *testing.T) {
	t.Parallel()
	for _, sh := range []shape{{name: "standalone"}, {name: "cluster", cluster: true}, {name: "cluster-tagged", cluster: true, tagged: true}} {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, sh)
			ctx := redistest.Ctx(t)
			f.sadd(f.idx.Live, "old")
			_, err := gens.DropPlain(ctx, f.c, f.idx, gens.Options{})
			redistest.WantErr(t, err, gens.ErrNoPointer)
			f.check(nil)

			f.registry(keys.RegNext, "1", "1", keys.RegCurrent)
			f.set(f.pointerKey(), "1")
			f.gen(1, 1)
			res, err := gens.DropPlain(ctx, f.c, f.idx, gens.Options{})
			if err != nil || res.Keys != 1 {
				t.Fatalf("DropPlain = %+v, %v; want 1 key deleted", res, err)
			}
			f.forget(f.idx.Live)
			f.check(map[string]string{keys.RegNext: "1", "1": keys.RegCurrent})
		})
	}
}

// TestDropPlainRefuses checks what DropPlain refuses or skips before
// deleting anything: a family without its type, a corrupt pointer, and an
// untagged family on a cluster, which never had the plain shape there.
func TestDropPlainRefuses(t *testing.T) {
	t.Parallel()
	t.Run("no type", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, shape{family: true})
		plainFamily(f, 2)
		f.registry(keys.RegNext, "1", "1", keys.RegCurrent)
		f.set(f.pointerKey(), "1")
		idx := f.idx
		idx.Type = ""
		if _, err := gens.DropPlain(redistest.Ctx(t), f.c, idx, gens.Options{}); err == nil {
			t.Error("DropPlain without a type: nil error")
		}
		f.check(map[string]string{keys.RegNext: "1", "1": keys.RegCurrent})
	})
	t.Run("corrupt pointer", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, shape{family: true})
		plainFamily(f, 2)
		f.registry(keys.RegNext, "1", "1", keys.RegPrevious)
		f.set(f.pointerKey(), "1")
		_, err := gens.DropPlain(redistest.Ctx(t), f.c, f.idx, gens.Options{})
		redistest.WantErr(t, err, gens.ErrCorrupt)
		f.check(map[string]string{keys.RegNext: "1", "1": keys.RegPrevious})
	})
	t.Run("untagged on a cluster", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, shape{cluster: true, family: true})
		plainFamily(f, 2)
		f.registry(keys.RegNext, "1", "1", keys.RegCurrent)
		f.set(f.pointerKey(), "1")
		res, err := gens.DropPlain(redistest.Ctx(t), f.c, f.idx, gens.Options{})
		if err != nil || res.Keys != 0 || res.Note == "" {
			t.Errorf("DropPlain = %+v, %v; want nothing deleted, and a note", res, err)
		}
		f.check(map[string]string{keys.RegNext: "1", "1": keys.RegCurrent})
	})
}

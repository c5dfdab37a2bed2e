package reader_test

import (
	"context"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/reader"
	"github.com/redis/rueidis"
)

// BenchmarkRead compares an HGET of a generation's key sent directly with
// the same read through a Reader: with the pointer cached (no extra round
// trip), on a client without client-side caching (a GET of the pointer
// first), and right after a flip (the invalidation received, so the
// pointer is fetched again). Run it with
//
//	go test -run '^$' -bench BenchmarkRead -benchtime 20000x ./reader/
func BenchmarkRead(b *testing.B) {
	ctx := context.Background()
	p := redistest.Prefix(b)
	live, ptr := p+"by-email", keys.PointerKey(p+"by-email", false)
	other := env.Standalone.Client(b)
	for _, g := range []int64{1, 2} {
		redistest.Cmd(b, other, "HSET", keys.GenKey(live, g), "ada", "1")
	}
	redistest.Cmd(b, other, "SET", ptr, "1")
	invalidated := make(chan struct{}, 1)
	client := func(edit func(*rueidis.ClientOption)) rueidis.Client {
		opt := rueidis.ClientOption{InitAddress: []string{env.Standalone.Addr}, ForceSingleClient: true,
			OnInvalidations: func([]rueidis.RedisMessage) {
				select {
				case invalidated <- struct{}{}:
				default:
				}
			}}
		if edit != nil {
			edit(&opt)
		}
		c, err := rueidis.NewClient(opt)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		return c
	}
	hget := func(b *testing.B, r *reader.Reader) {
		if v, ok, err := r.HGet(ctx, reader.Plain(live), "ada"); err != nil || !ok || v != "1" {
			b.Fatalf("HGet = %q, %v, %v", v, ok, err)
		}
	}

	b.Run("direct", func(b *testing.B) {
		c := client(nil)
		key := keys.GenKey(live, 1)
		for b.Loop() {
			if v, err := c.Do(ctx, c.B().Hget().Key(key).Field("ada").Build()).ToString(); err != nil || v != "1" {
				b.Fatalf("HGET = %q, %v", v, err)
			}
		}
	})
	b.Run("reader/cached", func(b *testing.B) {
		r := newReader(b, client(nil), reader.Options{})
		hget(b, r)
		for b.Loop() {
			hget(b, r)
		}
	})
	b.Run("reader/key-cached", func(b *testing.B) { // the resolve alone: no round trip
		r := newReader(b, client(nil), reader.Options{})
		hget(b, r)
		for b.Loop() {
			if _, err := r.Key(ctx, live); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reader/no-cache", func(b *testing.B) {
		r := newReader(b, client(func(o *rueidis.ClientOption) { o.DisableCache = true }), reader.Options{})
		for b.Loop() {
			hget(b, r)
		}
	})
	b.Run("reader/after-flip", func(b *testing.B) {
		r := newReader(b, client(nil), reader.Options{})
		gen := "1"
		for b.Loop() {
			b.StopTimer()
			hget(b, r) // the pointer is cached, and tracked
			select {
			case <-invalidated: // an earlier one, not this flip's
			default:
			}
			gen = map[string]string{"1": "2", "2": "1"}[gen]
			redistest.Cmd(b, other, "SET", ptr, gen)
			select {
			case <-invalidated:
			case <-time.After(10 * time.Second):
				b.Fatal("no invalidation 10 s after the flip")
			}
			b.StartTimer()
			hget(b, r)
		}
	})
}

// BenchmarkReadCluster is BenchmarkRead's cached reads on the cluster, for
// a name no other live key can share a base with (a hash tag of its own)
// and one that can (an untagged name, SPEC C104), whose resolve reads the
// owner stamp beside the pointer. Run it with
//
//	go test -run '^$' -bench BenchmarkReadCluster -benchtime 20000x ./reader/
func BenchmarkReadCluster(b *testing.B) {
	ctx := context.Background()
	p := redistest.Prefix(b)
	other := env.Cluster.Client(b)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: env.Cluster.Addrs})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	for _, name := range []struct{ name, live string }{
		{"tagged", p + "{users}:by-email"},
		{"untagged", p + "by-email"},
	} {
		live := name.live
		redistest.Cmd(b, other, "HSET", keys.GenKey(live, 1), "ada", "1")
		redistest.Cmd(b, other, "SET", keys.PointerKey(live, true), "1")
		if keys.Aliasable(live, true) {
			redistest.Cmd(b, other, "SET", keys.OwnerKey(live, true), live)
		}
		r := newReader(b, c, reader.Options{})
		hget := func(b *testing.B) {
			if v, ok, err := r.HGet(ctx, reader.Plain(live), "ada"); err != nil || !ok || v != "1" {
				b.Fatalf("HGet = %q, %v, %v", v, ok, err)
			}
		}
		b.Run(name.name+"/cached", func(b *testing.B) {
			hget(b)
			for b.Loop() {
				hget(b)
			}
		})
		b.Run(name.name+"/key-cached", func(b *testing.B) { // the resolve alone: no round trip
			hget(b)
			for b.Loop() {
				if _, err := r.Key(ctx, live); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package reader_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/reader"
	"github.com/redis/rueidis"
)

// An index without a pointer is in the rename-in-place shape: the reader
// reads its live key, and a family's buckets at "<prefix>:<bucket>".
func TestPlainShapeWithoutPointer(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		plain := tg.gen(0, "1", 10)
		plain.write(t, tg.other)
		before := tg.snapshot(t)

		r := newReader(t, tg.client(t, nil), reader.Options{})
		if got, err := r.Key(ctx, tg.live); err != nil || got != tg.live {
			t.Errorf("Key = %q, %v; want %q", got, err, tg.live)
		}
		if got, err := r.Bucket(ctx, tg.family, "uk"); err != nil || got != tg.family+":uk" {
			t.Errorf("Bucket = %q, %v; want %q", got, err, tg.family+":uk")
		}
		wantData(t, ctx, r, tg, plain)
		if !r.Cached() {
			t.Error("Cached() = false on a client with client-side caching")
		}
		tg.wantUnchanged(t, before)
	})
}

// With a pointer, the reader reads the generation it names and never the
// plain keys.
func TestPointerNamesGeneration(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		tg.gen(0, "plain", 1).write(t, tg.other)
		g7 := tg.gen(7, "seven", 70)
		g7.write(t, tg.other)
		for _, live := range []string{tg.live, tg.live + "/z", tg.family} {
			tg.setPtr(t, live, "7")
		}
		before := tg.snapshot(t)

		r := newReader(t, tg.client(t, nil), reader.Options{})
		if got, err := r.Key(ctx, tg.live); err != nil || got != keys.GenKey(tg.live, 7) {
			t.Errorf("Key = %q, %v; want %q", got, err, keys.GenKey(tg.live, 7))
		}
		if got, err := r.Bucket(ctx, tg.family, "uk"); err != nil || got != keys.GenBucketKey(tg.family, 7, "uk") {
			t.Errorf("Bucket = %q, %v; want %q", got, err, keys.GenBucketKey(tg.family, 7, "uk"))
		}
		if got, err := r.Resolve(ctx, reader.InBucket(tg.family, "fr")); err != nil || got != keys.GenBucketKey(tg.family, 7, "fr") {
			t.Errorf("Resolve fr = %q, %v; want %q", got, err, keys.GenBucketKey(tg.family, 7, "fr"))
		}
		wantData(t, ctx, r, tg, g7)
		tg.wantUnchanged(t, before)
	})
}

// A flip (SET of the pointer by another client) reaches the reader through
// Redis's invalidation; while the pointer is cached, resolving it sends
// nothing.
func TestFollowsFlip(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		tg.twoGenerations(t)

		wire := &wireCounter{needle: tg.ptr(tg.live)}
		c := tg.client(t, func(o *rueidis.ClientOption) { o.DialCtxFn = wire.dial })
		r := newReader(t, c, reader.Options{CacheTTL: time.Minute})
		hash := reader.Plain(tg.live)
		if v, ok, err := r.HGet(ctx, hash, "ada"); err != nil || !ok || v != "one" {
			t.Fatalf("HGet before the flip = %q, %v, %v; want one", v, ok, err)
		}
		sent := wire.count()
		if sent == 0 {
			t.Fatal("the first resolve sent nothing that names the pointer")
		}
		for range 100 {
			if got, err := r.Key(ctx, tg.live); err != nil || got != keys.GenKey(tg.live, 1) {
				t.Fatalf("Key = %q, %v; want generation 1", got, err)
			}
		}
		if v, ok, err := r.HGet(ctx, hash, "ada"); err != nil || !ok || v != "one" {
			t.Fatalf("HGet = %q, %v, %v; want one", v, ok, err)
		}
		if n := wire.count(); n != sent {
			t.Errorf("the cached pointer was sent %d more times", n-sent)
		}
		if !r.Cached() {
			t.Error("Cached() = false on a client with client-side caching")
		}

		tg.setPtr(t, tg.live, "2") // the flip
		deadline := time.Now().Add(10 * time.Second)
		for {
			v, ok, err := r.HGet(ctx, hash, "ada")
			if err != nil || !ok {
				t.Fatalf("HGet during the flip = %q, %v, %v", v, ok, err)
			}
			if v == "two" {
				break
			}
			if v != "one" {
				t.Fatalf("HGet during the flip = %q; want one or two", v)
			}
			if time.Now().After(deadline) {
				t.Fatal("the reader still reads generation 1 10 s after the flip")
			}
		}
		if got, err := r.Key(ctx, tg.live); err != nil || got != keys.GenKey(tg.live, 2) {
			t.Errorf("Key after the flip = %q, %v; want generation 2", got, err)
		}
		sent = wire.count()
		for range 100 {
			if _, err := r.Key(ctx, tg.live); err != nil {
				t.Fatal(err)
			}
		}
		if n := wire.count(); n != sent {
			t.Errorf("the new cached pointer was sent %d more times", n-sent)
		}
	})
}

// A cached generation can be stale when an invalidation is lost: the
// client below tracks in broadcast mode for a prefix no key has, so it
// never hears of a flip. A typed read that finds the stale generation's
// data missing (it was swept) rechecks the pointer without the cache and
// reads the current generation; an answer that is empty in the current
// generation too costs that one recheck and no second read.
func TestMissingDataRechecksPointer(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		g1, g2 := tg.gen(1, "one", 1), tg.gen(2, "two", 2)
		g1.write(t, tg.other)
		lives := []string{tg.live, tg.live + "/z", tg.family}
		for _, live := range lives {
			tg.setPtr(t, live, "1")
		}
		c := tg.client(t, func(o *rueidis.ClientOption) {
			o.ClientTrackingOptions = []string{"PREFIX", "ks-no-such-prefix:", "BCAST"}
		})
		rec := &recorder{}
		r := newReader(t, rec.wrap(c), reader.Options{CacheTTL: time.Minute})
		wantData(t, ctx, r, tg, g1) // caches every pointer at 1
		rec.take()

		// A flip the reader's cache misses, then the sweep of generation 1.
		g2.write(t, tg.other)
		for _, live := range lives {
			tg.setPtr(t, live, "2")
		}
		g1.remove(t, tg.other)
		before := tg.snapshot(t)
		if got, err := r.Key(ctx, tg.live); err != nil || got != keys.GenKey(tg.live, 1) {
			t.Fatalf("Key = %q, %v; want the stale generation 1 (the cache must miss the flip for this test)", got, err)
		}

		if v, ok, err := r.HGet(ctx, reader.Plain(tg.live), "ada"); err != nil || !ok || v != "two" {
			t.Errorf("HGet ada = %q, %v, %v; want two", v, ok, err)
		}
		want := []string{
			"HGET " + g1.hash + " ada",
			tg.get(tg.live),
			"HGET " + g2.hash + " ada",
		}
		if got := rec.take(); !slices.Equal(got, want) {
			t.Errorf("HGet sent %q; want %q", got, want)
		}
		if ok, err := r.SIsMember(ctx, reader.InBucket(tg.family, "uk"), "bob"); err != nil || !ok {
			t.Errorf("SIsMember bob = %v, %v; want true", ok, err)
		}
		if m, err := r.SMembers(ctx, reader.InBucket(tg.family, "uk")); err != nil || len(m) != 2 {
			t.Errorf("SMembers = %v, %v; want ada and bob", m, err)
		}
		if s, ok, err := r.ZScore(ctx, reader.Plain(tg.live+"/z"), "ada"); err != nil || !ok || s != 2 {
			t.Errorf("ZScore ada = %v, %v, %v; want 2", s, ok, err)
		}
		if zs, err := r.ZRevRange(ctx, reader.Plain(tg.live+"/z"), 0, 0); err != nil || len(zs) != 1 || zs[0].Member != "bob" {
			t.Errorf("ZRevRange 0 0 = %v, %v; want bob", zs, err)
		}
		if now, changed, err := r.Recheck(ctx, reader.Plain(tg.live), keys.GenKey(tg.live, 1)); err != nil || !changed || now != g2.hash {
			t.Errorf("Recheck = %q, %v, %v; want %q, true", now, changed, err, g2.hash)
		}
		// The cache stays stale until its TTL, but the recheck's generation
		// wins over it: a read goes to generation 2 at once, and a missing
		// field costs one recheck, no read of generation 1.
		rec.take()
		if got, err := r.Key(ctx, tg.live); err != nil || got != g2.hash {
			t.Errorf("Key after a recheck = %q, %v; want %q", got, err, g2.hash)
		}
		if v, ok, err := r.HGet(ctx, reader.Plain(tg.live), "ada"); err != nil || !ok || v != "two" {
			t.Errorf("HGet ada = %q, %v, %v; want two", v, ok, err)
		}
		if v, ok, err := r.HGet(ctx, reader.Plain(tg.live), "nobody"); err != nil || ok || v != "" {
			t.Errorf("HGet nobody = %q, %v, %v; want not found", v, ok, err)
		}
		want = []string{"HGET " + g2.hash + " ada", "HGET " + g2.hash + " nobody", tg.get(tg.live)}
		if got := rec.take(); !slices.Equal(got, want) {
			t.Errorf("HGets after a recheck, the cache stale, sent %q; want %q", got, want)
		}

		// With a current cache, an answer missing in the current generation
		// costs one recheck and no second read.
		fresh := newReader(t, rec.wrap(tg.client(t, nil)), reader.Options{})
		if got, err := fresh.Key(ctx, tg.live); err != nil || got != g2.hash {
			t.Fatalf("Key = %q, %v; want %q", got, err, g2.hash)
		}
		rec.take()
		if v, ok, err := fresh.HGet(ctx, reader.Plain(tg.live), "nobody"); err != nil || ok || v != "" {
			t.Errorf("HGet nobody = %q, %v, %v; want not found", v, ok, err)
		}
		want = []string{"HGET " + g2.hash + " nobody", tg.get(tg.live)}
		if got := rec.take(); !slices.Equal(got, want) {
			t.Errorf("HGet of a missing field sent %q; want %q", got, want)
		}
		tg.wantUnchanged(t, before)
	})
}

// The generation a recheck reads wins over the stale cached one only while
// the cache serves that stale reply: a later recheck that finds the
// pointer back at the cached generation (a rollback the cache missed too)
// ends it, and so does the end of the stale reply's TTL, even when the
// reply the cache fetches then names the stale generation again. The
// client's invalidations are lost, as in TestMissingDataRechecksPointer.
func TestRecheckOverrideEnds(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		g1, g2 := tg.twoGenerations(t)
		ptr := tg.ptr(tg.live)
		lost := func(o *rueidis.ClientOption) {
			o.ClientTrackingOptions = []string{"PREFIX", "ks-no-such-prefix:", "BCAST"}
		}
		rec := &recorder{}
		hget := func(r *reader.Reader, field, want string, sent ...string) {
			t.Helper()
			if v, ok, err := r.HGet(ctx, reader.Plain(tg.live), field); err != nil || ok != (want != "") || v != want {
				t.Errorf("HGet %s = %q, %v, %v; want %q", field, v, ok, err, want)
			}
			if got := rec.take(); !slices.Equal(got, sent) {
				t.Errorf("HGet %s sent %q; want %q", field, got, sent)
			}
		}
		wantKey := func(r *reader.Reader, want string) {
			t.Helper()
			if got, err := r.Key(ctx, tg.live); err != nil || got != want {
				t.Errorf("Key = %q, %v; want %q", got, err, want)
			}
		}

		// A rollback the cache misses.
		r := newReader(t, rec.wrap(tg.client(t, lost)), reader.Options{CacheTTL: time.Minute})
		wantKey(r, g1.hash)
		redistest.Cmd(t, tg.other, "SET", ptr, "2")
		rec.take()
		hget(r, "nobody", "", "HGET "+g1.hash+" nobody", tg.get(tg.live), "HGET "+g2.hash+" nobody")
		wantKey(r, g2.hash)
		redistest.Cmd(t, tg.other, "SET", ptr, "1")
		hget(r, "nobody", "", "HGET "+g2.hash+" nobody", tg.get(tg.live), "HGET "+g1.hash+" nobody")
		wantKey(r, g1.hash)
		hget(r, "ada", "one", "HGET "+g1.hash+" ada")

		// The stale reply's TTL ends; the cache fetches the pointer again,
		// back at the stale generation.
		const ttl = 3 * time.Second
		c := tg.client(t, lost)
		r = newReader(t, rec.wrap(c), reader.Options{CacheTTL: ttl})
		wantKey(r, g1.hash)
		redistest.Cmd(t, tg.other, "SET", ptr, "2")
		rec.take()
		hget(r, "nobody", "", "HGET "+g1.hash+" nobody", tg.get(tg.live), "HGET "+g2.hash+" nobody")
		if v, err := c.DoCache(ctx, c.B().Get().Key(ptr).Cache(), ttl).ToString(); err != nil || v != "1" {
			t.Fatalf("cached pointer = %q, %v; want the stale 1 (the cache must keep it for this test)", v, err)
		}
		wantKey(r, g2.hash)
		redistest.Cmd(t, tg.other, "SET", ptr, "1")
		start := time.Now()
		poll := time.NewTicker(10 * time.Millisecond)
		defer poll.Stop()
		for got, _ := r.Key(ctx, tg.live); got != g1.hash; got, _ = r.Key(ctx, tg.live) {
			if got != g2.hash || time.Since(start) > 10*ttl {
				t.Fatalf("Key = %q %v after the flip back; want %q once the stale reply's TTL (%v) ends", got, time.Since(start), g1.hash, ttl)
			}
			<-poll.C
		}
		rec.take()
		hget(r, "ada", "one", "HGET "+g1.hash+" ada")
	})
}

// A pointer that holds anything but a positive decimal number fails every
// read with ErrBadPointer, in an error that names the pointer and quotes
// its value; the reader falls back to no shape and writes nothing.
func TestBadPointer(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		tg.gen(0, "plain", 1).write(t, tg.other)
		uncached := newReader(t, tg.other, reader.Options{})
		ptr := tg.ptr(tg.live)
		tg.setPtr(t, tg.live, "1") // the owner stamp, where there is one
		long := strings.Repeat("9", 200)
		for _, v := range []string{"", "0", "00", "-1", "+1", "01", " 1", "1 ", "1.5", "1e3", "0x10", "abc", "9223372036854775808", long} {
			redistest.Cmd(t, tg.other, "SET", ptr, v)
			before := tg.snapshot(t)
			// A new caching client each time, so that its first resolve
			// reads the value just set.
			cached := newReader(t, tg.client(t, nil), reader.Options{})
			for name, r := range map[string]*reader.Reader{"cached": cached, "uncached": uncached} {
				_, err := r.Key(ctx, tg.live)
				wantBadPointer(t, name+" Key", err, "resolve", ptr, v)
				_, _, err = r.HGet(ctx, reader.Plain(tg.live), "ada")
				wantBadPointer(t, name+" HGet", err, "resolve", ptr, v)
				_, _, err = r.Recheck(ctx, reader.Plain(tg.live), tg.live)
				wantBadPointer(t, name+" Recheck", err, "recheck", ptr, v)
			}
			if got, ok := redistest.Get(t, tg.other, ptr); !ok || got != v {
				t.Errorf("pointer = %q, %v after the reads; want %q", got, ok, v)
			}
			tg.wantUnchanged(t, before)
		}

		// A pointer of the wrong type is Redis's error, naming the pointer.
		redistest.Cmd(t, tg.other, "DEL", ptr)
		redistest.Cmd(t, tg.other, "HSET", ptr, "gen", "1")
		_, err := newReader(t, tg.client(t, nil), reader.Options{}).Key(ctx, tg.live)
		var e *reader.Error
		if !errors.As(err, &e) || e.Key != ptr || e.Op != "resolve" || errors.Is(err, reader.ErrBadPointer) ||
			!strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("Key with a hash at the pointer: %v; want a WRONGTYPE *reader.Error naming %s", err, ptr)
		}
	})
}

// wantBadPointer fails t unless err is ErrBadPointer in an *Error of op on
// ptr whose message quotes value (its first 64 bytes).
func wantBadPointer(t *testing.T, what string, err error, op, ptr, value string) {
	t.Helper()
	var e *reader.Error
	if !errors.Is(err, reader.ErrBadPointer) || !errors.As(err, &e) || e.Op != op || e.Key != ptr {
		t.Errorf("%s with pointer %q: %v; want ErrBadPointer in an *Error of op %s on %s", what, value, err, op, ptr)
		return
	}
	quoted := value
	if len(quoted) > 64 {
		quoted = quoted[:64]
	}
	if !strings.Contains(err.Error(), `"`+quoted) {
		t.Errorf("%s: %q does not quote the pointer's value %q", what, err, value)
	}
}

// Cached tells a client with client-side caching from one without it:
// DisableCache, which AlwaysRESP2 requires (rueidis refuses to connect
// otherwise), sends every resolve as a GET. A server that refuses the
// MULTI of a cached read is read without the cache too.
func TestCachedReportsClientTracking(t *testing.T) {
	tg := targets(t)[0]
	ctx := redistest.Ctx(t)
	redistest.Cmd(t, tg.other, "SET", tg.ptr(tg.live), "3")
	check := func(name string, r *reader.Reader, want bool) {
		t.Helper()
		if r.Cached() {
			t.Errorf("%s: Cached() = true before any resolve", name)
		}
		if got, err := r.Key(ctx, tg.live); err != nil || got != keys.GenKey(tg.live, 3) {
			t.Errorf("%s: Key = %q, %v; want generation 3", name, got, err)
		}
		if r.Cached() != want {
			t.Errorf("%s: Cached() = %v; want %v", name, r.Cached(), want)
		}
	}
	check("default", newReader(t, tg.client(t, nil), reader.Options{}), true)
	check("DisableCache", newReader(t, tg.client(t, func(o *rueidis.ClientOption) { o.DisableCache = true }), reader.Options{}), false)
	check("AlwaysRESP2", newReader(t, tg.client(t, func(o *rueidis.ClientOption) {
		o.DisableCache, o.AlwaysRESP2 = true, true
	}), reader.Options{}), false)
	if _, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: tg.addrs, AlwaysRESP2: true}); !errors.Is(err, rueidis.ErrNoCache) {
		t.Errorf("rueidis connected with AlwaysRESP2 and a cache: %v", err)
	}

	srv := redistest.OwnServer(t, "--rename-command", "MULTI", "")
	c := srv.Client(t)
	redistest.Cmd(t, c, "SET", keys.PointerKey(tg.live, false), "4")
	own := target{addrs: []string{srv.Addr}, live: tg.live}
	wire := &wireCounter{needle: keys.PointerKey(tg.live, false)}
	r := newReader(t, own.client(t, func(o *rueidis.ClientOption) { o.DialCtxFn = wire.dial }), reader.Options{})
	for i := range 3 {
		if got, err := r.Key(ctx, tg.live); err != nil || got != keys.GenKey(tg.live, 4) {
			t.Errorf("without MULTI: Key = %q, %v; want generation 4", got, err)
		}
		if i == 0 {
			wire.reset()
		}
	}
	if r.Cached() {
		t.Error("without MULTI: Cached() = true")
	}
	// PTTL and GET in the refused MULTI, then a GET: the first resolve
	// only; the next ones send one GET each.
	if n := wire.count(); n != 2 {
		t.Errorf("without MULTI: two more resolves named the pointer %d times on the wire; want 2 (one GET each)", n)
	}
}

// New refuses a nil client and a negative TTL, and defaults the TTL.
func TestNewOptions(t *testing.T) {
	if _, err := reader.New(nil, reader.Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
	c := env.Standalone.Client(t)
	if _, err := reader.New(c, reader.Options{CacheTTL: -time.Second}); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("New with a negative CacheTTL: %v", err)
	}
	if r := newReader(t, c, reader.Options{}); r.CacheTTL() != reader.DefaultCacheTTL {
		t.Errorf("CacheTTL() = %v; want %v", r.CacheTTL(), reader.DefaultCacheTTL)
	}
	if got := reader.InBucket("users:by-country", "uk").String(); got != "users:by-country:uk" {
		t.Errorf("InBucket.String() = %q", got)
	}
}

// A read fails with an *Error that names the step and the key: a data key
// of another type (Redis's WRONGTYPE, on the data key), a pointer found
// broken by the recheck of a missing key, a closed client (standalone).
func TestReadErrors(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		g1 := tg.gen(1, "one", 1)
		redistest.Cmd(t, tg.other, "SADD", g1.hash, "not-a-hash")
		tg.setPtr(t, tg.live, "1")
		c := tg.client(t, func(o *rueidis.ClientOption) {
			o.ClientTrackingOptions = []string{"PREFIX", "ks-no-such-prefix:", "BCAST"}
		})
		r := newReader(t, c, reader.Options{CacheTTL: time.Minute})
		_, _, err := r.HGet(ctx, reader.Plain(tg.live), "ada")
		var e *reader.Error
		if !errors.As(err, &e) || e.Op != "hget" || e.Key != g1.hash || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("HGet of a set: %v; want a WRONGTYPE *reader.Error of op hget on %s", err, g1.hash)
		}

		// The cached pointer says 1; generation 1 is gone and the pointer
		// now holds garbage, which only the recheck reads.
		redistest.Cmd(t, tg.other, "DEL", g1.hash)
		redistest.Cmd(t, tg.other, "SET", tg.ptr(tg.live), "1x")
		before := tg.snapshot(t)
		_, _, err = r.HGet(ctx, reader.Plain(tg.live), "ada")
		wantBadPointer(t, "HGet with a stale cache", err, "recheck", tg.ptr(tg.live), "1x")
		tg.wantUnchanged(t, before)

		if tg.cluster {
			return // rueidis's cluster client may still answer after Close
		}
		c.Close()
		if _, err := r.Key(ctx, tg.live+"-other"); !errors.As(err, &e) || e.Op != "resolve" || !errors.Is(err, rueidis.ErrClosing) {
			t.Errorf("Key on a closed client: %v; want ErrClosing in an *Error of op resolve", err)
		}
	})
}

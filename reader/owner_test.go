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

// owners holds two indexes, x and y, each with its plain key and its
// generation 1 written, and y's pointer set to 1. On the cluster with
// untagged names, x and y = "{x}" share that pointer (SPEC C104), and the
// owner stamp of their base says whose it is; elsewhere each has its own
// pointer and no stamp is read.
type owners struct {
	x, y, stamp string
	shared      bool
}

func newOwners(t *testing.T, tg target) owners {
	t.Helper()
	x := tg.prefix + "own"
	if tg.name == "cluster/tagged" {
		return ownersOf(t, tg, tg.prefix+"{own}:a", tg.prefix+"{own}:b")
	}
	return ownersOf(t, tg, x, "{"+x+"}")
}

// ownersOf is newOwners of x and y.
func ownersOf(t *testing.T, tg target, x, y string) owners {
	t.Helper()
	o := owners{x: x, y: y}
	o.stamp = keys.OwnerKey(o.y, tg.cluster)
	o.shared = tg.ptr(o.x) == tg.ptr(o.y)
	if o.shared != (tg.name == "cluster/untagged") || o.shared != keys.Aliasable(o.x, tg.cluster) {
		t.Fatalf("%s and %s share a pointer: %v, on %s", o.x, o.y, o.shared, tg.name)
	}
	for _, live := range []string{o.x, o.y} {
		redistest.Cmd(t, tg.other, "HSET", live, "ada", live+" plain")
		redistest.Cmd(t, tg.other, "HSET", keys.GenKey(live, 1), "ada", live+" 1")
	}
	redistest.Cmd(t, tg.other, "SET", tg.ptr(o.y), "1")
	return o
}

// setStamp puts the owner stamp (and, where x's differs, x's) in the
// state set writes with c.
func (o owners) setStamp(t *testing.T, tg target, set func(stamp string)) {
	t.Helper()
	set(o.stamp)
	if s := keys.OwnerKey(o.x, tg.cluster); s != o.stamp {
		set(s)
	}
}

// Where two indexes share a pointer, the owner stamp of their base decides
// whose it is, through the cache and without: the index it names follows
// the pointer, the other reads its plain key (it rebuilds in place), and
// with no stamp, one of another type, or one naming neither, both fail
// with ErrBadPointer naming the stamp. Elsewhere the stamp's key is never
// read: y follows its pointer and x, with none, reads its plain key.
func TestOwnerStamp(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		o := newOwners(t, tg)
		uncached := newReader(t, tg.other, reader.Options{})
		for _, c := range []struct {
			name   string
			set    func(stamp string)
			owner  string // the index whose pointer it is; "" for an error
			errHas string
		}{
			{"names {X}", func(s string) { redistest.Cmd(t, tg.other, "SET", s, o.y) }, o.y, ""},
			{"names X", func(s string) { redistest.Cmd(t, tg.other, "SET", s, o.x) }, o.x, ""},
			{"absent", func(s string) { redistest.Cmd(t, tg.other, "DEL", s) }, "", "is absent"},
			{"another type", func(s string) {
				redistest.Cmd(t, tg.other, "DEL", s)
				redistest.Cmd(t, tg.other, "HSET", s, "owner", o.x)
			}, "", "WRONGTYPE"},
			{"names neither", func(s string) { redistest.Cmd(t, tg.other, "SET", s, tg.prefix+"nobody") }, "", "neither"},
		} {
			t.Run(c.name, func(t *testing.T) {
				o.setStamp(t, tg, c.set)
				before := tg.snapshot(t)
				owner, errHas := c.owner, c.errHas
				if !o.shared {
					owner, errHas = o.y, ""
				}
				cached := newReader(t, tg.client(t, nil), reader.Options{})
				for rname, r := range map[string]*reader.Reader{"cached": cached, "uncached": uncached} {
					for _, live := range []string{o.x, o.y} {
						wantKey, wantValue := live, live+" plain"
						if live == owner {
							wantKey, wantValue = keys.GenKey(live, 1), live+" 1"
						}
						check := func(what, op, got string, err error) {
							t.Helper()
							if errHas != "" {
								var e *reader.Error
								if !errors.Is(err, reader.ErrBadPointer) || !errors.As(err, &e) || e.Op != op || e.Key != o.stamp ||
									!strings.Contains(err.Error(), errHas) || !strings.Contains(err.Error(), "SET "+o.stamp+" ") {
									t.Errorf("%s %s(%s) = %q, %v; want ErrBadPointer in an *Error of op %s on %s saying %q and how to SET it", rname, what, live, got, err, op, o.stamp, errHas)
								}
								return
							}
							if err != nil || got != wantKey && got != wantValue {
								t.Errorf("%s %s(%s) = %q, %v; want %q", rname, what, live, got, err, wantKey)
							}
						}
						got, err := r.Key(ctx, live)
						check("Key", "resolve", got, err)
						v, _, err := r.HGet(ctx, reader.Plain(live), "ada")
						check("HGet", "resolve", v, err)
						if v != "" && v != wantValue {
							t.Errorf("%s HGet(%s) = %q; want %q", rname, live, v, wantValue)
						}
						now, _, err := r.Recheck(ctx, reader.Plain(live), live)
						check("Recheck", "recheck", now, err)
					}
				}
				tg.wantUnchanged(t, before)
			})
		}
	})
}

// A cached reader follows a change of the owner stamp (SET or DEL by an
// operator) within its invalidation, as it follows a flip, and resolves a
// cached pointer and stamp without sending either. With invalidations
// lost, Recheck reads the stamp from the server, and later resolves use
// what it read until the cache drops the stale pair.
func TestOwnerStampCache(t *testing.T) {
	tg := targets(t)[1] // cluster/untagged: the names that share a base
	ctx := redistest.Ctx(t)
	o := newOwners(t, tg)
	redistest.Cmd(t, tg.other, "SET", o.stamp, o.y)
	wire := &wireCounter{needle: o.stamp}
	r := newReader(t, tg.client(t, func(opt *rueidis.ClientOption) { opt.DialCtxFn = wire.dial }), reader.Options{CacheTTL: time.Minute})
	wantKey := func(want string) {
		t.Helper()
		if got, err := r.Key(ctx, o.x); err != nil || got != want {
			t.Fatalf("Key = %q, %v; want %q", got, err, want)
		}
	}
	wantKey(o.x)
	sent := wire.count()
	for range 100 {
		wantKey(o.x)
	}
	if n := wire.count(); sent == 0 || n != sent {
		t.Errorf("the stamp was sent %d times by the first resolve and %d more by 100 cached ones; want some, then none", sent, n-sent)
	}
	poll := func(what string, done func(got string, err error) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := r.Key(ctx, o.x)
			if done(got, err) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("Key = %q, %v 10 s after %s", got, err, what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	redistest.Cmd(t, tg.other, "SET", o.stamp, o.x)
	poll("SET of the stamp to X", func(got string, err error) bool { return err == nil && got == keys.GenKey(o.x, 1) })
	redistest.Cmd(t, tg.other, "DEL", o.stamp)
	poll("DEL of the stamp", func(_ string, err error) bool { return errors.Is(err, reader.ErrBadPointer) })
	redistest.Cmd(t, tg.other, "SET", o.stamp, o.y)
	poll("SET of the stamp to {X}", func(got string, err error) bool { return err == nil && got == o.x })

	// Invalidations lost: the cache keeps the stamp naming {X}.
	lost := newReader(t, tg.client(t, func(opt *rueidis.ClientOption) {
		opt.ClientTrackingOptions = []string{"PREFIX", "ks-no-such-prefix:", "BCAST"}
	}), reader.Options{CacheTTL: time.Minute})
	lostKey := func(want string) {
		t.Helper()
		if got, err := lost.Key(ctx, o.x); err != nil || got != want {
			t.Errorf("lost invalidations: Key = %q, %v; want %q", got, err, want)
		}
	}
	lostKey(o.x)
	redistest.Cmd(t, tg.other, "SET", o.stamp, o.x)
	lostKey(o.x) // stale, as the test needs
	if now, changed, err := lost.Recheck(ctx, reader.Plain(o.x), o.x); err != nil || !changed || now != keys.GenKey(o.x, 1) {
		t.Errorf("Recheck after the stamp moved to X = %q, %v, %v; want %q, true", now, changed, err, keys.GenKey(o.x, 1))
	}
	lostKey(keys.GenKey(o.x, 1))
	// {X} shares the pointer and the stale pair: it resolves by the stale
	// stamp until its own recheck, and neither's override is the other's.
	lostKeyOf := func(live, want string) {
		t.Helper()
		if got, err := lost.Key(ctx, live); err != nil || got != want {
			t.Errorf("lost invalidations: Key(%s) = %q, %v; want %q", live, got, err, want)
		}
	}
	lostKeyOf(o.y, keys.GenKey(o.y, 1))
	lostKeyOf(o.x, keys.GenKey(o.x, 1))
	if now, changed, err := lost.Recheck(ctx, reader.Plain(o.y), keys.GenKey(o.y, 1)); err != nil || !changed || now != o.y {
		t.Errorf("Recheck of {X} after the stamp moved to X = %q, %v, %v; want %q, true", now, changed, err, o.y)
	}
	lostKeyOf(o.y, o.y)
	lostKeyOf(o.x, keys.GenKey(o.x, 1))
	redistest.Cmd(t, tg.other, "DEL", o.stamp)
	if _, _, err := lost.Recheck(ctx, reader.Plain(o.x), keys.GenKey(o.x, 1)); !errors.Is(err, reader.ErrBadPointer) {
		t.Errorf("Recheck after the stamp was deleted: %v; want ErrBadPointer", err)
	}
}

// A server that refuses the MULTI of a cached read (here an ACL user
// without MULTI on every node) is read without the cache: the pointer and
// the stamp in one DoMulti, and the stamp's rule all the same.
func TestOwnerStampWithoutMulti(t *testing.T) {
	tg := targets(t)[1] // cluster/untagged
	ctx := redistest.Ctx(t)
	o := newOwners(t, tg)
	user := "nomulti-" + strings.ReplaceAll(tg.prefix, ":", "-")
	for _, n := range env.Cluster.Nodes {
		admin := n.Client(t)
		redistest.Cmd(t, admin, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-multi")
		t.Cleanup(func() { redistest.Cmd(t, admin, "ACL", "DELUSER", user) })
	}
	rec := &recorder{}
	r := newReader(t, rec.wrap(tg.client(t, func(opt *rueidis.ClientOption) { opt.Username, opt.Password = user, "pw" })), reader.Options{})
	for _, c := range []struct {
		owner, want string // the stamp, and the key x resolves to
	}{{o.y, o.x}, {o.x, keys.GenKey(o.x, 1)}} {
		redistest.Cmd(t, tg.other, "SET", o.stamp, c.owner)
		for range 2 { // the first finds MULTI refused
			if got, err := r.Key(ctx, o.x); err != nil || got != c.want {
				t.Errorf("stamp %s: Key = %q, %v; want %q", c.owner, got, err, c.want)
			}
		}
		if got, want := rec.take(), []string{tg.get(o.x), tg.get(o.x)}; !slices.Equal(got, want) {
			t.Errorf("stamp %s: two resolves sent %q; want %q", c.owner, got, want)
		}
	}
	if r.Cached() {
		t.Error("Cached() = true without MULTI")
	}
	redistest.Cmd(t, tg.other, "DEL", o.stamp)
	if _, err := r.Key(ctx, o.x); !errors.Is(err, reader.ErrBadPointer) {
		t.Errorf("Key with no stamp: %v; want ErrBadPointer", err)
	}
}

// A key with a '}' and no tag, a}b, shares its base "{rbN}a}b" with that
// key: the stamp decides between them as between X and {X}.
func TestOwnerStampSyntheticTag(t *testing.T) {
	tg := targets(t)[1] // cluster/untagged
	ctx := redistest.Ctx(t)
	x := tg.prefix + "a}b"
	o := ownersOf(t, tg, x, keys.Base(x, true))
	r := newReader(t, tg.client(t, nil), reader.Options{})
	for _, owner := range []string{o.y, o.x} {
		redistest.Cmd(t, tg.other, "SET", o.stamp, owner)
		for _, live := range []string{o.x, o.y} {
			want := live
			if live == owner {
				want = keys.GenKey(live, 1)
			}
			if got, err := newReader(t, tg.other, reader.Options{}).Key(ctx, live); err != nil || got != want {
				t.Errorf("stamp %s: uncached Key(%s) = %q, %v; want %q", owner, live, got, err, want)
			}
			if now, _, err := r.Recheck(ctx, reader.Plain(live), live); err != nil || now != want {
				t.Errorf("stamp %s: Recheck(%s) = %q, %v; want %q", owner, live, now, err, want)
			}
		}
	}
}

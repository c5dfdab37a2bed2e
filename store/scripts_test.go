package store_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
)

// Every branch of every Lua script runs against a real
// server, on the standalone server and on the cluster. The raw tests of the
// run core's scripts (acquire, heartbeat, refresh, release, publish), which
// run the script text directly, are in internal/protocol/scripts_test.go; touch's
// is TestScriptLease here. The tests below also run the scripts through the
// public API.

// scriptsEach runs f as a parallel subtest on the standalone server and on
// the cluster. Raw script runs use scriptsKeys, whose keys share one hash
// tag, so multi-key calls stay in one slot.
func scriptsEach(t *testing.T, f func(t *testing.T, tg target)) {
	t.Helper()
	for _, tg := range targets(t) {
		if tg.name != "standalone" && tg.name != "cluster/untagged" {
			continue // the key kinds matter to the Store, not to raw scripts
		}
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			f(t, tg)
		})
	}
}

// scriptsKeys returns a function naming keys that share the hash tag
// {<tg.live>/<group>}. The live keys under test have no braces.
func scriptsKeys(tg target, group string) func(name string) string {
	tag := "{" + tg.live + "/" + group + "}:"
	return func(name string) string { return tag + name }
}

// scriptsLoad returns keyswap's script name as a rueidis script.
func scriptsLoad(t *testing.T, name string) *rueidis.Lua {
	t.Helper()
	return redistest.ScriptNamed(name).Lua()
}

// scriptsRun runs script on c and returns its integer array reply.
func scriptsRun(t *testing.T, c rueidis.Client, script *rueidis.Lua, keys, args []string) []int64 {
	t.Helper()
	reply, err := script.Exec(context.Background(), c, keys, args).AsIntSlice()
	if err != nil {
		t.Fatalf("script(%q, %q): %v", keys, args, err)
	}
	return reply
}

func scriptsWantReply(t *testing.T, got []int64, want ...int64) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("reply = %v, want %v", got, want)
	}
}

func TestScriptLease(t *testing.T) {
	// lease.lua: {1, s...} with every lock extended first (C11, C13, C15)
	// and s per temp key: 0 absent, 1 alive (had a TTL), 2 created since
	// the last touch (had none); {-1, i} for the first lock that is not
	// ours, with nothing changed (C9).
	scriptsEach(t, func(t *testing.T, tg target) {
		lease := scriptsLoad(t, "touch")
		const tok = "0123456789abcdef0123456789abcdef"

		t.Run("all ours", func(t *testing.T) {
			k := scriptsKeys(tg, "lease-ok")
			l1, l2, t1, t2, t3 := k("l1"), k("l2"), k("t1"), k("t2"), k("t3")
			redistest.Cmd(t, tg.other, "SET", l1, tok, "EX", "10")
			redistest.Cmd(t, tg.other, "SET", l2, tok, "EX", "10")
			redistest.SeedHash(t, tg.other, t1, redistest.Fields("a", 3))
			redistest.Cmd(t, tg.other, "EXPIRE", t1, "10")
			redistest.Cmd(t, tg.other, "DEL", t2)
			redistest.SeedHash(t, tg.other, t3, redistest.Fields("c", 3)) // no TTL yet (C34.1)
			got := scriptsRun(t, tg.client, lease, []string{l1, l2, t1, t2, t3}, []string{tok, "100", "2"})
			scriptsWantReply(t, got, protocol.Code("OK"), protocol.Code("TEMP_ALIVE"), protocol.Code("TEMP_ABSENT"), protocol.Code("TEMP_CREATED"))
			for _, key := range []string{l1, l2, t1, t3} {
				redistest.WantPTTL(t, tg.other, key, 10*time.Second, 100*time.Second) // reset, not left to decay
			}
			redistest.WantString(t, tg.other, l1, tok)
			redistest.WantString(t, tg.other, l2, tok)
			redistest.WantAbsent(t, tg.other, t2) // EXPIRE does not create it (C12)
		})

		t.Run("no temps", func(t *testing.T) {
			k := scriptsKeys(tg, "lease-lock-only")
			redistest.Cmd(t, tg.other, "SET", k("l1"), tok, "EX", "10")
			scriptsWantReply(t, scriptsRun(t, tg.client, lease, []string{k("l1")}, []string{tok, "100", "1"}), protocol.Code("OK"))
			redistest.WantPTTL(t, tg.other, k("l1"), 10*time.Second, 100*time.Second)
		})

		for _, tt := range []struct {
			name   string
			thief  string // value of the lost lock; "" = expired
			lostAt int64  // which lock is lost (1 or 2)
		}{
			{"second stolen", "thief", 2},
			{"first stolen", "thief", 1},
			{"second expired", "", 2},
			{"first expired", "", 1},
		} {
			t.Run(tt.name, func(t *testing.T) {
				k := scriptsKeys(tg, "lease-"+strings.ReplaceAll(tt.name, " ", "-"))
				locks := []string{k("l1"), k("l2")}
				t1, t3 := k("t1"), k("t3")
				for _, l := range locks {
					redistest.Cmd(t, tg.other, "SET", l, tok, "EX", "10")
				}
				lost := locks[tt.lostAt-1]
				if tt.thief != "" {
					redistest.Cmd(t, tg.other, "SET", lost, tt.thief, "EX", "20")
				} else {
					redistest.Cmd(t, tg.other, "DEL", lost)
				}
				redistest.SeedHash(t, tg.other, t1, redistest.Fields("a", 3))
				redistest.Cmd(t, tg.other, "EXPIRE", t1, "10")
				redistest.SeedHash(t, tg.other, t3, redistest.Fields("c", 3))

				got := scriptsRun(t, tg.client, lease, []string{locks[0], locks[1], t1, t3}, []string{tok, "100", "2"})
				scriptsWantReply(t, got, protocol.Code("LOCK_LOST"), tt.lostAt)
				for _, l := range locks {
					switch {
					case l != lost:
						redistest.WantString(t, tg.other, l, tok)
						redistest.WantPTTL(t, tg.other, l, 0, 10*time.Second) // not extended
					case tt.thief != "":
						redistest.WantString(t, tg.other, l, tt.thief)
						redistest.WantPTTL(t, tg.other, l, 0, 20*time.Second)
					default:
						redistest.WantString(t, tg.other, l, "")
					}
				}
				redistest.WantPTTL(t, tg.other, t1, 0, 10*time.Second) // not touched
				redistest.WantPTTL(t, tg.other, t3, -1, -1)            // still no TTL
			})
		}
	})
}

func TestScriptLeaseViaTouch(t *testing.T) {
	// lease.lua through the public API: {1, 1}, {1, 0}, {-1, 1} (C11, C12).
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s := tg.store(store.Options{})
		temp := s.NewTempKey(tg.live)
		redistest.Clean(t, tg.other, s.LockKey(tg.live), temp)
		lock, err := s.Acquire(ctx, tg.live, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		redistest.Cmd(t, tg.other, "EXPIRE", lock.Key, "10")

		if populated, err := s.Touch(ctx, lock, temp); err != nil || populated {
			t.Errorf("Touch before any write = %v, %v; want false, nil", populated, err)
		}
		redistest.WantPTTL(t, tg.other, lock.Key, 10*time.Second, 60*time.Second)
		redistest.WantAbsent(t, tg.other, temp)

		redistest.SeedHash(t, tg.other, temp, redistest.Fields("a", 2))
		redistest.Cmd(t, tg.other, "EXPIRE", lock.Key, "10")
		if populated, err := s.Touch(ctx, lock, temp); err != nil || !populated {
			t.Errorf("Touch after a write = %v, %v; want true, nil", populated, err)
		}
		redistest.WantPTTL(t, tg.other, lock.Key, 10*time.Second, 60*time.Second)
		redistest.WantPTTL(t, tg.other, temp, 10*time.Second, 60*time.Second)

		redistest.Cmd(t, tg.other, "SET", lock.Key, "thief", "EX", "20")
		redistest.Cmd(t, tg.other, "EXPIRE", temp, "10")
		_, err = s.Touch(ctx, lock, temp)
		redistest.WantErr(t, err, store.ErrLockLost)
		redistest.WantLock(t, tg.other, lock.Key, "thief", 20*time.Second)
		redistest.WantPTTL(t, tg.other, temp, 0, 10*time.Second)
	})
}

func TestScriptReleaseViaStore(t *testing.T) {
	// release.lua through the public API: our lock is deleted; a lock
	// already gone leaves nothing to release; a lock held by another is
	// ErrLockLost and is left alone (C8).
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		s := tg.store(store.Options{})
		redistest.Clean(t, tg.other, s.LockKey(tg.live))
		lock, err := s.Acquire(ctx, tg.live, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, lock); err != nil {
			t.Fatalf("Release: %v", err)
		}
		redistest.WantString(t, tg.other, lock.Key, "")
		if err := s.Release(ctx, lock); err != nil {
			t.Fatalf("Release of a lock already gone: %v, want nil", err)
		}
		redistest.WantString(t, tg.other, lock.Key, "")
		redistest.Cmd(t, tg.other, "SET", lock.Key, "successor", "EX", "30")
		redistest.WantErr(t, s.Release(ctx, lock), store.ErrLockLost)
		redistest.WantLock(t, tg.other, lock.Key, "successor", 30*time.Second)
	})
}

// scriptsMapsEqual reports whether a and b hold the same fields.
func scriptsMapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// scriptsInfoInt returns field from INFO section on c.
func scriptsInfoInt(t *testing.T, c rueidis.Client, section, field string) int64 {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section(section).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %q: %v", section, line, err)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}

func TestScriptPublishUnlinksOldValue(t *testing.T) {
	// C23+: the old value is UNLINKed before the RENAME, so a large live key
	// is freed in the background, never on the server's main thread. On a
	// server of our own, where a plain RENAME frees synchronously
	// (lazyfree-lazy-server-del no), the lazy-free counter tells the two
	// apart.
	srv := redistest.OwnServer(t, "--lazyfree-lazy-server-del", "no")
	c := srv.Client(t)
	ctx := redistest.Ctx(t)
	s := store.New(c, store.Options{})
	p := redistest.Prefix(t)
	big := redistest.Fields("old", 2000) // a real hash table: above the lazy-free threshold of 64

	// Control: a plain RENAME over a large key does not free lazily here.
	redistest.SeedHash(t, c, p+"control", big)
	redistest.SeedHash(t, c, p+"control-temp", redistest.Fields("new", 3))
	before := scriptsInfoInt(t, c, "memory", "lazyfreed_objects")
	redistest.Cmd(t, c, "RENAME", p+"control-temp", p+"control")
	if after := scriptsInfoInt(t, c, "memory", "lazyfreed_objects"); after != before {
		t.Fatalf("control: a plain RENAME lazily freed %d objects; the server frees lazily, so this test cannot tell", after-before)
	}

	live := p + "idx"
	temp := s.NewTempKey(live)
	redistest.SeedHash(t, c, live, big)
	redistest.SeedHash(t, c, temp, redistest.Fields("new", 3))
	before = scriptsInfoInt(t, c, "memory", "lazyfreed_objects")
	if out, err := s.Swap(ctx, temp, live, store.SwapOptions{Populated: store.PopulatedYes}); err != nil || out != store.Swapped {
		t.Fatalf("Swap = %v, %v; want %v, nil", out, err, store.Swapped)
	}
	swapPollUntil(t, 10*time.Second, "the old value freed lazily (lazyfreed_objects +1)", func() bool {
		return scriptsInfoInt(t, c, "memory", "lazyfreed_objects") > before
	})
	redistest.WantHash(t, c, live, redistest.Fields("new", 3))
}

func TestScriptsSurviveScriptFlush(t *testing.T) {
	// After SCRIPT FLUSH every script still runs: rueidis gets NOSCRIPT from
	// EVALSHA and falls back to EVAL. On a server of our own, since the
	// flush would slow every other test on a shared one.
	srv := redistest.OwnServer(t)
	admin := srv.Client(t)
	s, sp := swapSpied(t, srv.Client(t), nil)
	ctx := redistest.Ctx(t)
	live := redistest.Prefix(t) + "idx"

	// round runs each script once through the Store and checks its result.
	round := func(t *testing.T, gen string) {
		t.Helper()
		lock, err := s.Acquire(ctx, live, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		temp := s.NewTempKey(live)
		redistest.SeedHash(t, admin, temp, redistest.Fields(gen, 4))
		if populated, err := s.Touch(ctx, lock, temp); err != nil || !populated { // lease
			t.Fatalf("Touch = %v, %v; want true, nil", populated, err)
		}
		if out, err := s.Swap(ctx, temp, live, store.SwapOptions{Lock: lock, Populated: store.PopulatedYes}); err != nil || out != store.Swapped { // publish
			t.Fatalf("Swap = %v, %v; want %v, nil", out, err, store.Swapped)
		}
		if err := s.Release(ctx, lock); err != nil { // release
			t.Fatalf("Release: %v", err)
		}
		redistest.WantHash(t, admin, live, redistest.Fields(gen, 4))
		redistest.WantString(t, admin, lock.Key, "")
	}

	var shas []string
	for _, name := range []string{"touch", "publish", "release"} {
		shas = append(shas, redistest.ScriptNamed(name).SHA1)
	}
	cached := func() []int64 {
		t.Helper()
		n, err := admin.Do(ctx, admin.B().ScriptExists().Sha1(shas...).Build()).AsIntSlice()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	round(t, "first") // loads every script
	if got := cached(); !slices.Equal(got, []int64{1, 1, 1}) {
		t.Fatalf("SCRIPT EXISTS after a first round = %v, want [1 1 1]", got)
	}
	sp.recorded()
	if err := admin.Do(ctx, admin.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if got := cached(); !slices.Equal(got, []int64{0, 0, 0}) {
		t.Fatalf("SCRIPT EXISTS after SCRIPT FLUSH = %v, want [0 0 0]", got)
	}
	round(t, "second")

	// Each script went EVALSHA (NOSCRIPT), then EVAL.
	var got []string
	for _, c := range sp.recorded() {
		if c.script != "" {
			got = append(got, c.args[0]+" "+c.script)
		}
	}
	want := []string{"EVALSHA touch", "EVAL touch", "EVALSHA publish", "EVAL publish", "EVALSHA release", "EVAL release"}
	if !slices.Equal(got, want) {
		t.Errorf("script commands after SCRIPT FLUSH = %q, want %q", got, want)
	}
}

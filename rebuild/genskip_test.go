package rebuild_test

// Options.SkipSizeCheck: a Generations run that sends no SCARD, HLEN or
// ZCARD before its flip, and tells evictions by the masters' evicted_keys
// instead (C103).

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

// sizeReads returns d with a Client that counts the size reads (SCARD,
// HLEN, ZCARD) sent through it, and the count.
func sizeReads(d deployment) (deployment, *atomic.Int64) {
	var n atomic.Int64
	d.Client = redistest.Watch(d.Client, func(cmds ...rueidis.Completed) {
		for _, c := range cmds {
			switch c.Commands()[0] {
			case "SCARD", "HLEN", "ZCARD":
				n.Add(1)
			}
		}
	})
	return d, &n
}

func TestGenerationsSkipSizeCheckPublishes(t *testing.T) {
	// C103: with SkipSizeCheck a run publishes exactly its source, and
	// sends no SCARD; the same run without it sends one per key.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		d = ownPrefix(t, d)
		d.Clear(t)
		d, reads := sizeReads(d)
		prefix := genPrefix(d)
		first := genUsers(90, 9)
		if _, err := genRebuilder(t, d, prefix, rebuild.Options{}).Run(ctx, sources.Slice(first)); err != nil {
			t.Fatal(err)
		}
		if n := reads.Swap(0); n != 9 {
			t.Fatalf("the run with the size check sent %d size reads, want 9 (one per bucket)", n)
		}
		next := genUsers(200, 20)
		stats, err := genRebuilder(t, d, prefix, rebuild.Options{SkipSizeCheck: true}).Run(ctx, sources.Slice(next))
		if err != nil {
			t.Fatal(err)
		}
		if n := reads.Load(); n != 0 {
			t.Errorf("the run with SkipSizeCheck sent %d size reads, want none", n)
		}
		if stats.Generations[prefix] != 2 {
			t.Errorf("Stats.Generations = %v, want 2", stats.Generations)
		}
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, next)
		wantNoGeneration(t, d, prefix, 1)
		wantGenClean(t, d, prefix, 2)
	})
}

func TestSkipSizeCheckRefusedInRenameInPlace(t *testing.T) {
	// C103: SkipSizeCheck in RenameInPlace mode is an error of New that
	// names it.
	c := env.Standalone.Client(t)
	set := builders.Set(redistest.Prefix(t)+"ids", func(u user) (string, bool) { return u.ID, true })
	_, err := rebuild.New(c, rebuild.Options{SkipSizeCheck: true}, index.Builder[user](set))
	var e *rebuild.Error
	if !errors.As(err, &e) || e.Op != "config" || !strings.Contains(err.Error(), "SkipSizeCheck in RenameInPlace mode") {
		t.Errorf("New: %v, want an *Error of op config naming SkipSizeCheck in RenameInPlace mode", err)
	}
}

func TestGenerationsSkipSizeCheckNoInfo(t *testing.T) {
	// C103: with SkipSizeCheck the run reads INFO; a user without it fails
	// at the acquire with ErrNoPermission naming INFO, writing nothing.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ownPrefix(t, d).Clear(t)
		ctx, d, prefix, us := published(t, d)
		c := clientAs(t, d, "~*", "+@all", "-info")
		before := redistest.Snapshot(t, d.Other, keys.GenPrefix(prefix, 1))
		stats, err := spreadRebuilder(t, c, prefix, rebuild.Options{SkipSizeCheck: true}).Run(ctx, sources.Slice(genUsers(60, 6)))
		redistest.WantErr(t, err, rebuild.ErrNoPermission)
		var e *rebuild.Error
		if !errors.As(err, &e) || e.Op != "acquire" || !strings.Contains(err.Error(), "INFO") {
			t.Errorf("Run: %v, want an *Error of op acquire naming INFO", err)
		}
		if stats.Batches != 0 {
			t.Errorf("Stats.Batches = %d, want 0", stats.Batches)
		}
		redistest.WantUnchanged(t, d.Other, keys.GenPrefix(prefix, 1), before)
		wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
		wantGenClean(t, d, prefix, 1)
	})
}

func TestGenerationsSkipSizeCheckPublishesDeletedKeyMissing(t *testing.T) {
	// C103, the documented trade: a generation key another client deletes
	// mid-run is published missing what was written before the delete
	// with SkipSizeCheck; without it the run fails with ErrTempKeyLost
	// naming the key, the pointer untouched.
	for _, skip := range []bool{true, false} {
		t.Run(fmt.Sprintf("skip=%v", skip), func(t *testing.T) {
			forEachDeployment(t, func(t *testing.T, d deployment) {
				ownPrefix(t, d).Clear(t)
				ctx, d, prefix, us := published(t, d)
				next := genUsers(200, 20)
				deleted := keys.GenBucketKey(prefix, 2, "b00")
				src := genSource(next, 150, func() error {
					waitFor(t, deleted, func() bool { return redistest.Exists(t, d.Other, deleted) })
					redistest.Cmd(t, d.Other, "DEL", deleted)
					return nil
				})
				_, err := genRebuilder(t, d, prefix, rebuild.Options{SkipSizeCheck: skip, MaxMerged: 10}).Run(ctx, src)
				if !skip {
					if !errors.Is(err, rebuild.ErrTempKeyLost) || !strings.Contains(err.Error(), deleted) {
						t.Fatalf("Run = %v, want ErrTempKeyLost naming %s", err, deleted)
					}
					wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent}, us)
					wantNoGeneration(t, d, prefix, 2)
					wantGenClean(t, d, prefix, 1)
					return
				}
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				// Every bucket but b00 exact; b00 holds only members of
				// its own, and lacks those written before the delete.
				var rest, b00 []user
				for _, u := range next {
					if u.Country == "b00" {
						b00 = append(b00, u)
					} else {
						rest = append(rest, u)
					}
				}
				have := redistest.SMembers(t, d.Other, deleted)
				want := map[string]bool{}
				for _, u := range b00 {
					want[u.ID] = true
				}
				for _, m := range have {
					if !want[m] {
						t.Errorf("%s holds %q, which its source does not", deleted, m)
					}
				}
				if len(have) >= len(b00) {
					t.Errorf("%s holds %d members, want fewer than %d: those written before the delete are lost", deleted, len(have), len(b00))
				}
				redistest.WantString(t, d.Other, keys.PointerKey(prefix, d.Cluster), "2")
				kept := rest
				for _, u := range b00 {
					if slices.Contains(have, u.ID) {
						kept = append(kept, u)
					}
				}
				wantBuckets(t, d, prefix, 2, kept)
				wantNoGeneration(t, d, prefix, 1)
				wantGenClean(t, d, prefix, 2)
			})
		})
	}
}

// evictionCase is a deployment of the test's own, for the eviction tests:
// they change maxmemory, which applies to every client of a server.
type evictionCase struct {
	d deployment
	// node returns the server of key.
	node func(key string) *redistest.Server
}

// ownDeployments runs f for a standalone server and a 3-master cluster
// of t's own.
func ownDeployments(t *testing.T, f func(t *testing.T, c evictionCase)) {
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		s := redistest.OwnServer(t)
		d := deployment{Name: "standalone", Client: s.Client(t), Other: s.Client(t), Prefix: redistest.Prefix(t), Addrs: []string{s.Addr}}
		f(t, evictionCase{d: d, node: func(string) *redistest.Server { return s }})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.OwnCluster(t, 3)
		d := deployment{Name: "cluster", Cluster: true, Client: cl.Client(t), Other: cl.Client(t), Prefix: "{" + redistest.Prefix(t) + "}", Addrs: cl.Addrs}
		f(t, evictionCase{d: d, node: func(k string) *redistest.Server { return cl.NodeFor(t, k) }})
	})
}

// infoInt returns field of INFO section on c.
func infoInt(t *testing.T, c rueidis.Client, section, field string) int64 {
	t.Helper()
	info, err := c.Do(redistest.Ctx(t), c.B().Info().Section(section).Build()).ToString()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %s %q: %v", section, field, v, err)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// evict makes s evict key, and key alone: with volatile-ttl, the key with
// the nearest expiry among those with a TTL goes first, and key, given a
// TTL shorter than any of the run's keys', frees enough alone under a
// maxmemory half its size below the server's use. The limit is lifted
// once evicted_keys counted it.
func evict(t *testing.T, s *redistest.Server, key string) {
	t.Helper()
	c := s.Client(t)
	redistest.Cmd(t, c, "PEXPIRE", key, "100000")
	size, err := c.Do(redistest.Ctx(t), c.B().MemoryUsage().Key(key).Samples(0).Build()).AsInt64()
	if err != nil {
		t.Fatalf("MEMORY USAGE %s: %v", key, err)
	}
	evicted := infoInt(t, c, "stats", "evicted_keys")
	used := infoInt(t, c, "memory", "used_memory")
	redistest.Cmd(t, c, "CONFIG", "SET", "maxmemory-policy", "volatile-ttl", "maxmemory-samples", "64", "maxmemory", strconv.FormatInt(used-size/2, 10))
	waitFor(t, "the eviction of "+key, func() bool { return infoInt(t, c, "stats", "evicted_keys") > evicted })
	redistest.Cmd(t, c, "CONFIG", "SET", "maxmemory", "0", "maxmemory-policy", "noeviction")
	if now := infoInt(t, c, "stats", "evicted_keys"); now != evicted+1 {
		t.Fatalf("evicted_keys went from %d to %d, want one eviction (%s, %d bytes, with %d bytes used)", evicted, now, key, size, used)
	}
	if redistest.Exists(t, c, key) {
		t.Fatalf("%s was not evicted", key)
	}
}

func TestGenerationsSkipSizeCheckEviction(t *testing.T) {
	// C103, C94: a key of the run's generation evicted mid-run. With
	// SkipSizeCheck the master's evicted_keys grew: the flip is refused
	// with ErrTempKeyLost naming the master; without it the size check
	// refuses it, naming the key. Either way the current generation is
	// untouched and nothing of the run is left.
	for _, skip := range []bool{true, false} {
		t.Run(fmt.Sprintf("skip=%v", skip), func(t *testing.T) {
			t.Parallel()
			ownDeployments(t, func(t *testing.T, c evictionCase) {
				d := c.d
				ctx := redistest.Ctx(t)
				prefix := genPrefix(d)
				first := genUsers(30, 3)
				if _, err := genRebuilder(t, d, prefix, rebuild.Options{}).Run(ctx, sources.Slice(first)); err != nil {
					t.Fatal(err)
				}
				before := redistest.Snapshot(t, d.Other, keys.GenPrefix(prefix, 1))
				// A big bucket first, then small ones.
				next := users(6400)
				for i := range next {
					next[i].Country = "big"
					if i >= 6000 {
						next[i].Country = fmt.Sprintf("b%02d", i%4)
					}
				}
				big := keys.GenBucketKey(prefix, 2, "big")
				node := c.node(big)
				src := genSource(next, 4500, func() error {
					waitFor(t, big, func() bool { return redistest.Exists(t, d.Other, big) })
					evict(t, node, big)
					return nil
				})
				_, err := genRebuilder(t, d, prefix, rebuild.Options{SkipSizeCheck: skip, MaxMerged: 500}).Run(ctx, src)
				want := big
				if skip {
					want = "master " + node.Addr + " evicted 1 keys"
				}
				if !errors.Is(err, rebuild.ErrTempKeyLost) || !strings.Contains(err.Error(), want) {
					t.Fatalf("Run = %v, want ErrTempKeyLost saying %q", err, want)
				}
				wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent}, first)
				redistest.WantUnchanged(t, d.Other, keys.GenPrefix(prefix, 1), before)
				wantNoGeneration(t, d, prefix, 2)
				wantGenClean(t, d, prefix, 1)
			})
		})
	}
}

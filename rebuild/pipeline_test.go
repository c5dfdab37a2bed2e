package rebuild_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// Compile-time checks: the builders the pipeline tests use are Builders.
var (
	_ rebuild.Builder[user] = builders.Hash[user]("k", nil)
	_ rebuild.Builder[user] = builders.SortedSet[user]("k", nil)
	_ rebuild.Builder[user] = builders.SetIndex[user]("k", nil)
)

// pipeKeys names the three targets of one source pass.
type pipeKeys struct{ hash, zset, country string }

func pipeNames(d deployment) pipeKeys {
	return pipeKeys{hash: d.Prefix + "users:by-email", zset: d.Prefix + "users:by-score", country: d.Prefix + "users:by-country"}
}

// pipeRebuilder rebuilds the three keys of k from users: email → id, id by
// score (users with a negative score are skipped, C48), and one set of ids
// per country.
func pipeRebuilder(t testing.TB, c rueidis.Client, k pipeKeys, opts rebuild.Options) *rebuild.Rebuilder[user] {
	return redistest.Rebuilder(t, c, opts,
		builders.Hash(k.hash, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SortedSet(k.zset, func(u user) (string, float64, bool) { return u.ID, u.Score, u.Score >= 0 }),
		builders.SetIndex(k.country, func(u user) (string, string, bool) { return u.Country, u.ID, true }),
	)
}

// pipeWant fails unless the live keys of k hold exactly what pipeRebuilder
// makes of us, with no expiry, and no other key (temp key, stale bucket)
// exists under the country prefix.
func pipeWant(t *testing.T, c rueidis.Client, k pipeKeys, us []user) {
	t.Helper()
	wantHash := map[string]string{}
	wantZset := map[string]float64{}
	wantSets := map[string]map[string]bool{}
	for _, u := range us {
		wantHash[u.Email] = u.ID
		if u.Score >= 0 {
			wantZset[u.ID] = u.Score
		}
		b := k.country + ":" + u.Country
		if wantSets[b] == nil {
			wantSets[b] = map[string]bool{}
		}
		wantSets[b][u.ID] = true
	}
	// maps.Equal first: cmp.Diff is slow on thousands of entries under -race.
	if got := redistest.HGetAll(t, c, k.hash); !maps.Equal(wantHash, got) {
		t.Errorf("hash %s (-want +got):\n%s", k.hash, cmp.Diff(wantHash, got))
	}
	if got := redistest.ZScores(t, c, k.zset); !maps.Equal(wantZset, got) {
		t.Errorf("sorted set %s (-want +got):\n%s", k.zset, cmp.Diff(wantZset, got))
	}
	gotSets := map[string][]string{}
	for _, b := range redistest.LiveKeys(t, c, k.country+":") {
		gotSets[b] = redistest.SMembers(t, c, b)
	}
	if want := sortedSets(wantSets); !maps.EqualFunc(want, gotSets, slices.Equal) {
		t.Errorf("buckets under %s: (-want +got):\n%s", k.country+":", cmp.Diff(want, gotSets))
	}
	for _, key := range append([]string{k.hash, k.zset}, slices.Collect(maps.Keys(wantSets))...) {
		if got := redistest.PTTL(t, c, key); got != -1 {
			t.Errorf("PTTL %s: got %v, want -1 (no expiry, C35)", key, got)
		}
	}
}

// pipeIsWrite reports whether cmd is a builder's write (HSET, ZADD, SADD).
func pipeIsWrite(cmd []string) bool {
	switch strings.ToUpper(cmd[0]) {
	case "HSET", "ZADD", "SADD":
		return true
	}
	return false
}

// pipeIsBatch reports whether a DoMulti is a round trip of batches: it
// carries writes, or advances the run's record (a source batch whose
// entries are all merged into later commands writes nothing yet, but still
// counts as a transaction).
func pipeIsBatch(multi []rueidis.Completed) bool {
	for _, cmd := range multi {
		args := cmd.Commands()
		if pipeIsWrite(args) || strings.ToUpper(args[0]) == "HINCRBY" && strings.HasSuffix(args[1], ":rebuild-lock:run") {
			return true
		}
	}
	return false
}

// TestRunPublishesEveryTargetInOneScript: the three builders of one source
// pass are published by ONE fenced publish script per Run, whose keys name
// every target and the orphan bucket (C22, C53+), and the live keys end
// exactly as built (C23). Checked on two successive runs, the second moving
// users between buckets and dropping one.
func TestRunPublishesEveryTargetInOneScript(t *testing.T) {
	publish := redistest.ScriptNamed("publish")
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := pipeNames(d)
		var mu sync.Mutex
		var evalshas, evals []redistest.PublishCall
		var noscript int
		client := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				args := slices.Clone(cmd.Commands()) // rueidis recycles cmd once Do returns
				res := c.Do(ctx, cmd)
				name := strings.ToUpper(args[0])
				if publish.Is(args) {
					call, err := redistest.ParsePublish(args)
					if err != nil {
						t.Error(err)
						return res
					}
					mu.Lock()
					defer mu.Unlock()
					if name == "EVALSHA" {
						evalshas = append(evalshas, call)
						if e, ok := rueidis.IsRedisErr(res.Error()); ok && e.IsNoScript() {
							noscript++
						}
					} else {
						evals = append(evals, call)
					}
				}
				return res
			},
		})
		// A stale bucket the first run must delete as an orphan.
		if err := d.Other.Do(ctx, d.Other.B().Sadd().Key(k.country+":jp").Member("u999999").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		r := pipeRebuilder(t, client, k, rebuild.Options{BatchSize: 300})

		moved := users(900)
		for i := range moved {
			moved[i].Country = []string{"fr", "de"}[i%2] // "us" empties: an orphan of run 2
		}
		for run, tc := range []struct {
			us          []user
			wantFinals  []string
			wantOrphans []string
		}{
			{users(1000), []string{k.hash, k.zset, k.country + ":de", k.country + ":fr", k.country + ":us"}, []string{k.country + ":jp"}},
			{moved, []string{k.hash, k.zset, k.country + ":de", k.country + ":fr"}, []string{k.country + ":us"}},
		} {
			mu.Lock()
			evalshas, evals, noscript = nil, nil, 0
			mu.Unlock()
			if _, err := r.Run(ctx, rebuild.FromSlice(tc.us)); err != nil {
				t.Fatalf("run %d: %v", run, err)
			}
			mu.Lock()
			if len(evalshas) != 1 {
				t.Fatalf("run %d: got %d publish EVALSHAs, want exactly 1", run, len(evalshas))
			}
			// rueidis falls back to EVAL only after NOSCRIPT on a server
			// that had not seen the script; that is the same single publish.
			if len(evals) != noscript {
				t.Errorf("run %d: got %d publish EVALs after %d NOSCRIPT replies, want equal", run, len(evals), noscript)
			}
			call := evalshas[0]
			mu.Unlock()
			lives := slices.Sorted(slices.Values(call.Lives))
			if diff := cmp.Diff(slices.Sorted(slices.Values(tc.wantFinals)), lives); diff != "" {
				t.Errorf("run %d: live keys named by the publish (-want +got):\n%s", run, diff)
			}
			// A fenced publish leaves its receipt, the first lock + ":done",
			// checks the run's records, each lock + ":run", and reads the
			// operator's requests, the first lock + ":ctl".
			var records []string
			for _, l := range call.Locks {
				records = append(records, l+":run")
			}
			if len(call.Locks) != 3 || !slices.Equal(call.Receipts, []string{call.Locks[0] + ":done"}) || !slices.Equal(call.Records, records) ||
				!slices.Equal(call.Ctls, []string{call.Locks[0] + ":ctl"}) {
				t.Fatalf("run %d: publish locks %q, receipts %q, records %q, requests %q: want 3 locks, the first's receipt, every lock's record, the first's requests", run, call.Locks, call.Receipts, call.Records, call.Ctls)
			}
			if diff := cmp.Diff(tc.wantOrphans, call.Orphans); diff != "" {
				t.Errorf("run %d: orphans named by the publish (-want +got):\n%s", run, diff)
			}
			pipeWant(t, d.Other, k, tc.us)
			redistest.WantClean(t, d.Other, d.Prefix)
		}
	})
}

// pipeGen is one generation of the reader test: its users and what a
// reader must see of every key while it is live.
type pipeGen struct {
	name string
	us   []user
	view []int64 // EXISTS hash, HLEN, EXISTS zset, ZCARD, SCARD of each pipeBuckets
}

var pipeBuckets = []string{"fr", "de", "us", "jp"}

// pipeReadScript reads every key of the reader test in one atomic step, so
// that one observation is one instant of the keyspace.
var pipeReadScript = sync.OnceValue(func() *rueidis.Lua {
	// Made when first used, not at init: TestFIPSOnly runs this binary
	// in FIPS-only mode, where hashing a script with SHA-1 panics.
	return rueidis.NewLuaScript(`
local out = {redis.call('EXISTS', KEYS[1]), redis.call('HLEN', KEYS[1]),
             redis.call('EXISTS', KEYS[2]), redis.call('ZCARD', KEYS[2])}
for i = 3, #KEYS do out[#out + 1] = redis.call('SCARD', KEYS[i]) end
return out`)
})

// TestReadersSeeOldOrNewNeverMixed (Guarantee 1, C23, C53+): while 100 sequential rebuilds alternate between two
// generations with different counts per key and users that move buckets,
// each written in several batches, a reader on an independent client polls
// every live key atomically. Every observation must show every key present
// and the whole keyspace equal to generation A or generation B: never a
// missing key (a gap), never one key from A with another from B (mixed).
func TestReadersSeeOldOrNewNeverMixed(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := pipeNames(d)
		a := pipeGen{name: "A", us: users(1000), view: []int64{1, 1000, 1, 1000, 334, 333, 333, 0}}
		b := pipeGen{name: "B", us: users(1500), view: []int64{1, 1500, 1, 1350, 375, 375, 375, 375}}
		for i := range b.us {
			b.us[i].Country = pipeBuckets[i%4] // 3 of every 12 users move bucket
			if i%10 == 0 {
				b.us[i].Score = -1 // skipped by the sorted set
			}
		}
		r := pipeRebuilder(t, d.Client, k, rebuild.Options{BatchSize: 250})
		if _, err := r.Run(ctx, rebuild.FromSlice(a.us)); err != nil {
			t.Fatal(err)
		}
		readKeys := []string{k.hash, k.zset}
		for _, bk := range pipeBuckets {
			readKeys = append(readKeys, k.country+":"+bk)
		}

		stop := make(chan struct{})
		var observations, gaps, mixed int
		seen := map[string]int{}
		var firstBad []int64
		readerDone := make(chan error, 1)
		go func() {
			for {
				select {
				case <-stop:
					readerDone <- nil
					return
				default:
				}
				view, err := pipeReadScript().Exec(ctx, d.Other, readKeys, nil).AsIntSlice()
				if err != nil {
					readerDone <- err
					return
				}
				observations++
				switch {
				case slices.Equal(view, a.view):
					seen["A"]++
				case slices.Equal(view, b.view):
					seen["B"]++
				case view[0] == 0 || view[2] == 0 || view[4] == 0 || view[5] == 0 || view[6] == 0:
					gaps++
					if firstBad == nil {
						firstBad = view
					}
				default:
					mixed++
					if firstBad == nil {
						firstBad = view
					}
				}
			}
		}()

		start := time.Now()
		const runs = 100
		var runErr error
		for i := range runs {
			gen := b
			if i%2 == 1 {
				gen = a
			}
			stats, err := r.Run(ctx, rebuild.FromSlice(gen.us))
			if err != nil {
				runErr = fmt.Errorf("rebuild %d (generation %s): %w", i, gen.name, err)
				break
			}
			if want := int64(len(gen.us) / 250); stats.Batches != want {
				runErr = fmt.Errorf("rebuild %d (generation %s): got %d batches, want %d", i, gen.name, stats.Batches, want)
				break
			}
		}
		close(stop)
		if err := <-readerDone; err != nil {
			t.Fatalf("reader: %v", err)
		}
		if runErr != nil {
			t.Fatal(runErr)
		}
		t.Logf("%d rebuilds in %v; %d observations (A %d, B %d), %d gaps, %d mixed",
			runs, time.Since(start).Round(time.Millisecond), observations, seen["A"], seen["B"], gaps, mixed)
		if gaps != 0 || mixed != 0 {
			t.Errorf("got %d gaps and %d mixed observations (first: %v), want 0 and 0 (A is %v, B is %v)",
				gaps, mixed, firstBad, a.view, b.view)
		}
		if seen["A"] == 0 || seen["B"] == 0 {
			t.Errorf("reader saw A %d times and B %d times, want both at least once", seen["A"], seen["B"])
		}
		pipeWant(t, d.Other, k, a.us) // the last rebuild (99) was A
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// TestProgressPerBatch (C51): Progress is called once per batch, then once
// per later phase, from one goroutine at a time, with non-decreasing counts,
// a positive rate, and a last call that reports the totals.
func TestProgressPerBatch(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		var busy atomic.Bool
		var overlaps atomic.Int64
		var mu sync.Mutex
		var calls []rebuild.Progress
		opts := rebuild.Options{BatchSize: 300, Writers: 4, Progress: func(p rebuild.Progress) {
			if !busy.CompareAndSwap(false, true) {
				overlaps.Add(1)
			}
			mu.Lock()
			calls = append(calls, p)
			mu.Unlock()
			busy.Store(false)
		}}
		const n, wantBatches = 2500, 9 // 8 batches of 300 and one of 100
		us := users(n)
		for i := range us {
			if i%7 == 0 {
				us[i].Score = -1 // skipped items count in Progress.Items too
			}
		}
		stats, err := pipeRebuilder(t, d.Client, pipeNames(d), opts).Run(ctx, rebuild.FromSlice(us))
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		// One call per batch while building, then one as the run enters
		// each later phase: catching up, then publishing.
		var phases []rebuild.Phase
		for i, p := range calls {
			if i >= wantBatches || p.Phase != rebuild.PhaseBuilding {
				phases = append(phases, p.Phase)
			}
		}
		wantPhases := []rebuild.Phase{rebuild.PhaseCatchingUp, rebuild.PhasePublishing}
		if len(calls) != wantBatches+len(wantPhases) || stats.Batches != wantBatches || !slices.Equal(phases, wantPhases) {
			t.Fatalf("got %d Progress calls (phases after the batches %v) and Stats.Batches %d, want %d batch calls, then %v, and %d",
				len(calls), phases, stats.Batches, wantBatches, wantPhases, wantBatches)
		}
		if got := overlaps.Load(); got != 0 {
			t.Errorf("got %d overlapping Progress calls, want 0", got)
		}
		for i, p := range calls {
			if p.Rate <= 0 || p.Elapsed <= 0 || p.Items <= 0 || p.Batches <= 0 {
				t.Errorf("call %d: got %+v, want positive Items, Batches, Elapsed and Rate", i, p)
			}
			if i > 0 {
				prev := calls[i-1]
				if p.Items < prev.Items || p.Batches < prev.Batches || p.Elapsed < prev.Elapsed {
					t.Errorf("call %d: got %+v after %+v, want non-decreasing counts", i, p, prev)
				}
			}
		}
		if last := calls[len(calls)-1]; last.Items != n || last.Batches != wantBatches {
			t.Errorf("last call: got Items %d, Batches %d, want %d, %d", last.Items, last.Batches, n, wantBatches)
		}
	})
}

// TestStats: Items counts skipped items too, Batches the batches written,
// Targets the entries written per builder (a family under its prefix), and
// Outcomes what the publish did to each live key: Swapped, Emptied for a
// builder that produced nothing (C24), Emptied for an orphan bucket (C53+).
// A key of another type under the family prefix is not the family's.
func TestStats(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := pipeNames(d)
		meta := k.country + ":meta" // a string: not a SetIndex bucket
		for _, cmd := range []rueidis.Completed{
			d.Other.B().Zadd().Key(k.zset).ScoreMember().ScoreMember(1, "old").Build(),
			d.Other.B().Sadd().Key(k.country + ":xx").Member("old").Build(),
			d.Other.B().Set().Key(meta).Value("keep").Build(),
		} {
			if err := d.Other.Do(ctx, cmd).Error(); err != nil {
				t.Fatal(err)
			}
		}
		us := users(1000)
		for i := range us {
			us[i].Score = -1 // the sorted set skips everyone: an empty rebuild
			if i%5 == 0 {
				us[i].Email = " " // the hash skips blank emails (C48)
			}
		}
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 300},
			builders.Hash(k.hash, func(u user) (string, string, bool) { return u.Email, u.ID, !builders.Blank(u.Email) }),
			builders.SortedSet(k.zset, func(u user) (string, float64, bool) { return u.ID, u.Score, u.Score >= 0 }),
			builders.SetIndex(k.country, func(u user) (string, string, bool) { return u.Country, u.ID, true }),
		)
		stats, err := r.Run(ctx, rebuild.FromSlice(us))
		if err != nil {
			t.Fatal(err)
		}
		if stats.Items != 1000 || stats.Batches != 4 {
			t.Errorf("got Items %d, Batches %d, want 1000, 4", stats.Items, stats.Batches)
		}
		if diff := cmp.Diff(map[string]int64{k.hash: 800, k.zset: 0, k.country: 1000}, stats.Entries); diff != "" {
			t.Errorf("Targets (-want +got):\n%s", diff)
		}
		wantOutcomes := map[string]rebuild.Outcome{
			k.hash: rebuild.Swapped, k.zset: rebuild.Emptied,
			k.country + ":fr": rebuild.Swapped, k.country + ":de": rebuild.Swapped, k.country + ":us": rebuild.Swapped,
			k.country + ":xx": rebuild.Emptied,
		}
		if diff := cmp.Diff(wantOutcomes, stats.Outcomes); diff != "" {
			t.Errorf("Outcomes (-want +got):\n%s", diff)
		}
		if stats.Elapsed <= 0 {
			t.Errorf("Elapsed: got %v, want > 0", stats.Elapsed)
		}
		for _, key := range []string{k.zset, k.country + ":xx"} {
			if n, err := d.Other.Do(ctx, d.Other.B().Exists().Key(key).Build()).AsInt64(); err != nil || n != 0 {
				t.Errorf("EXISTS %s: got %d, %v, want 0 (Emptied)", key, n, err)
			}
		}
		if got, err := d.Other.Do(ctx, d.Other.B().Get().Key(meta).Build()).ToString(); err != nil || got != "keep" {
			t.Errorf("GET %s: got %q, %v, want %q (not a bucket: a string)", meta, got, err, "keep")
		}
		if n := len(redistest.HGetAll(t, d.Other, k.hash)); n != 800 {
			t.Errorf("HLEN %s: got %d, want 800", k.hash, n)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// pipeBatchesIn returns the number of batches a DoMulti carries, for
// pipeRebuilder with BatchSize at most builders.MaxArgs: one HSET each.
func pipeBatchesIn(multi []rueidis.Completed) int {
	n := 0
	for _, cmd := range multi {
		if cmd.Commands()[0] == "HSET" {
			n++
		}
	}
	return n
}

// TestWritersGroupBatchesInSourceOrder (C50, C54): batches are built up to Writers ahead, and one sender writes
// them in source order: one batch DoMulti in flight at a time, each
// carrying at most Writers batches. With Writers=1 every DoMulti carries one
// batch; with Writers=4, when the server is slow, the next DoMulti carries
// the several batches built meanwhile.
//
// The source yields the first batch and waits until its DoMulti is sent, so
// that it goes alone. The hook then holds that DoMulti (a slow server)
// until the source has yielded max(Writers, 2) batches in all, or for at
// most 300 ms when the Rebuilder (rightly) stops pulling before that.
//
// The last user of every batch has the email shared@example.com, so that
// every two batches write a common hash field and must go in order (Hash is
// Keyed: batches with no field in common would overlap); the last batch's
// user must own it.
func TestWritersGroupBatchesInSourceOrder(t *testing.T) {
	for _, writers := range []int{1, 4} {
		t.Run(fmt.Sprintf("Writers=%d", writers), func(t *testing.T) {
			forEachDeployment(t, func(t *testing.T, d deployment) {
				ctx := redistest.Ctx(t)
				k := pipeNames(d)
				const batch = 100
				firstSent, queued := make(chan struct{}), make(chan struct{})
				var batches flight
				var mu sync.Mutex
				var groups []int    // batches per DoMulti, in send order
				var firsts []string // the first field of each batch, in send order
				client := rueidishook.WithHook(d.Client, redistest.Hook{
					OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
						if pipeBatchesIn(multi) == 0 {
							// Not a source batch: the last merged SADDs of
							// SetIndex, which commute with everything and
							// may overlap a batch.
							return c.DoMulti(ctx, multi...)
						}
						defer batches.enter()()
						mu.Lock()
						groups = append(groups, pipeBatchesIn(multi))
						for _, cmd := range multi {
							if args := cmd.Commands(); args[0] == "HSET" {
								firsts = append(firsts, args[2])
							}
						}
						nth := len(groups)
						mu.Unlock()
						if nth == 1 {
							close(firstSent)
							slow := time.NewTimer(300 * time.Millisecond) // a slow server: that is the test
							select {
							case <-queued:
							case <-slow.C:
							}
							slow.Stop()
						}
						return c.DoMulti(ctx, multi...)
					},
				})
				us := users(10 * batch)
				for b := range 10 {
					us[b*batch+batch-1].Email = "shared@example.com"
				}
				src := func(yield func(user, error) bool) {
					for i, u := range us {
						if !yield(u, nil) {
							return
						}
						if i+1 == batch {
							select {
							case <-firstSent:
							case <-ctx.Done():
								return
							}
						}
						if i+1 == max(writers, 2)*batch {
							close(queued)
						}
					}
				}
				stats, err := pipeRebuilder(t, client, k, rebuild.Options{BatchSize: batch, Writers: writers}).Run(ctx, rebuild.FromSeq2(src))
				if err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				defer mu.Unlock()
				t.Logf("%d batches in %d DoMultis: %v", stats.Batches, len(groups), groups)
				if got := batches.most.Load(); got != 1 {
					t.Errorf("got %d batch DoMultis in flight at once, want 1: one sender, in source order", got)
				}
				if len(groups) < 2 || groups[0] != 1 {
					t.Fatalf("got batches per DoMulti %v, want the first alone, then more", groups)
				}
				if writers > 1 && groups[1] < 2 {
					t.Errorf("got batches per DoMulti %v, want the second, sent after a slow write, to carry several", groups)
				}
				total := 0
				for i, g := range groups {
					total += g
					if g > writers {
						t.Errorf("DoMulti %d carries %d batches, want at most Writers = %d", i+1, g, writers)
					}
				}
				if total != 10 || stats.Batches != 10 {
					t.Errorf("got %d batches sent, Stats.Batches %d, want 10 and 10", total, stats.Batches)
				}
				if !slices.IsSorted(firsts) {
					t.Errorf("batches sent in order %v, want source order", firsts)
				}
				pipeWant(t, d.Other, k, us)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		})
	}
}

// TestTempKeysGetTTLWithFirstWrite (C34.1, Guarantee 5, C55, C56): every batch
// DoMulti that writes a temp key (HSET, ZADD, SADD) also carries, after
// those writes, an EXPIRE <temp> <2×TTL> NX of that key, so no temp key
// exists without a TTL beyond one pipeline; and every batch transaction
// advances the run's record (HINCRBY <first lock>:run batches 1), so that
// the publish can tell whether Redis still holds every batch.
func TestTempKeysGetTTLWithFirstWrite(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		var mu sync.Mutex
		var batches int
		var problems []string
		client := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				if pipeIsBatch(multi) {
					lastWrite := map[string]int{}
					expire := map[string]int{}
					counted := true // the batch since the last MULTI advanced the record
					for i, cmd := range multi {
						args := cmd.Commands()
						switch name := strings.ToUpper(args[0]); {
						case pipeIsWrite(args):
							lastWrite[args[1]] = i
						case name == "EXPIRE" && strings.HasSuffix(args[1], ":rebuild-lock:run"):
							// The record, should the lease lapse: the lease.
							if len(args) != 4 || args[2] != "120" || strings.ToUpper(args[3]) != "NX" {
								mu.Lock()
								problems = append(problems, fmt.Sprintf("got %q, want EXPIRE <record> 120 NX", args))
								mu.Unlock()
							}
						case name == "EXPIRE":
							// Twice the lease: a temp key outlives its lock.
							if len(args) == 4 && args[2] == "240" && strings.ToUpper(args[3]) == "NX" {
								expire[args[1]] = i
							} else {
								mu.Lock()
								problems = append(problems, fmt.Sprintf("got %q, want EXPIRE <temp> 240 NX", args))
								mu.Unlock()
							}
						case name == "MULTI":
							counted = false
						case name == "HINCRBY" && strings.HasSuffix(args[1], ":rebuild-lock:run") && args[2] == "batches" && args[3] == "1":
							counted = true
						case name == "EXEC" && !counted:
							mu.Lock()
							problems = append(problems, fmt.Sprintf("command %d: a batch transaction without HINCRBY <lock>:run batches 1", i))
							mu.Unlock()
						}
					}
					mu.Lock()
					batches += pipeBatchesIn(multi)
					for key, w := range lastWrite {
						if _, _, ok := store.ParseTempKey(key); !ok {
							problems = append(problems, fmt.Sprintf("write to %q, want writes to temp keys only", key))
						}
						if e, ok := expire[key]; !ok || e < w {
							problems = append(problems, fmt.Sprintf("temp key %s written by command %d without a later EXPIRE NX in the same DoMulti", key, w))
						}
					}
					mu.Unlock()
				}
				return c.DoMulti(ctx, multi...)
			},
		})
		k := pipeNames(d)
		us := users(1000)
		stats, err := pipeRebuilder(t, client, k, rebuild.Options{BatchSize: 200, Writers: 2, TTL: 120 * time.Second}).Run(ctx, rebuild.FromSlice(us))
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if int64(batches) != stats.Batches || batches != 5 {
			t.Errorf("inspected %d batches, Stats.Batches %d, want 5 and 5", batches, stats.Batches)
		}
		for _, p := range problems {
			t.Error(p)
		}
		pipeWant(t, d.Other, k, us)
	})
}

// TestLeaseRenewedDuringSlowSource (C16+, C13, C36): with a 3 s TTL, a
// source that yields a batch every 300 ms for 3 s, then nothing for 2.5 s,
// then a last batch: the run succeeds, and the lock, watched from another
// client, stays present with a PTTL above TTL/3 throughout. The heartbeat
// (every second at this TTL) rides in the batches' round trips while they
// come faster than every half second, and goes alone while they do not.
func TestLeaseRenewedDuringSlowSource(t *testing.T) {
	heartbeat := redistest.ScriptNamed("heartbeat")
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		const ttl = 3 * time.Second
		key := d.Prefix + "slow:by-email"
		lockKey := store.New(d.Other, store.Options{}).LockKey(key)

		var ridden, alone atomic.Int64
		client := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if heartbeat.Is(cmd.Commands()) {
					alone.Add(1)
				}
				return c.Do(ctx, cmd)
			},
			OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				if pipeIsBatch(multi) && heartbeat.Is(multi[len(multi)-1].Commands()) {
					ridden.Add(1)
				}
				return c.DoMulti(ctx, multi...)
			},
		})

		const batch, batches = 50, 11
		started, finished := make(chan struct{}), make(chan struct{})
		var aloneBeforeGap int64
		src := func(yield func(user, error) bool) {
			defer close(finished)
			us := users(batch * batches)
			close(started)
			for b := range batches {
				pause := 300 * time.Millisecond // a slow source: that is the test
				if b == batches-1 {
					aloneBeforeGap = alone.Load()
					pause = 2500 * time.Millisecond // and then a silent one
				}
				if b > 0 {
					wait := time.NewTimer(pause)
					select {
					case <-wait.C:
					case <-ctx.Done():
						return
					}
				}
				for _, u := range us[b*batch : (b+1)*batch] {
					if !yield(u, nil) {
						return
					}
				}
			}
		}

		// Watch the lock from another client while the source runs.
		type watch struct {
			samples int
			min     time.Duration
			err     error
		}
		watched := make(chan watch, 1)
		go func() {
			w := watch{min: ttl}
			select {
			case <-started:
			case <-ctx.Done():
				watched <- watch{err: ctx.Err()}
				return
			}
			for {
				select {
				case <-finished:
					watched <- w
					return
				default:
				}
				ms, err := d.Other.Do(ctx, d.Other.B().Pttl().Key(lockKey).Build()).AsInt64()
				if err != nil {
					w.err = err
					watched <- w
					return
				}
				w.samples++
				w.min = min(w.min, time.Duration(ms)*time.Millisecond) // -2 ms: absent
				period := time.NewTimer(10 * time.Millisecond)         // sampling period
				select {
				case <-period.C:
				case <-finished:
				}
				period.Stop()
			}
		}()

		start := time.Now()
		stats, err := redistest.Rebuilder(t, client, rebuild.Options{BatchSize: batch, TTL: ttl},
			builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
		).Run(ctx, rebuild.FromSeq2(src))
		w := <-watched
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		if w.err != nil {
			t.Fatalf("watching %s: %v", lockKey, w.err)
		}
		t.Logf("run took %v, %d batches; lock %s: %d samples, min PTTL %v; heartbeats: %d in batch round trips, %d alone (%d before the silent gap)",
			time.Since(start).Round(time.Millisecond), stats.Batches, lockKey, w.samples, w.min, ridden.Load(), alone.Load(), aloneBeforeGap)
		if w.samples < 10 {
			t.Errorf("got %d samples of the lock's PTTL, want at least 10", w.samples)
		}
		if w.min < ttl/3 {
			t.Errorf("lock PTTL went down to %v, want it renewed before it drops below TTL/3 = %v (negative: the lock was gone)", w.min, ttl/3)
		}
		if ridden.Load() < 1 {
			t.Errorf("got %d heartbeats in batch round trips over 3 s of batches every 300 ms, want at least 1", ridden.Load())
		}
		if alone.Load() <= aloneBeforeGap {
			t.Errorf("got %d heartbeats alone during the 2.5 s without batches, want at least 1", alone.Load()-aloneBeforeGap)
		}
	})
}

// TestRunTwiceAndConcurrently (C8, C43): the same Rebuilder runs twice in
// a row (its locks were released), and two Rebuilders of different keys run
// at the same time on one client. Both sources wait until the other has
// started, so the runs really overlap.
func TestRunTwiceAndConcurrently(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := pipeNames(d)
		r := pipeRebuilder(t, d.Client, k, rebuild.Options{BatchSize: 100})
		for i, us := range [][]user{users(500), users(300)} {
			if _, err := r.Run(ctx, rebuild.FromSlice(us)); err != nil {
				t.Fatalf("run %d: %v", i+1, err)
			}
			pipeWant(t, d.Other, k, us)
			redistest.WantClean(t, d.Other, d.Prefix)
		}

		k2 := pipeKeys{hash: d.Prefix + "second:by-email", zset: d.Prefix + "second:by-score", country: d.Prefix + "second:by-country"}
		r2 := pipeRebuilder(t, d.Client, k2, rebuild.Options{BatchSize: 100})
		var started sync.WaitGroup
		started.Add(2)
		both := make(chan struct{})
		go func() { started.Wait(); close(both) }()
		src := func(us []user) rebuild.Source[user] {
			return rebuild.FromSeq2(func(yield func(user, error) bool) {
				for i, u := range us {
					if !yield(u, nil) {
						return
					}
					if i == 0 {
						started.Done()
						select {
						case <-both:
						case <-ctx.Done():
							yield(user{}, ctx.Err())
							return
						}
					}
				}
			})
		}
		us1, us2 := users(700), users(900)
		errs := make(chan error, 2)
		go func() { _, err := r.Run(ctx, src(us1)); errs <- err }()
		go func() { _, err := r2.Run(ctx, src(us2)); errs <- err }()
		for range 2 {
			if err := <-errs; err != nil {
				t.Errorf("concurrent run: %v", err)
			}
		}
		pipeWant(t, d.Other, k, us1)
		pipeWant(t, d.Other, k2, us2)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

package rebuild_test

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// overlapHook counts the batch DoMultis in flight at once. It holds the
// DoMulti chosen by hold (the first batch DoMulti when hold is nil) until
// another batch DoMulti is in flight, or for at most wait: a server slow to
// answer it. Then it records whether the overlap happened.
//
// The Rebuilder sends each overlapping DoMulti from a goroutine of its own,
// so a later one can reach the hook first. A held DoMulti that finds one
// from later in the source already arrived has overlapped too: the later
// one was sent before it returned. Positions in the source are the
// smallest user id a DoMulti adds to a set (ids sort in source order).
type overlapHook struct {
	hold func(multi []rueidis.Completed) bool
	wait time.Duration

	flight     flight
	held       atomic.Int64 // DoMultis held
	overlapped atomic.Bool  // a held DoMulti saw another one arrive
	mu         sync.Mutex
	arrived    chan struct{} // closed, and replaced, when a batch DoMulti arrives
	maxPos     string        // the latest position in the source arrived so far
	batches    atomic.Int64
}

// position returns the smallest member of multi's SADDs, or "".
func position(multi []rueidis.Completed) string {
	pos := ""
	for _, cmd := range multi {
		if args := cmd.Commands(); args[0] == "SADD" {
			for _, m := range args[2:] {
				if pos == "" || m < pos {
					pos = m
				}
			}
		}
	}
	return pos
}

func newOverlapHook(wait time.Duration, hold func([]rueidis.Completed) bool) *overlapHook {
	return &overlapHook{hold: hold, wait: wait, arrived: make(chan struct{})}
}

func (h *overlapHook) client(c rueidis.Client) rueidis.Client {
	return rueidishook.WithHook(c, redistest.Hook{
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			if !pipeIsBatch(multi) {
				return c.DoMulti(ctx, multi...)
			}
			defer h.flight.enter()()
			pos := position(multi)
			h.mu.Lock()
			close(h.arrived) // wakes a held DoMulti: this one overlaps it
			h.arrived = make(chan struct{})
			next := h.arrived
			overtaken := pos != "" && h.maxPos > pos
			h.maxPos = max(h.maxPos, pos)
			h.mu.Unlock()
			first := h.batches.Add(1) == 1
			if (h.hold == nil && first) || (h.hold != nil && h.hold(multi)) {
				h.held.Add(1)
				if overtaken {
					h.overlapped.Store(true)
				} else {
					timer := time.NewTimer(h.wait)
					select {
					case <-next:
						h.overlapped.Store(true)
					case <-timer.C:
					}
					timer.Stop()
				}
			}
			return c.DoMulti(ctx, multi...)
		},
	})
}

// TestUnorderedOverlapsRoundTrips (C50, C54): a Rebuilder keeps one batch
// DoMulti in flight while order matters, and two when it cannot (every
// builder AnyOrder, as Set and SetIndex are, or ByEntry, as Hash is, and
// no entry written by both) or when the caller gave it up
// (Options.Unordered). The hook holds the first batch DoMulti, a slow
// server, and sees whether the next one arrives meanwhile. Never more than
// two are in flight, and the result is exact.
func TestUnorderedOverlapsRoundTrips(t *testing.T) {
	type tc struct {
		name      string
		unordered bool
		writers   int  // 0 means 4
		dup       bool // every batch writes the field "dup@example.com"
		builders  func(k pipeKeys) []index.Builder[user]
		want      func(t *testing.T, c rueidis.Client, k pipeKeys, us []user)
		overlap   bool
	}
	hash := func(k pipeKeys) index.Builder[user] {
		return builders.Hash(k.hash, func(u user) (string, string, bool) { return u.Email, u.ID, true })
	}
	// The same hash through Func: not ByEntry, so order must hold.
	funcHash := func(k pipeKeys) index.Builder[user] {
		return builders.Func(k.hash, func(c *index.Commands, us []user) error {
			temp, err := c.Temp(k.hash)
			if err != nil {
				return err
			}
			fvs := c.B().Hset().Key(temp).FieldValue()
			for _, u := range us {
				fvs = fvs.FieldValue(u.Email, u.ID)
			}
			c.Add(fvs.Build(), len(us))
			return nil
		})
	}
	set := func(k pipeKeys) index.Builder[user] {
		return builders.Set(k.zset, func(u user) (string, bool) { return u.ID, true })
	}
	setIndex := func(k pipeKeys) index.Builder[user] {
		return builders.SetIndex(k.country, func(u user) (string, string, bool) { return u.Country, u.ID, true })
	}
	wantHash := func(t *testing.T, c rueidis.Client, k pipeKeys, us []user) {
		t.Helper()
		want := map[string]string{}
		for _, u := range us {
			want[u.Email] = u.ID
		}
		if got := redistest.HGetAll(t, c, k.hash); !maps.Equal(want, got) {
			t.Errorf("hash %s (-want +got):\n%s", k.hash, cmp.Diff(want, got))
		}
	}
	wantSet := func(t *testing.T, c rueidis.Client, k pipeKeys, us []user) {
		t.Helper()
		var want []string
		for _, u := range us {
			want = append(want, u.ID)
		}
		slices.Sort(want)
		if got := redistest.SMembers(t, c, k.zset); !slices.Equal(want, got) {
			t.Errorf("set %s: got %d members, want %d (-want +got):\n%s", k.zset, len(got), len(want), cmp.Diff(want, got))
		}
	}
	wantIndex := func(t *testing.T, c rueidis.Client, k pipeKeys, us []user) {
		t.Helper()
		want := map[string]map[string]bool{}
		for _, u := range us {
			b := k.country + ":" + u.Country
			if want[b] == nil {
				want[b] = map[string]bool{}
			}
			want[b][u.ID] = true
		}
		got := map[string][]string{}
		for _, b := range redistest.LiveKeys(t, c, k.country+":") {
			got[b] = redistest.SMembers(t, c, b)
		}
		if want := sortedSets(want); !maps.EqualFunc(want, got, slices.Equal) {
			t.Errorf("buckets under %s (-want +got):\n%s", k.country+":", cmp.Diff(want, got))
		}
	}
	wantHashSet := func(t *testing.T, c rueidis.Client, k pipeKeys, us []user) {
		t.Helper()
		wantHash(t, c, k, us)
		wantSet(t, c, k, us)
	}
	for _, c := range []tc{
		// Hash is ByEntry: batches that share no field overlap...
		{name: "Hash", builders: func(k pipeKeys) []index.Builder[user] { return []index.Builder[user]{hash(k)} },
			want: wantHash, overlap: true},
		{name: "Hash+Set", builders: func(k pipeKeys) []index.Builder[user] { return []index.Builder[user]{hash(k), set(k)} },
			want: wantHashSet, overlap: true},
		// ... and batches that do go in order, the last write winning.
		{name: "Hash, a field in every batch", dup: true, builders: func(k pipeKeys) []index.Builder[user] { return []index.Builder[user]{hash(k)} },
			want: wantHash, overlap: false},
		{name: "Func", builders: func(k pipeKeys) []index.Builder[user] { return []index.Builder[user]{funcHash(k)} },
			want: wantHash, overlap: false},
		{name: "Func+Set", builders: func(k pipeKeys) []index.Builder[user] { return []index.Builder[user]{funcHash(k), set(k)} },
			want: wantHashSet, overlap: false},
		{name: "Hash Unordered", unordered: true, builders: func(k pipeKeys) []index.Builder[user] { return []index.Builder[user]{hash(k)} },
			want: wantHash, overlap: true},
		{name: "Set", builders: func(k pipeKeys) []index.Builder[user] { return []index.Builder[user]{set(k)} },
			want: wantSet, overlap: true},
		// One slot: the batch in flight holds it, so the source cannot fill
		// a second until the first is written (this once hung).
		{name: "Set Writers=1", writers: 1, builders: func(k pipeKeys) []index.Builder[user] { return []index.Builder[user]{set(k)} },
			want: wantSet, overlap: false},
		{name: "Set+SetIndex", builders: func(k pipeKeys) []index.Builder[user] { return []index.Builder[user]{set(k), setIndex(k)} },
			want: func(t *testing.T, c rueidis.Client, k pipeKeys, us []user) {
				wantSet(t, c, k, us)
				wantIndex(t, c, k, us)
			}, overlap: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			forEachDeployment(t, func(t *testing.T, d deployment) {
				k := pipeNames(d)
				// Where a second DoMulti should come while the first is
				// held, the hook waits for it as long as a loaded machine
				// may need to build and send it; where none should, 300 ms
				// without one is the finding.
				wait := 300 * time.Millisecond
				if c.overlap {
					wait = 20 * time.Second
				}
				h := newOverlapHook(wait, nil)
				us := users(1000)
				if c.dup {
					for i := range us {
						if i%50 == 7 {
							us[i].Email = "dup@example.com"
						}
					}
				}
				writers := c.writers
				if writers == 0 {
					writers = 4
				}
				r := redistest.Rebuilder(t, h.client(d.Client), rebuild.Options{BatchSize: 100, Writers: writers, Unordered: c.unordered}, c.builders(k)...)
				stats, err := r.Run(redistest.Ctx(t), sources.Slice(us))
				if err != nil {
					t.Fatal(err)
				}
				if stats.Batches != 10 {
					t.Errorf("Stats.Batches: got %d, want 10", stats.Batches)
				}
				want := int64(1)
				if c.overlap {
					want = 2
				}
				if got := h.flight.most.Load(); got != want {
					t.Errorf("got at most %d batch DoMultis in flight at once, want %d", got, want)
				}
				if got := h.overlapped.Load(); got != c.overlap {
					t.Errorf("a second batch DoMulti was sent while the first was held: %v, want %v", got, c.overlap)
				}
				c.want(t, d.Other, k, us)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		})
	}
}

// TestUnorderedFailWithRoundTripInFlight (C45, C52): with Options.Unordered,
// a run fails while a second round trip is in flight: the server rejects a
// write of the held DoMulti, the source fails, or ctx is cancelled. The run
// returns its error only after the other round trip has returned, so its
// writes cannot land after the cleanup: the live keys stay byte-identical,
// and no temp key or lock is left.
func TestUnorderedFailWithRoundTripInFlight(t *testing.T) {
	t.Parallel()
	errSource := errors.New("source failed")
	forEachDeployment(t, func(t *testing.T, d deployment) {
		s := failNewShape(d)
		before := failPopulate(t, d, s, s.builders(nil))
		us := failSecondUsers(failN)
		marker := us[failN/2].Email
		for _, tc := range []struct {
			name string
			op   string
			want error
			run  func(t *testing.T, c rueidis.Client) error
		}{
			{"write error", "write", nil, func(t *testing.T, c rueidis.Client) error {
				var replaced atomic.Int64
				_, err := redistest.Rebuilder(t, failRejectHSET(c, marker, &replaced), rebuild.Options{BatchSize: failBatch, Writers: 4, Unordered: true}, s.builders(nil)...).
					Run(redistest.Ctx(t), sources.Slice(us))
				if n := replaced.Load(); n != 1 {
					t.Errorf("HSETs replaced: got %d, want 1", n)
				}
				return err
			}},
			{"source error", "source", errSource, func(t *testing.T, c rueidis.Client) error {
				_, err := redistest.Rebuilder(t, c, rebuild.Options{BatchSize: failBatch, Writers: 4, Unordered: true}, s.builders(nil)...).
					Run(redistest.Ctx(t), failSource(us, failN/2+failBatch/2, errSource))
				return err
			}},
			{"cancel", "", context.Canceled, func(t *testing.T, c rueidis.Client) error {
				ctx, cancel := context.WithCancel(redistest.Ctx(t))
				defer cancel()
				var once sync.Once
				_, err := redistest.Rebuilder(t, c, rebuild.Options{BatchSize: failBatch, Writers: 4, Unordered: true, Progress: func(p rebuild.Progress) {
					if p.Batches >= 3 {
						once.Do(cancel)
					}
				}}, s.builders(nil)...).Run(ctx, sources.Slice(us))
				return err
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				// Hold the DoMulti carrying the marker (the write error's
				// batch), or else every batch DoMulti, until another is in
				// flight.
				h := newOverlapHook(2*time.Second, func(multi []rueidis.Completed) bool {
					for _, cmd := range multi {
						// The write error's hook runs first: it has replaced
						// the marker's HSET.
						if args := cmd.Commands(); args[0] == "HSET" && slices.Contains(args, failRejectedField) {
							return true
						}
					}
					return tc.name != "write error"
				})
				err := tc.run(t, h.client(d.Client))
				failWantError(t, err, tc.op, tc.want)
				if h.held.Load() == 0 || !h.overlapped.Load() {
					t.Errorf("held %d DoMultis, overlap seen: %v; want a second round trip in flight while one was held", h.held.Load(), h.overlapped.Load())
				}
				if got := h.flight.most.Load(); got > 2 {
					t.Errorf("got %d batch DoMultis in flight at once, want at most 2", got)
				}
				failWantNothingChanged(t, d, before)
			})
		}
	})
}

// TestOverlapRenewalBeforeCreation (C20, C45): a refresh of the temp keys
// can run while a round trip that creates one of them is still on its way.
// Here the round trip that creates a bucket's temp key is held until a
// refresh has run: the refresh finds that key absent. The key was not
// populated when the refresh took its snapshot, so its absence is no loss:
// the run publishes, exactly.
func TestOverlapRenewalBeforeCreation(t *testing.T) {
	t.Parallel()
	refresh := redistest.ScriptNamed("refresh")
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		prefix := d.Prefix + "users:by-country"
		refreshed := make(chan struct{}) // a refresh of the held bucket's temp key has run
		var once sync.Once
		var held, absent atomic.Bool
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				args := slices.Clone(cmd.Commands())
				wasHeld := held.Load()
				res := c.Do(ctx, cmd)
				// EVALSHA sha numkeys lock temp...: the state of args[a] is
				// the reply's element a-3 (the first is the lock's check).
				if !refresh.Is(args) || !wasHeld {
					return res
				}
				n, _ := strconv.Atoi(args[2])
				for a := 4; a < 3+n && a < len(args); a++ {
					if !strings.Contains(args[a], ":only-b") {
						continue
					}
					if states, err := res.AsIntSlice(); err == nil && a-3 < len(states) && states[a-3] == 0 {
						absent.Store(true) // it found the held bucket's temp key absent
					}
					once.Do(func() { close(refreshed) })
				}
				return res
			},
			OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				for _, cmd := range multi {
					if args := cmd.Commands(); args[0] == "SADD" && strings.Contains(args[1], ":only-b:") && held.CompareAndSwap(false, true) {
						select { // run after a refresh
						case <-refreshed:
						case <-time.After(10 * time.Second):
							t.Error("no refresh of the held bucket's temp key came while the round trip was held")
						}
					}
				}
				return c.DoMulti(ctx, multi...)
			},
		})
		us := users(20)
		for i := range us {
			us[i].Country = "other"
			if i >= 10 {
				us[i].Country = "only-b"
			}
		}
		r := redistest.Rebuilder(t, hooked, rebuild.Options{BatchSize: 10, Writers: 2, TTL: 2 * time.Second},
			builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if !absent.Load() {
			t.Fatal("no refresh found the held bucket's temp key absent: the test did not test")
		}
		for bucket, want := range map[string]int{"only-b": 10, "other": 10} {
			if got := len(redistest.SMembers(t, d.Other, prefix+":"+bucket)); got != want {
				t.Errorf("SCARD %s:%s: got %d, want %d", prefix, bucket, got, want)
			}
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// TestKeyedOverlapKeepsLastWrite (C50, C54): with Hash and SortedSet, which
// are ByEntry, round trips overlap unless they write a common field or
// member. One item in 60 rewrites an entry from up to 150 items
// back, often in the trip still in flight, and the hook delays each batch
// DoMulti by a random 0–3 ms before sending it, so that an overlapping
// later trip can reach Redis first. The last write in source order must
// win every field and member, and two round trips must have been in flight
// at once. (With the conflict check removed, last writes are lost.)
func TestKeyedOverlapKeepsLastWrite(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		k := pipeNames(d)
		for seed := range uint64(4) {
			rng := rand.New(rand.NewPCG(seed, 42))
			us := users(3000)
			for i := range us {
				if i > 0 && rng.IntN(60) == 0 {
					us[i].Email = us[max(0, i-1-rng.IntN(150))].Email
				}
			}
			var mu sync.Mutex
			delays := rand.New(rand.NewPCG(seed, 7))
			var batches flight
			hooked := rueidishook.WithHook(d.Client, redistest.Hook{
				OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
					if !pipeIsBatch(multi) {
						return c.DoMulti(ctx, multi...)
					}
					defer batches.enter()()
					mu.Lock()
					delay := time.Duration(delays.IntN(3000)) * time.Microsecond
					mu.Unlock()
					time.Sleep(delay)
					return c.DoMulti(ctx, multi...)
				},
			})
			r := redistest.Rebuilder(t, hooked, rebuild.Options{BatchSize: 50, Writers: 4},
				builders.Hash(k.hash, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
				builders.SortedSet(k.zset, func(u user) (string, float64, bool) { return u.Email, u.Score, true }))
			if _, err := r.Run(redistest.Ctx(t), sources.Slice(us)); err != nil {
				t.Fatal(err)
			}
			wantH, wantZ := map[string]string{}, map[string]float64{}
			for _, u := range us {
				wantH[u.Email], wantZ[u.Email] = u.ID, u.Score
			}
			if got := redistest.HGetAll(t, d.Other, k.hash); !maps.Equal(wantH, got) {
				t.Errorf("seed %d: hash %s (-want +got):\n%s", seed, k.hash, cmp.Diff(wantH, got))
			}
			if got := redistest.ZScores(t, d.Other, k.zset); !maps.Equal(wantZ, got) {
				t.Errorf("seed %d: sorted set %s (-want +got):\n%s", seed, k.zset, cmp.Diff(wantZ, got))
			}
			if got := batches.most.Load(); got != 2 {
				t.Errorf("seed %d: at most %d batch DoMultis in flight at once, want 2 (trips that share no entry overlap)", seed, got)
			}
			redistest.WantClean(t, d.Other, d.Prefix)
		}
	})
}

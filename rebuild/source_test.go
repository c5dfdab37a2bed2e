package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// srcCollect drains src, stopping after limit items (limit < 0: never).
func srcCollect[T any](src sources.Source[T], limit int) ([]T, error) {
	var out []T
	for v, err := range src(context.Background()) {
		if err != nil {
			return out, err
		}
		if limit >= 0 && len(out) == limit {
			break
		}
		out = append(out, v)
	}
	return out, nil
}

// TestFromSlice: the source yields the slice's items in order, never an
// error, and stops when the consumer stops.
func TestFromSlice(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    []int
		limit int
		want  []int
	}{
		{name: "nil", in: nil, limit: -1, want: nil},
		{name: "all", in: []int{3, 1, 2}, limit: -1, want: []int{3, 1, 2}},
		{name: "break early", in: []int{3, 1, 2, 5, 8}, limit: 2, want: []int{3, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := srcCollect(sources.Slice(tc.in), tc.limit)
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("items (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFromSeq: the source yields the sequence's items in order, and when
// the consumer breaks out, the sequence sees yield return false and stops:
// it produces nothing more.
func TestFromSeq(t *testing.T) {
	for _, tc := range []struct {
		name         string
		n, limit     int
		want         []int
		wantProduced int
	}{
		{name: "all", n: 4, limit: -1, want: []int{0, 1, 2, 3}, wantProduced: 4},
		{name: "break early", n: 100, limit: 3, want: []int{0, 1, 2}, wantProduced: 4}, // the 4th is the one refused
	} {
		t.Run(tc.name, func(t *testing.T) {
			produced, returned := 0, false
			seq := func(yield func(int) bool) {
				defer func() { returned = true }()
				for i := range tc.n {
					produced++
					if !yield(i) {
						return
					}
				}
			}
			got, err := srcCollect(sources.Seq(seq), tc.limit)
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("items (-want +got):\n%s", diff)
			}
			if produced != tc.wantProduced || !returned {
				t.Errorf("sequence produced %d items and returned=%v, want %d and true", produced, returned, tc.wantProduced)
			}
		})
	}
}

// TestFromSeqStopsWhenRunFails (C52, SOURCE early stop): an endless
// generator feeds a run whose builder fails on its third batch. The run
// fails with the builder's error, stops pulling, and the generator returns;
// the live key is untouched and nothing is left behind.
func TestFromSeqStopsWhenRunFails(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		key := d.Prefix + "gen:by-email"
		if _, err := redistest.Rebuilder(t, d.Client, rebuild.Options{},
			builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
		).Run(ctx, sources.Slice(users(10))); err != nil {
			t.Fatal(err)
		}
		before := redistest.Snapshot(t, d.Other, d.Prefix)

		errBoom := errors.New("boom")
		var builds atomic.Int64
		hash := builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true })
		failing := builders.Func(key, func(c *index.Commands, us []user) error {
			if builds.Add(1) == 3 {
				return errBoom
			}
			return hash.Build(c, us)
		})
		const limit = 10_000_000 // far more than the run can pull before it stops
		var produced int
		returned, exhausted := false, false
		gen := func(yield func(user) bool) {
			defer func() { returned = true }()
			for i := range limit {
				produced++
				if !yield(user{ID: fmt.Sprint(i), Email: fmt.Sprint("e", i)}) {
					return
				}
			}
			exhausted = true
		}
		_, err := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 100, Writers: 2}, failing).Run(ctx, sources.Seq(gen))
		if !errors.Is(err, errBoom) {
			t.Fatalf("got error %v, want one matching %v", err, errBoom)
		}
		if !returned || exhausted {
			t.Errorf("generator returned=%v exhausted=%v after %d items, want it stopped early", returned, exhausted, produced)
		}
		t.Logf("the generator produced %d items before it was stopped", produced)
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// srcKind is a SCAN source under test: Hashes, or Scan reading two
// fields with HMGET. fail is called once per key decoded; an error it
// returns is the decode's error.
type srcKind struct {
	name   string
	source func(c rueidis.Client, match string, fail func() error) sources.Source[user]
}

var srcKinds = []srcKind{
	{name: "Hashes", source: func(c rueidis.Client, match string, fail func() error) sources.Source[user] {
		return sources.Hashes(c, match, func(key string, fields map[string]string) (user, bool, error) {
			if err := fail(); err != nil {
				return user{}, false, err
			}
			return user{ID: fields["id"], Email: fields["email"]}, true, nil
		})
	}},
	{name: "Scan", source: func(c rueidis.Client, match string, fail func() error) sources.Source[user] {
		return sources.Scan(c, sources.ScanOptions{Match: match, Type: "hash", Count: 500},
			func(cb rueidis.Builder, key string) rueidis.Completed {
				return cb.Hmget().Key(key).Field("id", "email").Build()
			},
			func(key string, reply rueidis.RedisMessage) (user, bool, error) {
				if err := fail(); err != nil {
					return user{}, false, err
				}
				vals, err := reply.ToArray()
				if err != nil || len(vals) != 2 {
					return user{}, false, fmt.Errorf("HMGET reply %v: %v", reply, err)
				}
				if vals[0].IsNil() {
					return user{}, false, nil // deleted since SCAN
				}
				id, _ := vals[0].ToString()
				email, _ := vals[1].ToString()
				return user{ID: id, Email: email}, true, nil
			})
	}},
}

// srcIsRead reports whether a DoMulti is a SCAN source's page read.
func srcIsRead(multi []rueidis.Completed) bool {
	if len(multi) == 0 {
		return false
	}
	switch multi[0].Commands()[0] {
	case "HGETALL", "HMGET":
		return true
	}
	return false
}

// srcSeed writes the object hashes "<objects>user:<id>:object" of us, plus
// a string that matches the pattern (excluded by SCAN TYPE hash) and a hash
// that does not match it.
func srcSeed(t *testing.T, c rueidis.Client, objects string, us []user) {
	t.Helper()
	ctx := context.Background()
	cmds := rueidis.Commands{
		c.B().Set().Key(objects + "user:noise:object").Value("not a hash").Build(),
		c.B().Hset().Key(objects+"user:u1:profile").FieldValue().FieldValue("id", "x").FieldValue("email", "x@x").Build(),
	}
	for _, u := range us {
		cmds = append(cmds, c.B().Hset().Key(objects+"user:"+u.ID+":object").FieldValue().
			FieldValue("id", u.ID).FieldValue("email", u.Email).FieldValue("country", u.Country).Build())
	}
	for i, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			t.Fatalf("seed command %d: %v", i, err)
		}
	}
}

// srcPerMaster counts the keys starting with prefix on each master.
func srcPerMaster(t *testing.T, c rueidis.Client, prefix string) map[string]int {
	t.Helper()
	ctx := context.Background()
	out := map[string]int{}
	for addr, node := range c.Nodes() {
		role, err := node.Do(ctx, node.B().Role().Build()).ToArray()
		if err != nil {
			t.Fatalf("ROLE on %s: %v", addr, err)
		}
		if r, _ := role[0].ToString(); r != "master" {
			continue
		}
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(prefix+"*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				t.Fatalf("SCAN on %s: %v", addr, err)
			}
			out[addr] += len(e.Elements)
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return out
}

// TestScanSources (FromScan, FromHashes; Familia's
// fallback of rebuilding an index from the object keys): 5,000 object
// hashes are rebuilt into a hash index with exact contents, on standalone
// and on the cluster, where the objects either share the index's hash tag
// (one node) or are untagged and spread over all 3 masters while the index
// stays tagged. Then, on the same objects: a decode error and a read error
// each stop the run (errors.Is matches the cause, no read follows, the live
// index is unchanged, nothing is left behind, C52); and keys deleted
// between SCAN and their read are skipped.
func TestScanSources(t *testing.T) {
	const n = 5000
	forEachDeployment(t, func(t *testing.T, d deployment) {
		untagged := strings.NewReplacer("{", "", "}", "").Replace(d.Prefix)
		for _, kind := range srcKinds {
			for _, place := range []struct {
				name    string
				objects string
			}{
				{"tagged", d.Prefix + kind.name + ":obj:"},
				{"untagged", untagged + kind.name + ":spread:"},
			} {
				t.Run(kind.name+"/"+place.name, func(t *testing.T) {
					t.Parallel()
					ctx := redistest.Ctx(t)
					us := users(n)
					srcSeed(t, d.Other, place.objects, us)
					if d.Cluster && place.name == "untagged" {
						per := srcPerMaster(t, d.Other, place.objects)
						if len(per) != 3 {
							t.Fatalf("object keys on %d masters (%v), want 3", len(per), per)
						}
						for addr, c := range per {
							if c == 0 {
								t.Errorf("master %s holds no object key, want the untagged keys spread over every master", addr)
							}
						}
					}
					scope := d.Prefix + kind.name + ":" + place.name + ":" // sibling subtests run in parallel under d.Prefix
					index := scope + "idx:by-email"
					match := place.objects + "user:*:object"
					want := map[string]string{}
					for _, u := range us {
						want[u.Email] = u.ID
					}

					// The source's client, hooked to delete keys before a read
					// or to fail a read; reads are counted.
					var reads atomic.Int64
					var mu sync.Mutex
					var failRead error
					var deleteBefore bool
					var deleted []string
					srcClient := rueidishook.WithHook(d.Client, redistest.Hook{
						OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
							if !srcIsRead(multi) {
								return c.DoMulti(ctx, multi...)
							}
							nth := reads.Add(1)
							mu.Lock()
							fail, del := failRead, deleteBefore
							mu.Unlock()
							if fail != nil && nth >= 2 {
								out := make([]rueidis.RedisResult, len(multi))
								for i := range out {
									out[i] = rueidis.NewErrorResult(fail)
								}
								return out
							}
							if del && nth == 1 {
								var dels rueidis.Commands
								for i, cmd := range multi {
									if i%2 == 0 {
										key := cmd.Commands()[1]
										deleted = append(deleted, key)
										dels = append(dels, d.Other.B().Del().Key(key).Build())
									}
								}
								for _, r := range d.Other.DoMulti(ctx, dels...) {
									if err := r.Error(); err != nil {
										t.Errorf("DEL: %v", err)
									}
								}
							}
							return c.DoMulti(ctx, multi...)
						},
					})
					newRun := func() *rebuild.Rebuilder[user] {
						return redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 700},
							builders.Hash(index, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
					}
					noFail := func() error { return nil }

					// 1. Every object, exactly.
					stats, err := newRun().Run(ctx, kind.source(srcClient, match, noFail))
					if err != nil {
						t.Fatalf("rebuild: %v", err)
					}
					if got := redistest.HGetAll(t, d.Other, index); !maps.Equal(want, got) { // cmp.Diff only on failure: it is slow on 5,000 entries
						t.Errorf("index (-want +got):\n%s", cmp.Diff(want, got))
					}
					if stats.Items < n { // SCAN may return a key twice, never miss one
						t.Errorf("Stats.Items: got %d, want at least %d", stats.Items, n)
					}
					redistest.WantClean(t, d.Other, scope)
					before := redistest.Snapshot(t, d.Other, index)

					// 2. A decode error stops the run.
					errDecode := errors.New("cannot decode object")
					var decoded atomic.Int64
					failDecode := func() error {
						if decoded.Add(1) == n/2 {
							return errDecode
						}
						return nil
					}
					reads.Store(0)
					stats, err = newRun().Run(ctx, kind.source(srcClient, match, failDecode))
					if !errors.Is(err, errDecode) {
						t.Errorf("decode error: got %v, want an error matching %v", err, errDecode)
					}
					if got := decoded.Load(); got != n/2 || stats.Items >= n/2 {
						t.Errorf("decode error: got %d decodes and %d items, want the source stopped at decode %d", got, stats.Items, n/2)
					}
					redistest.WantUnchanged(t, d.Other, index, before)
					redistest.WantClean(t, d.Other, scope)

					// 3. A read error stops the run: the second page's read fails.
					errRead := errors.New("read failed")
					mu.Lock()
					failRead = errRead
					mu.Unlock()
					reads.Store(0)
					_, err = newRun().Run(ctx, kind.source(srcClient, match, noFail))
					if !errors.Is(err, errRead) {
						t.Errorf("read error: got %v, want an error matching %v", err, errRead)
					}
					if got := reads.Load(); got != 2 {
						t.Errorf("read error: got %d page reads, want 2: the source must stop at the failed one", got)
					}
					redistest.WantUnchanged(t, d.Other, index, before)
					redistest.WantClean(t, d.Other, scope)

					// 4. Keys deleted between SCAN and the read are skipped.
					mu.Lock()
					failRead, deleteBefore = nil, true
					mu.Unlock()
					reads.Store(0)
					if _, err := newRun().Run(ctx, kind.source(srcClient, match, noFail)); err != nil {
						t.Fatalf("rebuild with deletions: %v", err)
					}
					if len(deleted) == 0 {
						t.Fatal("deleted no key between SCAN and the read, want some")
					}
					for _, key := range deleted {
						id := strings.TrimSuffix(strings.TrimPrefix(key, place.objects+"user:"), ":object")
						i := slices.IndexFunc(us, func(u user) bool { return u.ID == id })
						if i < 0 {
							t.Fatalf("deleted key %q is not an object", key)
						}
						delete(want, us[i].Email)
					}
					if got := redistest.HGetAll(t, d.Other, index); !maps.Equal(want, got) {
						t.Errorf("index after %d deletions (-want +got):\n%s", len(deleted), cmp.Diff(want, got))
					}
					redistest.WantClean(t, d.Other, scope)
				})
			}
		}
	})
}

// TestScanSourceSkipsOwnKeys (11.1): a SCAN source whose pattern also
// matches the index being rebuilt (a hash, like the objects) and keyswap's
// own keys (a temp key and a record, both hashes, and a generation) never
// yields them: the source sees exactly the objects.
func TestScanSourceSkipsOwnKeys(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		p := d.Prefix + "broad:"
		const n = 300
		srcSeed(t, d.Other, p, users(n)) // p + "user:<id>:object"
		index := p + "by-email"
		planted := []string{
			index + ":rebuild:1700000000:0123456789abcdef", // a crashed run's temp key
			index + ":rebuild-lock:run",                    // a record
		}
		for _, k := range planted {
			redistest.SeedHash(t, d.Other, k, map[string]string{"id": "planted", "email": "planted@example.com"})
			redistest.Cmd(t, d.Other, "EXPIRE", k, "600")
		}
		var seen []string
		src := sources.Hashes(d.Client, p+"*", func(key string, f map[string]string) (user, bool, error) {
			seen = append(seen, key)
			return user{ID: f["id"], Email: f["email"]}, true, nil
		})
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{},
			builders.Hash(index, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
		for run := range 2 { // the second run's pattern matches the index the first one made
			seen = nil
			stats, err := r.Run(ctx, src)
			if err != nil {
				t.Fatalf("run %d: %v", run, err)
			}
			// srcSeed's objects, and the application's one other hash.
			if stats.Items != n+1 {
				t.Errorf("run %d: Stats.Items = %d, want %d: the %d objects and the profile only", run, stats.Items, n+1, n)
			}
			for _, k := range seen {
				if k == index || slices.Contains(planted, k) || strings.Contains(k, ":rebuild") {
					t.Errorf("run %d: the source read %q, which is keyswap's or the run's own", run, k)
				}
			}
		}
		for _, k := range planted {
			redistest.Cmd(t, d.Other, "DEL", k)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

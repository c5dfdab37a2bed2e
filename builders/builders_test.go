package builders_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidiscompat"
	"github.com/redis/rueidis/rueidishook"
)

// Every constructor returns a rebuild.Builder.
var (
	_ rebuild.Builder[user] = builders.Hash[user]("h", func(user) (string, string, bool) { return "", "", false })
	_ rebuild.Builder[user] = builders.SortedSet[user]("z", func(user) (string, float64, bool) { return "", 0, false })
	_ rebuild.Builder[user] = builders.Set[user]("s", func(user) (string, bool) { return "", false })
	_ rebuild.Builder[user] = builders.SetIndex[user]("i", func(user) (string, string, bool) { return "", "", false })
	_ rebuild.Builder[user] = builders.HashErr[user]("h", func(user) (string, string, bool, error) { return "", "", false, nil })
	_ rebuild.Builder[user] = builders.SortedSetErr[user]("z", func(user) (string, float64, bool, error) { return "", 0, false, nil })
	_ rebuild.Builder[user] = builders.SetErr[user]("s", func(user) (string, bool, error) { return "", false, nil })
	_ rebuild.Builder[user] = builders.SetIndexErr[user]("i", func(user) (string, string, bool, error) { return "", "", false, nil })
	_ rebuild.Builder[user] = builders.Func[user]("f", func(*rebuild.Commands, []user) error { return nil })
	_ rebuild.Builder[user] = builders.Compat[user]("c", func(context.Context, rueidiscompat.Pipeliner, string, []user) error { return nil })
)

// The builders the tests use, over user.
func byEmail(key string) rebuild.Builder[user] {
	return builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, !builders.Blank(u.Email) })
}

func byScore(key string) rebuild.Builder[user] {
	return builders.SortedSet(key, func(u user) (string, float64, bool) { return u.ID, u.Score, !builders.Blank(u.ID) })
}

func ids(key string) rebuild.Builder[user] {
	return builders.Set(key, func(u user) (string, bool) { return u.ID, !builders.Blank(u.ID) })
}

func byCountry(prefix string) rebuild.Builder[user] {
	return builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, !builders.Blank(u.Country) })
}

// recorder is a redistest.Hook that records the commands of every DoMulti,
// which is how the Rebuilder sends batches.
type recorder struct {
	mu    sync.Mutex
	multi [][]string
}

func (r *recorder) client(c rueidis.Client) rueidis.Client {
	return rueidishook.WithHook(c, redistest.Hook{
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			r.mu.Lock()
			for _, cmd := range multi {
				r.multi = append(r.multi, slices.Clone(cmd.Commands()))
			}
			r.mu.Unlock()
			return c.DoMulti(ctx, multi...)
		},
	})
}

// entries returns the number of entries (fields, members) of each HSET,
// ZADD, SADD and PFADD sent, in order.
func (r *recorder) entries() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for _, args := range r.multi {
		switch strings.ToUpper(args[0]) {
		case "HSET", "ZADD":
			out = append(out, (len(args)-2)/2)
		case "SADD", "PFADD":
			out = append(out, len(args)-2)
		}
	}
	return out
}

// commands returns the commands sent, in order.
func (r *recorder) commands() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.multi)
}

// wantRunError checks that err is a failed run's *rebuild.Error of op op,
// whose message contains every string of want.
func wantRunError(t *testing.T, err error, op string, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Run: got nil error, want a %q error", op)
	}
	var e *rebuild.Error
	if !errors.As(err, &e) {
		t.Fatalf("Run: got error %v (%T), want a *rebuild.Error", err, err)
	}
	if e.Op != op {
		t.Errorf("Run: got Op %q, want %q (error %v)", e.Op, op, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Run: got error %q, want it to contain %q", err, w)
		}
	}
}

func TestBuilderKeyAndFamily(t *testing.T) {
	// The Rebuilder finds family builders by type assertion (database/sql
	// style): only SetIndex is one, and its Key is its prefix.
	for _, tc := range []struct {
		name   string
		b      rebuild.Builder[user]
		key    string
		family bool
	}{
		{"Hash", byEmail("users:by-email"), "users:by-email", false},
		{"SortedSet", byScore("users:by-score"), "users:by-score", false},
		{"Set", ids("users:ids"), "users:ids", false},
		{"SetIndex", byCountry("users:by-country"), "users:by-country", true},
		{"Func", builders.Func("visitors", func(*rebuild.Commands, []user) error { return nil }), "visitors", false},
		{"Compat", builders.Compat("c", func(context.Context, rueidiscompat.Pipeliner, string, []user) error { return nil }), "c", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.b.Key(); got != tc.key {
				t.Errorf("Key(): got %q, want %q", got, tc.key)
			}
			f, ok := tc.b.(rebuild.Family)
			if ok != tc.family {
				t.Fatalf("implements rebuild.Family: got %v, want %v", ok, tc.family)
			}
			if ok && f.KeyType() != "set" {
				t.Errorf("KeyType(): got %q, want %q", f.KeyType(), "set")
			}
		})
	}
}

func TestBlank(t *testing.T) {
	// C48: Familia skips nil, empty and whitespace-only index values.
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"", true}, {" ", true}, {"\t\n\r ", true},
		{"a", false}, {" a ", false}, {"0", false}, {"-", false},
	} {
		t.Run(fmt.Sprintf("%q", tc.s), func(t *testing.T) {
			if got := builders.Blank(tc.s); got != tc.want {
				t.Errorf("Blank(%q): got %v, want %v", tc.s, got, tc.want)
			}
		})
	}
}

func TestHash(t *testing.T) {
	// C48 (skip blanks), C50 (last write of a field wins, written entries
	// counted), C23 (replaced, not merged; no TTL left on the live key).
	src := []user{
		{ID: "1", Email: "ann@example.com"},
		{ID: "2", Email: ""},
		{ID: "3", Email: "bob@example.com"},
		{ID: "4", Email: " \t "},
		{ID: "5", Email: "ann@example.com"}, // same field as ID 1: the last write wins
		{ID: "6", Email: "cy@example.com"},
	}
	want := map[string]string{"ann@example.com": "5", "bob@example.com": "3", "cy@example.com": "6"}
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, bs := range []int{1, 2, 1000} {
			t.Run(fmt.Sprintf("batch=%d", bs), func(t *testing.T) {
				key := fmt.Sprintf("%sby-email:%d", d.Prefix, bs)
				redistest.Do(t, d.Other, d.Other.B().Hset().Key(key).FieldValue().FieldValue("stale@example.com", "99").Build())

				stats := mustRun(t, d.Client, rebuild.Options{BatchSize: bs, Writers: 1}, src, byEmail(key))

				if diff := cmp.Diff(want, redistest.HGetAll(t, d.Other, key)); diff != "" {
					t.Errorf("HGETALL %s (-want +got):\n%s", key, diff)
				}
				if got := stats.Entries[key]; got != 4 {
					t.Errorf("Stats.Entries[%q]: got %d, want 4 (6 items, 2 blank)", key, got)
				}
				if stats.Items != 6 {
					t.Errorf("Stats.Items: got %d, want 6 (skipped items included)", stats.Items)
				}
				if want := int64((6 + bs - 1) / bs); stats.Batches != want {
					t.Errorf("Stats.Batches: got %d, want %d", stats.Batches, want)
				}
				if got := stats.Outcomes[key]; got != store.Swapped {
					t.Errorf("Stats.Outcomes[%q]: got %v, want %v", key, got, store.Swapped)
				}
				if got := redistest.PTTL(t, d.Other, key); got != -1 {
					t.Errorf("PTTL %s: got %v, want -1 (no expiry)", key, got)
				}
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

func TestSortedSet(t *testing.T) {
	// C54: a member's score is whatever the builder returns, exactly, and
	// the last write of a member wins. C48: blank members are skipped.
	src := []user{
		{ID: "a", Score: 1.5},
		{ID: "b", Score: -2},
		{ID: "a", Score: 3}, // last write wins
		{ID: "inf", Score: math.Inf(1)},
		{ID: "-inf", Score: math.Inf(-1)},
		{ID: "big", Score: 1e300},
		{ID: "-small", Score: -1e-300},
		{ID: "max", Score: math.MaxFloat64},
		{ID: "tiny", Score: math.SmallestNonzeroFloat64},
		{ID: "tenth", Score: 0.1},
		{ID: "third", Score: 1.0 / 3},
		{ID: "  ", Score: 7}, // skipped
	}
	want := map[string]float64{
		"a": 3, "b": -2, "inf": math.Inf(1), "-inf": math.Inf(-1), "big": 1e300, "-small": -1e-300,
		"max": math.MaxFloat64, "tiny": math.SmallestNonzeroFloat64, "tenth": 0.1, "third": 1.0 / 3,
	}
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, bs := range []int{1, 1000} {
			t.Run(fmt.Sprintf("batch=%d", bs), func(t *testing.T) {
				key := fmt.Sprintf("%sby-score:%d", d.Prefix, bs)
				redistest.Do(t, d.Other, d.Other.B().Zadd().Key(key).ScoreMember().ScoreMember(1, "phantom").Build())

				stats := mustRun(t, d.Client, rebuild.Options{BatchSize: bs, Writers: 1}, src, byScore(key))

				got := redistest.ZScores(t, d.Other, key)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("ZRANGE %s WITHSCORES (-want +got):\n%s", key, diff)
				}
				for _, m := range sortedKeys(want) { // cmp.Diff compares with ==; say it for the bits too
					if math.Float64bits(got[m]) != math.Float64bits(want[m]) {
						t.Errorf("score of %q: got %v (%#x), want %v (%#x)", m, got[m], math.Float64bits(got[m]), want[m], math.Float64bits(want[m]))
					}
				}
				if got := stats.Entries[key]; got != 11 {
					t.Errorf("Stats.Entries[%q]: got %d, want 11 (12 items, 1 blank)", key, got)
				}
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

func TestSortedSetNaN(t *testing.T) {
	// A NaN score fails the run with an error naming the member (Redis
	// would refuse it), after earlier batches were written: nothing is
	// published, the temp key is discarded, the lock released (C52, C18).
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "by-score"
		redistest.Do(t, d.Other, d.Other.B().Zadd().Key(key).ScoreMember().ScoreMember(1, "old").Build())
		before := redistest.Snapshot(t, d.Other, d.Prefix)

		src := []user{{ID: "a", Score: 1}, {ID: "b", Score: 2}, {ID: "c", Score: 3}, {ID: "not-a-number", Score: math.NaN()}, {ID: "e", Score: 5}}
		var rec recorder
		_, err := redistest.Rebuilder(t, rec.client(d.Client), rebuild.Options{BatchSize: 2, Writers: 1}, byScore(key)).
			Run(redistest.Ctx(t), rebuild.FromSlice(src))

		wantRunError(t, err, "build", "NaN", `"not-a-number"`, key)
		if got := rec.entries(); !slices.Equal(got, []int{2}) {
			t.Errorf("ZADDs sent before the failure: got entries %v, want [2] (the first batch)", got)
		}
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestSet(t *testing.T) {
	// C48: blank members skipped. C76: a member belongs to one item: a
	// source in which two items have the same member fails the run, naming
	// the key and the member, and the live key is as it was.
	src := []user{{ID: "a"}, {ID: ""}, {ID: "b"}, {ID: "c"}}
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "ids"
		redistest.Do(t, d.Other, d.Other.B().Sadd().Key(key).Member("stale").Build())

		stats := mustRun(t, d.Client, rebuild.Options{BatchSize: 2}, src, ids(key))

		if got, want := redistest.SMembers(t, d.Other, key), []string{"a", "b", "c"}; !slices.Equal(got, want) {
			t.Errorf("SMEMBERS %s: got %v, want %v", key, got, want)
		}
		if got := stats.Entries[key]; got != 3 {
			t.Errorf("Stats.Entries[%q]: got %d, want 3", key, got)
		}

		r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 2}, ids(key))
		_, err := r.Run(redistest.Ctx(t), rebuild.FromSlice(append(src, user{ID: "a"})))
		if err == nil || !strings.Contains(err.Error(), `"a"`) || !strings.Contains(err.Error(), strconv.Quote(key)) {
			t.Errorf("a member two items share: Run = %v, want an error naming %s and the member a", err, key)
		}
		if got, want := redistest.SMembers(t, d.Other, key), []string{"a", "b", "c"}; !slices.Equal(got, want) {
			t.Errorf("SMEMBERS %s after the refused run: got %v, want %v", key, got, want)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestSetIndex(t *testing.T) {
	// C53+: buckets grouped across batches, the orphan bucket removed in
	// the same publish; keys under the prefix that are not sets, and
	// temp- or lock-shaped keys, are not buckets and are left alone, as are
	// the bare prefix key and keys that only share its first characters.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		prefix := d.Prefix + "by-country"
		o := d.Other
		redistest.Do(t, o, o.B().Sadd().Key(prefix+":fr").Member("stale").Build())
		redistest.Do(t, o, o.B().Sadd().Key(prefix+":xx").Member("orphan").Build())
		keep := []string{
			prefix + ":meta", // a hash: not of the family's type
			prefix + ":note", // a string
			prefix + ":zz:rebuild:1700000000:0123456789abcdef", // temp-shaped set
			prefix + ":yy:rebuild-lock",                        // lock-shaped set
			prefix,                                             // the bare prefix, a set
			prefix + "X",                                       // shares the prefix but not "prefix:"
		}
		redistest.Do(t, o, o.B().Hset().Key(keep[0]).FieldValue().FieldValue("a", "1").Build())
		redistest.Do(t, o, o.B().Set().Key(keep[1]).Value("hello").Build())
		for _, k := range keep[2:] {
			redistest.Do(t, o, o.B().Sadd().Key(k).Member("keep-me").Build())
		}
		before := redistest.Snapshot(t, o, d.Prefix)

		src := users(9)
		src = append(src, user{ID: "nowhere", Country: " "}) // skipped
		stats := mustRun(t, d.Client, rebuild.Options{BatchSize: 2, Writers: 2}, src, byCountry(prefix))

		for bucket, want := range map[string][]string{
			"fr": {"u000000", "u000003", "u000006"},
			"de": {"u000001", "u000004", "u000007"},
			"us": {"u000002", "u000005", "u000008"},
		} {
			if got := redistest.SMembers(t, o, prefix+":"+bucket); !slices.Equal(got, want) {
				t.Errorf("SMEMBERS %s:%s: got %v, want %v", prefix, bucket, got, want)
			}
		}
		if redistest.Exists(t, o, prefix+":xx") {
			t.Errorf("orphan bucket %s:xx: got present, want removed", prefix)
		}
		after := redistest.Snapshot(t, o, d.Prefix)
		for _, k := range keep {
			if after[k] != before[k] {
				t.Errorf("key %s: got %+v, want unchanged %+v", k, after[k], before[k])
			}
		}
		wantOutcomes := map[string]store.Outcome{
			prefix + ":fr": store.Swapped, prefix + ":de": store.Swapped, prefix + ":us": store.Swapped,
			prefix + ":xx": store.Emptied,
		}
		if diff := cmp.Diff(wantOutcomes, stats.Outcomes); diff != "" {
			t.Errorf("Stats.Outcomes (-want +got):\n%s", diff)
		}
		if got := stats.Entries[prefix]; got != 9 {
			t.Errorf("Stats.Entries[%q]: got %d, want 9", prefix, got)
		}
		for _, b := range []string{"fr", "de", "us"} {
			if got := redistest.PTTL(t, o, prefix+":"+b); got != -1 {
				t.Errorf("PTTL %s:%s: got %v, want -1", prefix, b, got)
			}
		}
		// Only the two planted look-alikes may look like leftovers.
		if got, want := redistest.Leftovers(t, o, d.Prefix), []string{keep[3], keep[2]}; !slices.Equal(got, want) {
			t.Errorf("temp- and lock-shaped keys: got %v, want exactly the planted %v", got, want)
		}
	})
}

func TestSetIndexEmptyBucket(t *testing.T) {
	// A bucket must be non-empty: "<prefix>:" is not a key of the family.
	// The run fails with an error naming the family, nothing published.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		prefix := d.Prefix + "by-country"
		redistest.Do(t, d.Other, d.Other.B().Sadd().Key(prefix+":fr").Member("old").Build())
		before := redistest.Snapshot(t, d.Other, d.Prefix)

		b := builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true })
		src := []user{{ID: "1", Country: "fr"}, {ID: "2", Country: "de"}, {ID: "3", Country: ""}}
		_, err := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 2, Writers: 1}, b).Run(redistest.Ctx(t), rebuild.FromSlice(src))

		wantRunError(t, err, "build", fmt.Sprintf("%q", prefix+":"), "bucket")
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestSetIndexBucketShapedLikeLockOrTemp(t *testing.T) {
	// 11.4, C60: bucket values come from data. A value that would make
	// "<prefix>:<bucket>" one of keyswap's own keys (the family's lock
	// "rebuild-lock", its record, a generation, a temp key of either shape)
	// is skipped, counted in Stats.Skipped and logged once per key; the run
	// succeeds, the other buckets are rebuilt, and the family's lock is
	// never written as a bucket.
	odd := []string{"rebuild-lock", "rebuild-lock:run", "rebuild-gen", "rebuild:2024", "x:rebuild:1600000000:0123456789abcdef"}
	forEachDeployment(t, func(t *testing.T, d deployment) {
		prefix := d.Prefix + "tags"
		redistest.Do(t, d.Other, d.Other.B().Sadd().Key(prefix+":fr").Member("old").Build())
		src := []user{{ID: "1", Country: "fr"}, {ID: "2", Country: "de"}}
		for i, b := range odd {
			src = append(src, user{ID: fmt.Sprint(10 + i), Country: b}, user{ID: fmt.Sprint(20 + i), Country: b})
		}
		var logged strings.Builder
		var mu sync.Mutex
		logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return logged.Write(p)
		}), nil))
		stats, err := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 3, Logger: logger}, byCountry(prefix)).
			Run(redistest.Ctx(t), rebuild.FromSlice(src))
		if err != nil {
			t.Fatalf("Run: got %v, want success: one odd value must not block the family", err)
		}
		if got, want := stats.Skipped[prefix], int64(2*len(odd)); got != want {
			t.Errorf("Stats.Skipped[%q] = %d, want %d", prefix, got, want)
		}
		if diff := cmp.Diff(map[string]string{"tags:de": "set [2]", "tags:fr": "set [1]"}, contents(t, d.Other, d.Prefix)); diff != "" {
			t.Errorf("keys after the run (-want +got):\n%s", diff)
		}
		mu.Lock()
		counts := map[string]int{}
		for _, m := range regexp.MustCompile(`skipped_key=(\S+)`).FindAllStringSubmatch(logged.String(), -1) {
			counts[strings.Trim(m[1], `"`)]++
		}
		want := map[string]int{}
		for _, b := range odd {
			want[prefix+":"+b] = 1
		}
		if diff := cmp.Diff(want, counts); diff != "" {
			t.Errorf("skipped keys logged (-want +got):\n%s\nlog:\n%s", diff, logged.String())
		}
		mu.Unlock()
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// writerFunc is an io.Writer of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestMaxArgs(t *testing.T) {
	// A batch larger than MaxArgs entries is split into commands of at most
	// MaxArgs entries each. Set and SetIndex merge their members across
	// batches (Commands.Merge), so the rest of one batch and the next one
	// share a command.
	const n, batch = 2600, 2500
	src := users(n)
	for i := range src {
		src[i].Country = "all" // one SetIndex bucket, so that it is split too
	}
	wantSizes := []int{builders.MaxArgs, builders.MaxArgs, batch - 2*builders.MaxArgs, n - batch}
	wantMerged := []int{rebuild.MaxMergeArgs, rebuild.MaxMergeArgs, n - 2*rebuild.MaxMergeArgs}
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, tc := range []struct {
			name   string
			b      rebuild.Builder[user]
			count  func(t *testing.T) int
			merged bool
		}{
			{"Hash", byEmail(d.Prefix + "h"), func(t *testing.T) int { return len(redistest.HGetAll(t, d.Other, d.Prefix+"h")) }, false},
			{"SortedSet", byScore(d.Prefix + "z"), func(t *testing.T) int { return len(redistest.ZScores(t, d.Other, d.Prefix+"z")) }, false},
			{"Set", ids(d.Prefix + "s"), func(t *testing.T) int { return len(redistest.SMembers(t, d.Other, d.Prefix+"s")) }, true},
			{"SetIndex", byCountry(d.Prefix + "i"), func(t *testing.T) int { return len(redistest.SMembers(t, d.Other, d.Prefix+"i:all")) }, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var rec recorder
				stats, err := redistest.Rebuilder(t, rec.client(d.Client), rebuild.Options{BatchSize: batch, Writers: 1}, tc.b).
					Run(redistest.Ctx(t), rebuild.FromSlice(src))
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				want := wantSizes
				if tc.merged {
					want = wantMerged
				}
				if got := rec.entries(); !slices.Equal(got, want) {
					t.Errorf("entries per command: got %v, want %v", got, want)
				}
				if got := tc.count(t); got != n {
					t.Errorf("entries in the live key: got %d, want %d", got, n)
				}
				if got := stats.Entries[tc.b.Key()]; got != n {
					t.Errorf("Stats.Entries[%q]: got %d, want %d", tc.b.Key(), got, n)
				}
			})
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// familiaSource is a source with what real data has: blank index values,
// and records that claim the same unique value (the last one wins).
func familiaSource() []user {
	src := users(250)
	for i := 0; i < 250; i += 25 {
		src[i].Email = []string{"", "  ", "\t"}[i%3]
		src[i].Country = ""
	}
	for i := range 10 { // ten later records claim earlier emails
		u := users(300)[260+i]
		u.Email = src[i*7+1].Email
		src = append(src, u)
	}
	return src
}

// familiaBuilders returns a unique index, a timeline, a set and a
// set-per-value index under p.
func familiaBuilders(p string) []rebuild.Builder[user] {
	return []rebuild.Builder[user]{byEmail(p + "by-email"), byScore(p + "by-score"), ids(p + "ids"), byCountry(p + "by-country")}
}

// familiaWant models what familiaBuilders must produce from src, applying
// writes in source order, under p.
func familiaWant(src []user) map[string]string {
	h := map[string]string{}
	z := map[string]float64{}
	s := map[string]bool{}
	buckets := map[string]map[string]bool{}
	for _, u := range src {
		if !builders.Blank(u.Email) {
			h[u.Email] = u.ID
		}
		z[u.ID] = u.Score
		s[u.ID] = true
		if !builders.Blank(u.Country) {
			if buckets[u.Country] == nil {
				buckets[u.Country] = map[string]bool{}
			}
			buckets[u.Country][u.ID] = true
		}
	}
	out := map[string]string{
		"by-email": "hash " + fmt.Sprint(h),
		"by-score": "zset " + fmt.Sprint(z),
		"ids":      "set " + fmt.Sprint(sortedKeys(s)),
	}
	for b, ms := range buckets {
		out["by-country:"+b] = "set " + fmt.Sprint(sortedKeys(ms))
	}
	return out
}

func TestFamiliaUniqueIndex(t *testing.T) {
	// Familia's unique index as a Hash: blank and whitespace-only values
	// skipped (C48), only written entries counted, the last write wins
	// (C50), and the entries of deleted records are gone after the next
	// rebuild (C23: replaced, not merged).
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "users:by-email"
		opts := rebuild.Options{BatchSize: 2, Writers: 1}
		first := []user{
			{ID: "1", Email: "ann@example.com"},
			{ID: "2", Email: ""},
			{ID: "3", Email: "   "},
			{ID: "4", Email: "bob@example.com"},
			{ID: "5", Email: "ann@example.com"},
			{ID: "6", Email: "cy@example.com"},
		}
		stats := mustRun(t, d.Client, opts, first, byEmail(key))
		want := map[string]string{"ann@example.com": "5", "bob@example.com": "4", "cy@example.com": "6"}
		if diff := cmp.Diff(want, redistest.HGetAll(t, d.Other, key)); diff != "" {
			t.Errorf("first rebuild (-want +got):\n%s", diff)
		}
		if got := stats.Entries[key]; got != 4 {
			t.Errorf("first rebuild: Stats.Entries: got %d, want 4", got)
		}

		// Record 4 is deleted; record 6 changes its email.
		second := []user{first[0], first[1], first[2], first[4], {ID: "6", Email: "cy2@example.com"}}
		stats = mustRun(t, d.Client, opts, second, byEmail(key))
		want = map[string]string{"ann@example.com": "5", "cy2@example.com": "6"}
		if diff := cmp.Diff(want, redistest.HGetAll(t, d.Other, key)); diff != "" {
			t.Errorf("second rebuild (-want +got):\n%s", diff)
		}
		if got := stats.Entries[key]; got != 3 {
			t.Errorf("second rebuild: Stats.Entries: got %d, want 3", got)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestFamiliaSetPerValue(t *testing.T) {
	// C53+: a bucket from the previous run that no longer has members is
	// removed, and a value that moved buckets is only in its new one.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		prefix := d.Prefix + "users:by-country"
		opts := rebuild.Options{BatchSize: 1}
		mustRun(t, d.Client, opts, []user{
			{ID: "a", Country: "fr"}, {ID: "b", Country: "fr"}, {ID: "c", Country: "de"}, {ID: "d", Country: "us"},
		}, byCountry(prefix))
		want := map[string]string{"by-country:de": "set [c]", "by-country:fr": "set [a b]", "by-country:us": "set [d]"}
		if diff := cmp.Diff(want, contents(t, d.Other, d.Prefix+"users:")); diff != "" {
			t.Fatalf("first rebuild (-want +got):\n%s", diff)
		}

		// a moves to de; d, the only member of us, is deleted.
		stats := mustRun(t, d.Client, opts, []user{
			{ID: "a", Country: "de"}, {ID: "b", Country: "fr"}, {ID: "c", Country: "de"},
		}, byCountry(prefix))
		want = map[string]string{"by-country:de": "set [a c]", "by-country:fr": "set [b]"}
		if diff := cmp.Diff(want, contents(t, d.Other, d.Prefix+"users:")); diff != "" {
			t.Errorf("second rebuild (-want +got):\n%s", diff)
		}
		if got := stats.Outcomes[prefix+":us"]; got != store.Emptied {
			t.Errorf("Stats.Outcomes[%q]: got %v, want %v", prefix+":us", got, store.Emptied)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestFamiliaTimeline(t *testing.T) {
	// A timeline sorted set: a phantom member that is not in the source is
	// gone after the rebuild, and stale scores are replaced (C23, C54).
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "users:timeline"
		redistest.Do(t, d.Other, d.Other.B().Zadd().Key(key).ScoreMember().ScoreMember(42, "phantom").ScoreMember(1, "u000001").Build())

		mustRun(t, d.Client, rebuild.Options{BatchSize: 2}, users(5), byScore(key))

		want := map[string]float64{"u000000": 0, "u000001": 1, "u000002": 2, "u000003": 3, "u000004": 4}
		if diff := cmp.Diff(want, redistest.ZScores(t, d.Other, key)); diff != "" {
			t.Errorf("ZRANGE %s WITHSCORES (-want +got):\n%s", key, diff)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestFamiliaBatchSizes(t *testing.T) {
	// Batch sizes 1, 2, 100 and 1000 give identical results, equal to a
	// model that applies the source in order (C48, C50, C54, C53+). With
	// concurrent writers the source has no duplicate unique values: see
	// TestLastWriteWinsAcrossConcurrentBatches.
	noDup := users(250)
	for i := 0; i < len(noDup); i += 25 {
		noDup[i].Email, noDup[i].Country = " ", ""
	}
	for _, tc := range []struct {
		name    string
		writers int
		src     []user
	}{
		{"writers=1, duplicates", 1, familiaSource()},
		{"writers=4, no duplicates", 4, noDup},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := familiaWant(tc.src)
			forEachDeployment(t, func(t *testing.T, d deployment) {
				for _, bs := range []int{1, 2, 100, 1000} {
					p := fmt.Sprintf("%sbs%d:", d.Prefix, bs)
					mustRun(t, d.Client, rebuild.Options{BatchSize: bs, Writers: tc.writers}, tc.src, familiaBuilders(p)...)
					if diff := cmp.Diff(want, contents(t, d.Other, p)); diff != "" {
						t.Errorf("batch size %d (-want +got):\n%s", bs, diff)
					}
				}
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		})
	}
}

func TestFamiliaRepeatedRebuilds(t *testing.T) {
	// Three rebuilds in a row from the same source give identical results,
	// each published (C23, C32), nothing left behind.
	src := familiaSource()
	want := familiaWant(src)
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for i := range 3 {
			stats := mustRun(t, d.Client, rebuild.Options{BatchSize: 64, Writers: 1}, src, familiaBuilders(d.Prefix)...)
			if diff := cmp.Diff(want, contents(t, d.Other, d.Prefix)); diff != "" {
				t.Errorf("rebuild %d (-want +got):\n%s", i+1, diff)
			}
			for k, o := range stats.Outcomes {
				if o != store.Swapped {
					t.Errorf("rebuild %d: Stats.Outcomes[%q]: got %v, want %v", i+1, k, o, store.Swapped)
				}
			}
			if got, want := len(stats.Outcomes), len(want); got != want {
				t.Errorf("rebuild %d: got %d outcomes, want %d", i+1, got, want)
			}
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestFamiliaEmptySource(t *testing.T) {
	// C24: an empty result deletes the live keys, and Stats.Outcomes says
	// Emptied for each, whether the source yields nothing or only items
	// every builder skips; with the SetIndex alone too (11.5), which then
	// has no key to publish, only buckets to delete.
	allSkipped := []user{{ID: " ", Email: "", Country: "\t"}, {ID: "", Email: " ", Country: ""}}
	for _, tc := range []struct {
		name   string
		src    []user
		items  int64
		family bool // the SetIndex alone
	}{
		{"no items", nil, 0, false},
		{"every item skipped", allSkipped, 2, false},
		{"family alone, no items", nil, 0, true},
		{"family alone, every item skipped", allSkipped, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachDeployment(t, func(t *testing.T, d deployment) {
				p := d.Prefix
				bs := familiaBuilders(p)
				if tc.family {
					bs = bs[len(bs)-1:]
				}
				mustRun(t, d.Client, rebuild.Options{}, users(6), bs...)
				live := sortedKeys(contents(t, d.Other, p))
				if want := len(bs) - 1 + 3; len(live) != want { // the plain keys and 3 buckets
					t.Fatalf("before: got live keys %v, want %d", live, want)
				}

				stats := mustRun(t, d.Client, rebuild.Options{BatchSize: 1}, tc.src, bs...)

				if got := redistest.LiveKeys(t, d.Other, p); len(got) != 0 {
					t.Errorf("keys after an empty rebuild: got %v, want none", got)
				}
				want := map[string]store.Outcome{}
				for _, k := range live {
					want[p+k] = store.Emptied
				}
				if diff := cmp.Diff(want, stats.Outcomes); diff != "" {
					t.Errorf("Stats.Outcomes (-want +got):\n%s", diff)
				}
				for k, n := range stats.Entries {
					if n != 0 {
						t.Errorf("Stats.Entries[%q]: got %d, want 0", k, n)
					}
				}
				if stats.Items != tc.items {
					t.Errorf("Stats.Items: got %d, want %d", stats.Items, tc.items)
				}
			})
		})
	}
}

func TestLastWriteWinsAcrossConcurrentBatches(t *testing.T) {
	// C50 and Familia: the last write of a field wins, in source order. With
	// Writers > 1 two batches are sent concurrently; here the batch that
	// holds the earlier write is held back (through rueidishook) until the
	// later batch has been written, as a scheduler or a slow connection can
	// do. The source-order last write must still win.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "by-email"
		secondDone := make(chan struct{})
		var once sync.Once
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				var first, second bool
				for _, cmd := range multi {
					if args := cmd.Commands(); args[0] == "HSET" {
						first = first || slices.Contains(args, "first")
						second = second || slices.Contains(args, "second")
					}
				}
				if first {
					select { // bounded: if the batches are not concurrent, go on
					case <-secondDone:
					case <-time.After(3 * time.Second):
					}
				}
				res := c.DoMulti(ctx, multi...)
				if second {
					once.Do(func() { close(secondDone) })
				}
				return res
			},
		})
		src := []user{{ID: "first", Email: "dup@example.com"}, {ID: "second", Email: "dup@example.com"}}

		mustRun(t, hooked, rebuild.Options{BatchSize: 1, Writers: 2}, src, byEmail(key))

		if got := redistest.HGetAll(t, d.Other, key)["dup@example.com"]; got != "second" {
			t.Errorf("HGET %s dup@example.com: got %q, want %q (the last write in source order)", key, got, "second")
		}
	})
}

func TestFuncHyperLogLog(t *testing.T) {
	// A custom key type through Func: a HyperLogLog built with PFADD.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "visitors"
		redistest.Do(t, d.Other, d.Other.B().Pfadd().Key(key).Element("someone-else").Build())
		hll := builders.Func(key, func(c *rebuild.Commands, us []user) error {
			temp, err := c.Temp(key)
			if err != nil {
				return err
			}
			els := make([]string, len(us))
			for i, u := range us {
				els[i] = u.ID
			}
			c.Add(c.B().Pfadd().Key(temp).Element(els...).Build(), len(els))
			return nil
		})
		src := users(20)
		src = append(src, src[:10]...) // repeat visitors

		stats := mustRun(t, d.Client, rebuild.Options{BatchSize: 7}, src, hll)

		n, err := d.Other.Do(context.Background(), d.Other.B().Pfcount().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PFCOUNT: %v", err)
		}
		if n != 20 {
			t.Errorf("PFCOUNT %s: got %d, want 20", key, n)
		}
		if got := stats.Entries[key]; got != 30 {
			t.Errorf("Stats.Entries[%q]: got %d, want 30", key, got)
		}
		if got := redistest.PTTL(t, d.Other, key); got != -1 {
			t.Errorf("PTTL %s: got %v, want -1", key, got)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

var errBoom = errors.New("boom: the catalogue is unreachable")

func TestFuncError(t *testing.T) {
	// A builder error on the second batch fails the run: the cause matches
	// under errors.Is, nothing is published, the temp key written by the
	// first batch is discarded (C52, C18).
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "visitors"
		redistest.Do(t, d.Other, d.Other.B().Pfadd().Key(key).Element("old").Build())
		before := redistest.Snapshot(t, d.Other, d.Prefix)
		b := builders.Func(key, func(c *rebuild.Commands, us []user) error {
			if us[0].ID == users(3)[1].ID { // the second batch (BatchSize 1)
				return errBoom
			}
			temp, err := c.Temp(key)
			if err != nil {
				return err
			}
			c.Add(c.B().Pfadd().Key(temp).Element(us[0].ID).Build(), 1)
			return nil
		})
		var rec recorder
		_, err := redistest.Rebuilder(t, rec.client(d.Client), rebuild.Options{BatchSize: 1, Writers: 1}, b).
			Run(redistest.Ctx(t), rebuild.FromSlice(users(3)))

		if !errors.Is(err, errBoom) {
			t.Errorf("Run: got error %v, want one matching errBoom", err)
		}
		wantRunError(t, err, "build", key)
		// Batches are built ahead of the sender, which stops at the first
		// failed one: the first batch may or may not have been sent, the
		// failed one and those after it never are.
		if got := rec.entries(); !slices.Equal(got, []int{1}) && len(got) != 0 {
			t.Errorf("PFADDs sent: got entries %v, want [1] or none (never past the failed batch)", got)
		}
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// encodeUser is a mapping that can fail: json.Marshal refuses an infinite
// score. Its error wraps errBoom as well as json's.
func encodeUser(u user) (string, error) {
	doc, err := json.Marshal(map[string]any{"id": u.ID, "score": u.Score})
	if err != nil {
		return "", fmt.Errorf("%w: encoding %s: %w", errBoom, u.ID, err)
	}
	return string(doc), nil
}

// errForms are the four builders whose mapping can fail, each with a
// mapping that JSON-encodes the user, and the live key they rebuild under
// p, with a command that gives it old contents.
func errForms(p string) []struct {
	name, key string
	builder   rebuild.Builder[user]
	seed      func(c rueidis.Client) rueidis.Completed
} {
	type form = struct {
		name, key string
		builder   rebuild.Builder[user]
		seed      func(c rueidis.Client) rueidis.Completed
	}
	return []form{
		{"HashErr", p + "by-email", builders.HashErr(p+"by-email", func(u user) (string, string, bool, error) {
			doc, err := encodeUser(u)
			return u.Email, doc, err == nil, err
		}), func(c rueidis.Client) rueidis.Completed {
			return c.B().Hset().Key(p+"by-email").FieldValue().FieldValue("old@example.com", "{}").Build()
		}},
		{"SortedSetErr", p + "by-score", builders.SortedSetErr(p+"by-score", func(u user) (string, float64, bool, error) {
			doc, err := encodeUser(u)
			return doc, u.Score, err == nil, err
		}), func(c rueidis.Client) rueidis.Completed {
			return c.B().Zadd().Key(p+"by-score").ScoreMember().ScoreMember(1, "old").Build()
		}},
		{"SetErr", p + "docs", builders.SetErr(p+"docs", func(u user) (string, bool, error) {
			doc, err := encodeUser(u)
			return doc, err == nil, err
		}), func(c rueidis.Client) rueidis.Completed {
			return c.B().Sadd().Key(p + "docs").Member("old").Build()
		}},
		{"SetIndexErr", p + "by-country", builders.SetIndexErr(p+"by-country", func(u user) (string, string, bool, error) {
			doc, err := encodeUser(u)
			return u.Country, doc, err == nil, err
		}), func(c rueidis.Client) rueidis.Completed {
			return c.B().Sadd().Key(p + "by-country:fr").Member("old").Build()
		}},
	}
}

func TestErrFormsMappingError(t *testing.T) {
	// A mapping error on the third item, in the second batch, fails the
	// run: a "build" error names the builder's key and wraps the mapping's
	// error, which errors.Is and errors.As reach; the live keys are
	// untouched, and no temp key or lock is left, although the first batch
	// may have been written (C52, C18). The mapping says ok false with its
	// error: the error wins.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, f := range errForms(d.Prefix) {
			t.Run(f.name, func(t *testing.T) {
				redistest.Do(t, d.Other, f.seed(d.Other))
				before := redistest.Snapshot(t, d.Other, d.Prefix)
				src := users(5)
				src[2].Score = math.Inf(1)

				_, err := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 2, Writers: 1}, f.builder).
					Run(redistest.Ctx(t), rebuild.FromSlice(src))

				wantRunError(t, err, "build", f.key, "encoding "+src[2].ID)
				var e *rebuild.Error
				if errors.As(err, &e) && e.Key != f.key {
					t.Errorf("Error.Key: got %q, want the builder's key %q", e.Key, f.key)
				}
				if !errors.Is(err, errBoom) {
					t.Errorf("Run: got error %v, want one matching errBoom", err)
				}
				var unsupported *json.UnsupportedValueError
				if !errors.As(err, &unsupported) {
					t.Errorf("Run: got error %v, want one holding a *json.UnsupportedValueError", err)
				}
				redistest.WantUnchanged(t, d.Other, d.Prefix, before)
				redistest.WantClean(t, d.Other, d.Prefix)
				redistest.Do(t, d.Other, d.Other.B().Del().Key(f.key, f.key+":fr").Build())
			})
		}
	})
}

func TestErrFormsWriteWhatThePlainFormsWrite(t *testing.T) {
	// With a mapping that does not fail, an Err form writes exactly what
	// its plain form does with the same entries.
	src := users(7)
	src[3].Email, src[4].Country = " ", "" // skipped by both forms
	forEachDeployment(t, func(t *testing.T, d deployment) {
		plainPrefix, errPrefix := d.Prefix+"plain:", d.Prefix+"err:"
		plain := []rebuild.Builder[user]{
			builders.Hash(plainPrefix+"h", func(u user) (string, string, bool) { return u.Email, u.ID, !builders.Blank(u.Email) }),
			builders.SortedSet(plainPrefix+"z", func(u user) (string, float64, bool) { return u.ID, u.Score, true }),
			builders.Set(plainPrefix+"s", func(u user) (string, bool) { return u.ID, !builders.Blank(u.Country) }),
			builders.SetIndex(plainPrefix+"i", func(u user) (string, string, bool) { return u.Country, u.ID, !builders.Blank(u.Country) }),
		}
		withErr := []rebuild.Builder[user]{
			builders.HashErr(errPrefix+"h", func(u user) (string, string, bool, error) { return u.Email, u.ID, !builders.Blank(u.Email), nil }),
			builders.SortedSetErr(errPrefix+"z", func(u user) (string, float64, bool, error) { return u.ID, u.Score, true, nil }),
			builders.SetErr(errPrefix+"s", func(u user) (string, bool, error) { return u.ID, !builders.Blank(u.Country), nil }),
			builders.SetIndexErr(errPrefix+"i", func(u user) (string, string, bool, error) { return u.Country, u.ID, !builders.Blank(u.Country), nil }),
		}
		plainStats := mustRun(t, d.Client, rebuild.Options{BatchSize: 3}, src, plain...)
		errStats := mustRun(t, d.Client, rebuild.Options{BatchSize: 3}, src, withErr...)

		want := contents(t, d.Other, plainPrefix)
		if len(want) != 6 { // h, z, s, and three buckets
			t.Fatalf("the plain forms wrote %d keys, want 6: %v", len(want), want)
		}
		if diff := cmp.Diff(want, contents(t, d.Other, errPrefix)); diff != "" {
			t.Errorf("keys written by the Err forms (-plain +err):\n%s", diff)
		}
		for _, k := range []string{"h", "z", "s", "i"} {
			if got, want := errStats.Entries[errPrefix+k], plainStats.Entries[plainPrefix+k]; got != want {
				t.Errorf("Stats.Entries of %s: got %d, want %d as the plain form", k, got, want)
			}
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestTempOfForeignKey(t *testing.T) {
	// Commands.Temp refuses a key the builder does not own, even another
	// builder's key of the same run: the run fails with an error naming
	// both, and nothing is published.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		own, other := d.Prefix+"mine", d.Prefix+"theirs"
		for _, tc := range []struct {
			name    string
			foreign string
			with    []rebuild.Builder[user]
		}{
			{"unrelated key", d.Prefix + "elsewhere", nil},
			{"the live key's neighbour", own + ":x", nil},
			{"another builder's key", other, []rebuild.Builder[user]{ids(other)}},
			{"a SetIndex bucket of another builder", other + ":fr", []rebuild.Builder[user]{byCountry(other)}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				redistest.Do(t, d.Other, d.Other.B().Set().Key(own).Value("old").Build())
				redistest.Do(t, d.Other, d.Other.B().Sadd().Key(tc.foreign).Member("old").Build())
				before := redistest.Snapshot(t, d.Other, d.Prefix)
				f := builders.Func(own, func(c *rebuild.Commands, us []user) error {
					temp, err := c.Temp(tc.foreign)
					if err != nil {
						return err
					}
					c.Add(c.B().Sadd().Key(temp).Member(us[0].ID).Build(), 1)
					return nil
				})
				bs := append(slices.Clone(tc.with), f)
				_, err := redistest.Rebuilder(t, d.Client, rebuild.Options{}, bs...).Run(redistest.Ctx(t), rebuild.FromSlice(users(3)))

				wantRunError(t, err, "build", fmt.Sprintf("%q", own), fmt.Sprintf("%q", tc.foreign), "does not own")
				redistest.WantUnchanged(t, d.Other, d.Prefix, before)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

func TestCompat(t *testing.T) {
	// go-redis style code through rueidiscompat: each HSet, however many
	// fields it is given (pairs, a map), is exactly one command, and Stats
	// counts one entry per queued command, as Compat documents.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "by-email"
		redistest.Do(t, d.Other, d.Other.B().Hset().Key(key).FieldValue().FieldValue("stale", "0").Build())
		b := builders.Compat(key, func(ctx context.Context, p rueidiscompat.Pipeliner, temp string, us []user) error {
			fields := map[string]string{}
			for _, u := range us[1:] {
				fields[u.Email] = u.ID
			}
			p.HSet(ctx, temp, us[0].Email, us[0].ID) // pairs
			p.HSet(ctx, temp, fields)                // a map
			return nil
		})
		var rec recorder
		stats, err := redistest.Rebuilder(t, rec.client(d.Client), rebuild.Options{BatchSize: 4, Writers: 1}, b).
			Run(redistest.Ctx(t), rebuild.FromSlice(users(8)))
		if err != nil {
			t.Fatalf("Run: %v", err)
		}

		want := map[string]string{}
		for _, u := range users(8) {
			want[u.Email] = u.ID
		}
		if diff := cmp.Diff(want, redistest.HGetAll(t, d.Other, key)); diff != "" {
			t.Errorf("HGETALL %s (-want +got):\n%s", key, diff)
		}
		if got, want := rec.entries(), []int{1, 3, 1, 3}; !slices.Equal(got, want) {
			t.Errorf("fields per HSET sent: got %v, want %v", got, want)
		}
		if got := stats.Entries[key]; got != 4 {
			t.Errorf("Stats.Entries[%q]: got %d, want 4 (one per command)", key, got)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestCompatRefused(t *testing.T) {
	// A Compat builder is bound to its temp key: a command on another key
	// (the live key above all), or one that can write a second key, fails
	// the run with an error naming the command, and no batch is sent.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		live, other := d.Prefix+"by-email", d.Prefix+"other"
		for _, tc := range []struct {
			name string
			cmd  string
			fn   func(ctx context.Context, p rueidiscompat.Pipeliner, temp string)
		}{
			{"the live key", "HSET", func(ctx context.Context, p rueidiscompat.Pipeliner, _ string) { p.HSet(ctx, live, "f", "v") }},
			{"another key", "SADD", func(ctx context.Context, p rueidiscompat.Pipeliner, _ string) { p.SAdd(ctx, other, "m") }},
			{"DEL", "DEL", func(ctx context.Context, p rueidiscompat.Pipeliner, temp string) { p.Del(ctx, temp) }},
			{"SMOVE", "SMOVE", func(ctx context.Context, p rueidiscompat.Pipeliner, temp string) { p.SMove(ctx, temp, other, "m") }},
			{"RENAME", "RENAME", func(ctx context.Context, p rueidiscompat.Pipeliner, temp string) { p.Rename(ctx, temp, live) }},
			{"COPY", "COPY", func(ctx context.Context, p rueidiscompat.Pipeliner, temp string) { p.Copy(ctx, temp, live, 0, true) }},
			{"MSET", "MSET", func(ctx context.Context, p rueidiscompat.Pipeliner, temp string) { p.MSet(ctx, temp, "a", other, "b") }},
			{"Do del", "DEL", func(ctx context.Context, p rueidiscompat.Pipeliner, temp string) { p.Do(ctx, "del", temp) }},
			{"EVAL", "EVAL", func(ctx context.Context, p rueidiscompat.Pipeliner, temp string) {
				p.Eval(ctx, "return redis.call('DEL', KEYS[1])", []string{temp})
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				redistest.Do(t, d.Other, d.Other.B().Hset().Key(live).FieldValue().FieldValue("f", "old").Build())
				redistest.Do(t, d.Other, d.Other.B().Sadd().Key(other).Member("m").Build())
				before := redistest.Snapshot(t, d.Other, d.Prefix)
				b := builders.Compat(live, func(ctx context.Context, p rueidiscompat.Pipeliner, temp string, us []user) error {
					p.HSet(ctx, temp, "ok", "1") // a good command first
					tc.fn(ctx, p, temp)
					return nil
				})
				var rec recorder
				_, err := redistest.Rebuilder(t, rec.client(d.Client), rebuild.Options{}, b).Run(redistest.Ctx(t), rebuild.FromSlice(users(2)))

				wantRunError(t, err, "build", tc.cmd, fmt.Sprintf("%q", live))
				for _, args := range rec.commands() {
					// Only taking the lock, the write connection's first
					// commands (EXISTS of the record, HELLO) and the cleanup
					// of the (never written) temp key; no batch.
					if args[0] == "HELLO" || args[0] == "EXISTS" && strings.HasSuffix(args[1], ":rebuild-lock:run") {
						continue
					}
					if args[0] != "UNLINK" && !strings.HasSuffix(args[1], ":rebuild-lock") {
						t.Errorf("command sent in a DoMulti: got %v, want no batch sent", args)
					}
				}
				redistest.WantUnchanged(t, d.Other, d.Prefix, before)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

func TestCompatRefusedOtherSlot(t *testing.T) {
	// On a cluster, a command over keys of two hash slots cannot even be
	// built: the rueidis command builder panics. Compat documents that a
	// command writing a second key fails the rebuild with an error naming
	// the command; it must say so on a cluster too, not panic. SUNIONSTORE
	// writes only its first key: on standalone it is refused for reading
	// a key that is not a temp key (C63), on a cluster for its slots.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		live := d.Prefix + "by-email"
		far := "far"
		for i := 0; keys.Slot(far) == keys.Slot(live); i++ {
			far = fmt.Sprintf("far%d", i)
		}
		for _, tc := range []struct {
			name  string
			queue func(ctx context.Context, p rueidiscompat.Pipeliner, temp, member string)
			want  []string
		}{
			{"SMOVE", func(ctx context.Context, p rueidiscompat.Pipeliner, temp, member string) {
				p.SMove(ctx, temp, far, member)
			}, []string{"SMOVE"}},
			{"SUNIONSTORE", func(ctx context.Context, p rueidiscompat.Pipeliner, temp, _ string) {
				p.SUnionStore(ctx, temp, temp, far)
			}, []string{"SUNIONSTORE"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				redistest.Do(t, d.Other, d.Other.B().Hset().Key(live).FieldValue().FieldValue("f", "old").Build())
				before := redistest.Snapshot(t, d.Other, d.Prefix)
				b := builders.Compat(live, func(ctx context.Context, p rueidiscompat.Pipeliner, temp string, us []user) error {
					tc.queue(ctx, p, temp, us[0].ID)
					return nil
				})

				panicked, err := runRecovering(t, d.Client, b)

				switch {
				case panicked != nil:
					first, _, _ := strings.Cut(fmt.Sprint(panicked), "\n")
					t.Errorf("Run: got a panic %q, want an error naming %s", first, tc.name)
				default:
					wantRunError(t, err, "build", tc.want...)
					if d.Cluster && !strings.Contains(err.Error(), "hash slot") {
						t.Errorf("Run: got %q, want it to blame the hash slots", err)
					}
				}
				redistest.WantUnchanged(t, d.Other, d.Prefix, before)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

func TestCompatPanicPassedOn(t *testing.T) {
	// A Compat function's own panic is the builder's panic, whatever it
	// says: Run panics with a *rebuild.PanicError holding it, as for any
	// builder. It is not taken for the refusal of a command over two
	// hash slots, also when it talks of slots, on a cluster as on
	// standalone.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		live := d.Prefix + "by-email"
		before := redistest.Snapshot(t, d.Other, d.Prefix)
		for _, value := range []any{
			"no free slot in the application's pool",
			fmt.Errorf("slot %d moved", keys.Slot(live)),
			[]string{"multi key command with different key slots are not allowed"}, // not comparable
		} {
			b := builders.Compat(live, func(ctx context.Context, p rueidiscompat.Pipeliner, temp string, us []user) error {
				p.HSet(ctx, temp, us[0].Email, us[0].ID)
				panic(value)
			})
			panicked, err := runRecovering(t, d.Client, b)
			if pe, ok := panicked.(*rebuild.PanicError); !ok || fmt.Sprint(pe.Value) != fmt.Sprint(value) {
				t.Errorf("Run: got the panic %.200v and the error %v, want a panic with a *rebuild.PanicError of %v", panicked, err, value)
			}
		}
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// runRecovering runs a rebuild of two users with b, and returns its error,
// or what Run panicked with.
func runRecovering(t *testing.T, c rueidis.Client, b rebuild.Builder[user]) (panicked any, err error) {
	t.Helper()
	defer func() { panicked = recover() }()
	_, err = redistest.Rebuilder(t, c, rebuild.Options{}, b).Run(redistest.Ctx(t), rebuild.FromSlice(users(2)))
	return nil, err
}

func TestCompatServerRefusal(t *testing.T) {
	// A command the server refuses (HSet with an empty map is "HSET temp",
	// a wrong number of arguments) fails the run as a write error after
	// earlier batches were written: nothing published, temp key discarded.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "by-email"
		redistest.Do(t, d.Other, d.Other.B().Hset().Key(key).FieldValue().FieldValue("f", "old").Build())
		before := redistest.Snapshot(t, d.Other, d.Prefix)
		b := builders.Compat(key, func(ctx context.Context, p rueidiscompat.Pipeliner, temp string, us []user) error {
			fields := map[string]string{}
			for _, u := range us {
				if !builders.Blank(u.Email) {
					fields[u.Email] = u.ID
				}
			}
			p.HSet(ctx, temp, fields)
			return nil
		})
		src := []user{{ID: "1", Email: "a@example.com"}, {ID: "2", Email: " "}}

		_, err := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 1, Writers: 1}, b).Run(redistest.Ctx(t), rebuild.FromSlice(src))

		wantRunError(t, err, "write", "wrong number of arguments")
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestCompatStringKeepTTL(t *testing.T) {
	// C34: every temp key has a TTL from its first batch on. A plain SET
	// removes it, so a second batch's SET reads as a temp key that vanished
	// and was re-created: the run fails closed with ErrTempKeyLost and says
	// to use KEEPTTL. With KEEPTTL the same builder works.
	for _, tc := range []struct {
		name    string
		keepTTL bool
	}{{"plain SET", false}, {"SET KEEPTTL", true}} {
		t.Run(tc.name, func(t *testing.T) {
			forEachDeployment(t, func(t *testing.T, d deployment) {
				key := d.Prefix + "last-signup"
				redistest.Do(t, d.Other, d.Other.B().Set().Key(key).Value("old").Build())
				before := redistest.Snapshot(t, d.Other, d.Prefix)
				b := builders.Compat(key, func(ctx context.Context, p rueidiscompat.Pipeliner, temp string, us []user) error {
					last := us[len(us)-1].ID
					if tc.keepTTL {
						p.SetArgs(ctx, temp, last, rueidiscompat.SetArgs{KeepTTL: true})
					} else {
						p.Set(ctx, temp, last, 0)
					}
					return nil
				})
				_, err := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 1, Writers: 1}, b).Run(redistest.Ctx(t), rebuild.FromSlice(users(3)))

				if tc.keepTTL {
					if err != nil {
						t.Fatalf("Run: %v", err)
					}
					if got, _ := d.Other.Do(context.Background(), d.Other.B().Get().Key(key).Build()).ToString(); got != "u000002" {
						t.Errorf("GET %s: got %q, want %q", key, got, "u000002")
					}
				} else {
					if !errors.Is(err, rebuild.ErrTempKeyLost) {
						t.Errorf("Run: got error %v, want one matching ErrTempKeyLost", err)
					}
					wantRunError(t, err, "write", "KEEPTTL")
					redistest.WantUnchanged(t, d.Other, d.Prefix, before)
				}
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		})
	}
}

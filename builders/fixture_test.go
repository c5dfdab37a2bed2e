package builders_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// deployment is one Redis deployment the suite runs against, with a key
// prefix unique to the test. On the cluster the prefix carries a hash tag,
// so that every key of one Rebuilder shares a slot. (The same shape as the
// fixture of package rebuild.)
type deployment struct {
	name    string
	cluster bool
	client  rueidis.Client // what the Rebuilder sends through
	other   rueidis.Client // an independent client: reader, saboteur
	prefix  string
}

// forEachDeployment runs f as a parallel subtest on the standalone server
// and on the 3-master cluster.
func forEachDeployment(t *testing.T, f func(t *testing.T, d deployment)) {
	t.Helper()
	p := redistest.Prefix(t)
	for _, d := range []deployment{
		{name: "standalone", client: env.Standalone.Client(t), other: env.Standalone.Client(t), prefix: p},
		{name: "cluster", cluster: true, client: env.Cluster.Client(t), other: env.Cluster.Client(t), prefix: "{" + p + "}"},
	} {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			f(t, d)
		})
	}
}

// user is the item type of the tests.
type user struct {
	ID      string
	Email   string
	Country string
	Score   float64
}

// users returns n users with distinct ids and emails, countries cycling
// over fr, de, us, and scores equal to their index.
func users(n int) []user {
	out := make([]user, n)
	for i := range out {
		out[i] = user{
			ID:      fmt.Sprintf("u%06d", i),
			Email:   fmt.Sprintf("user%06d@example.com", i),
			Country: []string{"fr", "de", "us"}[i%3],
			Score:   float64(i),
		}
	}
	return out
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mustRun runs a Rebuilder of bs over src and fails the test on error.
func mustRun[T any](t *testing.T, c rueidis.Client, opts rebuild.Options, src []T, bs ...rebuild.Builder[T]) rebuild.Stats {
	t.Helper()
	stats, err := rebuild.New(c, opts, bs...).Run(ctxT(t), rebuild.FromSlice(src))
	if err != nil {
		t.Fatalf("Run: got error %v, want nil", err)
	}
	return stats
}

// do runs cmd and fails the test on error.
func do(t *testing.T, c rueidis.Client, cmd rueidis.Completed) rueidis.RedisResult {
	t.Helper()
	r := c.Do(context.Background(), cmd)
	if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
		t.Fatalf("%v: %v", cmd.Commands(), err)
	}
	return r
}

func hgetall(t *testing.T, c rueidis.Client, key string) map[string]string {
	t.Helper()
	m, err := c.Do(context.Background(), c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		t.Fatalf("HGETALL %s: %v", key, err)
	}
	return m
}

func zrangeWithScores(t *testing.T, c rueidis.Client, key string) map[string]float64 {
	t.Helper()
	zs, err := c.Do(context.Background(), c.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		t.Fatalf("ZRANGE %s: %v", key, err)
	}
	out := make(map[string]float64, len(zs))
	for _, z := range zs {
		out[z.Member] = z.Score
	}
	return out
}

func smembers(t *testing.T, c rueidis.Client, key string) []string {
	t.Helper()
	ms, err := c.Do(context.Background(), c.B().Smembers().Key(key).Build()).AsStrSlice()
	if err != nil {
		t.Fatalf("SMEMBERS %s: %v", key, err)
	}
	slices.Sort(ms)
	return ms
}

func exists(t *testing.T, c rueidis.Client, key string) bool {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Exists().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("EXISTS %s: %v", key, err)
	}
	return n == 1
}

// contents is the logical state of every key under a prefix: the key (less
// the prefix) → its type and contents in a canonical form, with "ttl" when
// it has an expiry. Unlike DUMP it does not depend on insertion order, so
// runs that write the same entries in a different order compare equal.
func contents(t *testing.T, c rueidis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, k := range redistest.Keys(t, c, prefix) {
		typ, err := c.Do(ctx, c.B().Type().Key(k).Build()).ToString()
		if err != nil {
			t.Fatalf("TYPE %s: %v", k, err)
		}
		var v string
		switch typ {
		case "hash":
			h := hgetall(t, c, k)
			v = fmt.Sprint(h) // fmt prints maps sorted by key
		case "zset":
			v = fmt.Sprint(zrangeWithScores(t, c, k))
		case "set":
			v = fmt.Sprint(smembers(t, c, k))
		case "string":
			s, err := c.Do(ctx, c.B().Get().Key(k).Build()).ToString()
			if err != nil {
				t.Fatalf("GET %s: %v", k, err)
			}
			v = fmt.Sprintf("%q", s)
		default:
			t.Fatalf("contents: key %s has type %q, which this helper does not read", k, typ)
		}
		if ttl, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64(); err != nil {
			t.Fatalf("PTTL %s: %v", k, err)
		} else if ttl >= 0 {
			v += " ttl"
		}
		out[k[len(prefix):]] = typ + " " + v
	}
	return out
}

// wantClean fails if a temp key or a lock key is left under prefix.
func wantClean(t *testing.T, c rueidis.Client, prefix string) {
	t.Helper()
	if left := redistest.Leftovers(t, c, prefix); len(left) > 0 {
		t.Errorf("left behind under %q: %v", prefix, left)
	}
}

// wantUnchanged fails unless every key under prefix is byte-identical (DUMP)
// to before, with the same expiry.
func wantUnchanged(t *testing.T, c rueidis.Client, prefix string, before map[string]redistest.KeyState) {
	t.Helper()
	if diff := cmp.Diff(before, redistest.Snapshot(t, c, prefix)); diff != "" {
		t.Errorf("keys under %q changed (-before +after):\n%s", prefix, diff)
	}
}

// sortedKeys returns m's keys in order, for stable failure messages.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

func pttl(t *testing.T, c rueidis.Client, key string) time.Duration {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	if n < 0 {
		return time.Duration(n)
	}
	return time.Duration(n) * time.Millisecond
}

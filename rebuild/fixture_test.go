package rebuild_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

// deployment is one Redis deployment the suite runs against, with a key
// prefix unique to the test. On the cluster the prefix carries a hash tag,
// so that every key of one Rebuilder shares a slot.
type deployment struct {
	name    string
	cluster bool
	client  rueidis.Client // what the Rebuilder sends through
	other   rueidis.Client // an independent client: reader, thief, saboteur
	prefix  string
}

// deployments returns the standalone server and the 3-master cluster.
func deployments(t *testing.T) []deployment {
	t.Helper()
	p := redistest.Prefix(t)
	return []deployment{
		{name: "standalone", client: env.Standalone.Client(t), other: env.Standalone.Client(t), prefix: p},
		{name: "cluster", cluster: true, client: env.Cluster.Client(t), other: env.Cluster.Client(t), prefix: "{" + p + "}"},
	}
}

// forEachDeployment runs f as a parallel subtest per deployment.
func forEachDeployment(t *testing.T, f func(t *testing.T, d deployment)) {
	t.Helper()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			f(t, d)
		})
	}
}

// user is the item type of most tests.
type user struct {
	ID      string
	Email   string
	Country string
	Score   float64
}

// users returns n users with distinct ids and emails, countries cycling
// over fr, de, us, and scores equal to their index.
// flight counts the calls in flight and the most at once.
type flight struct{ now, most atomic.Int64 }

// enter counts a call as started; call the returned func when it returns.
func (f *flight) enter() (exit func()) {
	n := f.now.Add(1)
	for m := f.most.Load(); n > m && !f.most.CompareAndSwap(m, n); m = f.most.Load() {
	}
	return func() { f.now.Add(-1) }
}

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

func smembers(t *testing.T, c rueidis.Client, key string) map[string]bool {
	t.Helper()
	ms, err := c.Do(context.Background(), c.B().Smembers().Key(key).Build()).AsStrSlice()
	if err != nil {
		t.Fatalf("SMEMBERS %s: %v", key, err)
	}
	out := make(map[string]bool, len(ms))
	for _, m := range ms {
		out[m] = true
	}
	return out
}

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

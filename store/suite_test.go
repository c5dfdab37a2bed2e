package store_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// env holds the package's redis-server processes: one standalone server and
// a 3-master cluster, started by TestMain.
var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// target is one deployment and live key the store suite runs against.
type target struct {
	name    string
	cluster bool
	// client is what the Store under test sends through.
	client rueidis.Client
	// other is an independent second client: the thief, the reader, the
	// saboteur. It never shares a connection with client.
	other rueidis.Client
	// final is the live key under test, unique to the test.
	final string
}

// targets returns the standalone target and, on the cluster, an untagged
// key, a tagged key and an odd key that needs a synthetic tag (C5+).
func targets(t *testing.T) []target {
	t.Helper()
	p := redistest.Prefix(t)
	return []target{
		{name: "standalone", client: env.Standalone.Client(t), other: env.Standalone.Client(t), final: p + "idx"},
		{name: "cluster/untagged", cluster: true, client: env.Cluster.Client(t), other: env.Cluster.Client(t), final: p + "idx"},
		{name: "cluster/tagged", cluster: true, client: env.Cluster.Client(t), other: env.Cluster.Client(t), final: p + "user{42}:idx"},
		{name: "cluster/odd", cluster: true, client: env.Cluster.Client(t), other: env.Cluster.Client(t), final: p + "a{}b"},
	}
}

// forEachTarget runs f as a parallel subtest per target.
func forEachTarget(t *testing.T, f func(t *testing.T, tg target)) {
	t.Helper()
	for _, tg := range targets(t) {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			f(t, tg)
		})
	}
}

// newStore returns a Store on tg's client.
func (tg target) store(opts store.Options) *store.Store { return store.New(tg.client, opts) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// do runs one command on c and fails the test on error: args are the
// command name, one key, then arguments.
func do(t *testing.T, c rueidis.Client, args ...string) rueidis.RedisResult {
	t.Helper()
	r := c.Do(context.Background(), c.B().Arbitrary(args[0]).Keys(args[1]).Args(args[2:]...).Build())
	if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
		t.Fatalf("%v: %v", args, err)
	}
	return r
}

// seedHash replaces key with a hash of fields (no TTL).
func seedHash(t *testing.T, c rueidis.Client, key string, fields map[string]string) {
	t.Helper()
	do(t, c, "DEL", key)
	if len(fields) == 0 {
		return
	}
	cmd := c.B().Hset().Key(key).FieldValue()
	for _, f := range slices.Sorted(mapsKeys(fields)) {
		cmd = cmd.FieldValue(f, fields[f])
	}
	if err := c.Do(context.Background(), cmd.Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// hashOf returns key's fields; an absent key gives an empty map.
func hashOf(t *testing.T, c rueidis.Client, key string) map[string]string {
	t.Helper()
	m, err := c.Do(context.Background(), c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		t.Fatalf("HGETALL %s: %v", key, err)
	}
	return m
}

// pttl returns key's PTTL: -2 when absent, -1 when it has no expiry.
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

// get returns key's string value and whether it exists.
func get(t *testing.T, c rueidis.Client, key string) (string, bool) {
	t.Helper()
	v, err := c.Do(context.Background(), c.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", false
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v, true
}

func exists(t *testing.T, c rueidis.Client, key string) bool {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Exists().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("EXISTS %s: %v", key, err)
	}
	return n == 1
}

// wantHash fails unless key holds exactly want and has no TTL (C35).
func wantHash(t *testing.T, c rueidis.Client, key string, want map[string]string) {
	t.Helper()
	if diff := cmp.Diff(want, hashOf(t, c, key)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", key, diff)
	}
	if got := pttl(t, c, key); len(want) > 0 && got != -1 {
		t.Errorf("%s: PTTL %v, want -1 (no expiry)", key, got)
	}
}

// wantAbsent fails if key exists.
func wantAbsent(t *testing.T, c rueidis.Client, key string) {
	t.Helper()
	if exists(t, c, key) {
		t.Errorf("%s exists, want it absent", key)
	}
}

// wantTTL fails unless key exists with 0 < TTL <= max.
func wantTTL(t *testing.T, c rueidis.Client, key string, max time.Duration) {
	t.Helper()
	if got := pttl(t, c, key); got <= 0 || got > max {
		t.Errorf("%s: PTTL %v, want in (0, %v]", key, got, max)
	}
}

// wantLock fails unless the lock key holds want ("" = absent).
func wantLock(t *testing.T, c rueidis.Client, key, want string) {
	t.Helper()
	got, ok := get(t, c, key)
	switch {
	case want == "" && ok:
		t.Errorf("lock %s = %q, want it absent", key, got)
	case want != "" && got != want:
		t.Errorf("lock %s = %q (present %v), want %q", key, got, ok, want)
	}
}

// wantErr fails unless errors.Is(err, target).
func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("err = %v, want errors.Is(err, %v)", err, target)
	}
}

// fields returns n hash fields "f<i>" = "<gen>-<i>".
func fields(gen string, n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m["f"+strconv.Itoa(i)] = gen + "-" + strconv.Itoa(i)
	}
	return m
}

// hook is a rueidishook.Hook that passes everything through, except that
// onDo (when set) intercepts Do.
type hook struct {
	onDo func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult
}

var _ rueidishook.Hook = hook{}

func (h hook) Do(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if h.onDo != nil {
		return h.onDo(c, ctx, cmd)
	}
	return c.Do(ctx, cmd)
}
func (hook) DoMulti(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	return c.DoMulti(ctx, multi...)
}
func (hook) DoCache(c rueidis.Client, ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	return c.DoCache(ctx, cmd, ttl)
}
func (hook) DoMultiCache(c rueidis.Client, ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	return c.DoMultiCache(ctx, multi...)
}
func (hook) Receive(c rueidis.Client, ctx context.Context, sub rueidis.Completed, fn func(rueidis.PubSubMessage)) error {
	return c.Receive(ctx, sub, fn)
}
func (hook) DoStream(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResultStream {
	return c.DoStream(ctx, cmd)
}
func (hook) DoMultiStream(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) rueidis.MultiRedisResultStream {
	return c.DoMultiStream(ctx, multi...)
}

// isScript reports whether cmd runs the script store/scripts/<name>.lua,
// through EVALSHA or the EVAL fallback.
func isScript(t *testing.T, cmd rueidis.Completed, name string) bool {
	src, err := os.ReadFile("scripts/" + name + ".lua")
	if err != nil {
		t.Errorf("read script %s: %v", name, err)
		return false
	}
	sum := sha1.Sum(src)
	c := cmd.Commands()
	return len(c) > 1 && (c[0] == "EVALSHA" && c[1] == hex.EncodeToString(sum[:]) || c[0] == "EVAL" && c[1] == string(src))
}

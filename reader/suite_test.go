package reader_test

import (
	"context"
	"crypto/tls"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/reader"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// env holds the package's redis-server processes: one standalone server and
// a 3-master cluster, started by TestMain.
var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// target is one deployment and index names the suite runs against.
type target struct {
	name    string
	cluster bool
	// addrs are the addresses a client of the deployment connects to.
	addrs []string
	// other is an independent client, with no cache, that plays the
	// writer: it sets pointers and writes generations by hand.
	other rueidis.Client
	// prefix starts every key of the test; live is a plain index's live
	// key and family a family's prefix.
	prefix, live, family string
}

// targets returns the standalone target and, on the cluster, untagged
// names (the pointer in a slot of its own, each data key in its own slot)
// and names that carry a hash tag.
func targets(t *testing.T) []target {
	t.Helper()
	p := redistest.Prefix(t)
	s, u, g := p+"s:", p+"u:", p+"t:" // one prefix per target: the two on the cluster share it
	return []target{
		{name: "standalone", addrs: []string{env.Standalone.Addr}, other: env.Standalone.Client(t),
			prefix: s, live: s + "by-email", family: s + "by-country"},
		{name: "cluster/untagged", cluster: true, addrs: env.Cluster.Addrs, other: env.Cluster.Client(t),
			prefix: u, live: u + "by-email", family: u + "{c}by-country"},
		{name: "cluster/tagged", cluster: true, addrs: env.Cluster.Addrs, other: env.Cluster.Client(t),
			prefix: g, live: g + "{users}:by-email", family: g + "{users}:by-country"},
	}
}

// forEach runs f as a parallel subtest per target.
func forEach(t *testing.T, f func(t *testing.T, tg target)) {
	t.Helper()
	for _, tg := range targets(t) {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			f(t, tg)
		})
	}
}

// client returns a new client of tg's deployment with rueidis's default
// client-side caching, after applying edit to its options, closed when t
// ends.
func (tg target) client(t *testing.T, edit func(*rueidis.ClientOption)) rueidis.Client {
	t.Helper()
	opt := rueidis.ClientOption{InitAddress: tg.addrs, ForceSingleClient: !tg.cluster}
	if edit != nil {
		edit(&opt)
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("connect to %v: %v", tg.addrs, err)
	}
	t.Cleanup(c.Close)
	return c
}

// newReader returns a Reader over c, failing t on error.
func newReader(t testing.TB, c rueidis.Client, opts reader.Options) *reader.Reader {
	t.Helper()
	r, err := reader.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ptr returns the pointer key of the index live (or family) on tg.
func (tg target) ptr(live string) string { return keys.PointerKey(live, tg.cluster) }

// setPtr sets the pointer of the index live to v, as a run of live in
// Generations mode does: where another live key can share the pointer
// (SPEC C104, the untagged names on the cluster), with the owner stamp of
// its base naming live, which such a run writes first.
func (tg target) setPtr(t *testing.T, live, v string) {
	t.Helper()
	if keys.Aliasable(live, tg.cluster) {
		redistest.Cmd(t, tg.other, "SET", keys.OwnerKey(live, tg.cluster), live)
	}
	redistest.Cmd(t, tg.other, "SET", tg.ptr(live), v)
}

// get returns what a recorder records for a read of the pointer of the
// index live without the cache: its GET, with the GET of the owner stamp
// in the same DoMulti where another live key can share the pointer.
func (tg target) get(live string) string {
	if keys.Aliasable(live, tg.cluster) {
		return "GET " + tg.ptr(live) + " | GET " + keys.OwnerKey(live, tg.cluster)
	}
	return "GET " + tg.ptr(live)
}

// snapshot returns the exact state of every key of the test, the pointers
// of untagged names on a cluster ("{<prefix>...}") included.
func (tg target) snapshot(t *testing.T) map[string]redistest.KeyState {
	t.Helper()
	s := redistest.Snapshot(t, tg.other, tg.prefix)
	maps.Copy(s, redistest.Snapshot(t, tg.other, "{"+tg.prefix))
	return s
}

// wantUnchanged fails t unless every key of the test is as in before:
// readers never write.
func (tg target) wantUnchanged(t *testing.T, before map[string]redistest.KeyState) {
	t.Helper()
	after := tg.snapshot(t)
	if !maps.EqualFunc(before, after, func(a, b redistest.KeyState) bool { return a == b }) {
		t.Errorf("keys changed by reads:\nbefore %v\nafter  %v", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
	}
}

// data is what the suite writes in one generation (or the plain shape) of
// three indexes: a hash, a sorted set and a family's bucket.
type data struct {
	hash  string // the hash's key; field "ada" = value
	value string
	zset  string // a sorted set: ada → score, bob → score+1
	score float64
	set   string // a set: {ada, bob}
}

// write writes d with c.
func (d data) write(t *testing.T, c rueidis.Client) {
	t.Helper()
	redistest.Cmd(t, c, "HSET", d.hash, "ada", d.value)
	redistest.Cmd(t, c, "ZADD", d.zset, ftoa(d.score), "ada", ftoa(d.score+1), "bob")
	redistest.Cmd(t, c, "SADD", d.set, "ada", "bob")
}

// remove deletes d's keys with c, as a sweep of its generation would.
func (d data) remove(t *testing.T, c rueidis.Client) {
	t.Helper()
	for _, k := range []string{d.hash, d.zset, d.set} {
		redistest.Cmd(t, c, "DEL", k)
	}
}

// ftoa formats a score as Redis reads it.
func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// gen returns the data of generation g of tg's indexes (g 0: the plain
// shape), with values that name it.
func (tg target) gen(g int64, value string, score float64) data {
	at := func(live string) string {
		if g == 0 {
			return live
		}
		return keys.GenKey(live, g)
	}
	bucket := tg.family + ":uk"
	if g != 0 {
		bucket = keys.GenBucketKey(tg.family, g, "uk")
	}
	return data{hash: at(tg.live), value: value, zset: at(tg.live + "/z"), score: score, set: bucket}
}

// twoGenerations writes generations 1 and 2 of tg's indexes, with values
// "one" and "two", and sets the plain index's pointer to 1.
func (tg target) twoGenerations(t *testing.T) (g1, g2 data) {
	t.Helper()
	g1, g2 = tg.gen(1, "one", 1), tg.gen(2, "two", 2)
	g1.write(t, tg.other)
	g2.write(t, tg.other)
	tg.setPtr(t, tg.live, "1")
	return g1, g2
}

// wantData reads d's indexes through r and fails t unless they hold d.
func wantData(t *testing.T, ctx context.Context, r *reader.Reader, tg target, d data) {
	t.Helper()
	hash, zset, set := reader.Plain(tg.live), reader.Plain(tg.live+"/z"), reader.InBucket(tg.family, "uk")
	if v, ok, err := r.HGet(ctx, hash, "ada"); err != nil || !ok || v != d.value {
		t.Errorf("HGet ada = %q, %v, %v; want %q, true, nil", v, ok, err, d.value)
	}
	if v, ok, err := r.HGet(ctx, hash, "nobody"); err != nil || ok || v != "" {
		t.Errorf("HGet nobody = %q, %v, %v; want \"\", false, nil", v, ok, err)
	}
	if s, ok, err := r.ZScore(ctx, zset, "ada"); err != nil || !ok || s != d.score {
		t.Errorf("ZScore ada = %v, %v, %v; want %v, true, nil", s, ok, err, d.score)
	}
	if s, ok, err := r.ZScore(ctx, zset, "nobody"); err != nil || ok || s != 0 {
		t.Errorf("ZScore nobody = %v, %v, %v; want 0, false, nil", s, ok, err)
	}
	want := []rueidis.ZScore{{Member: "ada", Score: d.score}, {Member: "bob", Score: d.score + 1}}
	if zs, err := r.ZRange(ctx, zset, 0, -1); err != nil || !slices.Equal(zs, want) {
		t.Errorf("ZRange 0 -1 = %v, %v; want %v", zs, err, want)
	}
	if zs, err := r.ZRevRange(ctx, zset, 0, 0); err != nil || !slices.Equal(zs, want[1:]) {
		t.Errorf("ZRevRange 0 0 = %v, %v; want %v", zs, err, want[1:])
	}
	if ok, err := r.SIsMember(ctx, set, "bob"); err != nil || !ok {
		t.Errorf("SIsMember bob = %v, %v; want true", ok, err)
	}
	if ok, err := r.SIsMember(ctx, set, "nobody"); err != nil || ok {
		t.Errorf("SIsMember nobody = %v, %v; want false", ok, err)
	}
	if m, err := r.SMembers(ctx, set); err != nil || !slices.Equal(slices.Sorted(slices.Values(m)), []string{"ada", "bob"}) {
		t.Errorf("SMembers = %v, %v; want [ada bob]", m, err)
	}
	if m, err := r.SMembers(ctx, reader.InBucket(tg.family, "nowhere")); err != nil || len(m) != 0 {
		t.Errorf("SMembers of a bucket nobody is in = %v, %v; want none", m, err)
	}
}

// wireCounter counts the times a string (a pointer key) is written on the
// connections of a client: each command that names the key writes it
// once. A command served from the client-side cache writes nothing.
type wireCounter struct {
	needle string
	mu     sync.Mutex
	n      int
}

// count returns how many times the needle has been written.
func (w *wireCounter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// reset sets the count back to 0.
func (w *wireCounter) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n = 0
}

// dial is a rueidis DialCtxFn that counts what the connection writes.
func (w *wireCounter) dial(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, w: w}, nil
}

// countingConn is a connection whose writes a wireCounter reads.
type countingConn struct {
	net.Conn
	w    *wireCounter
	tail []byte // the end of what was written, shorter than the needle
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.w.mu.Lock()
	buf := append(c.tail, p...)
	c.w.n += strings.Count(string(buf), c.w.needle)
	if keep := len(c.w.needle) - 1; len(buf) > keep {
		buf = buf[len(buf)-keep:]
	}
	c.tail = slices.Clone(buf)
	c.w.mu.Unlock()
	return c.Conn.Write(p)
}

// recorder records the commands a client sends with Do and DoMulti (not
// DoCache): those of one DoMulti in one string, joined by " | ".
type recorder struct {
	mu   sync.Mutex
	cmds []string
}

// wrap returns c with every Do recorded.
func (rec *recorder) wrap(c rueidis.Client) rueidis.Client {
	return rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			rec.mu.Lock()
			rec.cmds = append(rec.cmds, strings.Join(cmd.Commands(), " "))
			rec.mu.Unlock()
			return c.Do(ctx, cmd)
		},
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			one := make([]string, len(multi))
			for i, cmd := range multi {
				one[i] = strings.Join(cmd.Commands(), " ")
			}
			rec.mu.Lock()
			rec.cmds = append(rec.cmds, strings.Join(one, " | "))
			rec.mu.Unlock()
			return c.DoMulti(ctx, multi...)
		},
	})
}

// take returns the commands recorded since the last take.
func (rec *recorder) take() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := rec.cmds
	rec.cmds = nil
	return out
}

package rebuild_test

// The failure paths and edges of Rebuilder.Apply and of the online run:
// Apply without a run, its refusals and lost replies, and runs whose logs
// of changes reach their bound, whose catch-up runs out of time, whose
// publish finds a tail too long to replay, and whose catch-up empties a temp
// key that a later change re-creates. The indexes are those of the online
// tests (onlineNames, onlineRebuilder): a Hash of emails, a SortedSet of
// scores and a SetIndex of countries; after each case the live keys are
// compared whole, with their TTLs, and nothing of a run is left.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidiscompat"
	"github.com/redis/rueidis/rueidishook"
	"golang.org/x/sync/errgroup"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// sentCounter counts the commands a client sends, but not an EVALSHA
// answered NOSCRIPT (rueidis then sends the script again as EVAL): the
// round trips an Apply makes.
type sentCounter struct{ n atomic.Int64 }

// count returns c with a hook that counts into s.
func (s *sentCounter) count(c rueidis.Client) rueidis.Client {
	noScript := func(err error) bool {
		re, ok := rueidis.IsRedisErr(err)
		return ok && re.IsNoScript()
	}
	return rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			res := c.Do(ctx, cmd)
			if !noScript(res.Error()) {
				s.n.Add(1)
			}
			return res
		},
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			res := c.DoMulti(ctx, multi...)
			for _, r := range res {
				if !noScript(r.Error()) {
					s.n.Add(1)
				}
			}
			return res
		},
	})
}

// logRecorder is a slog.Handler that keeps every record's message and
// attributes as one line.
type logRecorder struct {
	mu    *sync.Mutex
	lines *[]string
}

func newLogRecorder() logRecorder { return logRecorder{mu: &sync.Mutex{}, lines: new([]string)} }

func (l logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l logRecorder) WithGroup(string) slog.Handler            { return l }
func (l logRecorder) Handle(_ context.Context, r slog.Record) error {
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		line += " " + a.Key + "=" + a.Value.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.lines = append(*l.lines, line)
	return nil
}

// matching returns the lines that contain every one of parts.
func (l logRecorder) matching(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range *l.lines {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			out = append(out, line)
		}
	}
	return out
}

// wantIndex fails t unless the three indexes of k hold exactly what us
// make of them, without TTLs, and no other bucket exists.
func wantIndex(t *testing.T, c rueidis.Client, k onlineKeys, us map[string]user) {
	t.Helper()
	wantHash, wantZset, wantSets := map[string]string{}, map[string]float64{}, map[string][]string{}
	for _, u := range us {
		wantHash[u.Email] = u.ID
		wantZset[u.ID] = u.Score
		b := k.Family + ":" + u.Country
		wantSets[b] = append(wantSets[b], u.ID)
	}
	for _, ms := range wantSets {
		slices.Sort(ms)
	}
	if diff := cmp.Diff(wantHash, redistest.HGetAll(t, c, k.Hash)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", k.Hash, diff)
	}
	if diff := cmp.Diff(wantZset, redistest.ZScores(t, c, k.Zset)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", k.Zset, diff)
	}
	gotSets := map[string][]string{}
	for _, b := range redistest.LiveKeys(t, c, k.Family+":") {
		gotSets[b] = redistest.SMembers(t, c, b)
	}
	if diff := cmp.Diff(wantSets, gotSets); diff != "" {
		t.Errorf("%s:* (-want +got):\n%s", k.Family, diff)
	}
	for _, key := range append(slices.Collect(maps.Keys(gotSets)), k.Hash, k.Zset) {
		if redistest.Exists(t, c, key) {
			redistest.WantPTTL(t, c, key, -1, -1)
		}
	}
}

// byID returns us keyed by id.
func byID(us ...user) map[string]user {
	m := map[string]user{}
	for _, u := range us {
		m[u.ID] = u
	}
	return m
}

// indexOf is the state of the online tests' indexes: it seeds them with a
// first run over us, and keeps what they must hold as changes are applied.
type indexOf struct {
	k     onlineKeys
	users map[string]user
}

// seedIndex publishes a first run of the indexes of d over us.
func seedIndex(t *testing.T, d deployment, us ...user) *indexOf {
	t.Helper()
	k := onlineNames(d.Prefix)
	if _, err := onlineRebuilder(t, d.Client, k, rebuild.Options{}).Run(redistest.Ctx(t), sources.Slice(us)); err != nil {
		t.Fatalf("first run: %v", err)
	}
	ix := &indexOf{k: k, users: byID(us...)}
	wantIndex(t, d.Other, k, ix.users)
	redistest.WantClean(t, d.Other, d.Prefix)
	return ix
}

// changed records what change does to the source of truth.
func (ix *indexOf) changed(cs ...index.Change[user]) {
	for _, c := range cs {
		if c.New != nil {
			ix.users[c.New.ID] = *c.New
		} else if c.Old != nil {
			delete(ix.users, c.Old.ID)
		}
	}
}

func TestApplyMaintainsIndex(t *testing.T) {
	// C64: without a run, Apply keeps the three indexes exactly as a rebuild of
	// the source of truth would make them, in one round trip per call
	// whatever the number of changes, and sends nothing for changes that
	// write nothing.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		base := users(6)
		base[5].Country = "solo" // alone in its bucket
		ix := seedIndex(t, d, base...)
		var sent sentCounter
		r := onlineRebuilder(t, sent.count(d.Client), ix.k, rebuild.Options{})
		u := user{ID: "u000100", Email: "new@example.com", Country: "fr", Score: 7}
		moved := base[5]
		moved.Country = "fr"
		all := u
		all.Email, all.Score, all.Country = "all@example.com", -1.5, "it"
		for _, step := range []struct {
			name    string
			changes []index.Change[user]
			sends   int64
		}{
			{"insert", []index.Change[user]{index.Insert(u)}, 1},
			{"update the email", []index.Change[user]{index.Update(u, with(u, func(v *user) { v.Email = "renamed@example.com" }))}, 1},
			{"update the score", []index.Change[user]{index.Update(with(u, func(v *user) { v.Email = "renamed@example.com" }), with(u, func(v *user) { v.Email, v.Score = "renamed@example.com", 9 }))}, 1},
			{"move to a new bucket", []index.Change[user]{index.Update(with(u, func(v *user) { v.Email, v.Score = "renamed@example.com", 9 }), with(u, func(v *user) { v.Email, v.Score, v.Country = "renamed@example.com", 9, "de" }))}, 1},
			{"move out of a bucket, emptying it", []index.Change[user]{index.Update(base[5], moved)}, 1},
			{"update every field", []index.Change[user]{index.Update(with(u, func(v *user) { v.Email, v.Score, v.Country = "renamed@example.com", 9, "de" }), all)}, 1},
			{"an update that changes nothing", []index.Change[user]{index.Update(all, all)}, 0},
			{"no changes", nil, 0},
			{"several changes that change nothing", []index.Change[user]{index.Update(all, all), index.Update(base[0], base[0])}, 0},
			{"delete", []index.Change[user]{index.Delete(all)}, 1},
			{"several changes at once", []index.Change[user]{
				index.Insert(u), index.Update(base[1], with(base[1], func(v *user) { v.Score, v.Country = 100, "zz" })),
				index.Delete(base[2]), index.Update(base[3], base[3]),
				index.Update(u, with(u, func(v *user) { v.Email = "twice@example.com" })),
			}, 1},
		} {
			t.Run(step.name, func(t *testing.T) {
				before := sent.n.Load()
				if err := r.Apply(ctx, step.changes...); err != nil {
					t.Fatalf("Apply: %v", err)
				}
				if got := sent.n.Load() - before; got != step.sends {
					t.Errorf("sent %d commands, want %d", got, step.sends)
				}
				ix.changed(step.changes...)
				wantIndex(t, d.Other, ix.k, ix.users)
			})
		}
		if redistest.Exists(t, d.Other, ix.k.Family+":solo") {
			t.Errorf("%s:solo exists, want it deleted with its last member", ix.k.Family)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// with returns a copy of u changed by f.
func with(u user, f func(*user)) user {
	f(&u)
	return u
}

func TestApplyRefusedBeforeSending(t *testing.T) {
	// C64: what Apply refuses without sending anything, the live keys as
	// they were: a builder that is not Incremental (ErrNotIncremental, naming
	// it), a change with neither Old nor New (even with valid changes
	// beside it), a Diff error (a NaN score), and a write to a key the
	// builder does not own.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		us := users(3)
		ix := seedIndex(t, d, us...)
		three := func() []index.Builder[user] {
			return []index.Builder[user]{
				builders.Hash(ix.k.Hash, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
				builders.SortedSet(ix.k.Zset, func(u user) (string, float64, bool) { return u.ID, u.Score, true }),
				builders.SetIndex(ix.k.Family, func(u user) (string, string, bool) { return u.Country, u.ID, true }),
			}
		}
		fn := d.Prefix + "idx:func"
		compat := d.Prefix + "idx:compat"
		nan := user{ID: "u000009", Email: "nan@example.com", Country: "fr", Score: math.NaN()}
		for _, tt := range []struct {
			name     string
			builders []index.Builder[user]
			changes  []index.Change[user]
			target   error
			key      string // the *Error's Key
			says     string
		}{
			{"a Func builder", append(three(), builders.Func(fn, func(*index.Commands, []user) error { return nil })),
				[]index.Change[user]{index.Insert(user{ID: "u000009", Email: "x@example.com", Country: "fr"})}, rebuild.ErrNotIncremental, fn, "does not implement index.Incremental"},
			{"a Compat builder first", append([]index.Builder[user]{builders.Compat(compat, func(context.Context, rueidiscompat.Pipeliner, string, []user) error { return nil })}, three()...),
				[]index.Change[user]{index.Insert(user{ID: "u000009", Email: "x@example.com", Country: "fr"})}, rebuild.ErrNotIncremental, compat, "does not implement index.Incremental"},
			{"neither old nor new", three(), []index.Change[user]{index.Insert(user{ID: "u000009", Email: "x@example.com", Country: "fr"}), {}},
				nil, ix.k.Hash + ", " + ix.k.Zset + ", " + ix.k.Family, "change 1 has neither an old nor a new value"},
			{"a NaN score", three(), []index.Change[user]{index.Insert(nan)}, nil, ix.k.Zset, "NaN score"},
			{"a key the builder does not own", []index.Builder[user]{&strayBuilder{key: ix.k.Hash, writes: ix.k.Zset}},
				[]index.Change[user]{index.Insert(us[0])}, nil, ix.k.Hash, "does not own"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				var sent sentCounter
				r := redistest.Rebuilder(t, sent.count(d.Client), rebuild.Options{}, tt.builders...)
				before := redistest.Snapshot(t, d.Other, d.Prefix)
				err := r.Apply(ctx, tt.changes...)
				var e *rebuild.Error
				switch {
				case !errors.As(err, &e):
					t.Fatalf("Apply: got %v, want a *rebuild.Error", err)
				case e.Op != "apply" || e.Key != tt.key:
					t.Errorf("Apply: got Op %q, Key %q (%v), want apply, %q", e.Op, e.Key, err, tt.key)
				case tt.target != nil && !errors.Is(err, tt.target):
					t.Errorf("Apply: got %v, want it to match %v", err, tt.target)
				case tt.target == nil && errors.Is(err, rebuild.ErrNotIncremental):
					t.Errorf("Apply: got %v, which matches ErrNotIncremental", err)
				}
				if !strings.Contains(err.Error(), tt.says) {
					t.Errorf("Apply: got %q, want it to say %q", err, tt.says)
				}
				if n := sent.n.Load(); n != 0 {
					t.Errorf("sent %d commands, want none", n)
				}
				redistest.WantUnchanged(t, d.Other, d.Prefix, before)
			})
		}
	})
}

// strayBuilder is an Incremental builder of key whose Diff writes another
// key, writes.
type strayBuilder struct{ key, writes string }

var _ index.Incremental[user] = (*strayBuilder)(nil)

func (s *strayBuilder) Key() string                         { return s.key }
func (s *strayBuilder) Build(*index.Commands, []user) error { return nil }
func (s *strayBuilder) Diff(w *index.Writes, _, new *user) error {
	return w.HSet(s.writes, new.ID, new.Email)
}

func TestApplyReservedBucket(t *testing.T) {
	// C60: a change whose bucket would have the shape of keyswap's own keys
	// (the family's "rebuild-lock", a generation) skips that write, as a
	// run skips such an entry, and logs it; the rest of the change is
	// applied, in the same round trip.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ix := seedIndex(t, d, users(3)...)
		rec := newLogRecorder()
		r := onlineRebuilder(t, d.Client, ix.k, rebuild.Options{Logger: slog.New(rec)})
		// The family's generation, which the first run published, keeps
		// its value: the change's write to it as a bucket is skipped.
		meta := keys.MetaKey(ix.k.Family, d.Cluster)
		metaBefore := redistest.Snapshot(t, d.Other, meta)
		if len(metaBefore) != 1 {
			t.Fatalf("%s: got %v, want the family's generation", meta, metaBefore)
		}
		odd := user{ID: "u000010", Email: "odd@example.com", Country: "rebuild-lock", Score: 10}
		fr := with(odd, func(u *user) { u.Country = "fr" })
		gen := with(odd, func(u *user) { u.Country = "rebuild-gen" })
		for _, step := range []struct {
			change  index.Change[user]
			skipped string
			want    user // what the index holds of the user: no bucket for a skipped one
		}{
			{index.Insert(odd), "rebuild-lock", with(odd, func(u *user) { u.Country = "" })},
			{index.Update(odd, fr), "rebuild-lock", fr},
			{index.Update(fr, gen), "rebuild-gen", with(gen, func(u *user) { u.Country = "" })},
		} {
			before := len(rec.matching("skipped"))
			if err := r.Apply(ctx, step.change); err != nil {
				t.Fatalf("Apply(%v → %v): %v", step.change.Old, step.change.New, err)
			}
			skipped := ix.k.Family + ":" + step.skipped
			if got := rec.matching("skipped a change's write", "skipped_key="+skipped); len(got) == 0 || len(rec.matching("skipped")) != before+1 {
				t.Errorf("log: got %q, want one line naming %s", rec.matching("skipped"), skipped)
			}
			want := maps.Clone(ix.users)
			want[odd.ID] = step.want
			wantHashZset(t, d.Other, ix.k, want)
			if skipped == meta {
				redistest.WantUnchanged(t, d.Other, meta, metaBefore)
			} else {
				redistest.WantAbsent(t, d.Other, skipped)
			}
		}
		wantMembers := map[string][]string{ix.k.Family + ":fr": {"u000000"}, ix.k.Family + ":de": {"u000001"}, ix.k.Family + ":us": {"u000002"}}
		for b, ms := range wantMembers {
			if got := redistest.SMembers(t, d.Other, b); !slices.Equal(got, ms) {
				t.Errorf("%s: got %q, want %q", b, got, ms)
			}
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// wantHashZset fails t unless the hash and the sorted set of k hold exactly
// what us make of them; users with an empty country are in no bucket.
func wantHashZset(t *testing.T, c rueidis.Client, k onlineKeys, us map[string]user) {
	t.Helper()
	wantHash, wantZset := map[string]string{}, map[string]float64{}
	for _, u := range us {
		wantHash[u.Email] = u.ID
		wantZset[u.ID] = u.Score
	}
	if diff := cmp.Diff(wantHash, redistest.HGetAll(t, c, k.Hash)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", k.Hash, diff)
	}
	if diff := cmp.Diff(wantZset, redistest.ZScores(t, c, k.Zset)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", k.Zset, diff)
	}
}

func TestApplyNoPermission(t *testing.T) {
	// A user without SREM: a change that needs it (a bucket move) fails
	// with ErrNoPermission naming SREM and the bucket, and nothing of it
	// is applied, not even the email and score it also changes; a change
	// that needs no SREM is applied. On a server of the test's own, and on
	// the cluster node that serves the test's slot (an ACL user lives on
	// one node), each through a client of that node alone.
	for _, where := range []string{"standalone", "cluster"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t)
			p := redistest.Prefix(t)
			srv := redistest.OwnServer(t)
			admin := srv.Client(t)
			if where == "cluster" {
				p = "{" + p + "}"
				srv, admin = env.Cluster.NodeFor(t, p), env.Cluster.Client(t)
			}
			d := deployment{Name: where, Client: admin, Other: admin, Prefix: p}
			u := users(3)
			ix := seedIndex(t, d, u...)
			c := srv.ClientAs(t, "ks-"+strings.ReplaceAll(t.Name(), "/", "-"), "~*", "+@all", "-srem")
			r := onlineRebuilder(t, c, ix.k, rebuild.Options{})
			before := redistest.Snapshot(t, admin, p)
			moved := with(u[0], func(v *user) { v.Email, v.Score, v.Country = "moved@example.com", 50, "de" })
			err := r.Apply(ctx, index.Update(u[0], moved))
			redistest.WantErr(t, err, rebuild.ErrNoPermission)
			bucket := ix.k.Family + ":fr"
			if !strings.Contains(err.Error(), "SREM") || !strings.Contains(err.Error(), bucket) {
				t.Errorf("Apply: %v, want it to name SREM and %s", err, bucket)
			}
			var e *rebuild.Error
			if !errors.As(err, &e) || e.Op != "apply" {
				t.Errorf("Apply: got %v, want an *Error of op apply", err)
			}
			redistest.WantUnchanged(t, admin, p, before)

			scored := with(u[1], func(v *user) { v.Score = 60 })
			if err := r.Apply(ctx, index.Update(u[1], scored)); err != nil {
				t.Fatalf("Apply of a score: %v", err)
			}
			ix.changed(index.Update(u[1], scored))
			wantIndex(t, admin, ix.k, ix.users)
			redistest.WantClean(t, admin, p)
		})
	}
}

func TestApplyReplyLost(t *testing.T) {
	// The connection breaks around Apply's script: after the script ran,
	// before its reply (the proxy cuts at the first byte back), or before
	// the script reached the server (at the first byte out). Either way
	// Apply returns an error matching ErrOutcomeUnknown; the change was
	// applied whole or not at all, and applying it again leaves the index
	// right.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, tt := range []struct {
			name string
			dir  faultproxy.Direction
			ran  bool
		}{
			{"reply lost", faultproxy.ToClient, true},
			{"script lost", faultproxy.ToServer, false},
		} {
			t.Run(tt.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				d := casePrefixed(d, tt.name)
				u := users(3)
				ix := seedIndex(t, d, u...)
				proxy, c := proxied(t, d, ix.k.Hash)
				r := onlineRebuilder(t, c, ix.k, rebuild.Options{})
				// A first change caches the script on the server and opens
				// the connection, so that the cut hits the script itself,
				// not a NOSCRIPT reply or a new connection's handshake.
				warm := with(u[2], func(v *user) { v.Email, v.Score, v.Country = "warm@example.com", 30, "it" })
				if err := r.Apply(ctx, index.Update(u[2], warm)); err != nil {
					t.Fatalf("Apply: %v", err)
				}
				ix.changed(index.Update(u[2], warm))

				change := index.Update(u[0], with(u[0], func(v *user) { v.Email, v.Score, v.Country = "moved@example.com", 50, "it" }))
				before := redistest.Snapshot(t, d.Other, d.Prefix)
				proxy.CutAfter(tt.dir, 0)
				err := r.Apply(ctx, change)
				redistest.WantErr(t, err, rebuild.ErrOutcomeUnknown)
				var e *rebuild.Error
				if !errors.As(err, &e) || e.Op != "apply" {
					t.Errorf("Apply: got %v, want an *Error of op apply", err)
				}
				t.Logf("Apply: %v", err)
				if tt.ran {
					want := maps.Clone(ix.users)
					want[u[0].ID] = *change.New
					waitIndex(t, d.Other, ix.k, want)
				} else {
					redistest.WantUnchanged(t, d.Other, d.Prefix, before)
				}
				// Applied again, until it gets a reply (the first try after a
				// cut may still go out on the broken connection): the same
				// index either way.
				for try := 1; ; try++ {
					err := r.Apply(ctx, change)
					if err == nil {
						break
					}
					if !errors.Is(err, rebuild.ErrOutcomeUnknown) || try == 10 {
						t.Fatalf("Apply again (try %d): %v", try, err)
					}
				}
				ix.changed(change)
				wantIndex(t, d.Other, ix.k, ix.users)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

// casePrefixed returns d with a prefix of its own for the case name under
// d's test: on the cluster it keeps d's hash tag.
func casePrefixed(d deployment, name string) deployment {
	d.Prefix += strings.ReplaceAll(name, " ", "-") + ":"
	return d
}

// proxied returns a client of d whose connections pass a faultproxy, and
// the proxy in front of the server that holds key. The client sends no
// keep-alive PING, so that a CutAfter counts only its commands' bytes, and
// has one connection per server (rueidis sends a command on any of them,
// at random), so that the next command goes out on the one a test opened.
func proxied(t *testing.T, d deployment, key string) (*faultproxy.Proxy, rueidis.Client) {
	t.Helper()
	opt := rueidis.ClientOption{DisableCache: true, Dialer: net.Dialer{KeepAlive: -1}, PipelineMultiplex: -1}
	var proxy *faultproxy.Proxy
	if d.Cluster {
		dialer := &faultproxy.Dialer{}
		t.Cleanup(func() { _ = dialer.Close() })
		opt.InitAddress, opt.DialCtxFn = env.Cluster.Addrs, dialer.Dial
		var err error
		if proxy, err = dialer.Proxy(env.Cluster.NodeFor(t, key).Addr); err != nil {
			t.Fatal(err)
		}
	} else {
		var err error
		if proxy, err = faultproxy.New(env.Standalone.Addr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = proxy.Close() })
		opt.InitAddress, opt.ForceSingleClient = []string{proxy.Addr()}, true
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return proxy, c
}

// waitIndex polls until the indexes of k hold exactly what us make of
// them: after a cut the server runs what it received after the client has
// seen the reset.
func waitIndex(t *testing.T, c rueidis.Client, k onlineKeys, us map[string]user) {
	t.Helper()
	want := user{}
	for _, u := range us {
		if u.Email == "moved@example.com" {
			want = u
		}
	}
	waitFor(t, "the change to reach the server", func() bool {
		id, ok := redistest.HGetAll(t, c, k.Hash)[want.Email]
		return ok && id == want.ID
	})
	wantIndex(t, c, k, us)
}

func TestApplyClusterBucketsShareTheSlot(t *testing.T) {
	// On a cluster, New refuses a family without a hash tag, so every
	// bucket of a family has its prefix's tag: a bucket named with braces
	// of its own stays in the slot, and Apply writes it with the rest of
	// the change. (A write to another slot cannot be asked for: Writes
	// refuses a key the builder does not own, and every key a builder owns
	// is in the Rebuilder's slot; protocol.Changes.Apply checks the slots anyway,
	// see TestApply in internal/protocol.)
	ctx := redistest.Ctx(t)
	c := env.Cluster.Client(t)
	p := "{" + redistest.Prefix(t) + "}"
	_, err := rebuild.New(c, rebuild.Options{}, builders.SetIndex(redistest.Prefix(t)+"idx", func(u user) (string, string, bool) { return u.Country, u.ID, true }))
	var e *rebuild.Error
	if !errors.As(err, &e) || e.Op != "config" || !strings.Contains(err.Error(), "no hash tag") {
		t.Fatalf("New with an untagged family: got %v, want a config error", err)
	}
	d := deployment{Name: "cluster", Cluster: true, Client: c, Other: env.Cluster.Client(t), Prefix: p}
	ix := seedIndex(t, d, users(2)...)
	r := onlineRebuilder(t, c, ix.k, rebuild.Options{})
	braced := user{ID: "u000009", Email: "braced@example.com", Country: "{elsewhere}", Score: 9}
	bucket := ix.k.Family + ":" + braced.Country
	if keys.Slot(bucket) != keys.Slot(ix.k.Hash) {
		t.Fatalf("%s is in slot %d, %s in %d", bucket, keys.Slot(bucket), ix.k.Hash, keys.Slot(ix.k.Hash))
	}
	if err := r.Apply(ctx, index.Insert(braced)); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	ix.changed(index.Insert(braced))
	wantIndex(t, d.Other, ix.k, ix.users)
	redistest.WantClean(t, d.Other, p)
}

// heldRun is a run whose source reads the source of truth when the run
// starts it (after the locks are taken: its snapshot), then holds it back
// until the run is released, and then yields it in id order: the changes
// applied meanwhile are logged for the run, and replayed by its catch-up.
type heldRun struct {
	started, released, done chan struct{}
	stats                   rebuild.Stats
	err                     error
	once                    sync.Once
}

// startHeld starts r.Run with a held source of the source of truth db,
// read through c, and returns once the source has read it.
func startHeld(t *testing.T, ctx context.Context, r *rebuild.Rebuilder[user], c rueidis.Client, db string) *heldRun {
	t.Helper()
	h := &heldRun{started: make(chan struct{}), released: make(chan struct{}), done: make(chan struct{})}
	src := redistest.TruthSource(c, db, func(ctx context.Context) bool {
		close(h.started)
		select {
		case <-h.released:
			return true
		case <-ctx.Done():
			return false
		}
	}, nil)
	go func() {
		defer close(h.done)
		h.stats, h.err = r.Run(ctx, src)
	}()
	t.Cleanup(func() { h.release(); <-h.done })
	select {
	case <-h.started:
	case <-h.done:
		t.Fatalf("Run ended before its source started: %v", h.err)
	}
	return h
}

// release lets the source yield.
func (h *heldRun) release() { h.once.Do(func() { close(h.released) }) }

// wait releases the source and returns Run's result.
func (h *heldRun) wait() (rebuild.Stats, error) {
	h.release()
	<-h.done
	return h.stats, h.err
}

// applier is the application of the run tests: it commits each change to
// the source of truth, then applies it through its Rebuilder, one Apply call
// per change.
type applier struct {
	c  rueidis.Client
	r  *rebuild.Rebuilder[user]
	db string
}

// apply commits and applies cs, in order.
func (a applier) apply(ctx context.Context, cs ...index.Change[user]) error {
	for _, ch := range cs {
		var cmd rueidis.Completed
		if ch.New != nil {
			cmd = a.c.B().Hset().Key(a.db).FieldValue().FieldValue(ch.New.ID, redistest.EncodeUser(*ch.New)).Build()
		} else {
			cmd = a.c.B().Hdel().Key(a.db).Field(ch.Old.ID).Build()
		}
		if err := a.c.Do(ctx, cmd).Error(); err != nil {
			return err
		}
		if err := a.r.Apply(ctx, ch); err != nil {
			return err
		}
	}
	return nil
}

// inserts returns n new users from index from on, each an Insert: 3 log
// entries, one per index.
func inserts(from, n int) []index.Change[user] {
	out := make([]index.Change[user], n)
	for i := range out {
		j := from + i
		out[i] = index.Insert(user{ID: fmt.Sprintf("n%07d", j), Email: fmt.Sprintf("new%07d@example.com", j), Country: fmt.Sprintf("c%02d", j%7), Score: float64(j)})
	}
	return out
}

// applyAll applies cs from 4 goroutines at once, each its share in order.
func (a applier) applyAll(ctx context.Context, cs []index.Change[user]) error {
	var g errgroup.Group
	const workers = 4
	for w := range workers {
		g.Go(func() error {
			for i := w; i < len(cs); i += workers {
				if err := a.apply(ctx, cs[i]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// onlineSeed seeds the source of truth of k with n users and publishes a
// first run of it.
func onlineSeed(t *testing.T, d deployment, k onlineKeys, n int, seed uint64) {
	t.Helper()
	redistest.Clean(t, d.Other, k.DB) // what an earlier run of the test (-count) inserted
	seedDB(t, d.Other, k.DB, n, seed)
	if _, err := onlineRebuilder(t, d.Client, k, rebuild.Options{}).Run(redistest.Ctx(t), onlineSource(d.Client, k.DB, nil, 0)); err != nil {
		t.Fatalf("first run: %v", err)
	}
}

// wantRunErr fails t unless err is a *rebuild.Error of op that matches
// target and says says.
func wantRunErr(t *testing.T, err error, op string, target error, says string) {
	t.Helper()
	var e *rebuild.Error
	switch {
	case !errors.Is(err, target):
		t.Fatalf("Run: got %v, want it to match %v", err, target)
	case !errors.As(err, &e) || e.Op != op:
		t.Errorf("Run: got %v, want an *Error of op %q", err, op)
	case !strings.Contains(err.Error(), says):
		t.Errorf("Run: got %q, want it to say %q", err, says)
	}
	t.Logf("Run: %v", err)
}

func TestApplyMaxChanges(t *testing.T) {
	// C65: the writer's Rebuilder bounds each log at MaxChanges entries: past
	// it, changes are applied but not logged (the log gets "!overrun",
	// and Apply logs a warning), and the run fails with ErrFallingBehind
	// instead of publishing without them: in its catch-up when the overrun
	// is among the entries it replays, in its publish when it is in the
	// tail. Nothing is published, nothing of the run is left, and the live
	// indexes hold every change.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, where := range []string{"catch-up", "publish"} {
			t.Run(where, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				d := casePrefixed(d, where)
				k := onlineNames(d.Prefix)
				onlineSeed(t, d, k, 500, 21)
				rec := newLogRecorder()
				const bound = 5
				a := applier{c: d.Other, r: onlineRebuilder(t, d.Other, k, rebuild.Options{MaxChanges: bound, Logger: slog.New(rec)}), db: k.DB}
				changes := inserts(0, 3*bound)
				runner := d.Client
				if where == "publish" {
					publish := redistest.ScriptNamed("publish")
					var once sync.Once
					runner = rueidishook.WithHook(d.Client, redistest.Hook{
						OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
							if publish.Is(cmd.Commands()) {
								once.Do(func() {
									if err := a.apply(ctx, changes...); err != nil {
										t.Errorf("apply: %v", err)
									}
								})
							}
							return c.Do(ctx, cmd)
						},
					})
				}
				run := startHeld(t, ctx, onlineRebuilder(t, runner, k, rebuild.Options{}), d.Client, k.DB)
				if where == "catch-up" {
					if err := a.apply(ctx, changes...); err != nil {
						t.Fatal(err)
					}
				}
				_, err := run.wait()
				wantRunErr(t, err, where, rebuild.ErrFallingBehind, "reached its bound")
				full := rec.matching("log of the run in progress is full", fmt.Sprintf("max_changes=%d", bound))
				if want := 3 * (len(changes) - bound); len(full) != want {
					t.Errorf("Apply logged %d warnings of a full log, want %d (3 logs × %d changes past the bound)", len(full), want, len(changes)-bound)
				}
				wantOnline(t, d.Other, k)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

func TestApplyCatchUpTimeout(t *testing.T) {
	// C66: a run whose catch-up cannot get within PublishTail of the logs
	// before CatchUpTimeout fails with ErrFallingBehind: CatchUpChunk +
	// PublishTail + 400 changes, each logged in the three logs, were applied
	// while its source was held, and the catch-up replays CatchUpChunk
	// entries per log per round trip at most; a hook makes
	// that round trip last at least 5 ms, and the timeout is 1 ms. Nothing
	// is published, nothing of the run is left, and the live indexes hold
	// every change.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := onlineNames(d.Prefix)
		onlineSeed(t, d, k, 500, 22)
		var rounds atomic.Int64
		slow := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				if redistest.IsCatchUpRead(multi) {
					rounds.Add(1)
					time.Sleep(5 * time.Millisecond) // the slow catch-up the test is about, not a wait for another goroutine
				}
				return c.DoMulti(ctx, multi...)
			},
		})
		a := applier{c: d.Other, r: onlineRebuilder(t, d.Other, k, rebuild.Options{}), db: k.DB}
		run := startHeld(t, ctx, onlineRebuilder(t, slow, k, rebuild.Options{CatchUpTimeout: time.Millisecond}), d.Client, k.DB)
		if err := a.applyAll(ctx, inserts(0, rebuild.CatchUpChunk+rebuild.PublishTail+400)); err != nil {
			t.Fatal(err)
		}
		stats, err := run.wait()
		wantRunErr(t, err, "catch-up", rebuild.ErrFallingBehind, "Options.CatchUpTimeout")
		if n := rounds.Load(); n != 1 {
			t.Errorf("catch-up round trips: %d, want 1 (the deadline passed during the first)", n)
		}
		if stats.Changes != 0 {
			t.Errorf("Stats.Changes = %d, want 0: nothing published", stats.Changes)
		}
		wantOnline(t, d.Other, k)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// sumLogs returns the entries of every log of k's locks.
func sumLogs(ctx context.Context, c rueidis.Client, k onlineKeys, cluster bool) (int64, error) {
	var n int64
	for _, live := range []string{k.Hash, k.Zset, k.Family} {
		m, err := c.Do(ctx, c.B().Llen().Key(keys.LogKey(keys.LockKey(live, cluster))).Build()).AsInt64()
		if err != nil {
			return 0, err
		}
		n += m
	}
	return n, nil
}

// publishCode returns the first element of a publish script's reply, or
// ok false for an error reply (a NOSCRIPT, after which rueidis sends EVAL).
func publishCode(res rueidis.RedisResult) (int64, bool) {
	arr, err := res.ToArray()
	if err != nil || len(arr) == 0 {
		return 0, false
	}
	code, err := arr[0].AsInt64()
	return code, err == nil
}

func TestApplyTailTooLong(t *testing.T) {
	// C66, C77: changes applied between the last catch-up and the publish,
	// more than PublishTail: the publish refuses before any write ({-7}), the
	// run catches up again and publishes. A hook on the publish script's
	// first send makes 1500 changes (inserts, deletes, updates of every
	// field) before letting it through. Stats.Changes counts every entry
	// logged, replayed by the catch-ups and the publish; 0 lost, 0 stale.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := onlineNames(d.Prefix)
		onlineSeed(t, d, k, 2000, 23)
		w, err := newOnlineWriter(ctx, d.Other, onlineRebuilder(t, d.Other, k, rebuild.Options{}), k.DB, 23)
		if err != nil {
			t.Fatal(err)
		}
		publish := redistest.ScriptNamed("publish")
		var mu sync.Mutex
		var codes []int64
		var logged int64 // entries in the logs when the last publish was sent
		var first sync.Once
		runner := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if !publish.Is(cmd.Commands()) {
					return c.Do(ctx, cmd)
				}
				first.Do(func() {
					for range 1500 {
						if err := w.Step(ctx); err != nil {
							t.Errorf("writer: %v", err)
							return
						}
					}
				})
				n, err := sumLogs(ctx, d.Other, k, d.Cluster)
				if err != nil {
					t.Errorf("LLEN: %v", err)
				}
				res := c.Do(ctx, cmd)
				if code, ok := publishCode(res); ok {
					mu.Lock()
					codes, logged = append(codes, code), n
					mu.Unlock()
				}
				return res
			},
		})
		run := startHeld(t, ctx, onlineRebuilder(t, runner, k, rebuild.Options{}), d.Client, k.DB)
		for range 100 { // some changes for the first catch-up too
			if err := w.Step(ctx); err != nil {
				t.Fatal(err)
			}
		}
		stats, err := run.wait()
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(codes, []int64{-7, 1}) {
			t.Errorf("publish replies: got codes %v, want [-7 1]: refused for its tail, then published", codes)
		}
		if stats.Changes != logged || stats.Changes < 1600 {
			t.Errorf("Stats.Changes = %d, want the %d entries logged (1600 changes, each logged once per index it writes)", stats.Changes, logged)
		}
		t.Logf("%d changes, %d log entries replayed, catch-up %v", w.Applied.Load(), stats.Changes, stats.CatchUp)
		wantOnline(t, d.Other, k)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestApplyEmptiesTempKey(t *testing.T) {
	// A change replayed by the catch-up moves the only member of a bucket
	// away, which leaves the bucket's temp key empty, and Redis deletes
	// it: the catch-up's EXISTS probes tell that from a loss. A later
	// change moves it back, replayed by a second catch-up round (the
	// temp key is re-created, without that being a loss either), or by the
	// publish's tail onto the live key; or none does, and the bucket is
	// published deleted. Either way the run publishes, without
	// ErrTempKeyLost, and the index equals the source of truth.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, back := range []string{"a later catch-up round", "the publish's tail", "none"} {
			t.Run(back, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				d := casePrefixed(d, strings.ReplaceAll(back, "'", ""))
				k := onlineNames(d.Prefix)
				redistest.Clean(t, d.Other, k.DB)
				seedDB(t, d.Other, k.DB, 300, 24)
				solo := user{ID: "solo", Email: "solo@example.com", Country: "solo", Score: 1}
				if err := d.Other.Do(ctx, d.Other.B().Hset().Key(k.DB).FieldValue().FieldValue(solo.ID, redistest.EncodeUser(solo)).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				if _, err := onlineRebuilder(t, d.Client, k, rebuild.Options{}).Run(ctx, onlineSource(d.Client, k.DB, nil, 0)); err != nil {
					t.Fatalf("first run: %v", err)
				}
				bucket := k.Family + ":solo"
				a := applier{c: d.Other, r: onlineRebuilder(t, d.Other, k, rebuild.Options{}), db: k.DB}
				away := with(solo, func(u *user) { u.Country = "c00" })
				moveBack := func() {
					if err := a.apply(ctx, index.Update(away, solo)); err != nil {
						t.Errorf("apply: %v", err)
					}
				}
				var catchingUp atomic.Bool
				var once sync.Once
				publish := redistest.ScriptNamed("publish")
				runner := rueidishook.WithHook(d.Client, redistest.Hook{
					OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
						read := redistest.IsCatchUpRead(multi)
						if read {
							catchingUp.Store(true)
						}
						write := catchingUp.Load() && !read && multi[0].Commands()[0] == "MULTI"
						res := c.DoMulti(ctx, multi...)
						if write && back == "a later catch-up round" {
							once.Do(moveBack) // after the first round's writes
						}
						return res
					},
					OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
						if back == "the publish's tail" && publish.Is(cmd.Commands()) {
							once.Do(moveBack)
						}
						return c.Do(ctx, cmd)
					},
				})
				run := startHeld(t, ctx, onlineRebuilder(t, runner, k, rebuild.Options{}), d.Client, k.DB)
				if err := a.apply(ctx, index.Update(solo, away)); err != nil {
					t.Fatal(err)
				}
				if back == "a later catch-up round" {
					// More than PublishTail entries past the first round
					// (1000 per log), so that the catch-up goes round again.
					if err := a.applyAll(ctx, inserts(0, rebuild.CatchUpChunk+rebuild.PublishTail+400)); err != nil {
						t.Fatal(err)
					}
				}
				stats, err := run.wait()
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				if back == "none" {
					if got := stats.Outcomes[bucket]; got != rebuild.Emptied {
						t.Errorf("Stats.Outcomes[%s] = %v, want %v", bucket, got, rebuild.Emptied)
					}
					redistest.WantAbsent(t, d.Other, bucket)
				} else {
					if got := redistest.SMembers(t, d.Other, bucket); !slices.Equal(got, []string{"solo"}) {
						t.Errorf("%s: got %q, want [solo]", bucket, got)
					}
				}
				t.Logf("Stats.Changes %d, outcome of %s: %v", stats.Changes, bucket, stats.Outcomes[bucket])
				wantOnline(t, d.Other, k)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

func TestApplyPublishRefusedDiscards(t *testing.T) {
	// A publish whose script refuses its tail before any write (an entry
	// that is not a change, {-9}; a change to a key of another type, {-8})
	// fails the run, publishes nothing, and, like every refusal, deletes the
	// temp keys: before it did, these two left them behind until their TTL
	// (twice the lease), although the run had failed. A hook on the publish
	// script's first send makes the refusal happen.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, tt := range []struct {
			name  string
			setup func(t *testing.T, ctx context.Context, k onlineKeys, a applier)
			says  string
		}{
			{"an entry that is not a change", func(t *testing.T, ctx context.Context, k onlineKeys, a applier) {
				// Counted as Apply counts it, so that the entry itself is
				// what the publish refuses.
				lock := keys.LockKey(k.Hash, d.Cluster)
				redistest.Cmd(t, d.Other, "RPUSH", keys.LogKey(lock), "garbage")
				redistest.Cmd(t, d.Other, "HINCRBY", keys.RecordKey(lock), "logged", "1")
			}, "is not a change keyswap logged"},
			{"a key of another type", func(t *testing.T, ctx context.Context, k onlineKeys, a applier) {
				// A change creates a bucket the run does not know (not in
				// its source, created after its scan of the family), which
				// another client then replaces with a string.
				u := user{ID: "n0000000", Email: "new@example.com", Country: "zz-new", Score: 1}
				if err := a.apply(ctx, index.Insert(u)); err != nil {
					t.Error(err)
				}
				bucket := k.Family + ":" + u.Country
				redistest.Cmd(t, d.Other, "DEL", bucket)
				redistest.Cmd(t, d.Other, "SET", bucket, "x")
			}, "holds a string"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				d := casePrefixed(d, tt.name)
				k := onlineNames(d.Prefix)
				onlineSeed(t, d, k, 100, 25)
				a := applier{c: d.Other, r: onlineRebuilder(t, d.Other, k, rebuild.Options{}), db: k.DB}
				publish := redistest.ScriptNamed("publish")
				var once sync.Once
				runner := rueidishook.WithHook(d.Client, redistest.Hook{
					OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
						if publish.Is(cmd.Commands()) {
							once.Do(func() { tt.setup(t, ctx, k, a) })
						}
						return c.Do(ctx, cmd)
					},
				})
				before := generationsOf(t, d, k)
				_, err := onlineRebuilder(t, runner, k, rebuild.Options{}).Run(ctx, onlineSource(d.Client, k.DB, nil, 0))
				var e *rebuild.Error
				if !errors.As(err, &e) || e.Op != "publish" || !strings.Contains(err.Error(), tt.says) {
					t.Fatalf("Run: got %v, want an *Error of op publish saying %q", err, tt.says)
				}
				if got := generationsOf(t, d, k); !slices.Equal(got, before) {
					t.Errorf("generations: got %v, want %v: nothing published", got, before)
				}
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

// generationsOf returns the generation of each index of k.
func generationsOf(t *testing.T, d deployment, k onlineKeys) []string {
	t.Helper()
	var out []string
	for _, live := range []string{k.Hash, k.Zset, k.Family} {
		out = append(out, redistest.HGetAll(t, d.Other, keys.MetaKey(live, d.Cluster))["gen"])
	}
	return out
}

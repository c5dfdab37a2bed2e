package reliability

// Online rebuilds (RELIABILITY.md, "Online rebuilds"): runs of an index
// that an application keeps changing through Rebuilder.Apply, while the
// run's connection is cut during its catch-up, while another process
// steals its lock during the catch-up, and while the changes race its
// publish. The source of truth is a hash in Redis, "<prefix>db" (field
// the user's id, value "email|score|country"); the application commits
// each change there first, then applies it, as the package documentation
// asks. After each case every index must equal what the source of truth
// holds, exactly: 0 lost changes, 0 stale entries; a failed run must have
// published nothing (every generation as it was) and left nothing.

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/run"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

const (
	onlineUsers     = 2000            // users in the source of truth
	onlineCountries = 12              // buckets: moves between them are frequent
	onlineTTL       = 5 * time.Second // lease of the faulted runs
	onlineHeld      = 300             // changes applied while a faulted run's source is held
)

// onlineKeys are the keys of one online case: the source of truth and
// the three indexes.
type onlineKeys struct {
	shape
	db string
}

func newOnlineKeys(prefix string) onlineKeys {
	return onlineKeys{shape: newShape(prefix), db: prefix + "db"}
}

// locks returns the lock key of each index.
func (k onlineKeys) locks(cluster bool) []string {
	return []string{keys.LockKey(k.email, cluster), keys.LockKey(k.score, cluster), keys.LockKey(k.country, cluster)}
}

// rebuilder returns a Rebuilder of k's indexes.
func (k onlineKeys) rebuilder(t testing.TB, c rueidis.Client, opts rebuild.Options) *rebuild.Rebuilder[fuser] {
	t.Helper()
	return redistest.Rebuilder(t, c, opts, k.builders()...)
}

func encodeFuser(u fuser) string {
	return u.Email + "|" + strconv.FormatFloat(u.Score, 'g', -1, 64) + "|" + u.Country
}

// readTruth returns the source of truth.
func readTruth(ctx context.Context, c rueidis.Client, db string) (map[string]fuser, error) {
	m, err := c.Do(ctx, c.B().Hgetall().Key(db).Build()).AsStrMap()
	if err != nil {
		return nil, err
	}
	out := make(map[string]fuser, len(m))
	for id, v := range m {
		f := strings.Split(v, "|")
		if len(f) != 3 {
			return nil, fmt.Errorf("user %s: %q is not email|score|country", id, v)
		}
		score, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return nil, fmt.Errorf("user %s: %w", id, err)
		}
		out[id] = fuser{ID: id, Email: f[0], Score: score, Country: f[2]}
	}
	return out, nil
}

// onlineUser returns user i of the application with tag w.
func onlineUser(w string, i int, rng *rand.Rand) fuser {
	return fuser{
		ID:      fmt.Sprintf("%s%06d", w, i),
		Email:   fmt.Sprintf("%s%06d.%d@example.com", w, i, rng.IntN(1_000_000)),
		Score:   float64(rng.IntN(1_000_000)),
		Country: fmt.Sprintf("c%02d", rng.IntN(onlineCountries)),
	}
}

// seedOnline replaces the source of truth of k with n users of each of
// tags, and publishes a first run of the indexes of it.
func seedOnline(t testing.TB, c rueidis.Client, k onlineKeys, n int, tags ...string) {
	t.Helper()
	ctx := redistest.Ctx(t)
	redistest.Cmd(t, c, "DEL", k.db)
	rng := rand.New(rand.NewPCG(uint64(n), 1))
	var cmds rueidis.Commands
	for _, w := range tags {
		for start := 0; start < n; start += 500 {
			fv := c.B().Hset().Key(k.db).FieldValue()
			for i := start; i < min(n, start+500); i++ {
				u := onlineUser(w, i, rng)
				fv = fv.FieldValue(u.ID, encodeFuser(u))
			}
			cmds = append(cmds, fv.Build())
		}
	}
	for _, res := range c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := k.rebuilder(t, c, rebuild.Options{}).Run(ctx, truthSource(c, k.db, nil)); err != nil {
		t.Fatalf("first run: %v", err)
	}
}

// truthSource reads the source of truth when the run starts it, after the
// run took its locks: a snapshot of it as of the run's start. It then
// waits for hold, if not nil, to be closed, and yields the snapshot in id
// order.
func truthSource(c rueidis.Client, db string, hold *heldSource) rebuild.Source[fuser] {
	return func(ctx context.Context) iter.Seq2[fuser, error] {
		return func(yield func(fuser, error) bool) {
			m, err := readTruth(ctx, c, db)
			if err != nil {
				yield(fuser{}, err)
				return
			}
			if hold != nil {
				close(hold.read)
				select {
				case <-hold.release:
				case <-ctx.Done():
					return
				}
			}
			for _, id := range slices.Sorted(maps.Keys(m)) {
				if !yield(m[id], nil) {
					return
				}
			}
		}
	}
}

// heldSource holds a truthSource back after its snapshot: read is closed
// once the snapshot is read, and the source yields once release is closed.
type heldSource struct{ read, release chan struct{} }

func newHeldSource() *heldSource {
	return &heldSource{read: make(chan struct{}), release: make(chan struct{})}
}

// onlineApp is the application: it changes its own users (those whose id
// starts with its tag) in the source of truth, then applies each change
// through its Rebuilder. It is the only writer of its users, so it keeps a
// copy of them.
type onlineApp struct {
	c     rueidis.Client
	r     *rebuild.Rebuilder[fuser]
	db    string
	tag   string
	rng   *rand.Rand
	users map[string]fuser
	ids   []string
	next  int
	// pending are the changes committed, not applied yet: refused while a
	// lock was held by a run that would not replay them.
	pending []rebuild.Change[fuser]

	applied atomic.Int64
}

func newOnlineApp(ctx context.Context, c rueidis.Client, r *rebuild.Rebuilder[fuser], db, tag string, seed uint64) (*onlineApp, error) {
	all, err := readTruth(ctx, c, db)
	if err != nil {
		return nil, err
	}
	a := &onlineApp{c: c, r: r, db: db, tag: tag, rng: rand.New(rand.NewPCG(seed, 2)), users: map[string]fuser{}}
	for id, u := range all {
		if n, err := strconv.Atoi(strings.TrimPrefix(id, tag)); err == nil && strings.HasPrefix(id, tag) {
			a.users[id] = u
			a.next = max(a.next, n+1)
		}
	}
	a.ids = slices.Sorted(maps.Keys(a.users))
	return a, nil
}

// step makes one change: an insert, a delete, or an update of the email,
// the score, the country, or several of them.
func (a *onlineApp) step(ctx context.Context) error {
	var change rebuild.Change[fuser]
	var commit rueidis.Completed
	switch roll := a.rng.IntN(100); {
	case roll < 10 || len(a.ids) == 0:
		u := onlineUser(a.tag, a.next, a.rng)
		a.next++
		a.users[u.ID] = u
		a.ids = append(a.ids, u.ID)
		change, commit = rebuild.Insert(u), a.c.B().Hset().Key(a.db).FieldValue().FieldValue(u.ID, encodeFuser(u)).Build()
	case roll < 20:
		i := a.rng.IntN(len(a.ids))
		u := a.users[a.ids[i]]
		delete(a.users, u.ID)
		a.ids[i] = a.ids[len(a.ids)-1]
		a.ids = a.ids[:len(a.ids)-1]
		change, commit = rebuild.Delete(u), a.c.B().Hdel().Key(a.db).Field(u.ID).Build()
	default:
		old := a.users[a.ids[a.rng.IntN(len(a.ids))]]
		u := old
		what := a.rng.IntN(7) + 1 // a non-empty subset of email, score, country
		if what&1 != 0 {
			u.Email = fmt.Sprintf("%s.%d@example.com", u.ID, a.rng.IntN(1_000_000))
		}
		if what&2 != 0 {
			u.Score = float64(a.rng.IntN(1_000_000))
		}
		if what&4 != 0 {
			u.Country = fmt.Sprintf("c%02d", a.rng.IntN(onlineCountries))
		}
		a.users[u.ID] = u
		change, commit = rebuild.Update(old, u), a.c.B().Hset().Key(a.db).FieldValue().FieldValue(u.ID, encodeFuser(u)).Build()
	}
	// Commit to the source of truth first, then apply.
	if err := a.c.Do(ctx, commit).Error(); err != nil {
		return err
	}
	a.pending = append(a.pending, change)
	return a.flush(ctx)
}

// flush applies the changes committed and not applied yet, in order. A
// change Apply refuses with ErrInProgress (a lock held by a run that would
// not replay it, such as a thief's) waits, with the changes after it, to
// be applied again later, as the package documentation asks.
func (a *onlineApp) flush(ctx context.Context) error {
	for len(a.pending) > 0 {
		err := a.r.Apply(ctx, a.pending[0])
		if errors.Is(err, rebuild.ErrInProgress) {
			return nil
		}
		if err != nil {
			return err
		}
		a.pending = a.pending[1:]
		a.applied.Add(1)
	}
	return nil
}

// settle applies the changes that wait, until none is left or wait has
// passed.
func (a *onlineApp) settle(ctx context.Context, wait time.Duration) error {
	return pollFor(wait, func() error {
		if err := a.flush(ctx); err != nil {
			return err
		}
		if len(a.pending) > 0 {
			return fmt.Errorf("%d changes still refused: %w", len(a.pending), rebuild.ErrInProgress)
		}
		return nil
	})
}

// steps makes n changes.
func (a *onlineApp) steps(ctx context.Context, n int) error {
	for range n {
		if err := a.step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// runUntil makes changes as fast as it can until stop is closed.
func (a *onlineApp) runUntil(ctx context.Context, stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		if err := a.step(ctx); err != nil {
			return err
		}
	}
}

// onlineDiff compares the three indexes of k with the source of truth and
// returns the entries lost (missing, or with another value) and the stale
// ones (that should be gone), described, and the number of users.
func onlineDiff(t testing.TB, c rueidis.Client, k onlineKeys) (lost, stale []string, users int) {
	t.Helper()
	truth, err := readTruth(redistest.Ctx(t), c, k.db)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, u := range truth {
		want["hash "+u.Email] = u.ID
		want["zset "+u.ID] = strconv.FormatFloat(u.Score, 'g', -1, 64)
		want["bucket "+k.country+":"+u.Country+" "+u.ID] = ""
	}
	got := map[string]string{}
	for f, v := range redistest.HGetAll(t, c, k.email) {
		got["hash "+f] = v
	}
	for m, s := range redistest.ZScores(t, c, k.score) {
		got["zset "+m] = strconv.FormatFloat(s, 'g', -1, 64)
	}
	for _, b := range redistest.LiveKeys(t, c, k.country+":") {
		for _, m := range redistest.SMembers(t, c, b) {
			got["bucket "+b+" "+m] = ""
		}
		if pttl := redistest.PTTL(t, c, b); pttl != -1 {
			stale = append(stale, fmt.Sprintf("%s has PTTL %v", b, pttl))
		}
	}
	for _, key := range []string{k.email, k.score} {
		if pttl := redistest.PTTL(t, c, key); pttl != -1 {
			stale = append(stale, fmt.Sprintf("%s has PTTL %v", key, pttl))
		}
	}
	for e, v := range want {
		if g, ok := got[e]; !ok || g != v {
			lost = append(lost, fmt.Sprintf("%s: got %q, want %q", e, g, v))
		}
	}
	for e, g := range got {
		if _, ok := want[e]; !ok {
			stale = append(stale, fmt.Sprintf("%s = %q", e, g))
		}
	}
	slices.Sort(lost)
	slices.Sort(stale)
	return lost, stale, len(truth)
}

// wantOnline fails t unless the indexes of k equal the source of truth,
// and returns the counts for the case's report line.
func wantOnline(t testing.TB, c rueidis.Client, k onlineKeys) (lost, stale int) {
	t.Helper()
	l, s, _ := onlineDiff(t, c, k)
	for i, d := range append(l, s...) {
		if i == 10 {
			t.Errorf("... and %d more", len(l)+len(s)-10)
			break
		}
		t.Error(d)
	}
	return len(l), len(s)
}

// generations returns the generation of each index of k, as its meta key
// holds it.
func generations(t testing.TB, c rueidis.Client, k onlineKeys, cluster bool) []string {
	t.Helper()
	var out []string
	for _, live := range []string{k.email, k.score, k.country} {
		out = append(out, redistest.HGetAll(t, c, keys.MetaKey(live, cluster))["gen"])
	}
	return out
}

// isCatchUpRead reports whether multi is a catch-up's read of its logs: a
// readlog script (the length and the counts) and an LRANGE of the entries
// of each.
func isCatchUpRead(multi []rueidis.Completed) bool {
	if len(multi) == 0 {
		return false
	}
	// Sent as EVAL (run.ReadLogCommands); its text, not its SHA1, which
	// FIPS 140-only mode does not allow.
	args := multi[0].Commands()
	return len(args) > 1 && args[0] == "EVAL" && args[1] == run.Source("readlog")
}

// catchUpFault is a hook on a run's client that acts once, when the run's
// catch-up reaches its point: before its first read of the logs, or before
// its first write of replayed changes. fault runs with every other command
// of the client held back (a heartbeat sent alone waits), with the
// intercepted commands; they are sent once it returns.
type catchUpFault struct {
	write bool // the first write of the catch-up, not its first read
	fault func(multi []rueidis.Completed)

	mu         sync.RWMutex
	catchingUp atomic.Bool
	fired      atomic.Bool
	err        error // the intercepted commands' first error
}

func (f *catchUpFault) wrap(c rueidis.Client) rueidis.Client {
	return rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			f.mu.RLock()
			defer f.mu.RUnlock()
			return c.Do(ctx, cmd)
		},
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			read := isCatchUpRead(multi)
			if read {
				f.catchingUp.Store(true)
			}
			at := f.catchingUp.Load() && (!f.write && read || f.write && !read && multi[0].Commands()[0] == "MULTI")
			if !at || !f.fired.CompareAndSwap(false, true) {
				f.mu.RLock()
				defer f.mu.RUnlock()
				return c.DoMulti(ctx, multi...)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			f.fault(multi)
			res := c.DoMulti(ctx, multi...)
			for _, r := range res {
				if err := r.Error(); err != nil {
					f.err = err
					break
				}
			}
			return res
		},
	})
}

// onlineFaultDeployments returns where the fault cases run: a private
// server behind a proxy, and the package's cluster behind a Dialer.
func onlineFaultDeployments(t *testing.T) map[string]func(t *testing.T) *deployment {
	return map[string]func(t *testing.T) *deployment{
		"standalone": func(t *testing.T) *deployment { return standalone(t) },
		"cluster":    func(t *testing.T) *deployment { return onCluster(t, env.Cluster, true) },
	}
}

// onlineFaultCase runs one faulted online run on the deployment d: a first
// run publishes the indexes of 2000 users; then a run whose client goes
// through d's proxy and hook f starts, its source is held while the
// application applies onlineHeld changes, and is let go while the
// application goes on applying changes until the run returns. It returns
// the case's keys, a client straight to its server(s), the generations
// before the run, and the run's error, once every connection of the run
// is closed.
func onlineFaultCase(t *testing.T, d *deployment, f *catchUpFault) (k onlineKeys, admin rueidis.Client, gens []string, app *onlineApp, err error) {
	t.Helper()
	ctx := redistest.Ctx(t)
	admin = d.observe(t)
	cluster := d.name == "cluster"
	k = newOnlineKeys(d.prefix)
	seedOnline(t, admin, k, onlineUsers, "a")
	gens = generations(t, admin, k, cluster)
	app, err = newOnlineApp(ctx, admin, k.rebuilder(t, admin, rebuild.Options{}), k.db, "a", 1)
	if err != nil {
		t.Fatal(err)
	}
	runner := k.rebuilder(t, f.wrap(d.client), rebuild.Options{TTL: onlineTTL, PreserveFor: faultPreserveFor})
	hold := newHeldSource()
	var stats rebuild.Stats
	done := make(chan struct{})
	go func() {
		defer close(done)
		stats, err = runner.Run(ctx, truthSource(d.client, k.db, hold))
	}()
	select {
	case <-hold.read:
	case <-done:
		t.Fatalf("Run ended before its source started: %v", err)
	}
	if err := app.steps(ctx, onlineHeld); err != nil {
		t.Fatal(err)
	}
	close(hold.release)
	stop := make(chan struct{})
	var appErr error
	var wg sync.WaitGroup
	wg.Go(func() { appErr = app.runUntil(ctx, stop) })
	<-done
	close(stop)
	wg.Wait()
	if appErr != nil {
		t.Fatalf("application: %v", appErr)
	}
	if !f.fired.Load() {
		t.Fatalf("the catch-up never reached the fault's point; Run: %v", err)
	}
	// Every connection of the run closed, so that the server has run all it
	// received before the keys are read.
	d.client.Close()
	if err := poll(d.allClosed); err != nil {
		t.Fatal(err)
	}
	t.Logf("Run: %v; %d changes applied, Stats.Changes %d", err, app.applied.Load(), stats.Changes)
	return k, admin, gens, app, err
}

// TestOnlineCatchUpCut cuts the run's connection during its catch-up:
// when its first read of the logs goes out (the proxy cuts before the
// LRANGE reaches the server), or when its first write of replayed changes
// does (after half of the DoMulti's bytes: a transaction whose EXEC never
// arrives).
//
// What happens next is rueidis's: it sends the read, a readlog script and an LRANGE per
// log, again on a fresh connection (it only reads, and is sent as
// retryable), and the run goes on; on a
// cluster it also sends a transaction again whose commands include a
// read-only one (the catch-up's EXISTS probes), and the run goes on too.
// Otherwise the write fails, and so does the run. A run that went on may
// still fail at its publish, sent on a connection the cut broke (rueidis
// sends a command on any of its connections to a server, and the publish
// is never retried): the publish is settled as not run, and its temp keys
// are kept for PreserveFor, as after any failed publish script.
//
// Whichever way: a run that returns nil published (every generation
// advanced) and one that fails published nothing, with the network's
// error; nothing is left but those preserved temp keys, with their TTL;
// and the live indexes hold every change applied before, during and after
// the run.
func TestOnlineCatchUpCut(t *testing.T) {
	t.Parallel()
	for name, deploy := range onlineFaultDeployments(t) {
		for _, write := range []bool{false, true} {
			point := map[bool]string{false: "first log read", true: "first replayed write"}[write]
			t.Run(name+"/"+point, func(t *testing.T) {
				t.Parallel()
				d := deploy(t)
				f := &catchUpFault{write: write}
				var accepted int64 // the proxy's connections when it cut
				f.fault = func(multi []rueidis.Completed) {
					n := int64(0)
					if write {
						n = respSize(multi) / 2
					}
					accepted = d.proxy.Stats().Accepted
					d.proxy.CutAfter(faultproxy.ToServer, n)
				}
				k, admin, gens, app, err := onlineFaultCase(t, d, f)
				if err := app.settle(redistest.Ctx(t), faultWait); err != nil {
					t.Fatal(err)
				}
				cluster := d.name == "cluster"
				retried := f.err == nil
				if retried && d.proxy.Stats().Accepted == accepted {
					t.Fatalf("the cut commands succeeded without a new connection: the cut missed them")
				}
				published := !slices.Equal(generations(t, admin, k, cluster), gens)
				switch {
				case retried && write && !cluster:
					t.Errorf("the cut write succeeded: %v; want it to fail (it has commands rueidis does not retry)", err)
				case !retried && (!write || !isNetwork(f.err)):
					t.Errorf("the cut commands failed with %v; want the read retried, the write failed by the cut", f.err)
				case published != (err == nil):
					t.Errorf("Run: %v, but published %v", err, published)
				case err != nil && !isNetwork(err):
					t.Errorf("Run: got %v, want the cut's network error", err)
				case !retried && errOp(err) != "write":
					t.Errorf("Run: got %v, want an *Error of op write: the catch-up's", err)
				}
				lost, stale := wantOnline(t, admin, k)
				var left []string
				preserved := 0
				for _, l := range leftovers(t, admin, d.prefix) {
					_, _, temp := keys.ParseTempKey(l.key)
					if temp && errOp(err) == "publish" && l.pttl > 0 && l.pttl <= faultPreserveFor {
						preserved++
						continue
					}
					left = append(left, fmt.Sprintf("%s (PTTL %v)", l.key, l.pttl))
				}
				if len(left) > 0 {
					t.Errorf("left behind: %q", left)
				}
				t.Logf("online fault: cut at %s, %s: retried %v, published %v, error %q, lost %d, stale %d, preserved %d, left %d",
					point, name, retried, published, errOp(err), lost, stale, preserved, len(left))
			})
		}
	}
}

// TestOnlineCatchUpLockStolen: another process takes the run's first lock
// over as the run's catch-up first reads its logs (it deletes the lock and
// sets its own token). The run fails with ErrLockLost and publishes
// nothing; the thief's lock stays, and so does the log next to it, which
// the run's release leaves to the lock's holder: it expires within the
// run's lease. Nothing else is left, and the live indexes hold every
// change.
func TestOnlineCatchUpLockStolen(t *testing.T) {
	t.Parallel()
	for name, deploy := range onlineFaultDeployments(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := deploy(t)
			cluster := d.name == "cluster"
			thief := d.observe(t)
			lock := newOnlineKeys(d.prefix).locks(cluster)[0]
			const thiefTok = "thief"
			f := &catchUpFault{fault: func([]rueidis.Completed) {
				ctx := redistest.Ctx(t)
				for _, cmd := range []rueidis.Completed{
					thief.B().Del().Key(lock).Build(),
					thief.B().Set().Key(lock).Value(thiefTok).ExSeconds(60).Build(),
				} {
					if err := thief.Do(ctx, cmd).Error(); err != nil {
						t.Errorf("steal %s: %v", lock, err)
					}
				}
			}}
			k, admin, gens, app, err := onlineFaultCase(t, d, f)
			redistest.WantErr(t, err, rebuild.ErrLockLost)
			if got := generations(t, admin, k, cluster); !slices.Equal(got, gens) {
				t.Errorf("generations: got %v, want %v: nothing published", got, gens)
			}
			redistest.WantLock(t, admin, lock, thiefTok, 60*time.Second)
			log := keys.LogKey(lock)
			var left []string
			for _, l := range leftovers(t, admin, d.prefix) {
				switch {
				case l.key == lock:
				case l.key == log && l.pttl > 0 && l.pttl <= onlineTTL:
				default:
					left = append(left, fmt.Sprintf("%s (PTTL %v)", l.key, l.pttl))
				}
			}
			if len(left) > 0 {
				t.Errorf("left behind: %q; want only the thief's lock, and the log beside it with a TTL of at most %v", left, onlineTTL)
			}
			// The thief is done. The changes Apply refused while the
			// thief's lock (which keeps no record: no run of this keyswap
			// replays them) was held are applied now (C75), and the
			// indexes hold every change. Once the log has expired, nothing
			// is left.
			redistest.Cmd(t, admin, "DEL", lock)
			refused := len(app.pending)
			if err := app.settle(redistest.Ctx(t), faultWait); err != nil {
				t.Fatal(err)
			}
			lost, stale := wantOnline(t, admin, k)
			t.Logf("%d changes refused while the thief held the lock, applied once it was gone", refused)
			if err := pollFor(onlineTTL+faultWait, func() error {
				if l := redistest.Leftovers(t, admin, d.prefix); len(l) > 0 {
					return fmt.Errorf("left behind: %q", l)
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
			t.Logf("online fault: lock stolen, %s: published false, error %q (ErrLockLost %v), lost %d, stale %d, left %d besides the thief's lock and the log beside it", name, errOp(err), errors.Is(err, rebuild.ErrLockLost), lost, stale, len(left))
		})
	}
}

// onlineRaceRuns is how many runs one trial of TestOnlineChangesRacePublish
// makes while the applications change the index.
const onlineRaceRuns = 25

// TestOnlineChangesRacePublish: two applications (each with its own users
// and its own Rebuilder and client) apply changes as fast as they can
// while 25 runs rebuild the indexes back to back, so that changes land in
// the catch-up, in the publish's tail, between a publish and its release,
// and between runs. Every run publishes; once the applications stop, the
// indexes equal the source of truth: 0 lost changes, 0 stale entries, and
// nothing left.
func TestOnlineChangesRacePublish(t *testing.T) {
	t.Parallel()
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		clean := func() {
			for _, key := range redistest.Keys(t, d.Other, d.Prefix) {
				redistest.Cmd(t, d.Other, "DEL", key)
			}
		}
		clean() // what an earlier run of the test (-count) left
		t.Cleanup(clean)
		k := newOnlineKeys(d.Prefix)
		seedOnline(t, d.Other, k, onlineUsers, "a", "b")
		var apps []*onlineApp
		for i, tag := range []string{"a", "b"} {
			c := d.Other
			if i == 1 {
				c = d.Client
			}
			app, err := newOnlineApp(ctx, c, k.rebuilder(t, c, rebuild.Options{}), k.db, tag, uint64(i+1))
			if err != nil {
				t.Fatal(err)
			}
			apps = append(apps, app)
		}
		stop := make(chan struct{})
		errs := make([]error, len(apps))
		var wg sync.WaitGroup
		for i, app := range apps {
			wg.Go(func() { errs[i] = app.runUntil(ctx, stop) })
		}
		// What each publish replayed itself (the last element of its
		// reply), and how often it found its tail too long ({-7}).
		publish := redistest.ScriptNamed("publish")
		var tails, behind atomic.Int64
		runner := k.rebuilder(t, rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if !publish.Is(cmd.Commands()) {
					return c.Do(ctx, cmd)
				}
				res := c.Do(ctx, cmd)
				if arr, err := res.ToArray(); err == nil && len(arr) > 1 {
					switch code, _ := arr[0].AsInt64(); code {
					case 1:
						n, _ := arr[len(arr)-1].AsInt64()
						tails.Add(n)
					case -7:
						behind.Add(1)
					}
				}
				return res
			},
		}), rebuild.Options{})
		var published int
		var replayed int64
		applied := func() (n int64) {
			for _, a := range apps {
				n += a.applied.Load()
			}
			return n
		}
		before := applied()
		for i := range onlineRaceRuns {
			stats, err := runner.Run(ctx, truthSource(d.Client, k.db, nil))
			if err != nil {
				t.Errorf("run %d: %v", i+1, err)
				continue
			}
			published++
			replayed += stats.Changes
		}
		during := applied() - before
		close(stop)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("application: %v", err)
			}
		}
		lost, stale := wantOnline(t, d.Other, k)
		left := redistest.Leftovers(t, d.Other, d.Prefix)
		if len(left) > 0 {
			t.Errorf("left behind: %q", left)
		}
		t.Logf("online race, %s: %d runs, %d published, %d changes applied (%d during the runs), %d log entries replayed (%d by the publishes' tails), %d publishes refused for their tail, lost %d, stale %d, left %d",
			d.Name, onlineRaceRuns, published, applied(), during, replayed, tails.Load(), behind.Load(), lost, stale, len(left))
	})
}

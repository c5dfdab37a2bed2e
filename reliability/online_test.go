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
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"

	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
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

// indexes returns k as the online model of redistest names it.
func (k onlineKeys) indexes() redistest.OnlineIndexes {
	return redistest.OnlineIndexes{DB: k.db, Hash: k.email, Zset: k.score, Family: k.country}
}

// seedOnline replaces the source of truth of k with n users of each of
// tags, and publishes a first run of the indexes of it.
func seedOnline(t testing.TB, c rueidis.Client, k onlineKeys, n int, tags ...string) {
	t.Helper()
	redistest.Cmd(t, c, "DEL", k.db)
	redistest.SeedTruth(t, c, k.db, n, onlineCountries, 500, uint64(n), tags...)
	if _, err := k.rebuilder(t, c, rebuild.Options{}).Run(redistest.Ctx(t), truthSource(c, k.db, nil)); err != nil {
		t.Fatalf("first run: %v", err)
	}
}

// truthSource is the source of truth's snapshot as of the run's start
// (redistest.TruthSource), which then waits for hold, if not nil, to be
// released.
func truthSource(c rueidis.Client, db string, hold *heldSource) sources.Source[fuser] {
	if hold == nil {
		return redistest.TruthSource(c, db, nil, nil)
	}
	return redistest.TruthSource(c, db, hold.wait, nil)
}

// heldSource holds a truthSource back after its snapshot: read is closed
// once the snapshot is read, and the source yields once release is closed.
type heldSource struct{ read, release chan struct{} }

func newHeldSource() *heldSource {
	return &heldSource{read: make(chan struct{}), release: make(chan struct{})}
}

// wait closes read and waits for release, or the end of ctx (false).
func (h *heldSource) wait(ctx context.Context) bool {
	close(h.read)
	select {
	case <-h.release:
		return true
	case <-ctx.Done():
		return false
	}
}

// newOnlineApp returns the application of tag's users (redistest.App):
// a change Apply refuses with ErrInProgress waits to be applied again.
func newOnlineApp(ctx context.Context, c rueidis.Client, r *rebuild.Rebuilder[fuser], db, tag string, seed uint64) (*redistest.App, error) {
	a, err := redistest.NewApp(ctx, c, r, db, tag, onlineCountries, seed)
	if a != nil {
		a.Patient = true
	}
	return a, err
}

// settle applies the changes of a that wait, until none is left or wait
// has passed.
func settle(ctx context.Context, a *redistest.App, wait time.Duration) error {
	return pollFor(wait, func() error {
		if err := a.Flush(ctx); err != nil {
			return err
		}
		if len(a.Pending) > 0 {
			return fmt.Errorf("%d changes still refused: %w", len(a.Pending), rebuild.ErrInProgress)
		}
		return nil
	})
}

// wantOnline fails t unless the indexes of k equal the source of truth,
// and returns the counts for the case's report line.
func wantOnline(t testing.TB, c rueidis.Client, k onlineKeys) (lost, stale int) {
	t.Helper()
	return redistest.WantOnline(t, c, k.indexes())
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
			read := redistest.IsCatchUpRead(multi)
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
func onlineFaultCase(t *testing.T, d *deployment, f *catchUpFault) (k onlineKeys, admin rueidis.Client, gens []string, app *redistest.App, err error) {
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
	if err := app.Steps(ctx, onlineHeld); err != nil {
		t.Fatal(err)
	}
	close(hold.release)
	stop := make(chan struct{})
	var appErr error
	var wg sync.WaitGroup
	wg.Go(func() { appErr = app.RunUntil(ctx, stop, nil) })
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
	t.Logf("Run: %v; %d changes applied, Stats.Changes %d", err, app.Applied.Load(), stats.Changes)
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
				if err := settle(redistest.Ctx(t), app, faultWait); err != nil {
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
			refused := len(app.Pending)
			if err := settle(redistest.Ctx(t), app, faultWait); err != nil {
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
		var apps []*redistest.App
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
			wg.Go(func() { errs[i] = app.RunUntil(ctx, stop, nil) })
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
				n += a.Applied.Load()
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

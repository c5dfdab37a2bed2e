package rebuild_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"iter"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// hangDeadline bounds a command that must not wait behind a stalled
// connection: far longer than any wait a loaded machine causes, far
// shorter than the stall.
const hangDeadline = 15 * time.Second

// connDialer dials every connection of a client through a faultproxy.Proxy
// of its own, so that a test can stall or cut one connection alone.
type connDialer struct {
	mu      sync.Mutex
	proxies []*faultproxy.Proxy
}

func (d *connDialer) dial(ctx context.Context, dst string, nd *net.Dialer, _ *tls.Config) (net.Conn, error) {
	p, err := faultproxy.New(dst)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.proxies = append(d.proxies, p)
	d.mu.Unlock()
	return nd.DialContext(ctx, "tcp", p.Addr())
}

func (d *connDialer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.proxies {
		_ = p.Close()
	}
}

// busiest returns the proxy of the connection that carried the most bytes
// to the server: the one the run's batches went on.
func (d *connDialer) busiest() *faultproxy.Proxy {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.MaxFunc(d.proxies, func(a, b *faultproxy.Proxy) int {
		return int(a.Stats().ToServer - b.Stats().ToServer)
	})
}

func (d *connDialer) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.proxies)
}

// writeCounts counts the run's transactions (the DoMultis that start with
// MULTI) by the connection they went on: a dedicated one of their own, or
// the client's shared ones. served counts those of own that no server
// redirected (MOVED, ASK).
type writeCounts struct{ own, shared, served atomic.Int64 }

// recordWrites wraps c so that w counts the transactions sent through it.
func recordWrites(c rueidis.Client) (rueidis.Client, *writeCounts) {
	w := &writeCounts{}
	return rueidishook.WithHook(c, redistest.Hook{OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
		if len(multi) == 0 || multi[0].Commands()[0] != "MULTI" {
			return c.DoMulti(ctx, multi...)
		}
		// rueidishook hands a dedicated connection's calls over as a
		// client that also has the methods of a DedicatedClient.
		if _, own := c.(interface {
			SetPubSubHooks(rueidis.PubSubHooks) <-chan error
		}); !own {
			w.shared.Add(1)
			return c.DoMulti(ctx, multi...)
		}
		w.own.Add(1)
		res := c.DoMulti(ctx, multi...)
		if !slices.ContainsFunc(res, redirected) {
			w.served.Add(1)
		}
		return res
	}}), w
}

// redirected reports whether r is a cluster's redirection, MOVED or ASK.
func redirected(r rueidis.RedisResult) bool {
	e, ok := rueidis.IsRedisErr(r.Error())
	if !ok {
		return false
	}
	_, moved := e.IsMoved()
	_, ask := e.IsAsk()
	return moved || ask
}

// isolationClient returns a client of d (a server or a cluster) whose every
// connection goes through a proxy of its own, wrapped to count the run's
// transactions, with its blocking pool of size pool (0: the default); tune,
// if given, changes its options further.
func isolationClient(t *testing.T, addrs []string, cluster bool, pool int, tune ...func(*rueidis.ClientOption)) (rueidis.Client, *connDialer, *writeCounts) {
	t.Helper()
	d := &connDialer{}
	t.Cleanup(d.close)
	// rueidis closes a connection whose replies are late by
	// ConnWriteTimeout (10 s by default), and sends a GET again on a new
	// one: long enough here that a command behind a stalled connection
	// waits for it, rather than past it.
	opt := rueidis.ClientOption{InitAddress: addrs, ForceSingleClient: !cluster, DisableCache: true,
		BlockingPoolSize: pool, DialCtxFn: d.dial, ConnWriteTimeout: 2 * time.Minute}
	for _, f := range tune {
		f(&opt)
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(c.Close)
	hooked, w := recordWrites(c)
	return hooked, d, w
}

// onOwnDeployments runs f on a private standalone server and on a private
// 3-master cluster (the tests stall and cut their connections).
func onOwnDeployments(t *testing.T, f func(t *testing.T, addrs []string, cluster bool, admin rueidis.Client)) {
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		s := redistest.OwnServer(t)
		f(t, []string{s.Addr}, false, s.Client(t))
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.OwnCluster(t, 3)
		f(t, cl.Addrs, true, cl.Client(t))
	})
}

// TestWritesApartFromTheApplication (C81): while a run writes, the
// connection its transactions go on is stalled (its proxy holds every byte
// both ways). The application's GETs of another key of the same server,
// and its Apply of a change, on the very client the run was given, still
// return: nothing of the application waits behind the run's writes on the
// way to Redis. Every transaction of the run went on a dedicated connection.
// Once the stall ends the run publishes every item it pulled and the
// change, exactly, and leaves nothing behind.
//
// Before, the run's transactions went on the client's pipelined
// connections: a GET sent on the stalled one waited for the stall's end.
func TestWritesApartFromTheApplication(t *testing.T) {
	t.Parallel()
	onOwnDeployments(t, func(t *testing.T, addrs []string, cluster bool, admin rueidis.Client) {
		c, d, w := isolationClient(t, addrs, cluster, 0)
		key, other := "{iso}:by-email", "{iso}:other"
		redistest.Do(t, admin, admin.B().Set().Key(other).Value("v").Build())
		t.Cleanup(func() { redistest.Clean(t, admin, other) })
		app := redistest.Rebuilder(t, c, rebuild.Options{}, userHash(key))
		finish, yielded := endlessRun(t, c, key, rebuild.Options{BatchSize: 200})
		defer finish()
		waitFor(t, "some of the run's batches written", func() bool { return w.own.Load()+w.shared.Load() >= 5 })

		stalled := d.busiest()
		stalled.Pause()
		defer stalled.Resume()
		for i := range 20 {
			ctx, cancel := context.WithTimeout(t.Context(), hangDeadline)
			v, err := c.Do(ctx, c.B().Get().Key(other).Build()).ToString()
			cancel()
			if err != nil || v != "v" {
				t.Fatalf("GET %d of %s during the stall: got %q, %v; want \"v\" (did it wait behind the run's writes?)", i, other, v, err)
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), hangDeadline)
		err := app.Apply(ctx, index.Insert(appUser))
		cancel()
		if err != nil {
			t.Fatalf("Apply during the stall: %v (did it wait behind the run's writes?)", err)
		}
		stalled.Resume()

		if err := finishWithin(t, finish); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if n := w.shared.Load(); n != 0 {
			t.Errorf("%d of the run's transactions went on the client's shared connections, want none (%d on a connection of their own)", n, w.own.Load())
		}
		wantEndlessAnd(t, admin, key, yielded.Load(), appUser)
		redistest.WantClean(t, admin, "{iso}:by-email")
	})
}

// TestWritesWhilePoolBusy (C81): the application holds the only connection
// of the client's blocking pool (BlockingPoolSize 1), as a blocking
// command would. The run does not wait for it: its writes go on the
// client's shared connections, with one warning, and as soon as the
// application frees the connection they take it (logged at the Info level)
// and go on it alone. The run publishes every item it pulled, exactly,
// leaves nothing behind, and gives the connection back: the application
// has it again at once, and the pool still counts one connection.
func TestWritesWhilePoolBusy(t *testing.T) {
	t.Parallel()
	onOwnDeployments(t, func(t *testing.T, addrs []string, cluster bool, admin rueidis.Client) {
		c, _, w := isolationClient(t, addrs, cluster, 1)
		key := "{busy}:by-email"
		held, release := c.Dedicate()
		var once sync.Once
		free := func() { once.Do(release) }
		t.Cleanup(free)
		// A cluster client takes the connection on its first command, from
		// the pool of the server of its key.
		if err := held.Do(t.Context(), held.B().Get().Key(keys.LockKey(key, cluster)).Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
			t.Fatalf("GET on the held connection: %v", err)
		}

		rec := newLogRecorder()
		finish, yielded := endlessRun(t, c, key, rebuild.Options{BatchSize: 100, Logger: slog.New(rec)})
		defer finish()
		waitFor(t, "the warning that no connection is free for the writes", func() bool {
			return len(rec.matching("keyswap: no connection of the client's blocking pool", "key="+key)) > 0
		})
		shared := w.shared.Load()
		waitFor(t, "the run writing on the shared connections meanwhile", func() bool { return w.shared.Load() >= shared+3 })
		if n := w.own.Load(); n != 0 {
			t.Fatalf("%d transactions on a connection of their own while the application held the only one", n)
		}

		free()
		waitFor(t, "the writes taking the freed connection", func() bool {
			return len(rec.matching("keyswap: the run's writes have a connection of their own again", "key="+key)) > 0
		})
		// At most two round trips are in flight: three more on the
		// dedicated connection, and every one sent on the shared ones has
		// been counted.
		own := w.own.Load()
		waitFor(t, "writes on the dedicated connection", func() bool { return w.own.Load() >= own+3 })
		shared, own = w.shared.Load(), w.own.Load()
		waitFor(t, "more writes on the dedicated connection", func() bool { return w.own.Load() >= own+3 })
		if n := w.shared.Load(); n != shared {
			t.Errorf("%d more transactions went on the shared connections once the run had its own, want none", n-shared)
		}
		if n := len(rec.matching("keyswap: no connection of the client's blocking pool")); n != 1 {
			t.Errorf("got %d warnings that no connection is free, want 1", n)
		}

		if err := finishWithin(t, finish); err != nil {
			t.Fatalf("Run: %v", err)
		}
		wantEndless(t, admin, key, yielded.Load())
		redistest.WantClean(t, admin, "{busy}:by-email")
		// The run gave its connection back to the pool of one: the
		// application has it at once, and then no other comes. A
		// standalone client waits for it in Dedicate, without a context.
		lock := keys.LockKey(key, cluster)
		got := make(chan func(), 1)
		go func() {
			again, back := c.Dedicate()
			// Not cancellable: see redistest.WantPoolFull.
			if err := again.Do(context.Background(), again.B().Get().Key(lock).Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
				t.Errorf("GET on the connection the run gave back: %v", err)
			}
			got <- back
		}()
		select {
		case back := <-got:
			redistest.WantPoolFull(t, c, lock, back)
		case <-time.After(hangDeadline):
			t.Fatal("the application's blocking pool gave it no connection after the run: the run kept its own")
		}
	})
}

// TestWritesAfterCut (C81): between two of a run's writes, the connection
// they go on is cut. The run notices that its own connection closed
// (logged at the Info level), and its next write takes a new dedicated
// connection, not the client's shared ones: the run goes on, publishes
// every item, exactly, and leaves nothing behind. So it does
//   - on RESP3, where rueidis reads the connection between writes and the
//     run sees the cut before its next write;
//   - on RESP2 (ClientOption.AlwaysRESP2), where nothing reads a connection
//     between commands and the next write finds the cut itself, before it
//     sends anything: the run's connection is then one server connection,
//     not two;
//   - with a blocking pool of one connection (BlockingPoolSize 1), which the
//     cut one fills until it is given back.
//
// Before, on RESP2 the next write went on the broken connection and failed
// the run; with a pool of one the new connection was asked for before the
// broken one was given back, so the pool gave none until the wait for it
// had passed, and the writes went on the shared connections with a warning.
func TestWritesAfterCut(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		pool  int
		resp2 bool
	}{
		{name: "resp3"},
		{name: "resp2", resp2: true},
		{name: "pool of one", pool: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			onOwnDeployments(t, func(t *testing.T, addrs []string, cluster bool, admin rueidis.Client) {
				c, d, w := isolationClient(t, addrs, cluster, tc.pool, func(o *rueidis.ClientOption) { o.AlwaysRESP2 = tc.resp2 })
				key := "{cut}:by-email"
				rec := newLogRecorder()
				var written atomic.Int64
				more := make(chan struct{})
				src := func(ctx context.Context) iter.Seq2[user, error] {
					return func(yield func(user, error) bool) {
						for i := range 600 {
							if i == 300 {
								select {
								case <-more:
								case <-ctx.Done():
									return
								}
							}
							if !yield(user{ID: fmt.Sprintf("u%08d", i), Email: fmt.Sprintf("user%08d@example.com", i)}, nil) {
								return
							}
						}
					}
				}
				r := redistest.Rebuilder(t, c, rebuild.Options{BatchSize: 100, Logger: slog.New(rec),
					Progress: func(p rebuild.Progress) { written.Store(p.Items) }}, userHash(key))
				done := make(chan error, 1)
				go func() {
					_, err := r.Run(redistest.Ctx(t), src)
					done <- err
				}()
				waitFor(t, "the first 300 items written", func() bool { return written.Load() == 300 })

				dialed := d.count()
				d.busiest().CutAll()
				closed := func() bool {
					return len(rec.matching("keyswap: the connection of the run's writes closed", "key="+key)) > 0
				}
				if !tc.resp2 {
					waitFor(t, "the run noticing that its connection closed", closed)
				}
				close(more)
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("Run: %v", err)
					}
				case <-time.After(time.Minute):
					t.Fatal("Run did not return within a minute")
				}
				if !closed() {
					t.Error("the run did not log that its connection closed")
				}
				if n := w.shared.Load(); n != 0 {
					t.Errorf("%d of the run's transactions went on the client's shared connections, want none (%d on connections of their own)", n, w.own.Load())
				}
				if d.count() == dialed {
					t.Error("no connection was dialed after the cut")
				}
				wantEndless(t, admin, key, 600)
				redistest.WantClean(t, admin, "{cut}:by-email")
			})
		})
	}
}

// TestWritesAfterSlotMoved (C81): on a cluster, while a run waits for its
// source, the hash slot of its keys moves to another master with every key
// in it (IMPORTING, MIGRATING, MIGRATE, SETSLOT NODE, as a resharding does).
// The run's connection still goes to the old master, which answers its
// next write with MOVED, so that none of the write's transactions runs:
// the run sends them again on the client's shared connections, which
// follow the slot, logs it at the Info level, and takes a connection to
// the new master for the writes after. It publishes every item, exactly,
// on the new master, and leaves nothing behind.
//
// Before, the write failed with MOVED and EXECABORT, and so did the run.
func TestWritesAfterSlotMoved(t *testing.T) {
	t.Parallel()
	cl := redistest.OwnCluster(t, 3)
	admin := cl.Client(t)
	c, _, w := isolationClient(t, cl.Addrs, true, 0)
	key := "{moved}:by-email"
	rec := newLogRecorder()
	var written, yielded atomic.Int64
	more, stop := make(chan struct{}), make(chan struct{})
	src := func(ctx context.Context) iter.Seq2[user, error] {
		return func(yield func(user, error) bool) {
			for i := 0; ; i++ {
				if i == 300 {
					select {
					case <-more:
					case <-ctx.Done():
						return
					}
				}
				select {
				case <-stop:
					return
				default:
				}
				if !yield(user{ID: fmt.Sprintf("u%08d", i), Email: fmt.Sprintf("user%08d@example.com", i)}, nil) {
					return
				}
				yielded.Add(1)
			}
		}
	}
	r := redistest.Rebuilder(t, c, rebuild.Options{BatchSize: 100, Logger: slog.New(rec),
		Progress: func(p rebuild.Progress) { written.Store(p.Items) }}, userHash(key))
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(redistest.Ctx(t), src)
		done <- err
	}()
	waitFor(t, "the first 300 items written", func() bool { return written.Load() == 300 })
	if n := w.served.Load(); n == 0 {
		t.Fatal("no write went on a connection of the run's own before the move")
	}

	from := cl.NodeFor(t, key)
	to := cl.Nodes[0]
	if to == from {
		to = cl.Nodes[1]
	}
	cl.MoveSlot(t, cl.KeySlot(t, key), to)
	served := w.served.Load()
	close(more)
	waitFor(t, "writes on a connection of the run's own to the new master", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned before the test ended its source: %v", err)
		default:
		}
		return w.served.Load() >= served+3
	})
	close(stop)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute")
	}
	if len(rec.matching("keyswap: the hash slot of the run's writes moved", "key="+key)) == 0 {
		t.Error("the run did not log that its slot moved")
	}
	if got := cl.NodeFor(t, key); got != to {
		t.Fatalf("slot of %s served by %s, want %s", key, got.Addr, to.Addr)
	}
	wantEndless(t, admin, key, yielded.Load())
	redistest.WantClean(t, admin, "{moved}:by-email")
}

// TestWritesEndWhileAsking (C81): the application holds the only
// connection of the client's blocking pool (BlockingPoolSize 1) for a whole
// run, which asks for one for its writes and, with a LatencyBudget, one for
// its probes, and never gets them. The run ends while they are asked for:
// it returns, exactly published, and the pool still counts one connection.
// While the application holds it, no one gets another; once it gives it
// back, the asks the run left get it and give it back, and the application
// has it again.
//
// Before, on a cluster, the end of the run cancelled the asks, and rueidis
// counts a wait for its pool that is cancelled as a connection given back:
// the pool had room for one more connection after each such run.
func TestWritesEndWhileAsking(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		budget time.Duration
	}{
		{name: "unthrottled"},
		{name: "latency budget", budget: 50 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			onOwnDeployments(t, func(t *testing.T, addrs []string, cluster bool, admin rueidis.Client) {
				c, _, w := isolationClient(t, addrs, cluster, 1)
				key := "{asking}:by-email"
				lock := keys.LockKey(key, cluster)
				held, release := c.Dedicate()
				var once sync.Once
				free := func() { once.Do(release) }
				t.Cleanup(free)
				// A cluster client takes the connection on its first command, from
				// the pool of the server of its key.
				if err := held.Do(t.Context(), held.B().Get().Key(lock).Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
					t.Fatalf("GET on the held connection: %v", err)
				}

				rec := newLogRecorder()
				finish, yielded := endlessRun(t, c, key, rebuild.Options{BatchSize: 100, LatencyBudget: tc.budget, Logger: slog.New(rec)})
				defer finish()
				waitFor(t, "the run writing on the shared connections", func() bool { return w.shared.Load() >= 3 })
				if tc.budget > 0 {
					waitFor(t, "the warning that no connection is free for the probes", func() bool {
						return len(rec.matching("keyswap: no connection is free for the latency probes", "key="+key)) > 0
					})
				}
				if err := finishWithin(t, finish); err != nil {
					t.Fatalf("Run: %v", err)
				}
				wantEndless(t, admin, key, yielded.Load())
				redistest.WantClean(t, admin, "{asking}:by-email")

				redistest.WantPoolFull(t, c, lock, free)
			})
		})
	}
}

// appUser is a user that no endless source yields, which the application
// inserts during a run.
var appUser = user{ID: "app", Email: "app@example.com"}

// userHash is endlessRun's builder: email → id.
func userHash(key string) index.Builder[user] {
	return builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true })
}

// finishWithin calls finish, and fails t unless it returns within a minute.
func finishWithin(t *testing.T, finish func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- finish() }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of its source's end")
		return nil
	}
}

// wantEndlessAnd fails t unless key holds exactly the n first users of
// endlessRun's source and extra, without a TTL.
func wantEndlessAnd(t *testing.T, c rueidis.Client, key string, n int64, extra user) {
	t.Helper()
	got := redistest.HGetAll(t, c, key)
	if got[extra.Email] != extra.ID {
		t.Fatalf("field %s: got %q, want %q", extra.Email, got[extra.Email], extra.ID)
	}
	redistest.Do(t, c, c.B().Hdel().Key(key).Field(extra.Email).Build())
	wantEndless(t, c, key, n)
}

package protocol_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// bulkHang bounds what must not wait behind the Bulk's wait (a minute in
// these tests): far longer than a loaded machine takes to dial.
const bulkHang = 15 * time.Second

// bulkEvents records what a Bulk reports.
type bulkEvents struct {
	mu                       sync.Mutex
	shared, own, lost, moved []error
}

func (e *bulkEvents) events() protocol.BulkEvents {
	add := func(to *[]error, err error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		*to = append(*to, err)
	}
	return protocol.BulkEvents{
		Shared: func(_ time.Duration, err error) { add(&e.shared, err) },
		Own:    func() { add(&e.own, nil) },
		Lost:   func(err error) { add(&e.lost, err) },
		Moved:  func(err error) { add(&e.moved, err) },
	}
}

// count returns how many of what were reported.
func (e *bulkEvents) count(what *[]error) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(*what)
}

// bulkWrites counts the transactions (DoMultis that start with MULTI) sent
// on a dedicated connection (own) or on the client's shared ones.
type bulkWrites struct{ own, shared atomic.Int64 }

// bulkClient returns a client of addrs with a blocking pool of pool
// connections (0: the default), on RESP2 if resp2, wrapped to count the
// transactions sent through it.
func bulkClient(t *testing.T, addrs []string, cluster bool, pool int, resp2 bool) (rueidis.Client, *bulkWrites) {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, ForceSingleClient: !cluster, DisableCache: true,
		BlockingPoolSize: pool, AlwaysRESP2: resp2, ClientName: bulkClientName(t)})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(c.Close)
	w := &bulkWrites{}
	return rueidishook.WithHook(c, redistest.Hook{OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
		if multi[0].Commands()[0] == "MULTI" {
			// rueidishook hands a dedicated connection's calls over as a
			// client with the methods of a DedicatedClient.
			if _, own := c.(interface {
				SetPubSubHooks(rueidis.PubSubHooks) <-chan error
			}); own {
				w.own.Add(1)
			} else {
				w.shared.Add(1)
			}
		}
		return c.DoMulti(ctx, multi...)
	}}), w
}

// set writes each key=value of kv through b in a transaction of its own,
// in one DoMulti, and fails t unless every reply is a success.
func set(t *testing.T, b *protocol.Bulk, c rueidis.Client, route string, kv ...string) {
	t.Helper()
	if err := trySet(redistest.Ctx(t), b, c, route, kv...); err != nil {
		t.Fatal(err)
	}
}

// trySet is set, returning the first failed reply.
func trySet(ctx context.Context, b *protocol.Bulk, c rueidis.Client, route string, kv ...string) error {
	var cmds rueidis.Commands
	for i := 0; i < len(kv); i += 2 {
		cmds = append(cmds, c.B().Multi().Build(), c.B().Set().Key(kv[i]).Value(kv[i+1]).Build(), c.B().Exec().Build())
	}
	n := len(cmds)
	for i, r := range b.DoMulti(ctx, ctx, route, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("reply %d of %d: %w", i+1, n, err)
		}
	}
	return nil
}

// bulkConnID returns the id of the connection that b's DoMultis of route
// go on, failing t unless it is a dedicated one.
func bulkConnID(t *testing.T, b *protocol.Bulk, c rueidis.Client, w *bulkWrites, route string) int64 {
	t.Helper()
	ctx := redistest.Ctx(t)
	own := w.own.Load()
	res := b.DoMulti(ctx, ctx, route, c.B().Multi().Build(), c.B().ClientId().Build(), c.B().Exec().Build())
	ids, err := res[2].ToArray()
	if err != nil || len(ids) != 1 {
		t.Fatalf("MULTI CLIENT ID EXEC: %v %v", ids, err)
	}
	if w.own.Load() == own {
		t.Fatal("CLIENT ID did not go on a dedicated connection")
	}
	id, err := ids[0].AsInt64()
	if err != nil {
		t.Fatalf("CLIENT ID: %v", err)
	}
	return id
}

// bulkClientName is the name of the connections of t's bulkClient, one per
// test, so that no other test's connections are counted.
func bulkClientName(t *testing.T) string {
	return "bulk-" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, t.Name())
}

// connections returns the ids of the connections of t's bulkClient that the
// server of admin has.
func connections(t *testing.T, admin rueidis.Client) map[string]bool {
	t.Helper()
	list, err := admin.Do(redistest.Ctx(t), admin.B().ClientList().Build()).ToString()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	ids := map[string]bool{}
	for line := range strings.Lines(list) {
		fields := strings.Fields(line)
		if slices.Contains(fields, "name="+bulkClientName(t)) {
			ids[strings.TrimPrefix(fields[0], "id=")] = true
		}
	}
	return ids
}

// newConnections returns how many connections of t's bulkClient the server
// of admin has that were not in before. It counts what was opened since
// rather than comparing totals: a connection the cluster client opened
// while it started (the one it asked for the slot map on) can still be
// listed in before and be gone after, which made a Bulk's one connection
// come out as none.
func newConnections(t *testing.T, admin rueidis.Client, before map[string]bool) int {
	t.Helper()
	n := 0
	for id := range connections(t, admin) {
		if !before[id] {
			n++
		}
	}
	return n
}

// TestBulk (C81) runs each case on a standalone server and on a cluster of
// its own (they kill connections and move slots), one after the other.
func TestBulk(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		s := redistest.OwnServer(t)
		testBulk(t, []string{s.Addr}, nil, func(string) *redistest.Server { return s })
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.OwnCluster(t, 3)
		testBulk(t, cl.Addrs, cl, func(key string) *redistest.Server { return cl.NodeFor(t, key) })
	})
}

func testBulk(t *testing.T, addrs []string, cl *redistest.Cluster, nodeFor func(key string) *redistest.Server) {
	cluster := cl != nil

	// A connection killed between two writes: the next one goes on a new
	// dedicated connection, at once, even when the blocking pool has room
	// for one connection alone, which the killed one fills until it is
	// given back (a Bulk's wait of a minute would show). On RESP3 rueidis
	// reads the connection and the Bulk sees it close; on RESP2 the write
	// finds it closed, before it is sent. Either way a Bulk holds one
	// server connection, not two.
	//
	// Before, on RESP2 the Bulk's pub/sub hook opened a second connection,
	// which watched itself rather than the write's, and the write after the
	// kill failed on the broken connection; with a pool of one, the new
	// connection was asked for before the broken one was given back, and
	// the write waited out the Bulk's wait.
	for _, resp2 := range []bool{false, true} {
		name := "resp3"
		if resp2 {
			name = "resp2"
		}
		t.Run("killed, pool of one, "+name, func(t *testing.T) {
			route := "{bulk-kill-" + name + "}:k"
			c, w := bulkClient(t, addrs, cluster, 1, resp2)
			admin := nodeFor(route).Client(t)
			redistest.Do(t, c, c.B().Get().Key(route).Build()) // the client's shared connections
			before := connections(t, admin)
			var ev bulkEvents
			b := protocol.NewBulk(redistest.Ctx(t), c, time.Minute, ev.events())
			defer b.Close()
			id := bulkConnID(t, b, c, w, route)
			if n := newConnections(t, admin, before); n != 1 {
				t.Errorf("a Bulk holds %d server connections, want 1", n)
			}
			redistest.Do(t, admin, admin.B().ClientKill().Id(id).Build())
			if !resp2 {
				waitUntil(t, "the Bulk seeing its connection closed", func() bool { return ev.count(&ev.lost) == 1 })
			}
			done := make(chan error, 1)
			go func() { done <- trySet(redistest.Ctx(t), b, c, route, route, "v") }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the write after the kill: %v", err)
				}
			case <-time.After(bulkHang):
				t.Fatal("the write after the kill waited for the pool: the killed connection was not given back before a new one was asked for")
			}
			if got := bulkConnID(t, b, c, w, route); got == id {
				t.Errorf("the Bulk's connection is still %d after its kill", id)
			}
			if n := ev.count(&ev.lost); n != 1 {
				t.Errorf("Lost reported %d times, want 1", n)
			}
			if n := ev.count(&ev.shared); n != 0 || w.shared.Load() != 0 {
				t.Errorf("%d transactions went on the shared connections (%d warnings), want none", w.shared.Load(), n)
			}
			if v, _ := redistest.Get(t, admin, route); v != "v" {
				t.Errorf("GET %s: got %q, want v", route, v)
			}
			if n := newConnections(t, admin, before); n != 1 {
				t.Errorf("after the kill, a Bulk holds %d server connections, want 1", n)
			}
		})
	}

	if !cluster {
		return
	}
	// The slot of the Bulk's connection moves to another master: first
	// half way (IMPORTING, MIGRATING: the old master answers ASK for a key
	// it no longer holds), then whole (MOVED). What was redirected, and
	// only that, goes again on the shared connections, which follow the
	// slot; an ASK keeps the connection, a MOVED replaces it by one to the
	// new master, once the client has learnt the new slot map.
	//
	// Before, both came back as errors: MOVED or ASK, and EXECABORT.
	t.Run("slot moved", func(t *testing.T) {
		route, a, b2 := "{bulk-moved}:k", "{bulk-moved}:a", "{bulk-moved}:b"
		c, w := bulkClient(t, addrs, true, 0, false)
		var ev bulkEvents
		b := protocol.NewBulk(redistest.Ctx(t), c, time.Minute, ev.events())
		defer b.Close()
		set(t, b, c, route, a, "1")
		from := nodeFor(route)
		to := cl.Nodes[0]
		if to == from {
			to = cl.Nodes[1]
		}
		finish := cl.StartMove(t, cl.KeySlot(t, route), to)

		// a is on the old master, b not: the first transaction runs there,
		// the second gets ASK.
		own, shared := w.own.Load(), w.shared.Load()
		set(t, b, c, route, a, "2", b2, "1")
		if w.own.Load() != own+1 || w.shared.Load() != shared+1 {
			t.Errorf("during the move, got %d transactions on the Bulk's connection and %d on the shared ones, want 1 and 1", w.own.Load()-own, w.shared.Load()-shared)
		}
		if v, _ := redistest.Get(t, from.Client(t), a); v != "2" {
			t.Errorf("GET %s on the old master: got %q, want 2", a, v)
		}
		asking := to.Client(t)
		res := asking.DoMulti(redistest.Ctx(t), asking.B().Asking().Build(), asking.B().Get().Key(b2).Build())
		if v, err := res[1].ToString(); err != nil || v != "1" {
			t.Errorf("ASKING GET %s on the new master: got %q, %v; want 1", b2, v, err)
		}
		if n := ev.count(&ev.moved); n != 0 {
			t.Errorf("Moved reported %d times for an ASK, want 0", n)
		}

		finish()
		set(t, b, c, route, a, "3")
		if n := ev.count(&ev.moved); n != 1 {
			t.Errorf("Moved reported %d times, want 1", n)
		}
		waitUntil(t, "a write on a dedicated connection to the new master", func() bool {
			own, shared := w.own.Load(), w.shared.Load()
			set(t, b, c, route, a, "4")
			return w.own.Load() == own+1 && w.shared.Load() == shared
		})
		for key, want := range map[string]string{a: "4", b2: "1"} {
			if v, _ := redistest.Get(t, to.Client(t), key); v != want {
				t.Errorf("GET %s on the new master: got %q, want %s", key, v, want)
			}
		}
	})
}

// waitUntil polls cond until it holds, failing t after a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// busyScript runs on the server until SCRIPT KILL, or a minute: it reads
// the time and writes nothing, so SCRIPT KILL can end it.
const busyScript = `local s = redis.call('TIME')
while true do
  local t = redis.call('TIME')
  if t[1] - s[1] > 60 then break end
end
return 1`

// busy makes the server of s run busyScript, past a busy-reply-threshold of
// 100 ms, and returns once another client is answered BUSY. The returned
// function ends the script, and waits for its reply.
func busy(t *testing.T, s *redistest.Server) (end func()) {
	t.Helper()
	admin := s.Client(t)
	redistest.Do(t, admin, admin.B().ConfigSet().ParameterValue().ParameterValue("busy-reply-threshold", "100").Build())
	runner := s.Client(t)
	ran := make(chan error, 1)
	go func() {
		ran <- runner.Do(context.Background(), runner.B().Eval().Script(busyScript).Numkeys(0).Build()).Error()
	}()
	waitUntil(t, "a BUSY reply", func() bool {
		err := admin.Do(redistest.Ctx(t), admin.B().Ping().Build()).Error()
		e, ok := rueidis.IsRedisErr(err)
		return ok && strings.HasPrefix(e.Error(), "BUSY")
	})
	return func() {
		t.Helper()
		redistest.Do(t, admin, admin.B().ScriptKill().Build())
		select {
		case err := <-ran:
			if e, ok := rueidis.IsRedisErr(err); !ok || !strings.Contains(e.Error(), "killed") {
				t.Errorf("the busy script ended with %v, want it killed", err)
			}
		case <-time.After(bulkHang):
			t.Fatal("the busy script did not end after SCRIPT KILL")
		}
	}
}

// wantPoolFree fails t unless a connection of c's blocking pool comes, and
// reads key as want on it.
func wantPoolFree(t *testing.T, c rueidis.Client, key, want string) {
	t.Helper()
	got := make(chan error, 1)
	go func() {
		dc, release := c.Dedicate()
		defer release()
		v, err := dc.Do(context.Background(), dc.B().Get().Key(key).Build()).ToString()
		if err == nil && v != want {
			err = fmt.Errorf("got %q, want %q", v, want)
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("GET %s on a connection of the pool: %v", key, err)
		}
	case <-time.After(bulkHang):
		t.Fatal("no connection of the pool came: the one given back was not counted")
	}
}

func TestGiveBackWhileBusy(t *testing.T) {
	// C81: a connection of the blocking pool, the Bulk's or one taken by
	// TakeConnection, is given back while the server answers BUSY (a
	// script past its busy-reply-threshold: a large publish, another
	// run's or this one's). It is closed first: the pool counts it as
	// given back (a pool of one hands out the next), the Bulk reports no
	// loss, and the server holds none of them once it is given back.
	//
	// Before, rueidis v1.0.79 sent the connection UNSUBSCRIBE,
	// PUNSUBSCRIBE and SUNSUBSCRIBE, each with a PING, on its way back to
	// the pool (it had read it in the background: the Bulk's hook, or a
	// command under a context it could cancel), took the BUSY replies to
	// them for the PINGs', was left with three replies that nothing
	// waited for, and its reader panicked ("protocol bug, message handled
	// out of order"): the test binary died.
	t.Parallel()
	s := redistest.OwnServer(t)
	admin := s.Client(t)
	t.Run("bulk", func(t *testing.T) {
		route := "{bulk-busy}:k"
		c, w := bulkClient(t, []string{s.Addr}, false, 1, false)
		redistest.Do(t, c, c.B().Get().Key(route).Build()) // the client's shared connections
		before := connections(t, admin)
		var ev bulkEvents
		b := protocol.NewBulk(redistest.Ctx(t), c, time.Minute, ev.events())
		set(t, b, c, route, route, "v")
		if w.own.Load() != 1 {
			t.Fatalf("%d transactions on a dedicated connection, want 1", w.own.Load())
		}
		end := busy(t, s)
		b.Close()
		end()
		waitUntil(t, "the Bulk's connection closed on the server", func() bool { return newConnections(t, admin, before) == 0 })
		wantPoolFree(t, c, route, "v")
		if n := ev.count(&ev.lost); n != 0 {
			t.Errorf("Lost reported %d times for a connection given back, want 0", n)
		}
		if d := redistest.PTTL(t, admin, route); d != -1 {
			t.Errorf("PTTL %s: %v, want no TTL", route, d)
		}
	})
	t.Run("TakeConnection", func(t *testing.T) {
		key := "{take-busy}:k"
		redistest.Do(t, admin, admin.B().Set().Key(key).Value("v").Build())
		c, _ := bulkClient(t, []string{s.Addr}, false, 1, false)
		before := connections(t, admin)
		d := <-protocol.TakeConnection(redistest.Ctx(t), c, func(ctx context.Context, dc rueidis.DedicatedClient) error {
			return dc.Do(ctx, dc.B().Get().Key(key).Build()).Error()
		})
		if d.Err != nil {
			t.Fatalf("GET %s: %v", key, d.Err)
		}
		// A command under a context that can be cancelled and has no
		// deadline makes rueidis read the connection in the background
		// from then on, and the pool hands it out so to the next user: the
		// application may have used it so, or the keep-alive PING of
		// rueidis sent one while the durability wait's or a probe's was
		// on it.
		ctx, cancel := context.WithCancel(context.Background())
		err := d.Client.Do(ctx, d.Client.B().Get().Key(key).Build()).Error()
		cancel()
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		end := busy(t, s)
		d.Release()
		end()
		waitUntil(t, "the connection closed on the server", func() bool { return newConnections(t, admin, before) == 0 })
		wantPoolFree(t, c, key, "v")
		if v, _ := redistest.Get(t, admin, key); v != "v" {
			t.Errorf("GET %s: %q, want v", key, v)
		}
	})
	redistest.WantClean(t, admin, redistest.Prefix(t))
}

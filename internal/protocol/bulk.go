package protocol

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// Bulk gives a run's bulk writes (its batches' transactions, the replayed
// changes) connections of their own, apart from the pipelined connections
// that the application sends its commands on through the same client.
//
// rueidis pipelines every command of a client on a few shared connections:
// a command sent behind a round trip of a run's transactions (hundreds of
// kilobytes) waits until the server has read and run all of them, and its
// reply comes after theirs. On a connection of their own the transactions
// still take their turn on the server, one command at a time, but no
// command of the application waits behind them on the way there and back:
// it waits for what Redis is running at that moment, as the command of any
// other client does.
//
// The connections come from the client's blocking pool
// (rueidis ClientOption.BlockingPoolSize), one per route and run, asked for
// by the run's first write to the route (not before: a run that fails before
// it writes sends nothing more). When none comes within the wait given to [NewBulk]
// (the application keeps the pool busy with blocking commands, or the
// server does not answer), or the one asked for fails, the writes go on the
// client's shared connections, as they would without a Bulk, and the
// warning given to NewBulk is called once; each later write takes the
// connection as soon as it has come.
//
// A connection that closes (cut, killed by the server) between two writes
// is given back, before a new one is asked for, so that a pool at its limit
// has room for it; the next write takes the new one. On RESP3 rueidis reads
// the connection between commands (the Bulk sets a pub/sub hook that makes
// it do so) and tells when it closes. On RESP2 a hook would open a second
// connection, and that one's fate says nothing of the first, so a write
// that finds the connection idle first sends a PING on it: a connection
// that fails it is replaced before the write is sent. Only a write in
// flight when its connection breaks fails: its outcome is unknown, so it is
// never sent again.
//
// A route is a key of the DoMulti: every key of a DoMulti must be in the
// route's hash slot. On a cluster a dedicated connection is bound to the
// master that served the slot of its first command when it was taken, and
// rueidis does not follow a slot that moves (resharding, a failover that
// keeps the old master up as a replica): that master answers MOVED once
// the slot is another's, or ASK for a key it has already handed over while
// the slot moves, and runs none of a transaction that has such a command.
// The Bulk sends those transactions, and what follows them, again on the
// client's shared connections, which follow redirections. After a MOVED,
// the next write takes a new connection, once the client has learnt where
// the slot is; after an ASK the master still serves the slot and the keys
// it holds, so the connection stays. There is one connection per slot
// written; a run writes one slot today. A run that writes many slots would
// key its connections by the master that serves them instead (one per
// node, from the client's Nodes), which only the lookup of a route's
// connection need change.
//
// A connection is given back closed, never to be used again: the pool
// counts it as given back, and dials a new one for the next that is asked
// for (one per run). rueidis v1.0.79 sends a RESP3 connection that it has
// read in the background (the hook's, or any command's that waited under
// a context it could cancel) UNSUBSCRIBE, PUNSUBSCRIBE and SUNSUBSCRIBE on
// its way back to the pool, each followed by a PING, and takes a BUSY or
// LOADING reply to one of them for the PING's: while the server runs a
// script past its busy-reply-threshold (a large publish, the run's own
// included) or loads its data, the replies outnumber what it waits for,
// and its reader panics ("protocol bug, message handled out of order"),
// which ends the application. A connection closed first is sent none of
// them.
//
// rueidis gives no way to stop waiting for its blocking pool: a standalone
// or Sentinel client waits in Dedicate, without a context, and a cluster
// client in a connection's first command, where a cancelled wait is
// counted as a connection given back that was never taken (the pool then
// has room for one more connection than its size). So a connection asked
// for is never given up on: one that comes after [Bulk.Close] is given back
// at once, by a goroutine that may outlive the run.
//
// A Bulk is safe for concurrent use: two round trips may use one connection
// at once.
type Bulk struct {
	base    context.Context // the values the commands that take a connection carry
	client  rueidis.Client
	cluster bool
	wait    time.Duration
	events  BulkEvents
	stop    chan struct{} // closed by Close: ends an ask's pause

	mu     sync.Mutex
	conns  map[uint16]*bulkConn
	warned bool // Shared was called, and Own was not since
	closed bool
}

// bulkConn is one dedicated connection, asked for or held.
type bulkConn struct {
	asked time.Time
	ready chan struct{} // closed once the ask is answered

	// Set before ready is closed; release is taken by one caller (take).
	dc      rueidis.DedicatedClient
	release func()
	err     error
	gone    <-chan struct{} // closed when the connection closes; nil on RESP2

	// Guarded by the Bulk's mu.
	redirect error // the last MOVED the ask met, while it asks again
	broken   error // why the connection cannot carry the writes any more
	users    int   // writes that hold the connection
	retired  bool  // out of conns: given back once users is 0

	// check makes a write wait for the PING of another that found the
	// connection idle (RESP2).
	check sync.Mutex
}

// BulkEvents are what a Bulk reports, for logs. Each may be called from any
// goroutine, never with a lock of the Bulk held.
type BulkEvents struct {
	// Shared is called when a write goes on the client's shared
	// connections, after it waited for its own for waited; err is what
	// failed, if anything. It is not called again until Own has been.
	Shared func(waited time.Duration, err error)
	// Own is called when a write has a connection of its own again after
	// Shared.
	Own func()
	// Lost is called when a connection closes while it is held, with the
	// reason: the next write asks for a new one.
	Lost func(err error)
	// Moved is called when a connection's master answers a write with
	// MOVED, with that reply: the slot is another master's now. The
	// redirected transactions went on the shared connections, and the
	// next write asks for a new connection.
	Moved func(err error)
}

// Pauses between two asks of a cluster connection whose first command was
// answered MOVED: rueidis refreshes its slot map in the background, within
// a second of a redirection on a cluster of under 100 nodes.
const (
	redirectPause    = 10 * time.Millisecond
	redirectPauseMax = 200 * time.Millisecond
)

// NewBulk returns a Bulk of client's connections. A write waits at most
// wait, from when its route's connection was asked for, before it goes on
// the shared connections. The commands that take a connection carry ctx's
// values (a trace's span, say) but not its cancellation, which could not
// cut their wait short (see Bulk).
func NewBulk(ctx context.Context, client rueidis.Client, wait time.Duration, events BulkEvents) *Bulk {
	return &Bulk{base: context.WithoutCancel(ctx), client: client, cluster: client.Mode() == rueidis.ClientModeCluster, wait: wait,
		events: events, stop: make(chan struct{}), conns: map[uint16]*bulkConn{}}
}

// DoMulti sends cmds, whose keys must all be in route's hash slot, in one
// round trip, under send: on route's connection, or on the client's shared
// connections while none is ready (see Bulk). It waits for the connection
// at most until ctx is done or the wait given to NewBulk has passed since
// it was asked for. On a cluster, what the connection's server redirected
// without running it is sent again on the shared connections, and its
// replies are theirs.
func (b *Bulk) DoMulti(ctx, send context.Context, route string, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if b.cluster {
		// A redirected transaction is sent again: rueidis must not
		// recycle the commands once they are sent.
		for i := range cmds {
			cmds[i] = cmds[i].Pin()
		}
	}
	c := b.hold(ctx, send, route)
	if c == nil {
		return b.client.DoMulti(send, cmds...)
	}
	res := c.dc.DoMulti(send, cmds...)
	from, redirect := -1, error(nil)
	if b.cluster {
		from, redirect = redirected(cmds, res)
	}
	if !isMoved(redirect) {
		// ASK: the master still serves the slot, which it is moving
		// away, and the keys it still holds.
		redirect = nil
	}
	b.unhold(c, redirect)
	if from >= 0 {
		copy(res[from:], b.client.DoMulti(send, cmds[from:]...))
	}
	return res
}

// hold returns route's connection, held for a write, once it is ready and
// checked (see connection and checked), or nil for the client's shared
// connections.
func (b *Bulk) hold(ctx, send context.Context, route string) *bulkConn {
	// A connection that fails its check is replaced; when a second one
	// fails it too, the write goes on the shared connections.
	var err error
	for range 2 {
		c := b.connection(ctx, route)
		if c == nil || c.gone != nil {
			return c
		}
		if err = b.checked(send, c); err == nil {
			return c
		}
		b.unhold(c, nil)
		if err != errRetired {
			b.events.Lost(err)
		}
	}
	b.mu.Lock()
	warn := !b.warned
	b.warned = true
	b.mu.Unlock()
	if warn {
		b.events.Shared(0, err)
	}
	return nil
}

// errRetired is what checked returns for a connection that another write
// found broken meanwhile.
var errRetired = errors.New("keyswap: the connection was found broken by another write")

// checked checks a held RESP2 connection, unless another write holds it
// too: then that one checked it, or is checking it. It returns why the
// connection cannot carry the write.
//
// rueidis reads a RESP2 connection only while a command waits on it, so a
// cut between two writes would be seen by the second, once sent, and its
// outcome would be unknown: a PING first makes it known. A write that is
// sent behind another in flight takes its chance with it.
func (b *Bulk) checked(ctx context.Context, c *bulkConn) error {
	c.check.Lock()
	defer c.check.Unlock()
	b.mu.Lock()
	broken, idle := c.broken, c.users == 1
	b.mu.Unlock()
	switch {
	case broken != nil:
		return errRetired
	case !idle:
		return nil
	}
	err := c.dc.Do(ctx, c.dc.B().Ping().Build()).Error()
	if _, ok := rueidis.IsRedisErr(err); err == nil || ok {
		return nil // the server answered: the connection works
	}
	b.mu.Lock()
	c.broken = err
	b.mu.Unlock()
	return err
}

// connection returns route's connection, held, or nil for the client's
// shared connections: it waits for the connection at most until ctx is
// done or the wait given to NewBulk has passed since it was asked for. A
// connection that closed, or was answered MOVED, is given back, and a
// failed ask is tried again once per wait.
func (b *Bulk) connection(ctx context.Context, route string) *bulkConn {
	c := b.current(route)
	if c == nil {
		return nil
	}
	b.await(ctx, c)
	return b.claim(ctx, c)
}

// current returns route's connection, asked for or answered, not held: the
// one there is, unless it is done for (see done), else a new ask. It
// returns nil once the Bulk is closed.
func (b *Bulk) current(route string) *bulkConn {
	slot := b.slot(route)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	c := b.conns[slot]
	if c != nil && b.done(c) {
		release := b.retire(slot, c)
		b.mu.Unlock()
		// Before the next ask: a pool at its limit counts the connection
		// until it is given back.
		release()
		b.mu.Lock()
		if b.closed {
			return nil
		}
		c = b.conns[slot] // perhaps asked for by another write meanwhile
	}
	if c == nil {
		c = b.ask(route)
		b.conns[slot] = c
	}
	return c
}

// done reports whether c must be replaced: it closed, broke, or its ask
// failed at least one wait ago. b.mu is held.
func (b *Bulk) done(c *bulkConn) bool {
	if !c.answered() {
		return false
	}
	return c.closed() || c.broken != nil || c.err != nil && time.Since(c.asked) >= b.wait
}

// await waits until c is answered, ctx is done, or the wait given to
// NewBulk has passed since c was asked for.
func (b *Bulk) await(ctx context.Context, c *bulkConn) {
	left := b.wait - time.Since(c.asked)
	if left <= 0 || c.answered() {
		return
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-c.ready:
	case <-t.C:
	case <-ctx.Done():
	}
}

// claim holds c if it is ready, and tells events that writes go back to
// their own connections; else it returns nil and tells events, once, that
// they go on the shared connections, unless ctx is done.
func (b *Bulk) claim(ctx context.Context, c *bulkConn) *bulkConn {
	b.mu.Lock()
	var event func()
	held := c.answered() && c.err == nil && c.broken == nil && !c.retired && !c.closed()
	switch {
	case held:
		c.users++
		if b.warned {
			b.warned = false
			event = b.events.Own
		}
	case ctx.Err() != nil:
		// The run is ending: no warning for a wait it cut short.
	case !b.warned:
		b.warned = true
		err := c.redirect
		if c.answered() {
			err = c.err
		}
		waited := time.Since(c.asked)
		event = func() { b.events.Shared(waited, err) }
	}
	b.mu.Unlock()
	if event != nil {
		event()
	}
	if !held {
		return nil
	}
	return c
}

// unhold ends a write's hold of c. redirect is the redirection its write
// met: c is then replaced by the next write.
func (b *Bulk) unhold(c *bulkConn, redirect error) {
	b.mu.Lock()
	c.users--
	moved := redirect != nil && c.broken == nil
	if moved {
		c.broken = redirect
	}
	release := func() {}
	if c.retired && c.users == 0 {
		release = c.take()
	}
	b.mu.Unlock()
	release()
	if moved {
		b.events.Moved(redirect)
	}
}

// retire takes c, slot's connection, out of the Bulk, and returns the
// function that gives it back if no write holds it; else the last write
// that does gives it back (see unhold). A healthy connection that a write
// still uses must not go back to the pool. b.mu is held.
func (b *Bulk) retire(slot uint16, c *bulkConn) func() {
	if b.conns[slot] == c {
		delete(b.conns, slot)
	}
	c.retired = true
	if c.users > 0 {
		return func() {}
	}
	return c.take()
}

// Close gives back every connection held, and each one asked for once it
// comes. Every DoMulti must have returned.
func (b *Bulk) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.stop)
	var gone []func()
	for slot, c := range b.conns {
		if c.answered() {
			gone = append(gone, b.retire(slot, c))
		}
	}
	b.mu.Unlock()
	for _, f := range gone {
		f()
	}
}

// slot returns the key of route's connection.
func (b *Bulk) slot(route string) uint16 {
	if !b.cluster {
		return 0
	}
	return keys.Slot(route)
}

// ask asks for a connection for route, in a goroutine of its own that
// answers c. b.mu is held.
func (b *Bulk) ask(route string) *bulkConn {
	c := &bulkConn{asked: time.Now(), ready: make(chan struct{})}
	go b.answer(c, route)
	return c
}

// answer takes a connection for c: from the pool (a standalone or Sentinel
// client waits for a free one in Dedicate), then an EXISTS of route, which
// binds a cluster connection to the master of route's slot (a cluster
// client waits for a free one in this command), and a HELLO, whose reply
// tells RESP3 from RESP2. Neither wait can be cut short (see Bulk). A
// connection whose EXISTS is redirected (the client's slot map is out of
// date) is given back, and taken anew after a pause, until Close.
func (b *Bulk) answer(c *bulkConn, route string) {
	var (
		dc      rueidis.DedicatedClient
		give    func() // rueidis's: back to the pool, open
		release func() // give, closed first (see closing)
		err     error
		resp3   bool
	)
	for pause := redirectPause; ; pause = min(2*pause, redirectPauseMax) {
		dc, give = b.client.Dedicate()
		release = closing(dc, give, false)
		res := dc.DoMulti(b.base, dc.B().Exists().Key(route).Build(), dc.B().Hello().Build())
		err = res[0].Error()
		if isAsk(err) {
			// Bound to the slot's master, which is moving it away: the
			// keys it still holds are its.
			err = nil
		}
		if err == nil {
			// A HELLO that fails (before Redis 6.2, or refused by an ACL)
			// leaves RESP2 as far as the Bulk can tell: the check of
			// RESP2 works on RESP3 too.
			hello, herr := res[1].ToMessage()
			resp3 = herr == nil && hello.IsMap()
			break
		}
		if !isMoved(err) {
			break
		}
		release()
		release = func() {}
		b.mu.Lock()
		c.redirect = err
		b.mu.Unlock()
		t := time.NewTimer(pause)
		select {
		case <-b.stop:
		case <-t.C:
		}
		t.Stop()
		if b.isClosed() {
			break
		}
	}
	var gone <-chan struct{}
	if err == nil && resp3 {
		if gone = b.watch(dc); gone != nil {
			release = closing(dc, give, true)
		}
	}
	b.mu.Lock()
	c.dc, c.release, c.err, c.gone = dc, release, err, gone
	close(c.ready)
	if err != nil || b.closed {
		c.retired = true
		release = c.take()
	} else {
		release = func() {}
	}
	b.mu.Unlock()
	release()
}

// watch returns a channel that is closed when dc's connection closes, and
// calls Lost when it breaks. A hook makes rueidis read a RESP3 connection
// in the background, and tell when it closes: between two writes, a cut
// is then seen before the next one is sent, rather than by it. It returns
// nil when rueidis cannot tell (see checked).
func (b *Bulk) watch(dc rueidis.DedicatedClient) <-chan struct{} {
	ended := dc.SetPubSubHooks(rueidis.PubSubHooks{OnMessage: func(rueidis.PubSubMessage) {}})
	if ended == nil {
		return nil
	}
	done := make(chan struct{})
	go func() {
		// The channel gets the error of a connection that breaks, and is
		// closed without one when the hook is removed, before the
		// connection is closed and given back (see closing): this
		// goroutine ends with the connection.
		err, ok := <-ended
		close(done) // first: the next write must not take it
		if ok && err != nil {
			b.events.Lost(err)
		}
	}()
	return done
}

// closing returns the function that gives dc's connection back closed
// (see Bulk): release, the function that gives it back, after Close, which
// gives it back itself. Close waits for the replies in flight on the
// connection and a PING's, at most a second once the server stops
// answering. watched reports that watch set dc's hook: it is removed
// first, so that watch does not take the connection's end for a loss (and
// only then: on RESP2, SetPubSubHooks would open a second connection).
func closing(dc rueidis.DedicatedClient, release func(), watched bool) func() {
	return func() {
		if watched {
			dc.SetPubSubHooks(rueidis.PubSubHooks{})
		}
		dc.Close()
		release()
	}
}

// isClosed reports whether Close was called.
func (b *Bulk) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// answered reports whether the ask of c is answered.
func (c *bulkConn) answered() bool {
	select {
	case <-c.ready:
		return true
	default:
		return false
	}
}

// closed reports whether c's connection has closed, as far as rueidis
// tells (RESP3). c is answered.
func (c *bulkConn) closed() bool {
	if c.gone == nil {
		return false
	}
	select {
	case <-c.gone:
		return true
	default:
		return false
	}
}

// take returns the function that gives c's connection back, and a no-op
// to every later call: whoever takes it gives it back, after unlocking,
// for it may send commands (rueidis resets a connection it takes back). c
// is answered; its Bulk's mu is held.
func (c *bulkConn) take() func() {
	release := c.release
	c.release = func() {}
	return release
}

// isRedirect reports whether err is a cluster's redirection: MOVED, or ASK.
func isRedirect(err error) bool { return isMoved(err) || isAsk(err) }

// isMoved reports whether err is MOVED: the slot is served by another
// master.
func isMoved(err error) bool {
	e, ok := rueidis.IsRedisErr(err)
	if !ok {
		return false
	}
	_, moved := e.IsMoved()
	return moved
}

// isAsk reports whether err is ASK: the slot is moving to another master,
// which already holds the key.
func isAsk(err error) bool {
	e, ok := rueidis.IsRedisErr(err)
	if !ok {
		return false
	}
	_, ask := e.IsAsk()
	return ask
}

// redirected returns where the commands of cmds that did not run because
// of a redirection start, and that redirection, if nothing from there on
// ran; else -1 and nil. A redirected command did not run; neither did any
// of a MULTI ... EXEC whose EXEC answered EXECABORT, which a redirection
// inside the transaction causes. A redirection after something that ran
// (the slot came back?) is left to the caller, as any other error.
func redirected(cmds []rueidis.Completed, res []rueidis.RedisResult) (from int, redirect error) {
	first := -1
	for i, r := range res {
		if isRedirect(r.Error()) {
			first = i
			break
		}
	}
	if first < 0 {
		return -1, nil
	}
	// Back to the MULTI of the transaction it is in, if any.
	from = first
	for i := first - 1; i >= 0; i-- {
		if name := cmds[i].Commands()[0]; name == "EXEC" {
			break
		} else if name == "MULTI" {
			from = i
			break
		}
	}
	for i := from; i < len(cmds); i++ {
		switch cmds[i].Commands()[0] {
		case "MULTI":
			exec := i + 1
			for exec < len(cmds) && cmds[exec].Commands()[0] != "EXEC" {
				exec++
			}
			if exec == len(cmds) {
				return -1, nil
			}
			if e, ok := rueidis.IsRedisErr(res[exec].Error()); !ok || !strings.HasPrefix(e.Error(), "EXECABORT") {
				return -1, nil
			}
			i = exec
		default:
			if !isRedirect(res[i].Error()) {
				return -1, nil
			}
		}
	}
	return from, res[first].Error()
}

package run

import (
	"context"
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
// as the run starts. When none comes within the wait given to [NewBulk]
// (the application keeps the pool busy with blocking commands, or the
// server does not answer), or the one asked for fails, the writes go on the
// client's shared connections, as they would without a Bulk, and the
// warning given to NewBulk is called once; each later write takes the
// connection as soon as it has come. A connection that closes (cut, killed
// by the server) is given back, and the next write asks for a new one.
// Only a write in flight when its connection breaks fails: its outcome is
// unknown, so it is never sent again.
//
// A route is a key of the DoMulti: every key of a DoMulti must be in the
// route's hash slot. On a cluster a dedicated connection is bound to the
// slot of its first command, so there is one connection per slot written;
// a run writes one slot today. A run that writes many slots would key its
// connections by the master that serves them instead (one per node, from
// the client's Nodes), which only For's lookup need change.
//
// A Bulk is safe for concurrent use: two round trips may use one connection
// at once.
type Bulk struct {
	client  rueidis.Client
	cluster bool
	wait    time.Duration
	events  BulkEvents

	mu     sync.Mutex
	conns  map[uint16]*bulkConn
	warned bool // warn was called, and back was not since
	closed bool
}

// bulkConn is one dedicated connection, asked for or held.
type bulkConn struct {
	asked  time.Time
	cancel context.CancelFunc // ends the ask's first command
	ready  chan struct{}      // closed once the ask is answered

	// Set before ready is closed; release is taken by one caller (take).
	dc      rueidis.DedicatedClient
	release func()
	err     error
	gone    <-chan struct{} // closed when the connection closes
}

// BulkEvents are what a Bulk reports, for logs. Each may be called from any
// goroutine.
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
}

// NewBulk returns a Bulk of client's connections. A write waits at most
// wait, from when its route's connection was asked for, before it goes on
// the shared connections.
func NewBulk(client rueidis.Client, wait time.Duration, events BulkEvents) *Bulk {
	return &Bulk{client: client, cluster: client.Mode() == rueidis.ClientModeCluster, wait: wait,
		events: events, conns: map[uint16]*bulkConn{}}
}

// Ask asks for route's connection, if none is held or asked for, without
// waiting for it.
func (b *Bulk) Ask(route string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if slot := b.slot(route); b.conns[slot] == nil && !b.closed {
		b.conns[slot] = b.ask(route)
	}
}

// For returns where to send a DoMulti whose keys are all in route's slot:
// route's dedicated connection, or the client itself while none is ready
// (see Bulk). It waits for the connection, at most until ctx is done or
// the wait given to NewBulk has passed since it was asked for.
func (b *Bulk) For(ctx context.Context, route string) rueidis.CoreClient {
	slot := b.slot(route)
	var gone func()
	defer func() {
		if gone != nil {
			gone() // not under b.mu: it may send commands
		}
	}()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return b.client
	}
	c := b.conns[slot]
	switch {
	case c == nil:
		c = b.ask(route)
		b.conns[slot] = c
	case c.answered() && ((c.err != nil && time.Since(c.asked) >= b.wait) || c.closed()):
		// A failed ask is tried again once per wait; a closed connection
		// is replaced at once.
		gone = c.take()
		c = b.ask(route)
		b.conns[slot] = c
	}
	b.mu.Unlock()

	if left := b.wait - time.Since(c.asked); left > 0 && !c.answered() {
		t := time.NewTimer(left)
		select {
		case <-c.ready:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case c.answered() && c.err == nil && !c.closed():
		if b.warned {
			b.warned = false
			b.events.Own()
		}
		return c.dc
	case ctx.Err() != nil:
		// The run is ending: no warning for a wait it cut short.
	case !b.warned:
		b.warned = true
		var err error
		if c.answered() {
			err = c.err
		}
		b.events.Shared(time.Since(c.asked), err)
	}
	return b.client
}

// Close gives back every connection held, and each one asked for once it
// comes. Every DoMulti sent through For must have returned.
func (b *Bulk) Close() {
	b.mu.Lock()
	b.closed = true
	var gone []func()
	for _, c := range b.conns {
		c.cancel()
		if c.answered() {
			gone = append(gone, c.take())
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

// ask asks for a connection for route, in a goroutine of its own: a
// standalone or Sentinel client waits for a free connection of its pool in
// Dedicate, without a context; a cluster client in the connection's first
// command, an EXISTS of route that binds it to route's slot, under a
// context that Close cancels. b.mu is held.
func (b *Bulk) ask(route string) *bulkConn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &bulkConn{asked: time.Now(), cancel: cancel, ready: make(chan struct{})}
	go func() {
		defer cancel()
		dc, release := b.client.Dedicate()
		err := dc.Do(ctx, dc.B().Exists().Key(route).Build()).Error()
		var gone <-chan struct{}
		if err == nil {
			// A hook makes rueidis read the connection in the background,
			// and tell when it closes: between two writes, a cut is then
			// seen before the next one is sent, rather than by it.
			closing := dc.SetPubSubHooks(rueidis.PubSubHooks{OnMessage: func(rueidis.PubSubMessage) {}})
			done := make(chan struct{})
			gone = done
			go func() {
				if closing == nil {
					return // never closed: nothing tells
				}
				// The channel gets the error of a connection that breaks,
				// and is closed without one when the connection is given
				// back: this goroutine ends with the connection.
				if err, ok := <-closing; ok && err != nil {
					b.events.Lost(err)
				}
				close(done)
			}()
		}
		b.mu.Lock()
		c.dc, c.release, c.err, c.gone = dc, release, err, gone
		close(c.ready)
		if err != nil || b.closed {
			release = c.take()
		} else {
			release = func() {}
		}
		b.mu.Unlock()
		release()
	}()
	return c
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

// closed reports whether c's connection has closed. c is answered.
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

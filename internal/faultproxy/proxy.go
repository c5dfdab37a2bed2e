package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// dialTimeout bounds the proxy's connection to its target.
	dialTimeout = 5 * time.Second
	// acceptBackoff is the pause after an accept error other than a closed
	// listener (for instance, too many open files).
	acceptBackoff = 10 * time.Millisecond
	// bufSize is the size of each direction's copy buffer.
	bufSize = 32 << 10
)

// Proxy forwards TCP connections from a loopback listener to a target
// address, and injects faults on command. The package documentation says
// what a client observes for each fault.
type Proxy struct {
	ln     *net.TCPListener
	ctx    context.Context // cancelled by Close: ends dials to the target
	cancel context.CancelFunc
	done   chan struct{} // closed by Close

	wg   sync.WaitGroup
	live atomic.Int64 // running goroutines, checked by the leak test

	gate gate

	mu      sync.Mutex
	target  string // where new connections go; see SetTarget
	closed  bool
	links   map[*link]struct{}
	refuse  bool
	trip    trip
	closeMu sync.Mutex // serialises Close
	err     error      // the listener's close error, returned by every Close

	accepted, refused, dialErrors, cut atomic.Int64
	toServer, toClient, held           atomic.Int64
}

// New starts a Proxy that listens on a free port of 127.0.0.1 and forwards
// every connection it accepts to target, a "host:port" address. The proxy
// does not dial target until a client connects, so target need not be up yet.
// Close the Proxy when done.
func New(target string) (*Proxy, error) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target: target,
		ln:     ln,
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
		links:  map[*link]struct{}{},
	}
	p.goroutine(p.serve)
	return p, nil
}

// Addr returns the address clients connect to, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target returns the address the proxy forwards new connections to: the
// one given to New, or to the latest SetTarget.
func (p *Proxy) Target() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

// SetTarget makes the proxy forward the connections it accepts from now on
// to target, a "host:port" address, for instance a replica promoted after
// its master failed. Open connections keep the target they were made to
// until they end; call CutAll after SetTarget to move every client at once.
// A connection whose dial to the old target is still under way when
// SetTarget is called is reset once connected, as a failed dial is (and
// Stats.DialErrors counts it), so that after SetTarget and CutAll no
// connection reaches the old target.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Close closes the listener and every connection at once (clients see a
// reset, as after CutAll, but Stats.Cut does not count them, and the proxy
// does not wait for the server to close its side), and waits until every
// goroutine of the proxy has ended. Held bytes are discarded. Close is
// idempotent; every call returns the listener's close error.
func (p *Proxy) Close() error {
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	p.mu.Lock()
	already := p.closed
	p.closed = true
	links := p.snapshot()
	p.mu.Unlock()
	if !already {
		close(p.done)
		p.cancel()
		if err := p.ln.Close(); err != nil {
			p.err = fmt.Errorf("faultproxy: close %s: %w", p.Addr(), err)
		}
		p.gate.stop()
		for _, l := range links {
			l.cut(nil)
			l.server.Close() // Ends the drain of a server that never closes.
		}
	}
	p.wg.Wait()
	return p.err
}

// goroutine runs f in a goroutine that Close waits for.
func (p *Proxy) goroutine(f func()) {
	p.wg.Add(1)
	p.live.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.live.Add(-1)
		f()
	}()
}

// serve accepts connections until Close.
func (p *Proxy) serve() {
	for {
		c, err := p.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-p.done:
				return
			case <-time.After(acceptBackoff):
				continue
			}
		}
		p.accepted.Add(1)
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			p.refused.Add(1)
			reset(c)
			continue
		}
		p.goroutine(func() { p.handle(c) })
	}
}

// handle connects client to the target and forwards traffic both ways until
// either side ends or the connection is cut.
func (p *Proxy) handle(client *net.TCPConn) {
	target := p.Target()
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", target)
	cancel()
	if err != nil {
		p.dialErrors.Add(1)
		reset(client)
		return
	}
	l := newLink(client, conn.(*net.TCPConn))
	if ok, moved := p.register(l, target); !ok {
		if moved {
			p.dialErrors.Add(1)
		}
		l.cut(nil) // Close has begun, or SetTarget replaced target.
		l.close()
		return
	}
	defer p.unregister(l)
	upDone := make(chan struct{})
	p.goroutine(func() {
		defer close(upDone)
		p.pump(l, ToServer)
	})
	p.pump(l, ToClient)
	<-upDone
	l.close()
}

// register adds l, a connection to target, to the open links, unless Close
// has begun or SetTarget has replaced target since the dial (moved).
func (p *Proxy) register(l *link, target string) (ok, moved bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false, false
	}
	if p.target != target {
		return false, true
	}
	p.links[l] = struct{}{}
	return true, false
}

// unregister removes l from the open links.
func (p *Proxy) unregister(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.links, l)
}

// snapshot returns the open links. The caller holds p.mu.
func (p *Proxy) snapshot() []*link {
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	return links
}

// Refuse makes the proxy reset every connection it accepts from now on, while
// refuse is true, as a server that is down would; Refuse(false) accepts them
// again. Refuse leaves open connections alone: call CutAll as well to take the
// "server" down completely.
func (p *Proxy) Refuse(refuse bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = refuse
}

// Heal ends every fault still in force: it resumes held traffic, disarms
// CutAfter and stops refusing connections. Connections already cut stay cut.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.refuse = false
	p.trip = trip{}
	p.mu.Unlock()
	p.Resume()
}

// reset closes c with a TCP reset instead of a FIN.
func reset(c *net.TCPConn) {
	c.SetLinger(0) // An error leaves the default, a FIN: still a close.
	c.Close()
}

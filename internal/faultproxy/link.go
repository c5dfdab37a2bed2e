package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Direction is a direction of traffic through a proxy.
type Direction int

const (
	// ToServer is traffic from the client to the target server: commands.
	ToServer Direction = iota + 1
	// ToClient is traffic from the target server to the client: replies.
	ToClient
)

// String returns "to server" or "to client".
func (d Direction) String() string {
	switch d {
	case ToServer:
		return "to server"
	case ToClient:
		return "to client"
	}
	return "no direction"
}

// link is one proxied connection: a client's connection to the proxy and the
// proxy's connection to the target.
type link struct {
	client, server *net.TCPConn
	cutCh          chan struct{} // closed when the link is cut
	once           sync.Once
}

func newLink(client, server *net.TCPConn) *link {
	return &link{client: client, server: server, cutCh: make(chan struct{})}
}

// cut resets the client's side and half-closes the server's side: the server
// reads every byte already delivered, then the end of stream, so it runs
// every complete command it received, and the ToClient pump drains and drops
// its replies until it closes. A full close would instead draw a reset from
// the proxy's kernel at the server's first reply, and the server's kernel
// would discard the commands it had not read yet.
//
// Only the first call does anything; it increments a non-nil count before
// either side learns of the cut.
func (l *link) cut(count *atomic.Int64) {
	l.once.Do(func() {
		if count != nil {
			count.Add(1)
		}
		close(l.cutCh)
		reset(l.client)
		// A write in progress ends now, possibly partway: the server
		// drops a partial command with the connection.
		l.server.SetWriteDeadline(time.Unix(1, 0))
		l.server.CloseWrite() // An error means the server side is gone already.
	})
}

// isCut reports whether the link has been cut.
func (l *link) isCut() bool {
	select {
	case <-l.cutCh:
		return true
	default:
		return false
	}
}

// close closes both sides, once both directions have ended.
func (l *link) close() {
	l.client.Close()
	l.server.Close()
}

// pump copies one direction of l until its source ends, either side fails,
// or the link is cut. At the source's end of stream it half-closes the
// destination, passing the EOF on, and leaves the other direction running.
// After a cut, the ToClient pump drains the server until it closes.
func (p *Proxy) pump(l *link, dir Direction) {
	src, dst := l.client, l.server
	if dir == ToClient {
		src, dst = l.server, l.client
	}
	buf := make([]byte, bufSize)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.forward(l, dir, dst, buf[:n]) {
			break
		}
		if errors.Is(err, io.EOF) && !l.isCut() {
			dst.CloseWrite() // An error means dst is gone: nothing to pass on.
			return
		}
		if err != nil {
			// A reset from either end, or a close by cut or Close: end
			// the other direction as well.
			l.cut(nil)
			return
		}
	}
	if dir == ToClient {
		for {
			if _, err := l.server.Read(buf); err != nil {
				return // EOF once the server has run what it got; or Close.
			}
		}
	}
}

// forward writes b to dst once the gate lets traffic through and the CutAfter
// budget allows it. It reports whether the pump should go on.
func (p *Proxy) forward(l *link, dir Direction, dst *net.TCPConn, b []byte) bool {
	p.held.Add(int64(len(b)))
	pass := p.gate.wait(l.cutCh, p.done)
	p.held.Add(-int64(len(b))) // Before the write, so that a reply never finds b still counted.
	if !pass {
		return false // Cut or closed while held: the held bytes are dropped.
	}
	allowed, fire := p.reserve(dir, len(b))
	if allowed > 0 {
		n, err := dst.Write(b[:allowed])
		p.counter(dir).Add(int64(n))
		if err != nil && !fire {
			l.cut(nil)
			return false
		}
	}
	if fire {
		p.fire()
		return false
	}
	if allowed < len(b) {
		// Another link exhausted the budget and is cutting every link.
		l.cut(nil)
		return false
	}
	return true
}

// counter returns the byte counter of dir.
func (p *Proxy) counter(dir Direction) *atomic.Int64 {
	if dir == ToServer {
		return &p.toServer
	}
	return &p.toClient
}

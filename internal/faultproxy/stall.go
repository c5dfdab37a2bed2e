package faultproxy

import (
	"sync"
	"time"
)

// gate holds traffic while a stall or pause is in force. Its zero value lets
// traffic through.
type gate struct {
	mu    sync.Mutex
	held  chan struct{} // non-nil while traffic is held; closed on resume
	timer *time.Timer   // ends the current stall; nil for a pause
	gen   uint64        // bumped by every change, so that a stale timer does nothing
}

// wait returns true once traffic may flow, or false if cut or done is closed
// first.
func (g *gate) wait(cut, done <-chan struct{}) bool {
	g.mu.Lock()
	held := g.held
	g.mu.Unlock()
	if held == nil {
		return true
	}
	select {
	case <-held:
		return true
	case <-cut:
		return false
	case <-done:
		return false
	}
}

// hold holds traffic until resume, or for d when d > 0. It replaces any
// earlier end of the hold.
func (g *gate) hold(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gen++
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	if g.held == nil {
		g.held = make(chan struct{})
	}
	if d > 0 {
		gen := g.gen
		g.timer = time.AfterFunc(d, func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.gen == gen {
				g.release()
			}
		})
	}
}

// resume lets traffic through again.
func (g *gate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.release()
}

// release ends the hold and cancels its timer. The caller holds g.mu.
func (g *gate) release() {
	g.gen++
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	if g.held != nil {
		close(g.held)
		g.held = nil
	}
}

// stop cancels the timer of a stall, for Close. Traffic stays held.
func (g *gate) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gen++
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
}

// Stall holds all traffic through the proxy, in both directions and on every
// connection, current and new, for d from now; then it flows again. Bytes are
// delayed, never dropped: the proxy keeps what it has read and the kernel
// buffers the rest, which pushes back on the sender once full. A stall may
// last any time, longer than a lease TTL or a client timeout; the client sees
// only silence. Stall replaces the end of any stall or pause in force, so
// Stall(d) during a Pause ends it after d. Stall with d <= 0 is Resume.
//
// Bytes already written to the kernel before the call may still arrive, and
// a chunk the proxy is writing at that moment completes.
func (p *Proxy) Stall(d time.Duration) {
	if d <= 0 {
		p.Resume()
		return
	}
	p.gate.hold(d)
}

// Pause holds all traffic, as Stall does, until Resume (or Heal, or a later
// Stall's end).
func (p *Proxy) Pause() { p.gate.hold(0) }

// Resume ends a stall or pause at once: the held bytes are delivered, in
// order. Resume without a stall or pause does nothing.
func (p *Proxy) Resume() { p.gate.resume() }

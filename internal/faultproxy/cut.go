package faultproxy

// trip is an armed CutAfter. Its zero value is disarmed.
type trip struct {
	dir    Direction // 0: disarmed
	left   int64     // bytes still allowed in dir
	firing bool      // the budget is spent and the cut is under way
}

// CutAll cuts every open connection now: the client's side is reset, the
// server's side is closed normally, so the server still runs every command
// it has received in full. Bytes the proxy holds (during a stall) are
// dropped. New connections are still accepted, so a client that reconnects
// works again (unless Refuse is in force).
func (p *Proxy) CutAll() {
	p.mu.Lock()
	links := p.snapshot()
	p.mu.Unlock()
	for _, l := range links {
		l.cut(&p.cut)
	}
}

// CutAfter arms a one-shot cut: the proxy forwards n more bytes in direction
// dir, counted over all connections together, then cuts every connection as
// CutAll does, and disarms. The byte that would exceed the budget is never
// delivered, and neither is anything else from the moment the budget is spent
// until the cut is done. Traffic in the other direction is not counted.
//
// CutAfter(ToServer, n) makes a large write fail partway: the server gets
// (and runs) only the commands wholly within the first n bytes, and a partial
// command that it discards with the connection. CutAfter(ToClient, 0) loses
// the next reply: the server runs the command, and the client sees a reset
// instead of the answer, the ambiguous outcome of a real network failure.
//
// Beware that an idle rueidis client sends a PING every
// rueidis.ClientOption.Dialer.KeepAlive (1 s by default), whose bytes count
// too; set Dialer.KeepAlive to -1 in tests that need exact byte counts.
//
// A later CutAfter replaces an armed one; n < 0 disarms it, as Heal does.
func (p *Proxy) CutAfter(dir Direction, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n < 0 {
		p.trip = trip{}
		return
	}
	p.trip = trip{dir: dir, left: n}
}

// reserve takes up to n bytes in direction dir from the CutAfter budget. It
// returns how many bytes the caller may write, and fire = true when the caller
// spent the budget and must cut every link after writing them.
func (p *Proxy) reserve(dir Direction, n int) (allowed int, fire bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := &p.trip
	switch {
	case t.firing:
		return 0, false
	case t.dir != dir:
		return n, false
	case t.left > int64(n):
		t.left -= int64(n)
		return n, false
	}
	allowed = int(t.left)
	t.left = 0
	t.firing = true
	return allowed, true
}

// fire cuts every link for a spent CutAfter budget, then disarms it.
func (p *Proxy) fire() {
	p.CutAll()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trip.firing { // Heal or a new CutAfter may have replaced it.
		p.trip = trip{}
	}
}

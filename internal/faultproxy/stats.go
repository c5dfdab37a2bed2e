package faultproxy

// Stats counts what went through a proxy since New.
type Stats struct {
	// Accepted counts the connections accepted from clients, refused ones
	// included.
	Accepted int64
	// Refused counts the connections reset at once because Refuse was in
	// force.
	Refused int64
	// DialErrors counts the connections reset because the proxy could not
	// connect to the target, or because SetTarget replaced the target while
	// the proxy was connecting to it.
	DialErrors int64
	// Cut counts the connections cut by CutAll or CutAfter. Connections
	// closed by Close, or by either end, are not counted.
	Cut int64
	// Open is the number of connections not yet closed on both sides. A cut
	// connection counts until the server has closed its side, which it does
	// once it has read everything delivered to it.
	Open int64
	// ToServer counts the bytes delivered from clients to the target.
	ToServer int64
	// ToClient counts the bytes delivered from the target to clients.
	ToClient int64
	// Held is the number of bytes the proxy has read and is holding back
	// because of a stall or pause (the kernel buffers may hold more), so
	// that a test can wait until a command has reached the proxy. Without a
	// stall it is nonzero only fleetingly.
	Held int64
}

// Stats returns the proxy's counters. Counters are read one by one, so under
// traffic they may be from slightly different moments.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	open := int64(len(p.links))
	p.mu.Unlock()
	return Stats{
		Accepted:   p.accepted.Load(),
		Refused:    p.refused.Load(),
		DialErrors: p.dialErrors.Load(),
		Cut:        p.cut.Load(),
		Open:       open,
		ToServer:   p.toServer.Load(),
		ToClient:   p.toClient.Load(),
		Held:       p.held.Load(),
	}
}

// add returns the sum of s and o, field by field.
func (s Stats) add(o Stats) Stats {
	return Stats{
		Accepted:   s.Accepted + o.Accepted,
		Refused:    s.Refused + o.Refused,
		DialErrors: s.DialErrors + o.DialErrors,
		Cut:        s.Cut + o.Cut,
		Open:       s.Open + o.Open,
		ToServer:   s.ToServer + o.ToServer,
		ToClient:   s.ToClient + o.ToClient,
		Held:       s.Held + o.Held,
	}
}

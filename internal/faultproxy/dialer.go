package faultproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"time"
)

// Dialer routes every connection a client makes through a [Proxy] for its
// destination, creating one Proxy per destination address on first use. Its
// Dial method has the signature of rueidis.ClientOption.DialCtxFn:
//
//	var d faultproxy.Dialer
//	defer d.Close()
//	client, err := rueidis.NewClient(rueidis.ClientOption{
//		InitAddress: cluster.Addrs,
//		DialCtxFn:   d.Dial,
//	})
//
// A cluster client dials the addresses it learns from CLUSTER SLOTS, and each
// of them passes a Proxy too, so a Dialer covers a cluster where a single
// Proxy cannot. Faults apply to one node through [Dialer.Proxy], or to every
// node through the Dialer's own methods.
//
// The Dialer's fault methods act on the proxies that exist when they are
// called; a proxy created later starts without faults. Create the proxies up
// front with Dialer.Proxy, for every node address, when that matters.
//
// The zero value is ready to use. A Dialer must not be copied after first
// use.
type Dialer struct {
	mu      sync.Mutex
	proxies map[string]*Proxy
	closed  bool
}

// errDialerClosed is returned by Dial and Proxy after Close.
var errDialerClosed = errors.New("faultproxy: dialer closed")

// Proxy returns the Proxy in front of target, a "host:port" address, creating
// it on first use. The address must be spelled as the client spells it (as in
// InitAddress or CLUSTER SLOTS), for instance "127.0.0.1:7000". Proxy returns
// an error after Close, or when the proxy cannot listen.
func (d *Dialer) Proxy(target string) (*Proxy, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errDialerClosed
	}
	if p, ok := d.proxies[target]; ok {
		return p, nil
	}
	p, err := New(target)
	if err != nil {
		return nil, err
	}
	if d.proxies == nil {
		d.proxies = map[string]*Proxy{}
	}
	d.proxies[target] = p
	return p, nil
}

// Dial connects to dst through its Proxy. It has the signature of
// rueidis.ClientOption.DialCtxFn: dialer (which may be nil) makes the TCP
// connection to the proxy, with its timeout and keep-alive, and a non-nil
// tlsConfig wraps it in TLS, addressed to dst's host unless it names a
// server.
func (d *Dialer) Dial(ctx context.Context, dst string, dialer *net.Dialer, tlsConfig *tls.Config) (net.Conn, error) {
	p, err := d.Proxy(dst)
	if err != nil {
		return nil, err
	}
	if dialer == nil {
		dialer = &net.Dialer{}
	}
	conn, err := dialer.DialContext(ctx, "tcp", p.Addr())
	if err != nil {
		return nil, fmt.Errorf("faultproxy: dial %s through %s: %w", dst, p.Addr(), err)
	}
	if tlsConfig == nil {
		return conn, nil
	}
	cfg := tlsConfig
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(dst)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("faultproxy: dial %s: %w", dst, err)
		}
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("faultproxy: TLS handshake with %s: %w", dst, err)
	}
	return tc, nil
}

// Proxies returns the proxies created so far, sorted by target.
func (d *Dialer) Proxies() []*Proxy {
	d.mu.Lock()
	defer d.mu.Unlock()
	targets := slices.Sorted(maps.Keys(d.proxies))
	out := make([]*Proxy, len(targets))
	for i, t := range targets {
		out[i] = d.proxies[t]
	}
	return out
}

// CutAll cuts every open connection of every proxy, as [Proxy.CutAll] does.
func (d *Dialer) CutAll() { d.each((*Proxy).CutAll) }

// Stall stalls every proxy for dur, as [Proxy.Stall] does.
func (d *Dialer) Stall(dur time.Duration) { d.each(func(p *Proxy) { p.Stall(dur) }) }

// Pause holds the traffic of every proxy until Resume, as [Proxy.Pause]
// does.
func (d *Dialer) Pause() { d.each((*Proxy).Pause) }

// Resume ends a stall or pause on every proxy, as [Proxy.Resume] does.
func (d *Dialer) Resume() { d.each((*Proxy).Resume) }

// Refuse makes every proxy refuse new connections while refuse is true, as
// [Proxy.Refuse] does.
func (d *Dialer) Refuse(refuse bool) { d.each(func(p *Proxy) { p.Refuse(refuse) }) }

// Heal ends every fault still in force on every proxy, as [Proxy.Heal] does.
func (d *Dialer) Heal() { d.each((*Proxy).Heal) }

// Stats returns the sum of every proxy's Stats.
func (d *Dialer) Stats() Stats {
	var s Stats
	for _, p := range d.Proxies() {
		s = s.add(p.Stats())
	}
	return s
}

// Close closes every proxy, as [Proxy.Close] does, and makes later Dial and
// Proxy calls fail. Close is idempotent.
func (d *Dialer) Close() error {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	var errs []error
	for _, p := range d.Proxies() {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// each calls f on every proxy, in the order of Proxies.
func (d *Dialer) each(f func(*Proxy)) {
	for _, p := range d.Proxies() {
		f(p)
	}
}

package replication

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

const (
	// replTimeout is both servers' repl-timeout in seconds, Redis's default,
	// set explicitly because stalls depend on it: a side drops the link once
	// it has heard nothing over it for this long (and up to 2 s more, as
	// Redis compares whole seconds, once a second).
	replTimeout = "60"
	// syncTimeout bounds WaitSync, and the wait for the first sync in Start.
	syncTimeout = 20 * time.Second
	// pollInterval is the pause between two probes of WaitSync.
	pollInterval = 10 * time.Millisecond
	// callTimeout bounds one admin command such as REPLICAOF NO ONE.
	callTimeout = 10 * time.Second
)

// Pair is a master and one asynchronous replica, each a redistest.Server of
// the test's own, with two fault proxies. The replica replicates through
// Link, so that a test can stall or cut the replication link while both
// processes run; clients reach the master through Front, which Failover
// re-points to the promoted replica.
type Pair struct {
	// Master is the master, as started. After Failover it is killed (its
	// directory is kept, so Restart would bring it back, empty, as a second
	// master).
	Master *redistest.Server
	// Replica is the replica, started with --replicaof Link's address. After
	// Failover it is the master.
	Replica *redistest.Server
	// Link is the proxy that carries the replication link, both ways: the
	// stream of writes to the replica and its REPLCONF ACKs back, which WAIT
	// counts. Link.Pause (or Stall) holds both until Link.Resume; a stall
	// shorter than the servers' repl-timeout (60 s) leaves the link up, and
	// the replica then receives every held write, in order. Link.CutAll
	// breaks it; the replica reconnects within about a second and catches
	// up with a partial resync. Do not Close Link: the Pair closes it when
	// the test ends.
	Link *faultproxy.Proxy
	// Front is the proxy in front of whichever server is the master, for
	// clients (see Client). Do not Close it either.
	Front *faultproxy.Proxy

	master, replica rueidis.Client // admin clients, direct to each server

	mu         sync.Mutex
	failedOver bool
}

// Start starts a master and a replica of it, on free loopback ports, with the
// replica's link through a new proxy (Link) and a proxy for clients in front
// of the master (Front), and waits until the replica is in sync. The args are
// appended to both servers' command lines, after the Pair's own, which they
// override: Start(tb, "--repl-timeout", "5") makes both sides give up on a
// stalled link after 5 seconds.
//
// The master runs with --repl-diskless-sync-delay 0 (Redis waits 5 s by
// default for more replicas before a full sync) and without a limit on the
// output buffer for its replica (--client-output-buffer-limit "replica 0 0
// 0"), so that writes piling up behind a stall never make it drop the link
// (by default it does at 256 MB, or at 64 MB for a minute). The replica
// runs with --repl-diskless-load disabled: it receives a full sync into a
// file, and keeps answering clients meanwhile, where a diskless load would
// block it for as long as a stalled transfer lasts. Both run with
// --repl-timeout 60 and --shutdown-on-sigterm now (a master stopped with a
// lagging replica would otherwise wait for it, up to shutdown-timeout, 10 s).
//
// Everything started is stopped, and its directories removed, when tb's test
// ends. Start calls tb.Fatal when a server does not start (for instance,
// when redis-server is not installed) or the replica is not in sync within
// 20 seconds.
func Start(tb testing.TB, args ...string) *Pair {
	tb.Helper()
	p := &Pair{}
	p.Master = redistest.OwnServer(tb, append(masterArgs(), args...)...)
	p.Link = ownProxy(tb, p.Master.Addr)
	p.Replica = redistest.OwnServer(tb, append(replicaArgs(p.Link.Addr()), args...)...)
	p.Front = ownProxy(tb, p.Master.Addr)
	p.master, p.replica = p.Master.Client(tb), p.Replica.Client(tb)
	if err := p.WaitSync(tb.Context()); err != nil {
		tb.Fatal(err)
	}
	return p
}

// masterArgs returns the master's command-line arguments.
func masterArgs() []string {
	return []string{
		"--repl-diskless-sync", "yes",
		"--repl-diskless-sync-delay", "0",
		"--client-output-buffer-limit", "replica 0 0 0",
		"--repl-timeout", replTimeout,
		"--shutdown-on-sigterm", "now",
	}
}

// replicaArgs returns the command-line arguments of a replica of the master
// at addr.
func replicaArgs(addr string) []string {
	host, port, _ := net.SplitHostPort(addr) // addr is a proxy's, "127.0.0.1:port".
	return []string{
		"--replicaof", host, port,
		"--repl-diskless-load", "disabled",
		"--repl-timeout", replTimeout,
		"--shutdown-on-sigterm", "now",
	}
}

// ownProxy starts a proxy to target, closed when tb's test ends.
func ownProxy(tb testing.TB, target string) *faultproxy.Proxy {
	tb.Helper()
	px, err := faultproxy.New(target)
	if err != nil {
		tb.Fatalf("replication: proxy to %s: %v", target, err)
	}
	tb.Cleanup(func() {
		if err := px.Close(); err != nil {
			tb.Error(err)
		}
	})
	return px
}

// Client returns a new rueidis client that connects through Front, with
// client-side caching disabled, closed when tb's test ends. It reaches the
// master, and after Failover, from its next connection on, the promoted
// replica. Client calls tb.Fatal when it cannot connect.
//
// Beware WAIT, which covers the writes made before the calling connection's
// previous command (see the package documentation): rueidis sends a lone
// WAIT, a blocking command, on a connection of a pool of its own, not on the
// one that carried the test's writes, so c.Do(ctx, WAIT) on a pooled
// connection last used before the writes returns 1 at once, even while Link
// is stalled. Send the writes and the WAIT in one c.DoMulti (rueidis sends a
// batch holding a blocking command on one connection, in order), or within
// c.Dedicated.
func (p *Pair) Client(tb testing.TB) rueidis.Client {
	tb.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{p.Front.Addr()},
		DisableCache:      true,
		ForceSingleClient: true,
	})
	if err != nil {
		tb.Fatalf("replication: connect through %s to %s: %v", p.Front.Addr(), p.Front.Target(), err)
	}
	tb.Cleanup(c.Close)
	return c
}

// WaitSync waits until the replica has applied every write the master had
// when WaitSync polled it: the master reports its replica online, the
// replica reports master_link_status:up, and the replica's slave_repl_offset
// has reached the master's master_repl_offset (both from INFO replication).
// It polls every 10 ms until ctx ends or 20 seconds pass, and then returns an
// error that says what was last out of sync and wraps context.Cause. After
// Failover it returns an error at once.
func (p *Pair) WaitSync(ctx context.Context) error {
	if p.isFailedOver() {
		return fmt.Errorf("replication: wait for sync: %s failed over to %s", p.Master.Addr, p.Replica.Addr)
	}
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	start := time.Now()
	var last error
	for {
		err := p.inSync(ctx)
		if err == nil {
			return nil
		}
		// A probe cut short by ctx's end says less than the one before it.
		// (rueidis may report the deadline before ctx.Err does.)
		if last == nil || !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replication: replica %s not in sync with master %s after %v: %v: %w",
				p.Replica.Addr, p.Master.Addr, time.Since(start).Round(time.Millisecond), last, context.Cause(ctx))
		case <-time.After(pollInterval):
		}
	}
}

// inSync returns why the replica is not in sync yet, or nil when it is. It
// reads the master first, so that a replica that has reached the master's
// offset has every write the master had then.
func (p *Pair) inSync(ctx context.Context) error {
	m, err := replicationInfo(ctx, p.master)
	if err != nil {
		return fmt.Errorf("master: %w", err)
	}
	if m["connected_slaves"] != "1" || !strings.Contains(m["slave0"], ",state=online,") {
		return fmt.Errorf("master: no online replica (connected_slaves:%s, slave0:%s)", m["connected_slaves"], m["slave0"])
	}
	r, err := replicationInfo(ctx, p.replica)
	if err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	if r["master_link_status"] != "up" {
		return fmt.Errorf("replica: master_link_status:%s", r["master_link_status"])
	}
	mo, err := strconv.ParseInt(m["master_repl_offset"], 10, 64)
	if err != nil {
		return fmt.Errorf("master: master_repl_offset %q: %w", m["master_repl_offset"], err)
	}
	ro, err := strconv.ParseInt(r["slave_repl_offset"], 10, 64)
	if err != nil {
		return fmt.Errorf("replica: slave_repl_offset %q: %w", r["slave_repl_offset"], err)
	}
	if ro < mo {
		return fmt.Errorf("replica at offset %d, master at %d", ro, mo)
	}
	return nil
}

// replicationInfo returns the fields of INFO replication on c.
func replicationInfo(ctx context.Context, c rueidis.Client) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return redistest.Info(ctx, c, "replication")
}

// isFailedOver reports whether Failover has been called.
func (p *Pair) isFailedOver() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failedOver
}

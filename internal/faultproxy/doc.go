// Package faultproxy injects network faults between a Redis client and a
// redis-server, for tests. A [Proxy] is a loopback TCP proxy in front of one
// server; a [Dialer] puts a Proxy in front of every server a client dials,
// which is how a cluster client is covered.
//
// A test points its client at [Proxy.Addr] (or sets
// rueidis.ClientOption.DialCtxFn to [Dialer.Dial]), then, at the moment of
// its choosing, makes the network fail:
//
//   - [Proxy.CutAll] cuts every open connection at once. The client gets a
//     TCP reset; new connections are still accepted, so a client that
//     reconnects works again.
//   - [Proxy.CutAfter] lets exactly n more bytes through in one direction,
//     then cuts every connection. CutAfter(ToServer, n) makes a large write
//     fail partway; CutAfter(ToClient, 0) lets the server run the next
//     command but loses its reply.
//   - [Proxy.Stall] holds all traffic, both ways, for a duration; [Proxy.Pause]
//     holds it until [Proxy.Resume]. Held bytes are delayed, never dropped.
//   - [Proxy.Refuse] resets every new connection as soon as it is accepted,
//     as a server that is down would.
//   - [Proxy.Heal] undoes every fault that is still in force.
//
// [Proxy.SetTarget] re-points the proxy: new connections go to another
// server, as they would to a replica promoted after a failover, while the
// client keeps the same address. With [Proxy.CutAll] after it, every client
// reconnects to the new target.
//
// [Proxy.Stats] counts connections and bytes, so that a test can check that a
// fault happened where it meant it to.
//
// # What the client observes
//
// A cut closes the client's side with a TCP reset (SO_LINGER 0): the client's
// next read or write fails with "connection reset by peer" (ECONNRESET); the
// operations after that one see EOF or "broken pipe" (EPIPE), so a client
// with a reader and a writer goroutine, as rueidis has, may report any of the
// three. The server's side is half-closed (FIN) and drained, so the server
// still runs every complete command whose bytes the proxy delivered before
// the cut, and drops a partial one. It does so after the client has seen the
// reset: wait until [Stats].Open falls before checking the server's state.
// Bytes the proxy held back (by a stall, or beyond a CutAfter budget) are
// discarded with the connection.
//
// A stall gives the client no signal at all: its writes are accepted (until
// the kernel buffers fill) and its reads block, exactly as on a network that
// has gone silent. When the stall ends the held bytes are delivered, in order
// on each connection (but not across connections), including bytes the
// client sent just before it gave up and closed the connection, as a real
// network delivers segments already in flight: a command that timed out on
// the client may still run on the server.
//
// A refused connection is accepted and reset at once: the client's connect
// fails with ECONNRESET, or, when the reset comes a moment later, its first
// read or write does. The same happens when the proxy cannot reach its
// target (a killed server): clients see a reset, not "connection refused".
//
// When the target server itself goes away (redistest.Server.Kill), the proxy
// passes the end of stream on: the client reads EOF.
//
// # Clusters
//
// A cluster client learns node addresses from CLUSTER SLOTS, so a Proxy in
// front of one node does not see the traffic the client sends to the nodes
// it discovers. Use a [Dialer] instead: it creates one Proxy per destination
// address and dials through it, so every connection of any client passes a
// Proxy that the test controls, one node at a time ([Dialer.Proxy]) or all
// at once.
//
// # Lifecycle
//
// [New] starts listening at once. [Proxy.Close] closes the listener and every
// connection, and returns only after every goroutine of the Proxy has ended.
// A Dialer's zero value is ready to use; [Dialer.Close] closes every Proxy it
// created.
//
// # Concurrency
//
// Every method of Proxy and Dialer is safe for concurrent use.
package faultproxy

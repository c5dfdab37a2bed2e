// Package replication starts a Redis master with one asynchronous replica
// for tests, with the replication link through a fault proxy, so that a test
// can stall the link, count acknowledgements with WAIT, and fail the master
// over to the replica:
//
//	p := replication.Start(t)
//	c := p.Client(t)             // reaches the master, through p.Front
//	... write, then p.WaitSync(ctx): the replica has it all
//	p.Link.Pause()               // the replica hears nothing more
//	... write: the master acknowledges, the replica never gets it
//	promoted, err := p.Failover(ctx)
//	... c now reaches promoted, which has only what was replicated
//
// It is a package of its own, not part of redistest, because faultproxy's
// tests use redistest: redistest cannot import faultproxy.
//
// # What the servers do
//
// With redis-server 7.0.15, a stalled link goes unnoticed by both sides for
// repl-timeout (60 s here, Redis's default): until then the master keeps the
// replica "online" in INFO replication (its lag grows), the replica keeps
// master_link_status:up, and both keep running and answering clients. Each
// side checks once a second and drops the link when it has heard nothing
// for more than repl-timeout seconds: with --repl-timeout 2 both had dropped
// it 3 s into a stall, with 3 the master after 3 to 4 s and the replica
// after 4 to 5 s. When the stall ends before that, the replica receives
// every held write, in order, and acknowledges it; when it ends after, the
// replica reconnects and catches up with a partial resync. Start's args can
// shorten repl-timeout.
//
// WAIT n timeout counts the replicas that have acknowledged the master's
// replication offset as it was after the calling connection's previous
// command. In redis-server 7.0.15 that is any command, not only a write: a
// connection that has written nothing, but ran a PING after another
// connection's write, waits for that write too, and a connection whose
// previous command came before the write does not. During a stall WAIT 1
// returns 0 after timeout milliseconds; after [faultproxy.Proxy.Resume] it
// returns 1 as soon as the replica has caught up and acknowledged (the
// master asks for an acknowledgement when a client blocks in WAIT). With
// rueidis, send WAIT on the connection that carried the writes
// ([Pair.Client] says how).
//
// # Lifecycle
//
// [Start] returns once the replica is in sync, and stops both servers and
// closes both proxies when the test ends. [Pair.Failover] kills the master
// and promotes the replica; it can be called once.
//
// # Errors
//
// Start calls tb.Fatal, as redistest.OwnServer does: a missing redis-server
// fails the test, it never skips it. [Pair.WaitSync] and [Pair.Failover]
// return errors that name the server and the step that failed.
//
// # Concurrency
//
// The methods of [Pair] are safe for concurrent use, and so are the clients
// and proxies it holds.
package replication

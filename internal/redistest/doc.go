// Package redistest starts real redis-server processes for tests: a
// standalone [Server] or a Redis Cluster of masters ([Cluster]), each on free
// loopback ports chosen at start time. It never touches a Redis that it did not
// start.
//
// A test package usually starts one [Env] for all its tests:
//
//	var env *redistest.Env
//
//	func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }
//
// Tests then share env.Standalone and env.Cluster, and isolate their keys by
// [Prefix] instead of FLUSHDB, so that they can run in parallel. A test that
// kills, pauses or restarts a server starts its own with [StartServer].
//
// # Lifecycle
//
// [StartServer] and [StartCluster] return once every process answers PING
// (and, for a cluster, once every node reports cluster_state:ok and all nodes
// agree on the slot map). Servers run with --save "" and --appendonly no, so
// their data does not survive [Server.Kill] or [Server.Restart]; a cluster
// node keeps its nodes.conf and rejoins its cluster. [Server.Stop] and
// [Cluster.Stop] end the processes by PID and remove their directories.
// Every process is started with a parent-death signal of SIGKILL, so servers
// die with the test binary even when it crashes.
//
// # Errors
//
// A missing redis-server or redis-cli binary is an error that says how to
// install it, never a skip: tests that need Redis fail without it. Errors
// from a server that fails to start include the tail of its log.
//
// # Concurrency
//
// The methods of [Server] and [Cluster] are safe for concurrent use. The
// clients they return are rueidis clients, which are safe for concurrent use
// too.
package redistest

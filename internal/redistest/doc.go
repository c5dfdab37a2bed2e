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
// unless a test persists it (see Persistence) their data does not survive
// [Server.Kill] or [Server.Restart]; a cluster node keeps its nodes.conf and
// rejoins its cluster. [Server.Stop] and [Cluster.Stop] end the processes by
// PID and remove their directories.
// Every process is started with a parent-death signal of SIGKILL, so servers
// die with the test binary even when it crashes.
//
// # Persistence
//
// [Server.Restart] starts a killed server again on the same port, in the
// same directory, so it loads whatever was persisted there:
//
//   - With the default arguments, --save "" only disables automatic
//     snapshots. A SAVE writes dump.rdb, and Restart loads it: keys written
//     before the SAVE are back, keys written after it are gone.
//   - A server started with
//     StartServer("--appendonly", "yes", "--appendfsync", "always") (later
//     arguments override the defaults) replays its append-only file, so
//     every write it acknowledged survives a kill. With --appendfsync
//     everysec a kill (SIGKILL, unlike a crash of the machine) loses nothing
//     either in practice, because Redis writes to the file, if not to the
//     disk, before it replies; but it may postpone that write by up to 2
//     seconds while an earlier fsync is slow, without holding the replies
//     back, so tests that must not lose an acknowledged write use always.
//
// A server writes no dump.rdb of its own: SIGKILL gives it no chance to save
// on shutdown, and with --save "" it would not save on SIGTERM either.
//
// # Replication and failover
//
// Package [github.com/keyswap/keyswap/internal/redistest/replication] starts
// a master with one asynchronous replica, each a [Server], with the
// replication link through a faultproxy.Proxy that a test can stall, and a
// second proxy for clients that failover re-points to the promoted replica.
// It is a package of its own because faultproxy's tests import redistest.
// [OwnClusterWithReplicas] starts a cluster whose masters each have one
// replica ([Cluster].Replicas), linked directly: a test stops one with
// [Server.Pause] to make WAIT on its master fall short.
//
// # Sentinel
//
// [StartSentinel] and [OwnSentinel] start a Redis Sentinel that monitors a
// server under a master set name, as redis-server in sentinel mode, with a
// configuration file of its own (a sentinel rewrites it). Clients reach it at
// its Addr, as any [Server].
//
// # ACL users and renamed commands
//
// [Server.ClientAs] creates an ACL user with the given rules and returns a
// client authenticated as it, to test what a minimally privileged deployment
// allows; its documentation says what rueidis itself needs to connect
// (nothing: "-@all" is enough). Commands are renamed or disabled with
// StartServer arguments, as in a redis.conf:
//
//	srv, err := redistest.StartServer("--rename-command", "RENAME", "")
//
// RENAME is then an unknown command. A server started with
// "--rename-command", "ROLE", "" stands for a node that cannot answer ROLE
// (an embedded or proxied Redis that lacks it), which keyswap's scans treat
// as a master. ACL rules keep naming a renamed command
// by its original name ("-flushall" also denies FLUSHALL renamed to
// "ks-flushall", and "-ks-flushall" is an error).
//
// # Test kit
//
// What the test suites of several packages share lives here, not in copies:
// the item type [User] and [Users]; the online model, a source of truth
// (a hash of users, read by [ReadTruth], seeded by [SeedTruth], read as a
// run's source by [TruthSource]), the application that changes it and
// applies each change ([App]), and the check that the indexes equal it
// ([OnlineIndexes], [WantOnline]); and the ACL rules of the Apply user
// ([ApplyRules]). This package is compiled into test binaries only; it adds
// no module to the library's go.mod.
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

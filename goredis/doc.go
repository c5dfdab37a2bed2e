// Package goredis turns a go-redis client's options into the rueidis
// options that reach the same Redis, so that an application that talks to
// Redis through go-redis gives keyswap a client of the same server, built
// from the same configuration. It is a module of its own,
// github.com/keyswap/keyswap/goredis, so that the keyswap library never
// brings go-redis into a module graph:
//
//	o, err := redis.ParseURL(os.Getenv("REDIS_URL")) // redis://user:pass@host:6379/2, rediss://…, unix://…
//	if err != nil {
//		return err
//	}
//	app := redis.NewClient(o)                                 // the application's client, as before
//	client, err := rueidis.NewClient(goredis.ClientOption(o)) // keyswap's: rebuild.New(client, …)
//
// [ClientOption] takes the options of redis.NewClient (one server),
// [ClusterClientOption] those of redis.NewClusterClient (Redis Cluster),
// [FailoverClientOption] those of redis.NewFailoverClient (a master that
// Redis Sentinel monitors), and [UniversalClientOption] those of
// redis.NewUniversalClient, which it sends to one of the three as
// NewUniversalClient chooses its client.
//
// # What is carried over
//
// The addresses (a unix socket's too), the network and a custom Dialer;
// the ACL user and password, or a CredentialsProviderContext or
// CredentialsProvider, in go-redis's order of preference; the database;
// the TLS configuration (a clone); the dial timeout; the client name;
// protocol 2 (RESP2); DisableIdentity, as rueidis's DisableClientSetInfo;
// MaxRetries -1, as DisableRetry; and for Sentinel the master set, the
// sentinels' user and password, which go-redis keeps apart from the
// master's.
//
// The rest tunes go-redis's connection pool, retries and timeouts, which
// rueidis does differently: it pipelines every caller's commands over a
// few connections per server instead of taking one per caller from a
// pool, and it bounds each call by its context. ReadTimeout and
// WriteTimeout in particular are not carried over: rueidis's closest
// setting, ConnWriteTimeout, also bounds the wait for a reply, and one of
// keyswap's publish scripts may run longer than a read timeout chosen for
// the application's commands. Settings that let go-redis read from
// replicas (ReadOnly, RouteByLatency, RouteRandomly, ReplicaOnly) are not
// carried over either: keyswap writes, and reads what it wrote, on the
// masters. OnConnect, Limiter, StreamingCredentialsProvider and go-redis's
// own client-side cache have no rueidis counterpart. Set rueidis's own
// settings on the result.
//
// # Client-side caching
//
// The result keeps rueidis's client-side caching on (rueidis.Client's
// DoCache), as rueidis.NewClient does by default, except with protocol 2,
// whose connections cannot carry it. rueidis then turns on CLIENT
// TRACKING on every connection. rueidis.NewClient fails with an error
// matching rueidis.ErrNoCache where that is refused: an ACL user without
// the right to run CLIENT TRACKING, a proxy that does not forward it, a
// server that speaks only RESP2. Set DisableCache on the result for such
// a deployment.
//
// # Sentinel
//
// The result of [FailoverClientOption] connects to the sentinels at
// o.SentinelAddrs, asks them for the master of o.MasterName, and follows
// it when they fail over (rueidis listens for +switch-master; set
// Sentinel.TopologyRefreshInterval on the result to also ask them
// periodically). go-redis logs in to the sentinels with SentinelUsername
// and SentinelPassword and to the master with Username and Password, and
// so does the result. A credentials provider, however, is what rueidis
// asks for every connection's login, the sentinels' included: with one,
// the sentinels must accept its credentials (or have no password).
//
// # Errors
//
// The functions never fail: what cannot work shows when rueidis.NewClient
// connects. Options without a MasterName give a client that refuses to
// connect, with an error that says so. A nil options pointer is a
// programmer's error and panics, as it does in go-redis.
package goredis

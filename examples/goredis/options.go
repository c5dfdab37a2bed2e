package main

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// ClientOption returns the rueidis options that reach the server o
// describes, as go-redis would: the address (a unix socket when o.Network
// is "unix"), the ACL user and password (or o's credentials provider), the
// database, TLS, the dial timeout, the client name and RESP2 when o asks for
// protocol 2. Copy it into your code next to the go-redis client's
// options, and parse the URL once:
//
//	o, err := redis.ParseURL(os.Getenv("REDIS_URL"))
//	app := redis.NewClient(o)                  // the application's client
//	ks, err := rueidis.NewClient(ClientOption(o)) // keyswap's
//
// The rest of o tunes go-redis's connection pool, retries and timeouts,
// which rueidis does differently: it pipelines every caller's commands over
// a few connections per server instead of pooling one per caller, and it
// bounds each call by its context rather than by ReadTimeout. A custom
// o.Dialer is not carried over (set rueidis's DialCtxFn to the same
// function). Like redis.NewClient, the result talks to one server
// (ForceSingleClient): for a cluster use [ClusterClientOption].
func ClientOption(o *redis.Options) rueidis.ClientOption {
	opt := common(o.Username, o.Password, o.CredentialsProvider, o.CredentialsProviderContext,
		o.TLSConfig, o.ClientName, o.Protocol, o.DialTimeout, o.WriteTimeout)
	opt.InitAddress = []string{o.Addr}
	opt.SelectDB = o.DB
	opt.ForceSingleClient = true
	if o.Network == "unix" {
		opt.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
			return d.DialContext(ctx, "unix", addr)
		}
	}
	return opt
}

// ClusterClientOption is [ClientOption] for the options of a
// redis.ClusterClient, as redis.ParseClusterURL returns them: every seed
// address, the user and password, TLS, the dial timeout, the client name
// and the protocol. o.ReadOnly, RouteByLatency and RouteRandomly, which let
// go-redis read from replicas, are not carried over: keyswap must read
// what it wrote, from the masters.
func ClusterClientOption(o *redis.ClusterOptions) rueidis.ClientOption {
	opt := common(o.Username, o.Password, o.CredentialsProvider, o.CredentialsProviderContext,
		o.TLSConfig, o.ClientName, o.Protocol, o.DialTimeout, o.WriteTimeout)
	opt.InitAddress = append([]string(nil), o.Addrs...)
	return opt
}

// common is what redis.Options and redis.ClusterOptions share.
func common(user, password string, creds func() (string, string), credsCtx func(context.Context) (string, string, error),
	tlsConfig *tls.Config, clientName string, protocol int, dialTimeout, writeTimeout time.Duration) rueidis.ClientOption {
	opt := rueidis.ClientOption{
		Username:   user,
		Password:   password,
		ClientName: clientName,
		// keyswap never reads through the client-side cache (DoCache), and
		// without it rueidis asks no server for CLIENT TRACKING, which an
		// ACL user or a proxy may refuse.
		DisableCache: true,
		AlwaysRESP2:  protocol == 2,
	}
	if tlsConfig != nil {
		opt.TLSConfig = tlsConfig.Clone()
	}
	// go-redis dials for 5 s when DialTimeout is zero, and rueidis too.
	if dialTimeout > 0 {
		opt.Dialer.Timeout = dialTimeout
	}
	if writeTimeout > 0 {
		opt.ConnWriteTimeout = writeTimeout
	}
	switch {
	case credsCtx != nil: // go-redis prefers it to CredentialsProvider
		opt.AuthCredentialsFn = func(rueidis.AuthCredentialsContext) (rueidis.AuthCredentials, error) {
			u, p, err := credsCtx(context.Background())
			return rueidis.AuthCredentials{Username: u, Password: p}, err
		}
	case creds != nil:
		opt.AuthCredentialsFn = func(rueidis.AuthCredentialsContext) (rueidis.AuthCredentials, error) {
			u, p := creds()
			return rueidis.AuthCredentials{Username: u, Password: p}, nil
		}
	}
	return opt
}

package goredis

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// ClientOption returns the rueidis options that reach the server that o
// describes, as redis.NewClient(o) would reach it: one server
// (ForceSingleClient), at o.Addr ("localhost:6379" when empty) over
// o.Network ("unix" when the address is a path, else "tcp"), with the
// settings the package documentation lists. o is only read.
//
// ClientOption panics if o is nil.
func ClientOption(o *redis.Options) rueidis.ClientOption {
	if o == nil {
		panic("keyswap: goredis.ClientOption: nil options")
	}
	// The defaults redis.NewClient fills in.
	addr, network := o.Addr, o.Network
	if addr == "" {
		addr = "localhost:6379"
	}
	if network == "" {
		network = "tcp"
		if strings.HasPrefix(addr, "/") {
			network = "unix"
		}
	}
	opt := common(shared{
		user: o.Username, password: o.Password, creds: o.CredentialsProvider, credsCtx: o.CredentialsProviderContext,
		tls: o.TLSConfig, clientName: o.ClientName, protocol: o.Protocol, dialTimeout: o.DialTimeout,
		//lint:ignore SA1019 go-redis still honours the misspelt field, so the result does too
		maxRetries: o.MaxRetries, noIdentity: o.DisableIdentity || o.DisableIndentity,
	})
	opt.InitAddress = []string{addr}
	opt.SelectDB = o.DB
	opt.ForceSingleClient = true
	opt.DialCtxFn = dialFn(o.Dialer, network)
	return opt
}

// ClusterClientOption returns the rueidis options that reach the Redis
// Cluster that o describes, as redis.NewClusterClient(o) would: o.Addrs are
// the seeds ("127.0.0.1:6379" when there are none, as in go-redis), with
// the settings the package documentation lists. o is only read.
//
// ClusterClientOption panics if o is nil.
func ClusterClientOption(o *redis.ClusterOptions) rueidis.ClientOption {
	if o == nil {
		panic("keyswap: goredis.ClusterClientOption: nil options")
	}
	opt := common(shared{
		user: o.Username, password: o.Password, creds: o.CredentialsProvider, credsCtx: o.CredentialsProviderContext,
		tls: o.TLSConfig, clientName: o.ClientName, protocol: o.Protocol, dialTimeout: o.DialTimeout,
		//lint:ignore SA1019 go-redis still honours the misspelt field, so the result does too
		maxRetries: o.MaxRetries, noIdentity: o.DisableIdentity || o.DisableIndentity,
	})
	opt.InitAddress = append([]string(nil), o.Addrs...)
	if len(opt.InitAddress) == 0 {
		opt.InitAddress = []string{"127.0.0.1:6379"}
	}
	opt.DialCtxFn = dialFn(o.Dialer, "tcp")
	return opt
}

// FailoverClientOption returns the rueidis options that reach the master
// that the Redis Sentinels at o.SentinelAddrs monitor as o.MasterName, as
// redis.NewFailoverClient(o) would: the sentinels are logged in to with
// o.SentinelUsername and o.SentinelPassword, the master with o.Username
// and o.Password, both over TLS when o.TLSConfig is set, with the settings
// the package documentation lists. o is only read.
//
// When o.MasterName is empty, the result's client fails to connect, with
// an error that says so: the sentinels are no server to write to.
// FailoverClientOption panics if o is nil.
func FailoverClientOption(o *redis.FailoverOptions) rueidis.ClientOption {
	if o == nil {
		panic("keyswap: goredis.FailoverClientOption: nil options")
	}
	opt := common(shared{
		user: o.Username, password: o.Password, creds: o.CredentialsProvider, credsCtx: o.CredentialsProviderContext,
		tls: o.TLSConfig, clientName: o.ClientName, protocol: o.Protocol, dialTimeout: o.DialTimeout,
		//lint:ignore SA1019 go-redis still honours the misspelt field, so the result does too
		maxRetries: o.MaxRetries, noIdentity: o.DisableIdentity || o.DisableIndentity,
	})
	opt.InitAddress = append([]string(nil), o.SentinelAddrs...)
	opt.SelectDB = o.DB
	opt.DialCtxFn = dialFn(o.Dialer, "tcp")
	opt.Sentinel = rueidis.SentinelOption{
		MasterSet:  o.MasterName,
		Username:   o.SentinelUsername,
		Password:   o.SentinelPassword,
		ClientName: o.ClientName,
		Dialer:     net.Dialer{Timeout: opt.Dialer.Timeout},
	}
	if o.TLSConfig != nil {
		opt.Sentinel.TLSConfig = o.TLSConfig.Clone()
	}
	if o.MasterName == "" {
		// Without a master set, rueidis would take the sentinels for
		// servers.
		opt.DialCtxFn = func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
			return nil, errNoMasterName
		}
	}
	return opt
}

// errNoMasterName is the connection error of FailoverClientOption's result
// when its options name no master.
var errNoMasterName = errors.New("keyswap: goredis.FailoverClientOption: FailoverOptions.MasterName is empty: name the master that the sentinels monitor")

// UniversalClientOption returns the rueidis options for the client that
// redis.NewUniversalClient(o) would make: with o.MasterName, those of
// FailoverClientOption(o.Failover()) (keyswap writes, so a failover
// cluster client's replicas are not used either); else, with several
// addresses or o.IsClusterMode, those of ClusterClientOption(o.Cluster());
// else those of ClientOption(o.Simple()). Like those methods, it sets
// o.Addrs to go-redis's default when it is empty.
//
// UniversalClientOption panics if o is nil.
func UniversalClientOption(o *redis.UniversalOptions) rueidis.ClientOption {
	if o == nil {
		panic("keyswap: goredis.UniversalClientOption: nil options")
	}
	switch {
	case o.MasterName != "":
		return FailoverClientOption(o.Failover())
	case len(o.Addrs) > 1 || o.IsClusterMode:
		return ClusterClientOption(o.Cluster())
	}
	return ClientOption(o.Simple())
}

// shared is what the options of every kind of go-redis client carry over
// alike.
type shared struct {
	user, password string
	creds          func() (string, string)
	credsCtx       func(context.Context) (string, string, error)
	tls            *tls.Config
	clientName     string
	protocol       int
	dialTimeout    time.Duration
	maxRetries     int
	noIdentity     bool
}

// common returns the rueidis options that s gives.
func common(s shared) rueidis.ClientOption {
	opt := rueidis.ClientOption{
		Username:   s.user,
		Password:   s.password,
		ClientName: s.clientName,
	}
	if s.protocol == 2 {
		// Client-side caching needs RESP3: rueidis refuses to connect with
		// it on over RESP2.
		opt.AlwaysRESP2, opt.DisableCache = true, true
	}
	if s.tls != nil {
		opt.TLSConfig = s.tls.Clone()
	}
	// go-redis dials for 5 s when DialTimeout is zero, and rueidis too.
	if s.dialTimeout > 0 {
		opt.Dialer.Timeout = s.dialTimeout
	}
	if s.maxRetries == -1 { // go-redis's "no retries"; 0 means its default, 3
		opt.DisableRetry = true
	}
	if s.noIdentity {
		opt.ClientSetInfo = rueidis.DisableClientSetInfo
	}
	switch {
	case s.credsCtx != nil: // go-redis prefers it to CredentialsProvider
		opt.AuthCredentialsFn = func(rueidis.AuthCredentialsContext) (rueidis.AuthCredentials, error) {
			u, p, err := s.credsCtx(context.Background())
			return rueidis.AuthCredentials{Username: u, Password: p}, err
		}
	case s.creds != nil:
		opt.AuthCredentialsFn = func(rueidis.AuthCredentialsContext) (rueidis.AuthCredentials, error) {
			u, p := s.creds()
			return rueidis.AuthCredentials{Username: u, Password: p}, nil
		}
	}
	return opt
}

// dialFn returns the rueidis DialCtxFn that dials as go-redis would, with
// its Dialer custom (nil for none) over network: custom itself, which then
// does TLS too, as in go-redis; nil, rueidis's own dialer, for TCP; else a
// dialer of network, with TLS when the connection has it.
func dialFn(custom func(ctx context.Context, network, addr string) (net.Conn, error), network string) func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	switch {
	case custom != nil:
		return func(ctx context.Context, addr string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
			return custom(ctx, network, addr)
		}
	case network == "tcp":
		return nil
	}
	return func(ctx context.Context, addr string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
		if cfg == nil {
			return d.DialContext(ctx, network, addr)
		}
		return (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, network, addr)
	}
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/redis/rueidis"
)

// connUsage describes the connection flags, in every command's help.
const connUsage = `Connecting, as redis-cli does:

  - Where: -u URL (or -redis URL), else $REDIS_URL, else
    redis://127.0.0.1:6379. A URL may be redis://host:port/db,
    rediss://host:port for TLS, unix:///path/to/redis.sock (or the path
    alone) for a unix socket, or host:port. Several URLs (repeat -u, or
    separate them with commas) are seeds of one Redis Cluster; one seed
    finds the whole cluster too. redis://sentinel:26379?master_set=NAME
    reaches the master that Redis Sentinel monitors as NAME (the URLs are
    then the sentinels', which are asked without AUTH). A connection attempt
    times out after 3s (the URL parameter dial_timeout=10s changes that).
  - Who: --user NAME, else the URL's user, else "default".
  - The password, the first of: the one typed at the prompt of --askpass
    (read from the terminal without echo), the URL's, $KEYSWAP_PASSWORD,
    $REDISCLI_AUTH. Other users of the machine can read a password given
    in a -u or -redis URL in the process list: keyswap warns about it
    (--no-auth-warning silences that).
  - TLS: --tls or a rediss:// URL. The server's certificate is verified
    against the system's CAs, or --cacert's, and against the host each
    server is reached at, or --sni's name; --insecure skips the check.
    --cert and --key give a client certificate to a server that asks for
    one.`

// connFlags are the connection flags, the same for every command that
// talks to Redis: a command defines them with addConnFlags and connects with
// c.connect.
type connFlags struct {
	urls          urlList
	user          string
	askpass       bool
	noAuthWarning bool
	tls           tlsFlags
}

// addConnFlags defines the connection flags on fs.
func addConnFlags(fs *flag.FlagSet) *connFlags {
	f := &connFlags{}
	fs.Var(urlFlag{list: &f.urls, name: "redis"}, "redis", "Redis `URL`: redis://[user[:password]@]host[:port][/db], rediss:// for TLS,\n"+
		"unix://[user[:password]@]/path/to/socket[?db=N] or a socket's absolute path, or host:port.\n"+
		"Repeat the flag or separate URLs with commas to give several seeds of a cluster.\n"+
		"Add ?master_set=NAME to reach the master that Redis Sentinel monitors as NAME:\n"+
		"the addresses are then the sentinels'. (default $REDIS_URL, else "+defaultRedisURL+")")
	fs.Var(urlFlag{list: &f.urls, name: "u"}, "u", "Redis `URL`: the same as -redis, as in redis-cli")
	fs.StringVar(&f.user, "user", "", "the ACL user `name` to log in as, instead of the URL's (default: the URL's, else \"default\")")
	fs.BoolVar(&f.askpass, "askpass", false, "ask for the password on the terminal, without echo; it overrides every other password")
	fs.BoolVar(&f.noAuthWarning, "no-auth-warning", false, "do not warn when a -u or -redis URL on the command line holds a password")
	f.tls.add(fs)
	return f
}

// connFlagNames returns the names of the connection flags.
func connFlagNames() map[string]bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	addConnFlags(fs)
	names := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	return names
}

// target is where and how to connect, with where the password came from,
// for the messages.
type target struct {
	opt          rueidis.ClientOption
	passwordFrom string // "" when there is no password
}

// connect returns a client for the connection flags f. It returns a
// *usageError for a bad flag or URL, and otherwise an error that says whether
// the login failed or Redis could not be reached (see connectError).
func (c *cli) connect(ctx context.Context, f *connFlags) (rueidis.Client, error) {
	t, err := c.target(ctx, f)
	if err != nil {
		return nil, err
	}
	// rueidis.NewClient connects at once, to a standalone server or, when
	// the server answers CLUSTER SLOTS, to the whole cluster.
	client, err := rueidis.NewClient(t.opt)
	if err != nil {
		return nil, connectError(err, t)
	}
	return client, nil
}

// target turns the connection flags into client options.
func (c *cli) target(ctx context.Context, f *connFlags) (target, error) {
	urls, from := c.redisURLs(f.urls)
	opt, err := parseURLs(urls)
	if err != nil {
		return target{}, &usageError{err: fmt.Errorf("%s: %w", from, err)}
	}
	if opt.TLSConfig, err = f.tls.config(opt); err != nil {
		return target{}, &usageError{err: err}
	}
	if f.user != "" {
		opt.Username = f.user
	}
	// The sentinels, if any, are reached as the master is, with the same
	// TLS settings and dial timeout, but without AUTH.
	opt.Sentinel.TLSConfig = opt.TLSConfig
	opt.Sentinel.Dialer.Timeout = opt.Dialer.Timeout
	t := target{opt: opt}
	if t.opt.Password, t.passwordFrom, err = c.password(ctx, f, opt, from); err != nil {
		return target{}, err
	}
	return t, nil
}

// connectError describes err, the error of a connection to t: a refused
// login (WRONGPASS, NOAUTH), a user that may not run the commands of a
// connection (NOPERM), a failed TLS handshake, or an unreachable server (or
// Sentinel master).
func connectError(err error, t target) error {
	addrs := strings.Join(t.opt.InitAddress, ", ")
	user := userName(t.opt)
	var re *rueidis.RedisError
	if errors.As(err, &re) {
		code, _, _ := strings.Cut(re.Error(), " ")
		switch code {
		case "WRONGPASS", "NOAUTH":
			return fmt.Errorf("authentication failed for user %s at %s: %w (%s)", user, addrs, err, passwordHint(t.passwordFrom))
		case "NOPERM":
			return fmt.Errorf("user %s at %s may not run a command that connecting needs: %w", user, addrs, err)
		}
	}
	if hint, ok := tlsHint(err, t.opt.TLSConfig); ok {
		return fmt.Errorf("TLS handshake with %s failed: %w (%s)", addrs, err, hint)
	}
	if set := t.opt.Sentinel.MasterSet; set != "" {
		return fmt.Errorf("cannot reach the master %q through the sentinels at %s: %w", set, addrs, err)
	}
	return fmt.Errorf("cannot reach Redis at %s: %w", addrs, err)
}

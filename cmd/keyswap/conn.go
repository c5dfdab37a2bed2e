package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/redis/rueidis"
)

// connUsage describes the connection flags: 'keyswap help connect'.
const connUsage = `Connecting, as redis-cli does.

Every command that talks to Redis takes these flags, named as redis-cli
names them.

  - Where: -u URL (or -redis URL), or -h HOST, -p PORT and -s SOCKET, else
    $REDIS_URL, else redis://127.0.0.1:6379. -h means the host, as in
    redis-cli: help is --help. A URL may be redis://host:port/db,
    rediss://host:port for TLS, unix:///path/to/redis.sock (or the path
    alone) for a unix socket, or host:port. Several URLs (repeat -u, or
    separate them with commas) are seeds of one Redis Cluster; one seed
    finds the whole cluster too. redis://sentinel:26379?master_set=NAME
    reaches the master that Redis Sentinel monitors as NAME (the URLs are
    then the sentinels', which are asked without AUTH). -u wins over -h, -p
    and -s, whatever their order, and keyswap warns that it ignores them;
    -s wins over -h and -p. -h alone means port 6379, -p alone host
    127.0.0.1.
    A connection attempt times out after 3s (the URL parameter
    dial_timeout=10s changes that).
  - The database: -n DB, else the URL's, else 0.
  - Who: --user NAME, else the URL's user, else "default".
  - The password, the first of: the one --askpass reads, -a PASSWORD (or
    --pass PASSWORD), the URL's, $KEYSWAP_PASSWORD, $REDISCLI_AUTH.
    --askpass reads it from the terminal without echo, or, when stdin is
    not a terminal, from the first line of stdin, as redis-cli does. Other
    users of the machine can read a password given with -a, --pass or in a
    -u URL in the process list: keyswap warns about it, as redis-cli does
    (--no-auth-warning silences that). A command that keyswap suggests
    never repeats a password: it asks for one with --askpass instead.
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
	host          string
	port          int // 0: not given
	socket        string
	db            int // -1: not given
	password      string
	passwordFlag  string // "-a" or "--pass": the flag that gave password
	user          string
	askpass       bool
	noAuthWarning bool
	tls           tlsFlags
	// used is where connect connected, for what a command prints.
	used *target
}

// addConnFlags defines the connection flags on fs.
func addConnFlags(fs *flag.FlagSet) *connFlags {
	f := &connFlags{db: -1}
	fs.Var(urlFlag{list: &f.urls, name: "redis"}, "redis", "Redis `URL`: redis://[user[:password]@]host[:port][/db], rediss:// for TLS,\n"+
		"unix://[user[:password]@]/path/to/socket[?db=N] or a socket's absolute path, or host:port.\n"+
		"Repeat the flag or separate URLs with commas to give several seeds of a cluster.\n"+
		"Add ?master_set=NAME to reach the master that Redis Sentinel monitors as NAME:\n"+
		"the addresses are then the sentinels'. (default $REDIS_URL, else "+defaultRedisURL+")")
	fs.Var(urlFlag{list: &f.urls, name: "u"}, "u", "Redis `URL`: the same as -redis, as in redis-cli")
	fs.StringVar(&f.host, "h", "", "the server's `host`, as in redis-cli (default 127.0.0.1 when -p is given); help is --help")
	fs.Func("p", "the server's `port`, as in redis-cli (default 6379 when -h is given)", func(v string) error {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 65535 {
			return errors.New("want a port, 1 to 65535")
		}
		f.port = p
		return nil
	})
	fs.StringVar(&f.socket, "s", "", "the server's unix `socket`, as in redis-cli")
	fs.Func("n", "the database `number`, as in redis-cli (default: the URL's, else 0)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errors.New("want a database number, 0 or more")
		}
		f.db = n
		return nil
	})
	fs.Func("a", "the `password`, as in redis-cli; others can read it in the process list: prefer --askpass or $REDISCLI_AUTH", func(v string) error {
		f.password, f.passwordFlag = v, "-a"
		return nil
	})
	fs.Func("pass", "the `password`: the same as -a", func(v string) error {
		f.password, f.passwordFlag = v, "--pass"
		return nil
	})
	fs.StringVar(&f.user, "user", "", "the ACL user `name` to log in as, instead of the URL's (default: the URL's, else \"default\")")
	fs.BoolVar(&f.askpass, "askpass", false, "read the password from the terminal, without echo (or the first line of stdin when it is not one);\n"+
		"it overrides every other password")
	fs.BoolVar(&f.noAuthWarning, "no-auth-warning", false, "do not warn about a password given on the command line (-a, --pass, a -u URL)")
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

// connect returns a client for the connection flags f, and records the
// target in f.used. It returns a *usageError for a bad flag or URL, and
// otherwise an error that says whether the login failed or Redis could not
// be reached (see connectError).
func (c *cli) connect(ctx context.Context, f *connFlags) (rueidis.Client, error) {
	t, err := c.target(ctx, f)
	if err != nil {
		return nil, err
	}
	f.used = &t
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
	if strings.HasPrefix(f.host, "-") {
		return target{}, usagef("-h %s: a host does not start with '-' (-h is the host, as in redis-cli; for help, pass --help)", f.host)
	}
	urls, from := c.redisURLs(f)
	opt, err := parseURLs(urls)
	if err != nil {
		return target{}, &usageError{err: fmt.Errorf("%s: %w", from, err)}
	}
	if opt.TLSConfig, err = f.tls.config(opt); err != nil {
		return target{}, &usageError{err: err}
	}
	if f.db >= 0 {
		opt.SelectDB = f.db
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

// redisURLs returns the URLs to connect to and where they came from: the
// -redis and -u flags, which win over -h, -p and -s (with a warning when
// those are given too); else -s, which wins over -h and -p, as in
// redis-cli; else -h and -p; else $REDIS_URL; else defaultRedisURL.
func (c *cli) redisURLs(f *connFlags) (urls []string, from string) {
	byParts := f.host != "" || f.port != 0 || f.socket != ""
	switch {
	case len(f.urls.urls) > 0:
		if byParts {
			fmt.Fprintf(c.stderr, "keyswap: warning: %s gives the address: -h, -p and -s are ignored\n", f.urls.flag)
		}
		return f.urls.urls, f.urls.flag
	case f.socket != "":
		return []string{"unix://" + f.socket}, "-s"
	case byParts:
		host, port := f.host, f.port
		if host == "" {
			host = "127.0.0.1"
		}
		if port == 0 {
			port = 6379
		}
		return []string{"redis://" + net.JoinHostPort(host, strconv.Itoa(port))}, "-h and -p"
	}
	if urls := splitURLs(c.getenv("REDIS_URL")); len(urls) > 0 {
		return urls, "$REDIS_URL"
	}
	return []string{defaultRedisURL}, "the default URL"
}

// suggest returns the connection flags of f for a command that keyswap
// suggests, so that it reaches the same server: those given on the command
// line, without a password; --askpass stands for one given there (with -a,
// --pass, in a -u URL or read by --askpass). The address and password that
// came from the environment come from it again.
func (f *connFlags) suggest() []string {
	var args []string
	cmdLinePassword := f.askpass || f.password != ""
	if len(f.urls.urls) > 0 {
		urls := make([]string, len(f.urls.urls))
		for i, u := range f.urls.urls {
			var had bool
			urls[i], had = withoutPassword(u)
			cmdLinePassword = cmdLinePassword || had
		}
		args = append(args, "-u", shellQuote(strings.Join(urls, ",")))
	} else {
		if f.host != "" {
			args = append(args, "-h", shellQuote(f.host))
		}
		if f.port != 0 {
			args = append(args, "-p", strconv.Itoa(f.port))
		}
		if f.socket != "" {
			args = append(args, "-s", shellQuote(f.socket))
		}
	}
	if f.db >= 0 {
		args = append(args, "-n", strconv.Itoa(f.db))
	}
	if f.user != "" {
		args = append(args, "--user", shellQuote(f.user))
	}
	if cmdLinePassword {
		args = append(args, "--askpass")
	}
	return append(args, f.tls.suggest()...)
}

// withoutPassword returns the URL u without the password of its user
// information, and whether it had one. A URL that does not parse is
// returned as is: it would have failed to connect.
func withoutPassword(u string) (string, bool) {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return u, false
	}
	userinfo, hostpath, ok := strings.Cut(rest, "@")
	if !ok || strings.ContainsAny(userinfo, "/?#") {
		return u, false
	}
	user, _, had := strings.Cut(userinfo, ":")
	if user == "" {
		return scheme + "://" + hostpath, had
	}
	return scheme + "://" + user + "@" + hostpath, had
}

// server is the Redis a command read, as its output names it.
type server struct {
	// Mode is "standalone", "cluster" or "sentinel".
	Mode string
	// Addrs are the nodes the client knows: the server, or a cluster's
	// nodes, or the master that the sentinels named; a unix socket's path.
	Addrs []string
	// DB is the database (always 0 on a cluster).
	DB int
	// MasterSet is the sentinels' name of the master, for Sentinel.
	MasterSet string
}

// serverOf returns the server client reaches, connected with t.
func serverOf(client rueidis.Client, t *target) server {
	s := server{Mode: "standalone", Addrs: slices.Sorted(maps.Keys(client.Nodes()))}
	switch client.Mode() {
	case rueidis.ClientModeCluster:
		s.Mode = "cluster"
	case rueidis.ClientModeSentinel:
		s.Mode = "sentinel"
	}
	if t != nil {
		s.DB, s.MasterSet = t.opt.SelectDB, t.opt.Sentinel.MasterSet
	}
	return s
}

// String describes s in a line: "Redis 127.0.0.1:6379, database 0".
func (s server) String() string {
	addrs := strings.Join(s.Addrs, ", ")
	switch s.Mode {
	case "cluster":
		return "Redis Cluster " + addrs
	case "sentinel":
		return fmt.Sprintf("Redis %s, database %d: the master %q of Redis Sentinel", addrs, s.DB, s.MasterSet)
	}
	return fmt.Sprintf("Redis %s, database %d", addrs, s.DB)
}

// serverJSON is a server in a -json document.
type serverJSON struct {
	Mode      string   `json:"mode"`
	Addrs     []string `json:"addrs"`
	DB        int      `json:"db"`
	MasterSet string   `json:"master_set,omitempty"`
}

// json returns s in JSON.
func (s server) json() serverJSON {
	addrs := s.Addrs
	if addrs == nil {
		addrs = []string{}
	}
	return serverJSON{Mode: s.Mode, Addrs: addrs, DB: s.DB, MasterSet: s.MasterSet}
}

// connectError describes err, the error of a connection to t: a refused
// login (WRONGPASS, NOAUTH), a user that may not run the commands of a
// connection (NOPERM), a failed TLS handshake, a plain connection to a TLS
// port, or an unreachable server (or Sentinel master).
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
	if t.opt.TLSConfig == nil && droppedPlain(err) {
		return fmt.Errorf("%s ended the connection before it answered: %w (is this a TLS port? try --tls, or a rediss:// URL)", addrs, err)
	}
	if set := t.opt.Sentinel.MasterSet; set != "" {
		return fmt.Errorf("cannot reach the master %q through the sentinels at %s: %w", set, addrs, err)
	}
	return fmt.Errorf("cannot reach Redis at %s: %w", addrs, err)
}

// droppedPlain reports whether err is how a connection without TLS fails
// when the server speaks TLS: it takes the first command for a broken
// handshake and closes the connection, which the client sees as a reset or
// an end of file before any reply.
func droppedPlain(err error) bool {
	var dial *net.OpError
	if errors.As(err, &dial) && dial.Op == "dial" {
		return false // not connected at all
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

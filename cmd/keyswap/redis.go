package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/scan"
	"github.com/redis/rueidis"
	"golang.org/x/term"
)

const (
	// defaultRedisURL is used when neither -redis nor $REDIS_URL is given.
	defaultRedisURL = "redis://127.0.0.1:6379"
	// dialTimeout bounds each connection attempt, so that an unreachable
	// server fails fast. A URL's dial_timeout parameter overrides it.
	dialTimeout = 3 * time.Second
)

// redisFlag is the value of the -redis flag: the URLs given, in order. The
// flag may be repeated, and each value may hold comma-separated URLs.
type redisFlag []string

// String returns the URLs, comma-separated.
func (r *redisFlag) String() string { return strings.Join(*r, ",") }

// Set adds the comma-separated URLs in v.
func (r *redisFlag) Set(v string) error {
	urls := splitURLs(v)
	if len(urls) == 0 {
		return errors.New("no URL")
	}
	*r = append(*r, urls...)
	return nil
}

// splitURLs splits a comma-separated list, dropping blanks.
func splitURLs(v string) []string {
	var out []string
	for u := range strings.SplitSeq(v, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// addRedisFlag defines -redis on fs.
func addRedisFlag(fs *flag.FlagSet) *redisFlag {
	r := &redisFlag{}
	fs.Var(r, "redis", "Redis `URL`: redis://[user:password@]host:port[/db], rediss:// for TLS, or host:port.\n"+
		"Repeat the flag or separate URLs with commas to give several seeds of a cluster.\n"+
		"(default $REDIS_URL, else "+defaultRedisURL+")")
	return r
}

// redisURLs returns the URLs to connect to and where they came from: the
// -redis flags, else $REDIS_URL, else defaultRedisURL.
func (c *cli) redisURLs(r redisFlag) (urls []string, from string) {
	if len(r) > 0 {
		return r, "-redis"
	}
	if urls := splitURLs(c.getenv("REDIS_URL")); len(urls) > 0 {
		return urls, "$REDIS_URL"
	}
	return []string{defaultRedisURL}, "the default URL"
}

// clientOption turns URLs into one rueidis.ClientOption. The addresses of
// every URL become seeds; the other settings (credentials, database, TLS)
// come from the first URL, and the others must not contradict them. A URL
// without a scheme is taken as redis://.
func clientOption(urls []string) (rueidis.ClientOption, error) {
	var opt rueidis.ClientOption
	for i, u := range urls {
		if !strings.Contains(u, "://") {
			u = "redis://" + u
		}
		o, err := rueidis.ParseURL(u)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				// url.Error quotes the URL, password included.
				return opt, fmt.Errorf("invalid Redis URL: %w", ue.Err)
			}
			return opt, fmt.Errorf("invalid Redis URL %s: %w", redact(u), err)
		}
		if i == 0 {
			opt = o
			continue
		}
		if o.Username != opt.Username || o.Password != opt.Password || o.SelectDB != opt.SelectDB ||
			(o.TLSConfig == nil) != (opt.TLSConfig == nil) {
			return opt, fmt.Errorf("%s: user, password, database and TLS must be the same in every URL", redact(u))
		}
		opt.InitAddress = append(opt.InitAddress, o.InitAddress...)
	}
	if opt.Dialer.Timeout == 0 {
		opt.Dialer.Timeout = dialTimeout
	}
	// Client-side caching needs CLIENT TRACKING and buys an operator
	// command nothing.
	opt.DisableCache = true
	return opt, nil
}

// redact returns u with its password replaced by "xxxxx".
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}

// connect returns a client for the -redis flag r (see redisURLs). It
// returns a *usageError for a bad URL, and an error starting "cannot reach
// Redis at <addresses>" when no connection can be made.
func (c *cli) connect(r redisFlag) (rueidis.Client, error) {
	urls, from := c.redisURLs(r)
	opt, err := clientOption(urls)
	if err != nil {
		return nil, &usageError{err: fmt.Errorf("%s: %w", from, err)}
	}
	// rueidis.NewClient connects at once, to a standalone server or, when
	// the server answers CLUSTER SLOTS, to the whole cluster.
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("cannot reach Redis at %s: %w", strings.Join(opt.InitAddress, ", "), err)
	}
	return client, nil
}

// keyspaceSize returns the number of keys in the deployment: DBSIZE summed
// over every master.
func keyspaceSize(ctx context.Context, client rueidis.Client) (int64, error) {
	masters, err := scan.Masters(ctx, client)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, m := range masters {
		n, err := m.Do(ctx, m.B().Dbsize().Build()).AsInt64()
		if err != nil {
			return 0, fmt.Errorf("DBSIZE: %w", err)
		}
		total += n
	}
	return total, nil
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

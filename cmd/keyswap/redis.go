package main

import (
	"context"
	"errors"
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

// urlList holds the URLs of the -redis and -u flags, in order. Either flag
// may be repeated, and each value may hold comma-separated URLs.
type urlList struct {
	urls []string
	// flag is the flag that gave the first URL, "-redis" or "-u", for
	// messages.
	flag string
}

// urlFlag is the flag.Value of one of urlList's two flags.
type urlFlag struct {
	list *urlList
	name string
}

// String returns the URLs, comma-separated.
func (f urlFlag) String() string {
	if f.list == nil {
		return ""
	}
	return strings.Join(f.list.urls, ",")
}

// Set adds the comma-separated URLs in v.
func (f urlFlag) Set(v string) error {
	urls := splitURLs(v)
	if len(urls) == 0 {
		return errors.New("no URL")
	}
	if f.list.flag == "" {
		f.list.flag = "-" + f.name
	}
	f.list.urls = append(f.list.urls, urls...)
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

// parseURLs turns URLs into one rueidis.ClientOption. The addresses of
// every URL become seeds; the other settings (credentials, database, TLS,
// Sentinel master set, unix socket) come from the first URL, and the others
// must not contradict them. A URL without a scheme is taken as redis://,
// and an absolute path as unix://.
func parseURLs(urls []string) (rueidis.ClientOption, error) {
	var opt rueidis.ClientOption
	for i, u := range urls {
		o, err := parseURL(u)
		if err != nil {
			return opt, err
		}
		if i == 0 {
			opt = o
			continue
		}
		if o.Username != opt.Username || o.Password != opt.Password || o.SelectDB != opt.SelectDB ||
			(o.TLSConfig == nil) != (opt.TLSConfig == nil) || (o.DialCtxFn == nil) != (opt.DialCtxFn == nil) ||
			o.Sentinel.MasterSet != opt.Sentinel.MasterSet {
			return opt, fmt.Errorf("%s: user, password, database, TLS, unix socket and master_set must be the same in every URL", redact(u))
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

// parseURL parses one URL with rueidis.ParseURL.
func parseURL(u string) (rueidis.ClientOption, error) {
	switch {
	case strings.HasPrefix(u, "/"):
		u = "unix://" + u
	case !strings.Contains(u, "://"):
		u = "redis://" + u
	}
	o, err := rueidis.ParseURL(u)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			// url.Error quotes the URL, password included.
			return o, fmt.Errorf("invalid Redis URL: %w", ue.Err)
		}
		return o, fmt.Errorf("invalid Redis URL %s: %w", redact(u), err)
	}
	return o, nil
}

// redact returns u with its password replaced by "xxxxx".
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
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

// Package connect opens the Redis the examples run on: the server a
// -redis URL (or $REDIS_URL) names, or an embedded miniredis when there is
// none, so that every example runs with nothing installed.
package connect

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
)

// Flag registers the -redis flag on fs, defaulting to $REDIS_URL.
func Flag(fs *flag.FlagSet) *string {
	return fs.String("redis", os.Getenv("REDIS_URL"),
		"Redis `URL`, e.g. redis://127.0.0.1:6379, or redis://host:port?addr=host2:port2 for a cluster (default $REDIS_URL, else an embedded miniredis)")
}

// Open returns a client for url, or for a new embedded miniredis when url is
// empty, with a description for the user and a function that closes both.
func Open(url string) (client rueidis.Client, where string, closeFn func(), err error) {
	if url == "" {
		m, err := startEmbedded()
		if err != nil {
			return nil, "", nil, err
		}
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:       []string{m.Addr()},
			DisableCache:      true, // miniredis has no client-side caching
			ForceSingleClient: true, // nor CLUSTER commands: not a one-node cluster
		})
		if err != nil {
			m.Close()
			return nil, "", nil, err
		}
		return c, "an embedded Redis (miniredis; pass -redis redis://host:port for a real server)", func() { c.Close(); m.Close() }, nil
	}
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		return nil, "", nil, fmt.Errorf("-redis %q: %w", url, err)
	}
	opt.Dialer.Timeout = 5 * time.Second
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, "", nil, fmt.Errorf("connecting to %s: %w", url, err)
	}
	return c, url, c.Close, nil
}

// Embedded starts an embedded miniredis for an example that needs a URL
// rather than a client (one that parses it with another library), and
// returns its redis:// URL and a function that stops it.
func Embedded() (url string, stop func(), err error) {
	m, err := startEmbedded()
	if err != nil {
		return "", nil, err
	}
	return "redis://" + m.Addr(), m.Close, nil
}

// startEmbedded starts a miniredis whose TTLs run in real time, as on a
// real server.
func startEmbedded() (*miniredis.Miniredis, error) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		return nil, fmt.Errorf("starting the embedded Redis: %w", err)
	}
	m.ClockTTL(true)
	return m, nil
}

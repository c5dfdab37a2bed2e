// Quickstart rebuilds three indexes of a users table atomically, while a
// concurrent reader watches, and shows what a reader sees before and after.
//
//	go run ./examples/quickstart                         # embedded Redis, nothing to install
//	go run ./examples/quickstart -redis redis://127.0.0.1:6379
//
// Yesterday's indexes are already in Redis. Today's users differ: some were
// deleted, some changed their email, some moved country, and nobody lives in
// Brazil any more. One Rebuilder pass over today's users rebuilds
//
//	users:by-email       hash        email → id        (a unique index)
//	users:by-score       sorted set  id by score       (a leaderboard)
//	users:by-country:<c> sets        ids per country   (one set per value)
//
// and publishes all of them in one atomic step. The reader never sees an
// index missing or half-built. Without -redis (or REDIS_URL) the program
// runs on an embedded miniredis; with it, it writes only keys under
// "quickstart:" ("{quickstart}:" on a cluster) and leaves them there, and
// every key it prints is a key it wrote, named in full. -h prints the
// usage and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/keyswap/keyswap/examples/internal/cli"
	"github.com/keyswap/keyswap/examples/internal/connect"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cli.Main("quickstart", func() error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
}

// run is the program, with its arguments and output injectable for tests.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	url := connect.Flag(fs)
	n := fs.Int("users", 50000, "number of users in today's table")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: go run ./examples/quickstart [-redis URL] [-users N]

Quickstart rebuilds three indexes of a users table (a hash, a sorted set and
one set per country) in one atomic step while a concurrent reader watches,
and shows what a reader sees before and after. Without -redis it runs on an
embedded Redis; with it, it writes only keys under "quickstart:"
("{quickstart}:" on a cluster) and leaves them there.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := cli.Parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	client, where, closeFn, err := connect.Open(*url)
	if err != nil {
		return err
	}
	defer closeFn()

	prefix := "quickstart:"
	if client.Mode() == rueidis.ClientModeCluster {
		prefix = "{quickstart}:" // one hash slot, so one atomic publish
	}
	ix := newIndexes(prefix)
	yesterday, today := generate(*n)
	probes := ix.probes(*n)
	fmt.Fprintf(stdout, "keyswap quickstart on %s\n", where)

	// Yesterday's run, so that there are indexes to replace.
	seed, err := rebuild.New(client, rebuild.Options{}, ix.builders()...)
	if err != nil {
		return err
	}
	if _, err := seed.Run(ctx, sources.Slice(yesterday)); err != nil {
		return fmt.Errorf("building yesterday's indexes: %w", err)
	}
	before, err := ix.look(ctx, client, probes)
	if err != nil {
		return err
	}

	// Today's run, while a reader polls every index.
	fmt.Fprintf(stdout, "rebuilding %s, %s and %s:* from today's %d users...\n", ix.byEmail, ix.byScore, ix.byCountry, len(today))
	stopReader := startReader(ctx, client, ix, before.sizes, ix.expectedSizes(today))
	r, err := rebuild.New(client, rebuild.Options{Progress: progress(stderr)}, ix.builders()...)
	if err != nil {
		return err
	}
	stats, err := r.Run(ctx, sources.Slice(today))
	seen := stopReader()
	if err != nil {
		return fmt.Errorf("rebuilding: %w", err)
	}
	fmt.Fprintf(stdout, "published %d keys in one atomic step: %d users in %d batches, %v\n",
		len(stats.Outcomes), stats.Items, stats.Batches, stats.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(stdout, "a concurrent reader polled every index %d times: %d times one was missing, %d times half-built or mixed\n\n",
		seen.polls, seen.missing, seen.mixed)

	after, err := ix.look(ctx, client, probes)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "What a reader sees before and after the publish:")
	printViews(stdout, probes, before, after)

	if err := ix.verify(ctx, client, today); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if seen.missing > 0 || seen.mixed > 0 {
		return errors.New("the reader saw a missing, half-built or mixed index")
	}
	fmt.Fprintf(stdout, "\nverified: every index matches today's %d users exactly\n", len(today))
	return nil
}

// progress returns a Progress callback that redraws one line on a terminal,
// and stays quiet when stderr is not one (a log, a test).
func progress(w io.Writer) func(rebuild.Progress) {
	if f, ok := w.(*os.File); !ok || !isTerminal(f) {
		return nil
	}
	return func(p rebuild.Progress) {
		fmt.Fprintf(w, "\r  %7d users  %4d batches  %9.0f users/s ", p.Items, p.Batches, p.Rate)
	}
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

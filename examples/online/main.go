// Online rebuilds an index of a users table while the application keeps
// changing users, and shows that no change is lost.
//
//	go run ./examples/online                         # embedded Redis, nothing to install
//	go run ./examples/online -redis redis://127.0.0.1:6379
//
// The application keeps three indexes of its users in Redis:
//
//	users:by-email       hash        email → id
//	users:by-score       sorted set  id by score
//	users:by-country:<c> sets        ids per country
//
// and maintains them as users change, through the same Rebuilder that
// rebuilds them: each change is committed to the table first, then applied
// with Rebuilder.Apply. While the rebuild runs, a writer keeps inserting,
// deleting and updating users (new emails, scores, countries). Apply sees
// the rebuild in progress and logs each change for it; the rebuild replays
// them onto its new indexes before it publishes them, and the last ones
// inside the publish itself. Afterwards the program checks every index
// against the table, entry by entry, prints how many changes were applied
// during the rebuild and how many were lost (0), and exits with status 1 on
// any difference.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
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
	cli.Main("online", func() error { return run(ctx, os.Args[1:], os.Stdout) })
}

// run is the program, with its arguments and output injectable for tests.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("online", flag.ContinueOnError)
	url := connect.Flag(fs)
	n := fs.Int("users", 100_000, "number of users in the table")
	rate := fs.Float64("changes", 2000, "changes per second the application makes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	client, where, closeFn, err := connect.Open(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	prefix := "online:"
	if client.Mode() == rueidis.ClientModeCluster {
		prefix = "{online}:" // one hash slot, so one atomic publish
	}
	fmt.Fprintf(stdout, "keyswap online rebuild on %s\n", where)

	table := newTable(*n)
	ix := newIndexes(prefix)
	app, err := rebuild.New(client, rebuild.Options{}, ix.builders()...)
	if err != nil {
		return err
	}
	// The indexes as they stand before today's rebuild.
	if _, err := app.Run(ctx, sources.Slice(table.snapshot())); err != nil {
		return fmt.Errorf("building the indexes: %w", err)
	}

	// The application: changes users at a steady rate until told to stop.
	w := &writer{table: table, app: app, perSecond: *rate}
	wctx, stopWriter := context.WithCancel(ctx)
	defer stopWriter()
	werr := make(chan error, 1)
	go func() { werr <- w.run(wctx) }()
	if err := w.waitFor(ctx, 100); err != nil {
		return err
	}

	// The rebuild: its source reads the table when it starts, after the run
	// took its locks, so it holds every change committed before; every
	// change after is applied through app and logged for the run.
	r, err := rebuild.New(client, rebuild.Options{}, ix.builders()...)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rebuilding %s, %s and %s:* from %d users while the application changes %.0f users a second...\n",
		ix.byEmail, ix.byScore, ix.byCountry, *n, *rate)
	before := w.applied.Load()
	stats, err := r.Run(ctx, func(ctx context.Context) iter.Seq2[user, error] {
		return sources.Slice(table.snapshot())(ctx)
	})
	during := w.applied.Load() - before
	if err == nil {
		// A few more changes after the publish, straight to the new indexes.
		err = w.waitFor(ctx, w.applied.Load()+100)
	}
	stopWriter()
	if e := <-werr; e != nil && !errors.Is(e, context.Canceled) {
		err = errors.Join(err, fmt.Errorf("the application: %w", e))
	}
	if err != nil {
		return fmt.Errorf("rebuilding: %w", err)
	}
	fmt.Fprintf(stdout, "published in %v: %d users in %d batches; %d changes applied during the rebuild, replayed %d times (once per index they touched); catch-up %v\n",
		stats.Elapsed.Round(time.Millisecond), stats.Items, stats.Batches, during, stats.Changes, stats.CatchUp.Round(time.Millisecond))

	lost, err := ix.verify(ctx, client, table.snapshot())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "checked every entry of every index against the table (%d users, %d changes in all): %d lost\n",
		table.len(), w.applied.Load(), lost)
	if lost > 0 {
		return fmt.Errorf("%d entries differ from the table", lost)
	}
	return nil
}

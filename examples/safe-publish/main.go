// Safe-publish rebuilds an index with the checks a production switch
// wants: guards that refuse a suspicious result, a held publish that waits
// for a look at the diff, and a rollback.
//
//	go run ./examples/safe-publish                         # embedded Redis, nothing to install
//	go run ./examples/safe-publish -redis redis://127.0.0.1:6379
//
// It builds yesterday's index of products by category, then:
//
//  1. runs today's rebuild from a query that returned no rows by mistake:
//     the RefuseEmpty guard refuses it, and the index is untouched;
//  2. runs it again from the right rows, held before the publish: it prints
//     the review (sizes) and the diff (entries added, removed, changed),
//     then publishes, keeping yesterday's values for a rollback;
//  3. rolls back to yesterday's index, and forward again.
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

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/examples/internal/cli"
	"github.com/keyswap/keyswap/examples/internal/connect"
	"github.com/keyswap/keyswap/guards"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

type product struct {
	SKU, Name, Category string
	Price               float64
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cli.Main("safe-publish", func() error { return run(ctx, os.Args[1:], os.Stdout) })
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("safe-publish", flag.ContinueOnError)
	url := connect.Flag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	client, where, closeFn, err := connect.Open(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	prefix := "safe:"
	if client.Mode() == rueidis.ClientModeCluster {
		prefix = "{safe}:"
	}
	fmt.Fprintf(out, "keyswap safe publishing on %s\n", where)
	byName := prefix + "products:by-name"
	byPrice := prefix + "products:by-price"
	bs := []index.Builder[product]{
		builders.Hash(byName, func(p product) (string, string, bool) { return p.Name, p.SKU, true }),
		builders.SortedSet(byPrice, func(p product) (string, float64, bool) { return p.SKU, p.Price, true }),
	}
	opts := rebuild.Options{
		Guards:       []guards.Guard{guards.RefuseEmpty(), guards.RefuseShrink(0.5)},
		KeepPrevious: 10 * time.Minute, // what a rollback can go back to, for that long
	}
	r, err := rebuild.New(client, opts, bs...)
	if err != nil {
		return err
	}

	yesterday, today := catalog(200, 0), catalog(180, 1)
	if _, err := r.Run(ctx, sources.Slice(yesterday)); err != nil {
		return fmt.Errorf("yesterday's index: %w", err)
	}
	fmt.Fprintf(out, "yesterday's index: %d products\n", len(yesterday))

	// 1. A query that returned nothing.
	_, err = r.Run(ctx, sources.Slice[product](nil))
	if !errors.Is(err, guards.ErrRefused) {
		return fmt.Errorf("the empty rebuild: got %v, want it refused", err)
	}
	fmt.Fprintf(out, "\n1. an empty source is refused:\n   %v\n", err)
	if n, err := client.Do(ctx, client.B().Hlen().Key(byName).Build()).AsInt64(); err != nil || n != int64(len(yesterday)) {
		return fmt.Errorf("after the refusal the index holds %d names (%v), want %d", n, err, len(yesterday))
	}

	// 2. Today's rebuild, held before its publish.
	h, _, err := r.Build(ctx, sources.Slice(today))
	if err != nil {
		return fmt.Errorf("today's rebuild: %w", err)
	}
	fmt.Fprintln(out, "\n2. today's rebuild, held before the publish:")
	for _, b := range h.Review().Builders {
		fmt.Fprintf(out, "   %-28s %4d entries live, %4d new\n", b.Key, b.Live, b.New)
	}
	d, err := h.Diff(ctx, guards.DiffOptions{Samples: 2})
	if err != nil {
		return err
	}
	for _, b := range d.Builders {
		fmt.Fprintf(out, "   diff %-23s %4d added, %d removed, %d changed (exact: %v)\n", b.Key, b.Added, b.Removed, b.Changed, b.Exact)
		for _, k := range b.Keys {
			for _, s := range k.Samples {
				fmt.Fprintf(out, "     e.g. %-7s %-14s %q -> %q\n", s.Kind, s.Entry, s.Old, s.New)
			}
		}
	}
	stats, err := h.Publish(ctx)
	if err != nil {
		return fmt.Errorf("publishing: %w", err)
	}
	fmt.Fprintf(out, "   published: generation %d\n", stats.Generations[byName])

	// 3. Back to yesterday, and forward again.
	gens, err := r.Rollback(ctx)
	if err != nil {
		return fmt.Errorf("rolling back: %w", err)
	}
	n, err := client.Do(ctx, client.B().Hlen().Key(byName).Build()).AsInt64()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n3. rolled back: generation %d, %d products\n", gens[byName], n)
	if n != int64(len(yesterday)) {
		return fmt.Errorf("after the rollback the index holds %d names, want %d", n, len(yesterday))
	}
	if gens, err = r.Rollback(ctx); err != nil {
		return fmt.Errorf("rolling forward: %w", err)
	}
	if n, err = client.Do(ctx, client.B().Hlen().Key(byName).Build()).AsInt64(); err != nil {
		return err
	}
	fmt.Fprintf(out, "   rolled forward: generation %d, %d products\n", gens[byName], n)
	if n != int64(len(today)) {
		return fmt.Errorf("after rolling forward the index holds %d names, want %d", n, len(today))
	}
	return nil
}

// catalog returns n products; day 1 renames every tenth and reprices every
// seventh.
func catalog(n, day int) []product {
	ps := make([]product, n)
	for i := range ps {
		ps[i] = product{SKU: fmt.Sprintf("sku-%04d", i), Name: fmt.Sprintf("product %04d", i), Price: float64(10 + i%50)}
		if day == 1 && i%10 == 0 {
			ps[i].Name += " (new)"
		}
		if day == 1 && i%7 == 0 {
			ps[i].Price += 0.5
		}
	}
	return ps
}

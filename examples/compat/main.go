// Compat rebuilds an index with builder code written in the go-redis style,
// through rueidiscompat, for teams whose index code already looks like that.
//
//	go run ./examples/compat                  # embedded Redis
//	go run ./examples/compat -redis redis://127.0.0.1:6379
//
// builders.Compat hands the function a go-redis-style Pipeliner and this
// run's temp key. The function queues commands on it as usual; the Rebuilder
// sends them with the rest of the batch. The builder is bound to the temp
// key: a command on any other key (say, the live key) fails the rebuild
// before anything is published.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/examples/internal/cli"
	"github.com/keyswap/keyswap/examples/internal/connect"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidiscompat"
)

func main() {
	cli.Main("compat", func() error { return run(context.Background(), os.Args[1:], os.Stdout) })
}

// Product is a row of a catalogue.
type Product struct {
	SKU   string
	Price float64
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("compat", flag.ContinueOnError)
	url := connect.Flag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, where, closeFn, err := connect.Open(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	key := "compat:products:by-price"
	if c.Mode() == rueidis.ClientModeCluster {
		key = "{compat}:products:by-price"
	}
	fmt.Fprintf(stdout, "compat on %s\n", where)

	var products []Product
	for i := range 2500 {
		products = append(products, Product{SKU: fmt.Sprintf("sku-%04d", i), Price: float64(i%100) + 0.99})
	}

	byPrice := builders.Compat(key, func(ctx context.Context, p rueidiscompat.Pipeliner, temp string, batch []Product) error {
		members := make([]rueidiscompat.Z, len(batch))
		for i, pr := range batch {
			members[i] = rueidiscompat.Z{Score: pr.Price, Member: pr.SKU}
		}
		p.ZAdd(ctx, temp, members...)
		return nil
	})
	r, err := rebuild.New(c, rebuild.Options{}, byPrice)
	if err != nil {
		return err
	}
	if _, err := r.Run(ctx, sources.Slice(products)); err != nil {
		return err
	}
	n, err := c.Do(ctx, c.B().Zcard().Key(key).Build()).AsInt64()
	if err != nil {
		return err
	}
	cheapest, err := c.Do(ctx, c.B().Zrange().Key(key).Min("0").Max("2").Build()).AsStrSlice()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %d products; cheapest: %v\n", key, n, cheapest)

	// A builder that writes outside its temp key is refused.
	rogue := builders.Compat(key, func(ctx context.Context, p rueidiscompat.Pipeliner, temp string, batch []Product) error {
		p.Del(ctx, key) // the live key: never allowed
		return nil
	})
	bad, err := rebuild.New(c, rebuild.Options{}, rogue)
	if err != nil {
		return err
	}
	_, err = bad.Run(ctx, sources.Slice(products))
	fmt.Fprintf(stdout, "a builder that deletes the live key is refused: %v\n", err)
	after, cerr := c.Do(ctx, c.B().Zcard().Key(key).Build()).AsInt64()
	if cerr != nil {
		return cerr
	}
	fmt.Fprintf(stdout, "%s still has %d products\n", key, after)
	if n != 2500 || err == nil || after != n {
		return fmt.Errorf("got %d products, rogue error %v, %d after; want 2500, an error, 2500", n, err, after)
	}
	return nil
}

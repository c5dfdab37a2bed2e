// Goredis runs keyswap next to an application that talks to Redis through
// go-redis: both parse the same URL, the application keeps its go-redis
// client, and keyswap gets a rueidis client built from the same options by
// the module github.com/keyswap/keyswap/goredis, traced with OpenTelemetry
// through rueidisotel.
//
//	go run ./examples/goredis                          # embedded Redis
//	go run ./examples/goredis -redis redis://user:password@127.0.0.1:6379/2
//	go run ./examples/goredis -redis unix:///run/redis.sock
//	go run ./examples/goredis -cluster -redis 'redis://127.0.0.1:7000?addr=127.0.0.1:7001'
//
// keyswap is built on rueidis, not go-redis, so the process holds two
// clients of the same server. That costs connections and memory, not
// commands: rueidis pipelines every caller's commands over a few
// connections per server (four at most by default, one per cluster node),
// each with 1 MiB of buffers, and opens dedicated ones only for blocking
// commands, very large pipelines and Options.Durability's WAIT. Count them in
// the server's maxclients and the ACL user's limits next to go-redis's
// pool.
//
// builders.Compat gives builder code the go-redis-style API of
// rueidiscompat, whose types are rueidiscompat's, not go-redis's: a
// builder written against redis.Pipeliner and redis.Z is ported by renaming
// them (rueidiscompat.Pipeliner, rueidiscompat.Z, whose Member is a string
// where go-redis's is an any).
//
// Tracing: rueidisotel.NewClient takes the same rueidis options and records
// a span per command, or per pipeline (a batch's MULTI … EXEC, the publish
// script), as children of the span in the context passed to Run. This
// program uses the global TracerProvider, a no-op until the application
// installs one (otel.SetTracerProvider); its test installs an in-memory one
// and checks the spans.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/examples/internal/cli"
	"github.com/keyswap/keyswap/examples/internal/connect"
	"github.com/keyswap/keyswap/goredis"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidiscompat"
	"github.com/redis/rueidis/rueidisotel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

func main() {
	cli.Main("goredis", func() error { return run(context.Background(), os.Args[1:], os.Stdout, otel.GetTracerProvider()) })
}

// Product is the application's record, a hash product:<sku> that it
// writes with go-redis.
type Product struct {
	SKU      string
	Category string
	Price    float64
}

// catalogue returns the n products the application writes: categories
// cycle over four, prices over 25 values.
func catalogue(n int) []Product {
	categories := []string{"coffee", "tea", "cocoa", "mate"}
	out := make([]Product, n)
	for i := range out {
		out[i] = Product{
			SKU:      fmt.Sprintf("sku-%03d", i),
			Category: categories[i%len(categories)],
			Price:    float64(i%25) + 0.5,
		}
	}
	return out
}

// app is what the program needs of the application's go-redis client:
// *redis.Client and *redis.ClusterClient both have it.
type app interface {
	redis.Cmdable
	Close() error
}

func run(ctx context.Context, args []string, stdout io.Writer, tp trace.TracerProvider) error {
	fs := flag.NewFlagSet("goredis", flag.ContinueOnError)
	url := fs.String("redis", os.Getenv("REDIS_URL"), "the Redis `URL`, as go-redis parses it (default $REDIS_URL, else an embedded miniredis)")
	cluster := fs.Bool("cluster", false, "parse the URL with redis.ParseClusterURL and talk to a Redis Cluster")
	products := fs.Int("products", 120, "how many products the application writes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	embedded := *url == ""
	if embedded {
		if *cluster {
			return fmt.Errorf("-cluster needs -redis: the embedded Redis is not a cluster")
		}
		embedded, stop, err := connect.Embedded()
		if err != nil {
			return err
		}
		defer stop()
		*url = embedded
	}

	// One URL, parsed once by go-redis, gives both clients.
	var application app
	var where string
	var ksOpt rueidis.ClientOption
	if *cluster {
		o, err := redis.ParseClusterURL(*url)
		if err != nil {
			return err
		}
		application, ksOpt = redis.NewClusterClient(o), goredis.ClusterClientOption(o)
		where = fmt.Sprintf("a cluster seeded by %s", strings.Join(o.Addrs, ", "))
	} else {
		o, err := redis.ParseURL(*url)
		if err != nil {
			return err
		}
		application, ksOpt = redis.NewClient(o), goredis.ClientOption(o)
		where = fmt.Sprintf("%s %s, database %d", o.Network, o.Addr, o.DB)
	}
	defer application.Close()
	if embedded {
		// The embedded Redis (miniredis) has no CLIENT TRACKING, which
		// rueidis's client-side cache needs; a real server keeps it.
		ksOpt.DisableCache = true
	}
	keyswap, err := rueidisotel.NewClient(ksOpt, rueidisotel.WithTracerProvider(tp))
	if err != nil {
		return fmt.Errorf("keyswap's client: %w", err)
	}
	defer keyswap.Close()
	fmt.Fprintf(stdout, "goredis on %s: go-redis for the application, rueidis (traced) for keyswap\n", where)

	prefix := "goredis:"
	if *cluster {
		prefix = "{goredis}:" // one hash slot for the records and the indexes
	}

	// The application writes its records with go-redis.
	src := catalogue(*products)
	if _, err := application.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, pr := range src {
			p.HSet(ctx, prefix+"product:"+pr.SKU, "category", pr.Category, "price", pr.Price)
		}
		return nil
	}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "the application wrote %d products with go-redis\n", len(src))

	// keyswap rebuilds two indexes from them. The price index is written
	// in the go-redis style, with rueidiscompat's types.
	byPriceKey, byCategoryKey := prefix+"products:by-price", prefix+"products:by-category"
	byPrice := builders.Compat(byPriceKey, func(ctx context.Context, p rueidiscompat.Pipeliner, temp string, batch []Product) error {
		members := make([]rueidiscompat.Z, len(batch)) // not redis.Z
		for i, pr := range batch {
			members[i] = rueidiscompat.Z{Score: pr.Price, Member: pr.SKU}
		}
		p.ZAdd(ctx, temp, members...)
		return nil
	})
	byCategory := builders.SetIndex(byCategoryKey, func(pr Product) (bucket, member string, ok bool) {
		return pr.Category, pr.SKU, !builders.Blank(pr.Category)
	})
	r, err := rebuild.New(keyswap, rebuild.Options{}, byPrice, byCategory)
	if err != nil {
		return err
	}
	records := sources.Hashes(keyswap, prefix+"product:*", func(key string, f map[string]string) (Product, bool, error) {
		var pr Product
		_, err := fmt.Sscan(f["price"], &pr.Price)
		pr.SKU, pr.Category = strings.TrimPrefix(key, prefix+"product:"), f["category"]
		return pr, err == nil, err
	})
	ctx, span := tp.Tracer("github.com/keyswap/keyswap/examples/goredis").Start(ctx, "rebuild product indexes")
	stats, err := r.Run(ctx, records)
	span.End()
	if err != nil {
		return err
	}
	var buckets []string
	for k := range stats.Outcomes {
		if b, ok := strings.CutPrefix(k, byCategoryKey+":"); ok {
			buckets = append(buckets, b)
		}
	}
	slices.Sort(buckets)
	fmt.Fprintf(stdout, "keyswap rebuilt %s and %s:{%s} from %d products\n",
		byPriceKey, byCategoryKey, strings.Join(buckets, ","), stats.Items)

	// The application reads them with go-redis.
	cheapest, err := application.ZRangeWithScores(ctx, byPriceKey, 0, 2).Result()
	if err != nil {
		return err
	}
	var cheap []string
	for _, z := range cheapest {
		cheap = append(cheap, fmt.Sprintf("%v (%g)", z.Member, z.Score))
	}
	mate, err := application.SCard(ctx, byCategoryKey+":mate").Result()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "the application reads them with go-redis: cheapest %s; %d mate products\n", strings.Join(cheap, ", "), mate)
	return nil
}

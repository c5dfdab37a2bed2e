// Custom-builder rebuilds two kinds of key that package builders does not
// ship: a geo index (GEOADD), written as a type that implements
// index.Builder, and a HyperLogLog of unique visitors (PFADD), written as
// a function with builders.Func.
//
//	go run ./examples/custom-builder               # embedded Redis
//	go run ./examples/custom-builder -redis redis://127.0.0.1:6379
//
// A builder has two methods: Key, the live key it rebuilds, and Build, which
// turns a batch of items into commands addressed to this run's temp key,
// obtained from Commands.Temp. It never does I/O: the Rebuilder sends the
// commands, renews the lease and publishes.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/examples/internal/cli"
	"github.com/keyswap/keyswap/examples/internal/connect"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

func main() {
	cli.Main("custom-builder", func() error { return run(context.Background(), os.Args[1:], os.Stdout) })
}

// Visit is one row of a visits log.
type Visit struct {
	Store   string
	Lon     float64
	Lat     float64
	Visitor string
}

// geoBuilder rebuilds a geo index of the stores in the visits.
type geoBuilder struct{ key string }

// Key returns the live key.
func (g geoBuilder) Key() string { return g.key }

// Build adds every store of the batch with one GEOADD. A store seen twice
// is added twice; the last position wins, as in any Redis sorted set.
func (g geoBuilder) Build(c *index.Commands, visits []Visit) error {
	temp, err := c.Temp(g.key)
	if err != nil {
		return err
	}
	cmd := c.B().Geoadd().Key(temp).LongitudeLatitudeMember()
	for _, v := range visits {
		cmd = cmd.LongitudeLatitudeMember(v.Lon, v.Lat, v.Store)
	}
	c.Add(cmd.Build(), len(visits))
	return nil
}

var _ index.Builder[Visit] = geoBuilder{}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("custom-builder", flag.ContinueOnError)
	url := connect.Flag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, where, closeFn, err := connect.Open(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	prefix := "custom-builder:"
	if c.Mode() == rueidis.ClientModeCluster {
		prefix = "{custom-builder}:" // both keys in one slot: one atomic publish
	}
	geoKey, hllKey := prefix+"stores:geo", prefix+"visitors:unique"
	fmt.Fprintf(stdout, "custom-builder on %s\n", where)

	stores := []Visit{
		{Store: "louvre", Lon: 2.3376, Lat: 48.8606},
		{Store: "orsay", Lon: 2.3266, Lat: 48.8600},
		{Store: "tate", Lon: -0.0994, Lat: 51.5076},
	}
	var visits []Visit
	for i := range 3000 {
		v := stores[i%len(stores)]
		v.Visitor = "visitor-" + strconv.Itoa(i%1200) // 1200 distinct visitors
		visits = append(visits, v)
	}

	unique := builders.Func(hllKey, func(c *index.Commands, visits []Visit) error {
		temp, err := c.Temp(hllKey)
		if err != nil {
			return err
		}
		ids := make([]string, len(visits))
		for i, v := range visits {
			ids[i] = v.Visitor
		}
		c.Add(c.B().Pfadd().Key(temp).Element(ids...).Build(), len(ids))
		return nil
	})
	r, err := rebuild.New(c, rebuild.Options{BatchSize: 500}, geoBuilder{geoKey}, unique)
	if err != nil {
		return err
	}
	if _, err := r.Run(ctx, sources.Slice(visits)); err != nil {
		return err
	}

	near, err := c.Do(ctx, c.B().Geosearch().Key(geoKey).Fromlonlat(2.33, 48.86).Byradius(5).Km().Asc().Build()).AsStrSlice()
	if err != nil {
		return err
	}
	count, err := c.Do(ctx, c.B().Pfcount().Key(hllKey).Build()).AsInt64()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "stores within 5 km of Paris centre: %v\n", near)
	fmt.Fprintf(stdout, "unique visitors (HyperLogLog estimate): about %d\n", count)
	if len(near) != 2 || count < 1150 || count > 1250 {
		return fmt.Errorf("got %v and %d visitors, want [louvre orsay] and about 1200", near, count)
	}
	return nil
}

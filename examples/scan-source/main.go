// Scan-source rebuilds an index from the objects already in Redis: the
// fallback strategy of Familia, for when the index has drifted and the
// objects themselves are the source of truth.
//
//	go run ./examples/scan-source                 # embedded Redis
//	go run ./examples/scan-source -redis redis://127.0.0.1:6379
//
// It stores users as hashes "scan-source:user:<id>:object", then rebuilds
// the unique index "scan-source:users:by-email" (email → id) from them with
// sources.Hashes, which streams the keys with SCAN and reads them with
// HGETALL one page at a time, so memory stays bounded however many objects
// there are. A stale entry in the old index (a deleted user) disappears.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/examples/internal/cli"
	"github.com/keyswap/keyswap/examples/internal/connect"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

func main() {
	cli.Main("scan-source", func() error { return run(context.Background(), os.Args[1:], os.Stdout) })
}

// user is what an object hash decodes to.
type user struct{ id, email string }

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("scan-source", flag.ContinueOnError)
	url := connect.Flag(fs)
	// The embedded miniredis walks every key on each command to expire
	// TTLs in real time, so its cost grows with the square of the keys;
	// pass -redis and a bigger -objects to see a real server's speed.
	n := fs.Int("objects", 2000, "number of user objects to store")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, where, closeFn, err := connect.Open(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	prefix := "scan-source:"
	if c.Mode() == rueidis.ClientModeCluster {
		// The objects may spread over every master; only the index needs
		// one slot, for its lock, temp key and publish.
		prefix = "{scan-source}:"
	}
	index := prefix + "users:by-email"
	fmt.Fprintf(stdout, "scan-source on %s\n", where)

	// The objects, and a drifted index: it still names a deleted user.
	cmds := make(rueidis.Commands, 0, *n+1)
	for i := range *n {
		cmds = append(cmds, c.B().Hset().Key(fmt.Sprintf("scan-source:user:%d:object", i)).
			FieldValue().FieldValue("id", fmt.Sprint(i)).FieldValue("email", fmt.Sprintf("user%d@example.com", i)).Build())
	}
	cmds = append(cmds, c.B().Hset().Key(index).FieldValue().FieldValue("deleted@example.com", "999999").Build())
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}

	src := sources.Hashes(c, "scan-source:user:*:object",
		func(key string, fields map[string]string) (user, bool, error) {
			if fields["id"] == "" {
				return user{}, false, fmt.Errorf("object %s has no id", key)
			}
			return user{id: fields["id"], email: fields["email"]}, true, nil
		})
	emails := builders.Hash(index, func(u user) (string, string, bool) {
		return strings.ToLower(u.email), u.id, !builders.Blank(u.email)
	})
	r, err := rebuild.New(c, rebuild.Options{}, emails)
	if err != nil {
		return err
	}
	stats, err := r.Run(ctx, src)
	if err != nil {
		return err
	}
	size, err := c.Do(ctx, c.B().Hlen().Key(index).Build()).AsInt64()
	if err != nil {
		return err
	}
	stale, err := c.Do(ctx, c.B().Hexists().Key(index).Field("deleted@example.com").Build()).AsBool()
	if err != nil {
		return err
	}
	batches := "batches"
	if stats.Batches == 1 {
		batches = "batch"
	}
	fmt.Fprintf(stdout, "scanned %d objects in %d %s\n", stats.Items, stats.Batches, batches)
	fmt.Fprintf(stdout, "%s: %d entries; stale entry for deleted@example.com present: %v\n", index, size, stale)
	if size != int64(*n) || stale {
		return fmt.Errorf("index has %d entries (stale %v), want %d", size, stale, *n)
	}
	return nil
}

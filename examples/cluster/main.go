// Cluster runs a three-index rebuild on Redis Cluster, and shows what
// keyswap refuses there and why.
//
//	go run ./examples/cluster -redis 'redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002'
//
// It needs a cluster (miniredis is not one). Start three masters with
// --cluster-enabled yes, then redis-cli --cluster create ... --cluster-replicas 0.
//
// One publish is one Lua script, and a script may only touch keys of one
// hash slot. So every key a Rebuilder publishes together must share a
// slot: give them a common hash tag, the part in braces that Redis hashes
// instead of the whole key, as in "{users}:by-email" and
// "{users}:by-country:fr". keyswap checks this before writing anything, and
// places its own lock and temp keys in the same slot.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/examples/internal/cli"
	"github.com/keyswap/keyswap/examples/internal/connect"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

func main() {
	cli.Main("cluster", func() error { return run(context.Background(), os.Args[1:], os.Stdout) })
}

// User is a row of the users table.
type User struct {
	ID, Email, Country string
	Score              float64
}

// indexes returns the three builders under prefix.
func indexes(prefix string) []index.Builder[User] {
	return []index.Builder[User]{
		builders.Hash(prefix+"by-email", func(u User) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SortedSet(prefix+"by-score", func(u User) (string, float64, bool) { return u.ID, u.Score, true }),
		builders.SetIndex(prefix+"by-country", func(u User) (string, string, bool) { return u.Country, u.ID, true }),
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	url := connect.Flag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" {
		return errors.New("this example needs a Redis Cluster: pass -redis 'redis://host:port?addr=host2:port2&addr=host3:port3' (see the comment at the top of main.go)")
	}
	c, where, closeFn, err := connect.Open(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	if c.Mode() != rueidis.ClientModeCluster {
		return fmt.Errorf("%s is not a Redis Cluster", where)
	}
	fmt.Fprintf(stdout, "cluster example on %s\n\n", where)

	var users []User
	for i := range 10000 {
		users = append(users, User{ID: fmt.Sprint(i), Email: fmt.Sprintf("user%d@example.com", i), Country: []string{"fr", "de", "us"}[i%3], Score: float64(i)})
	}

	// 1. Tagged keys: every key hashes "users", so one slot, one publish.
	r, err := rebuild.New(c, rebuild.Options{}, indexes("{users}:")...)
	if err != nil {
		return err
	}
	stats, err := r.Run(ctx, sources.Slice(users))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "with a hash tag, %d keys were published in one atomic step:\n", len(stats.Outcomes))
	for _, k := range []string{"{users}:by-email", "{users}:by-score", "{users}:by-country:fr", "{users}:by-country:de", "{users}:by-country:us"} {
		slot, err := c.Do(ctx, c.B().ClusterKeyslot().Key(k).Build()).AsInt64()
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "  %-24s slot %d  %s\n", k, slot, stats.Outcomes[k])
	}

	// 2. Untagged keys hash whole, to different slots: New refuses them.
	_, err = rebuild.New(c, rebuild.Options{}, indexes("users:")[:2]...)
	fmt.Fprintf(stdout, "\nwithout a hash tag, two keys in one Rebuilder are refused:\n  %v\n", err)
	if err == nil {
		return errors.New("untagged keys in different slots were not refused")
	}

	// 3. A family needs a tag in its prefix, or its buckets would spread.
	_, err = rebuild.New(c, rebuild.Options{}, indexes("users:")[2])
	fmt.Fprintf(stdout, "\nand so is a SetIndex whose prefix has no hash tag:\n  %v\n", err)
	if err == nil {
		return errors.New("an untagged SetIndex prefix was not refused")
	}

	// 4. One untagged key alone is fine: keyswap tags its lock and temp key.
	single, err := rebuild.New(c, rebuild.Options{}, indexes("users:")[0])
	if err != nil {
		return err
	}
	if _, err := single.Run(ctx, sources.Slice(users)); err != nil {
		return err
	}
	n, err := c.Do(ctx, c.B().Hlen().Key("users:by-email").Build()).AsInt64()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\na single untagged key rebuilds fine (its lock is {users:by-email}:rebuild-lock): users:by-email has %d entries\n", n)
	return nil
}

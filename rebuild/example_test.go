package rebuild_test

// The examples run under go test as documentation, against the package's
// test server.

import (
	"context"
	"fmt"
	"log"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

// User is the record type of the examples: the source of truth from which
// the indexes are derived.
type User struct {
	ID      string
	Email   string
	Country string
	Score   float64
}

// exampleClient returns a client of a Redis server for the examples: the
// test suite's own, on a database the call empties first.
func exampleClient() rueidis.Client { return env.ExampleClient() }

// examplePrintKeys prints every key matching pattern, sorted, with its contents in
// a stable order.
func examplePrintKeys(ctx context.Context, client rueidis.Client, pattern string) {
	ks, err := client.Do(ctx, client.B().Keys().Pattern(pattern).Build()).AsStrSlice()
	if err != nil {
		log.Fatal(err)
	}
	slices.Sort(ks)
	for _, k := range ks {
		if strings.Contains(k, ":rebuild-") {
			continue // keyswap's own: each index's generation, "<key>:rebuild-gen"
		}
		typ, err := client.Do(ctx, client.B().Type().Key(k).Build()).ToString()
		if err != nil {
			log.Fatal(err)
		}
		var parts []string
		switch typ {
		case "hash":
			h, err := client.Do(ctx, client.B().Hgetall().Key(k).Build()).AsStrMap()
			if err != nil {
				log.Fatal(err)
			}
			for _, f := range slices.Sorted(maps.Keys(h)) {
				parts = append(parts, f+"="+h[f])
			}
		case "zset":
			zs, err := client.Do(ctx, client.B().Zrange().Key(k).Min("0").Max("-1").Withscores().Build()).AsZScores()
			if err != nil {
				log.Fatal(err)
			}
			for _, z := range zs { // already in score order
				parts = append(parts, z.Member+"="+strconv.FormatFloat(z.Score, 'g', -1, 64))
			}
		case "set":
			ms, err := client.Do(ctx, client.B().Smembers().Key(k).Build()).AsStrSlice()
			if err != nil {
				log.Fatal(err)
			}
			slices.Sort(ms)
			parts = ms
		}
		fmt.Printf("%s (%s): %s\n", k, typ, strings.Join(parts, " "))
	}
}

// Rebuild three indexes of users from one pass over the source: a unique
// index (a hash email → id), a leaderboard (a sorted set) and one set per
// country. All of them are published at once; readers see the old indexes
// until then.
func ExampleNew() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	// Stale index entries from an earlier run.
	client.Do(ctx, client.B().Hset().Key("users:by-email").FieldValue().FieldValue("gone@example.com", "9").Build())
	client.Do(ctx, client.B().Sadd().Key("users:by-country:it").Member("9").Build())

	users := []User{
		{ID: "1", Email: "ann@example.com", Country: "fr", Score: 120},
		{ID: "2", Email: "bob@example.com", Country: "de", Score: 75.5},
		{ID: "3", Email: "", Country: "fr", Score: 310}, // no email: not in the unique index
	}

	emails := builders.Hash("users:by-email", func(u User) (string, string, bool) {
		return u.Email, u.ID, !builders.Blank(u.Email)
	})
	scores := builders.SortedSet("users:by-score", func(u User) (string, float64, bool) {
		return u.ID, u.Score, true
	})
	country := builders.SetIndex("users:by-country", func(u User) (string, string, bool) {
		return u.Country, u.ID, !builders.Blank(u.Country)
	})
	r, err := rebuild.New(client, rebuild.Options{}, emails, scores, country)
	if err != nil {
		log.Fatal(err)
	}
	stats, err := r.Run(ctx, sources.Slice(users))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("items:", stats.Items)
	fmt.Println("written:", stats.Entries)
	fmt.Println("outcomes:", stats.Outcomes)
	examplePrintKeys(ctx, client, "users:*")
	// Output:
	// items: 3
	// written: map[users:by-country:3 users:by-email:2 users:by-score:3]
	// outcomes: map[users:by-country:de:swapped users:by-country:fr:swapped users:by-country:it:emptied users:by-email:swapped users:by-score:swapped]
	// users:by-country:de (set): 2
	// users:by-country:fr (set): 1 3
	// users:by-email (hash): ann@example.com=1 bob@example.com=2
	// users:by-score (zset): 2=75.5 1=120 3=310
}

// A unique index, as Familia builds one: blank and whitespace-only values
// are skipped, and when two records claim the same value the last one wins.
// The live hash is replaced, not merged: entries of deleted records go.
func ExampleNew_hash() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	client.Do(ctx, client.B().Hset().Key("users:by-email").FieldValue().FieldValue("deleted@example.com", "4").Build())

	users := []User{
		{ID: "1", Email: "ann@example.com"},
		{ID: "2", Email: "   "},
		{ID: "3", Email: "ann@example.com"},
	}
	emails := builders.Hash("users:by-email", func(u User) (string, string, bool) {
		return u.Email, u.ID, !builders.Blank(u.Email)
	})
	r, err := rebuild.New(client, rebuild.Options{}, emails)
	if err != nil {
		log.Fatal(err)
	}
	stats, err := r.Run(ctx, sources.Slice(users))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("items:", stats.Items, "written:", stats.Entries["users:by-email"])
	examplePrintKeys(ctx, client, "users:*")
	// Output:
	// items: 3 written: 2
	// users:by-email (hash): ann@example.com=3
}

// A builder that is neither AnyOrder nor ByEntry, such as this Func
// writing a hash, keeps one round trip in flight, in source order. A source
// that yields every field once, such as rows keyed by their primary key, may
// give up that order: a second round trip goes out while the first is in
// flight, and Redis never waits for the client between them.
// (builders.Hash needs no such option: it is ByEntry, and overlaps round
// trips that share no field.)
func ExampleOptions_unordered() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	users := make([]User, 5000)
	for i := range users {
		users[i] = User{ID: strconv.Itoa(i), Email: fmt.Sprintf("user%d@example.com", i)}
	}
	emails := builders.Func("users:by-email", func(c *index.Commands, us []User) error {
		temp, err := c.Temp("users:by-email")
		if err != nil {
			return err
		}
		fields := c.B().Hset().Key(temp).FieldValue()
		for _, u := range us {
			fields = fields.FieldValue(u.Email, u.ID)
		}
		c.Add(fields.Build(), len(us))
		return nil
	})
	opts := rebuild.Options{Unordered: true} // every email appears once in the source
	r, err := rebuild.New(client, opts, emails)
	if err != nil {
		log.Fatal(err)
	}
	stats, err := r.Run(ctx, sources.Slice(users))
	if err != nil {
		log.Fatal(err)
	}
	n, err := client.Do(ctx, client.B().Hlen().Key("users:by-email").Build()).AsInt64()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("batches:", stats.Batches, "fields:", n)
	// Output:
	// batches: 3 fields: 5000
}

// A rebuild that yields to the application: with a latency budget the run
// measures, with probes of its own, how long other clients' commands wait
// behind it, and paces itself to keep that under the budget; batches small
// enough to run well within it. MaxRate caps it besides, and an operator
// can change that cap during the run ("keyswap throttle").
func ExampleOptions_latencyBudget() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	users := make([]User, 3000)
	for i := range users {
		users[i] = User{ID: strconv.Itoa(i), Email: fmt.Sprintf("user%d@example.com", i)}
	}
	opts := rebuild.Options{
		LatencyBudget: 5 * time.Millisecond,
		BatchSize:     500,
		MaxRate:       100_000, // items per second, at most
	}
	r, err := rebuild.New(client, opts,
		builders.Hash("users:by-email", func(u User) (string, string, bool) { return u.Email, u.ID, true }))
	if err != nil {
		log.Fatal(err)
	}
	stats, err := r.Run(ctx, sources.Slice(users))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("items:", stats.Items, "fields:", stats.Entries["users:by-email"])
	// Output:
	// items: 3000 fields: 3000
}

// A leaderboard: a member's score is whatever the function returns, and a
// member missing from the source disappears from the sorted set.
func ExampleNew_sortedSet() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	client.Do(ctx, client.B().Zadd().Key("users:by-score").ScoreMember().ScoreMember(999, "phantom").Build())

	users := []User{{ID: "1", Score: 120}, {ID: "2", Score: -3.25}, {ID: "3", Score: 1e300}}
	scores := builders.SortedSet("users:by-score", func(u User) (string, float64, bool) {
		return u.ID, u.Score, true
	})
	r, err := rebuild.New(client, rebuild.Options{}, scores)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := r.Run(ctx, sources.Slice(users)); err != nil {
		log.Fatal(err)
	}
	examplePrintKeys(ctx, client, "users:*")
	// Output:
	// users:by-score (zset): 2=-3.25 1=120 3=1e+300
}

// One set per value: a member that moved is only in its new bucket, and a
// bucket left without members is deleted, in the same atomic publish.
func ExampleNew_setIndex() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	country := builders.SetIndex("users:by-country", func(u User) (string, string, bool) {
		return u.Country, u.ID, !builders.Blank(u.Country)
	})
	r, err := rebuild.New(client, rebuild.Options{}, country)
	if err != nil {
		log.Fatal(err)
	}

	if _, err := r.Run(ctx, sources.Slice([]User{
		{ID: "1", Country: "fr"}, {ID: "2", Country: "fr"}, {ID: "3", Country: "it"},
	})); err != nil {
		log.Fatal(err)
	}
	examplePrintKeys(ctx, client, "users:*")

	// User 1 moves to Germany; user 3, the only Italian, is deleted.
	stats, err := r.Run(ctx, sources.Slice([]User{
		{ID: "1", Country: "de"}, {ID: "2", Country: "fr"},
	}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("---", stats.Outcomes)
	examplePrintKeys(ctx, client, "users:*")
	// Output:
	// users:by-country:fr (set): 1 2
	// users:by-country:it (set): 3
	// --- map[users:by-country:de:swapped users:by-country:fr:swapped users:by-country:it:emptied]
	// users:by-country:de (set): 1
	// users:by-country:fr (set): 2
}

// Report progress after each batch. Progress is called from one goroutine
// at a time with counts that never decrease; the last call has the totals.
// Elapsed and Rate vary from run to run, so they are not printed here.
func ExampleRebuilder_Run() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	users := make([]User, 5)
	for i := range users {
		users[i] = User{ID: strconv.Itoa(i + 1), Score: float64(10 * (i + 1))}
	}
	scores := builders.SortedSet("users:by-score", func(u User) (string, float64, bool) {
		return u.ID, u.Score, true
	})
	r, err := rebuild.New(client, rebuild.Options{
		BatchSize: 2,
		Writers:   1, // batches complete in order, so the output is stable
		Progress: func(p rebuild.Progress) {
			fmt.Printf("%s: %d items in %d batches\n", p.Phase, p.Items, p.Batches)
		},
	}, scores)
	if err != nil {
		log.Fatal(err)
	}
	stats, err := r.Run(ctx, sources.Slice(users))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("done:", stats.Items, "items,", stats.Batches, "batches,", stats.Outcomes)
	// Output:
	// building: 2 items in 1 batches
	// building: 4 items in 2 batches
	// building: 5 items in 3 batches
	// catching up: 5 items in 3 batches
	// publishing: 5 items in 3 batches
	// done: 5 items, 3 batches, map[users:by-score:swapped]
}

// Generations mode: the run writes a new generation of the index and
// publishes it by pointing the index's pointer at it. Readers resolve the
// pointer, then read the generation's keys.
func ExampleOptions_generations() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	country := builders.SetIndex("users:by-country", func(u User) (string, string, bool) {
		return u.Country, u.ID, true
	})
	r, err := rebuild.New(client, rebuild.Options{Publish: rebuild.Generations, Grace: time.Millisecond}, country)
	if err != nil {
		log.Fatal(err)
	}
	for _, users := range [][]User{
		{{ID: "1", Country: "fr"}, {ID: "2", Country: "de"}},
		{{ID: "1", Country: "fr"}, {ID: "3", Country: "fr"}},
	} {
		stats, err := r.Run(ctx, sources.Slice(users))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("generation:", stats.Generations["users:by-country"])
	}
	ptr, _ := client.Do(ctx, client.B().Get().Key("users:by-country:rebuild-ptr").Build()).ToString()
	fmt.Println("pointer:", ptr)
	// The first generation was removed after the grace period.
	ks, _ := client.Do(ctx, client.B().Keys().Pattern("users:by-country:rebuild-g:*").Build()).AsStrSlice()
	for _, k := range ks {
		members, _ := client.Do(ctx, client.B().Smembers().Key(k).Build()).AsStrSlice()
		slices.Sort(members)
		fmt.Println(k, members)
	}
	// Output:
	// generation: 1
	// generation: 2
	// pointer: 2
	// users:by-country:rebuild-g:2:fr [1 3]
}

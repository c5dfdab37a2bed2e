package store_test

// The examples run under go test as documentation, against the package's
// test server.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"maps"
	"slices"
	"time"

	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
)

// exampleClient returns a client of a Redis server for the examples: the
// test suite's own, on a database the call empties first.
func exampleClient() rueidis.Client { return env.ExampleClient() }

// exampleHash prints key's fields in order, and whether it has an expiry.
func exampleHash(ctx context.Context, client rueidis.Client, key string) {
	h, err := client.Do(ctx, client.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		log.Fatal(err)
	}
	ttl, err := client.Do(ctx, client.B().Ttl().Key(key).Build()).AsInt64()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s (ttl %d):", key, ttl)
	for _, f := range slices.Sorted(maps.Keys(h)) {
		fmt.Printf(" %s=%s", f, h[f])
	}
	fmt.Println()
}

// Rebuild a unique index from scratch: the callback writes batches into the
// temp key and touches after each; readers see the old index until the swap.
func ExampleStore_WithRebuild() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	// The live index holds a stale entry.
	client.Do(ctx, client.B().Hset().Key("users:by-email").FieldValue().FieldValue("gone@example.com", "7").Build())

	users := [][]string{
		{"ann@example.com", "1", "bob@example.com", "2"},
		{"cy@example.com", "3"},
	}
	s := store.New(client, store.Options{})
	err := s.WithRebuild(ctx, "users:by-email", store.RebuildOptions{TTL: 60 * time.Second},
		func(ctx context.Context, temp string, touch func(context.Context) error) error {
			for _, batch := range users {
				cmd := client.B().Hset().Key(temp).FieldValue()
				for i := 0; i < len(batch); i += 2 {
					cmd = cmd.FieldValue(batch[i], batch[i+1])
				}
				if err := client.Do(ctx, cmd.Build()).Error(); err != nil {
					return err
				}
				if err := touch(ctx); err != nil {
					return err
				}
			}
			return nil
		})
	if err != nil {
		fmt.Println("rebuild failed:", err)
		return
	}
	exampleHash(ctx, client, "users:by-email")
	// Output:
	// users:by-email (ttl -1): ann@example.com=1 bob@example.com=2 cy@example.com=3
}

// The lower-level steps of WithRebuild, for callers who need to arrange them
// differently: acquire, write and touch, a fenced swap, release.
func ExampleStore_Swap() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()
	s := store.New(client, store.Options{})

	lock, err := s.Acquire(ctx, "users:by-email", 60*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Release(ctx, lock)

	temp := s.NewTempKey("users:by-email")
	client.Do(ctx, client.B().Hset().Key(temp).FieldValue().FieldValue("ann@example.com", "1").Build())
	populated, err := s.Touch(ctx, lock, temp) // extends the lock, then sets the temp key's TTL
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("populated:", populated)

	p := store.PopulatedNo
	if populated {
		p = store.PopulatedYes
	}
	outcome, err := s.Swap(ctx, temp, "users:by-email", store.SwapOptions{Lock: lock, Populated: p})
	if err != nil {
		fmt.Println("swap failed:", err)
		return
	}
	fmt.Println("outcome:", outcome)
	exampleHash(ctx, client, "users:by-email")

	// A rebuild that produced nothing deletes the live key.
	outcome, err = s.Swap(ctx, s.NewTempKey("users:by-email"), "users:by-email", store.SwapOptions{Lock: lock, Populated: store.PopulatedNo})
	if err != nil {
		fmt.Println("swap failed:", err)
		return
	}
	fmt.Println("outcome:", outcome)
	// Output:
	// populated: true
	// outcome: swapped
	// users:by-email (ttl -1): ann@example.com=1
	// outcome: emptied
}

// A second rebuild of the same key fails at once; it never waits.
func ExampleStore_Acquire() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()
	s := store.New(client, store.Options{})

	lock, err := s.Acquire(ctx, "users:by-email", 60*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("lock key:", lock.Key)

	_, err = s.Acquire(ctx, "users:by-email", 60*time.Second)
	fmt.Println(errors.Is(err, store.ErrInProgress), err)

	err = s.WithRebuild(ctx, "users:by-email", store.RebuildOptions{},
		func(context.Context, string, func(context.Context) error) error {
			panic("not reached: the callback does not run while the lock is held")
		})
	fmt.Println(errors.Is(err, store.ErrInProgress))

	if err := s.Release(ctx, lock); err != nil {
		log.Fatal(err)
	}
	_, err = s.Acquire(ctx, "users:by-email", 60*time.Second)
	fmt.Println("after release:", err)
	// Output:
	// lock key: users:by-email:rebuild-lock
	// true keyswap: acquire users:by-email: rebuild already in progress
	// true
	// after release: <nil>
}

// Sweep deletes temp keys orphaned by crashed processes: old, without a TTL
// and without a lock. DryRun only reports them.
func ExampleStore_Sweep() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	s := store.New(client, store.Options{Now: func() time.Time { return now }})

	set := func(key string) { client.Do(ctx, client.B().Set().Key(key).Value("x").Build()) }
	set("users:by-email:rebuild:1699990000:00000000deadbeef") // orphaned, current shape
	set("users:by-email:rebuild:1699990000")                  // orphaned, legacy shape
	set("users:by-name:rebuild:1699999990:00000000deadbeef")  // 10 s old: may still be running
	set("teams:by-slug:rebuild:1699990000:00000000deadbeef")  // old, but its rebuild holds the lock
	set("teams:by-slug:rebuild-lock")

	// By default the sweep matches only the shape keyswap makes; the
	// legacy shape <key>:rebuild:<digits> is also an application's own
	// naming scheme, so it is matched only when asked.
	would, err := s.Sweep(ctx, store.SweepOptions{DryRun: true})
	if err != nil {
		log.Fatal(err)
	}
	slices.Sort(would)
	fmt.Println("would delete:", would)

	deleted, err := s.Sweep(ctx, store.SweepOptions{OlderThan: time.Hour, Legacy: true})
	if err != nil {
		log.Fatal(err)
	}
	slices.Sort(deleted)
	fmt.Println("deleted:", deleted)
	left, err := client.Do(ctx, client.B().Keys().Pattern("*").Build()).AsStrSlice()
	if err != nil {
		log.Fatal(err)
	}
	slices.Sort(left)
	fmt.Println("left:", left)
	// Output:
	// would delete: [users:by-email:rebuild:1699990000:00000000deadbeef]
	// deleted: [users:by-email:rebuild:1699990000 users:by-email:rebuild:1699990000:00000000deadbeef]
	// left: [teams:by-slug:rebuild-lock teams:by-slug:rebuild:1699990000:00000000deadbeef users:by-name:rebuild:1699999990:00000000deadbeef]
}

package reader_test

// The examples run under go test as documentation, against the package's
// test server. They set pointers and write generations by hand, as a
// rebuild in generations mode does.

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/reader"
	"github.com/redis/rueidis"
)

// A Reader over a client with rueidis's default client-side caching reads
// a pointer once, then serves it from the cache until a flip invalidates
// it.
func ExampleNew() {
	ctx := context.Background()
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{env.Standalone.Addr}, // your Redis
		SelectDB:    redistest.ExampleDB,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// The writer's grace period (rebuild.Options.Grace, 10 s by default)
	// must exceed CacheTTL.
	r, err := reader.New(client, reader.Options{CacheTTL: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	key, err := r.Key(ctx, "orders:by-day")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(key, r.Cached())
	// Output: orders:by-day true
}

// Key names the key that holds an index's data: its live key until a run
// in generations mode sets its pointer, then the current generation's key.
func ExampleReader_Key() {
	ctx := context.Background()
	client := env.ExampleClient() // created with DisableCache: every resolve is a GET
	defer client.Close()
	r, err := reader.New(client, reader.Options{})
	if err != nil {
		log.Fatal(err)
	}

	key, err := r.Key(ctx, "users:by-email")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("no pointer:", key)

	// A flip: a run in generations mode published generation 3.
	if err := client.Do(ctx, client.B().Set().Key("users:by-email:rebuild-ptr").Value("3").Build()).Error(); err != nil {
		log.Fatal(err)
	}
	key, err = r.Key(ctx, "users:by-email")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("generation 3:", key)
	bucket, err := r.Bucket(ctx, "users:by-country", "uk")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("a family without a pointer:", bucket)
	fmt.Println("cached:", r.Cached())
	// Output:
	// no pointer: users:by-email
	// generation 3: users:by-email:rebuild-g:3
	// a family without a pointer: users:by-country:uk
	// cached: false
}

// The typed reads find the key and read it; an answer that may mean the key
// is missing is checked against the pointer first.
func ExampleReader_HGet() {
	ctx := context.Background()
	client := env.ExampleClient()
	defer client.Close()
	for _, cmd := range []rueidis.Completed{
		client.B().Hset().Key("users:by-email:rebuild-g:7").FieldValue().FieldValue("ada@example.com", "1").Build(),
		client.B().Sadd().Key("users:by-country:rebuild-g:7:uk").Member("1").Build(),
		client.B().Set().Key("users:by-email:rebuild-ptr").Value("7").Build(),
		client.B().Set().Key("users:by-country:rebuild-ptr").Value("7").Build(),
	} {
		if err := client.Do(ctx, cmd).Error(); err != nil {
			log.Fatal(err)
		}
	}
	r, err := reader.New(client, reader.Options{})
	if err != nil {
		log.Fatal(err)
	}

	id, ok, err := r.HGet(ctx, reader.Plain("users:by-email"), "ada@example.com")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(id, ok)
	_, ok, err = r.HGet(ctx, reader.Plain("users:by-email"), "nobody@example.com")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ok)
	inUK, err := r.SIsMember(ctx, reader.InBucket("users:by-country", "uk"), "1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(inUK)
	// Output:
	// 1 true
	// false
	// true
}

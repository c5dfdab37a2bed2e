package sources_test

// The examples run under go test as documentation; those that read Redis
// run against the package's test server.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// User is the record type of the examples.
type User struct {
	ID    string
	Email string
}

// A source is a function that returns a sequence; a Rebuilder calls it once
// per run with the run's context. Slice's items are yielded in order.
func ExampleSlice() {
	src := sources.Slice([]User{{ID: "1"}, {ID: "2"}})
	for u, err := range src(context.Background()) {
		fmt.Println(u.ID, err)
	}
	// Output:
	// 1 <nil>
	// 2 <nil>
}

// Seq2 wraps an iterator that can fail, such as a cursor over a database:
// the source yields its error once, and the run that pulls it fails.
func ExampleSeq2() {
	cursor := func(yield func(User, error) bool) {
		if !yield(User{ID: "1"}, nil) {
			return
		}
		yield(User{}, errors.New("connection reset"))
	}
	for u, err := range sources.Seq2(cursor)(context.Background()) {
		fmt.Printf("%q %v\n", u.ID, err)
	}
	// Output:
	// "1" <nil>
	// "" connection reset
}

// Seq wraps an iterator that cannot fail, such as the values of a map
// sorted, or a generator.
func ExampleSeq() {
	ids := slices.Values([]string{"3", "1", "2"})
	var got []string
	for id := range sources.Seq(ids)(context.Background()) {
		got = append(got, id)
	}
	fmt.Println(got)
	// Output:
	// [3 1 2]
}

// Rebuild an index from the objects themselves, Familia's fallback when
// there is no other source: SCAN the object hashes and read each one.
func ExampleHashes() {
	client := env.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	for _, u := range []User{{ID: "1", Email: "ann@example.com"}, {ID: "2", Email: "bob@example.com"}, {ID: "3"}} {
		client.Do(ctx, client.B().Hset().Key("user:"+u.ID+":object").FieldValue().
			FieldValue("id", u.ID).FieldValue("email", u.Email).Build())
	}
	client.Do(ctx, client.B().Set().Key("user:4:object").Value("not a hash").Build()) // skipped: SCAN TYPE hash

	src := sources.Hashes(client, "user:*:object", func(key string, f map[string]string) (User, bool, error) {
		return User{ID: f["id"], Email: f["email"]}, true, nil
	})
	emails := builders.Hash("users:by-email", func(u User) (string, string, bool) {
		return u.Email, u.ID, !builders.Blank(u.Email)
	})
	r, err := rebuild.New(client, rebuild.Options{}, emails)
	if err != nil {
		log.Fatal(err)
	}
	stats, err := r.Run(ctx, src)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("objects read:", stats.Items)
	emailsNow, err := client.Do(ctx, client.B().Hgetall().Key("users:by-email").Build()).AsStrMap()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("users:by-email:", emailsNow)
	// Output:
	// objects read: 3
	// users:by-email: map[ann@example.com:1 bob@example.com:2]
}

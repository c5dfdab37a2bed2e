package index_test

// The examples run under go test as documentation, against the package's
// test server.

import (
	"context"
	"fmt"
	"log"
	"maps"
	"slices"
	"strconv"

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
}

// printHash prints the hash key, field by field in field order.
func printHash(ctx context.Context, client rueidis.Client, key string) {
	h, err := client.Do(ctx, client.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range slices.Sorted(maps.Keys(h)) {
		fmt.Printf("%s=%s\n", f, h[f])
	}
}

// visitsByCountry is a custom family builder: a HyperLogLog per country of
// the users seen, "visits:by-country:<country>", counted with PFCOUNT.
type visitsByCountry struct{}

func (visitsByCountry) Key() string { return "visits:by-country" }

// KeyType reports "string", the type TYPE gives a HyperLogLog: only such
// keys under the prefix are orphans.
func (visitsByCountry) KeyType() string { return "string" }

// Order returns AnyOrder: PFADDs give the same HyperLogLog in any order.
func (visitsByCountry) Order() index.Order { return index.AnyOrder }

// Build merges each user into its country's HyperLogLog, one item at a time.
func (visitsByCountry) Build(c *index.Commands, items []User) error {
	for _, u := range items {
		if err := c.MergeBucket(u.Country, "PFADD", u.ID); err != nil {
			return err
		}
	}
	return nil
}

// A family builder of your own merges its entries bucket by bucket with
// MergeBucket; the Rebuilder gathers each bucket's entries across batches
// into full commands.
func ExampleCommands_MergeBucket() {
	client := env.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	r, err := rebuild.New(client, rebuild.Options{}, index.Builder[User](visitsByCountry{}))
	if err != nil {
		log.Fatal(err)
	}
	var users []User
	for i := range 3000 {
		users = append(users, User{ID: strconv.Itoa(i), Country: []string{"fr", "it", "fr"}[i%3]})
	}
	if _, err := r.Run(ctx, sources.Slice(users)); err != nil {
		log.Fatal(err)
	}
	for _, country := range []string{"fr", "it"} {
		n, err := client.Do(ctx, client.B().Pfcount().Key("visits:by-country:"+country).Build()).AsInt64()
		if err != nil {
			log.Fatal(err)
		}
		// A HyperLogLog's count is within about 1% of the truth.
		fmt.Printf("%s: about %d thousand\n", country, (n+500)/1000)
	}
	// Output:
	// fr: about 2 thousand
	// it: about 1 thousand
}

// A builder of your own implements Key and Build: Build writes each batch to
// the run's temp key, which Commands.Temp names, and the Rebuilder publishes
// it once the source is exhausted.
func ExampleBuilder() {
	client := env.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	r, err := rebuild.New[User](client, rebuild.Options{}, emailIndex{"users:by-email"})
	if err != nil {
		log.Fatal(err)
	}
	users := []User{{ID: "1", Email: "ann@example.com"}, {ID: "2", Email: "bob@example.com"}}
	if _, err := r.Run(ctx, sources.Slice(users)); err != nil {
		log.Fatal(err)
	}
	printHash(ctx, client, "users:by-email")
	// Output:
	// ann@example.com=1
	// bob@example.com=2
}

// emailIndex is a hand-written unique index, email → id, that Apply can
// maintain: its Diff removes an old email only while it still names the old
// user, with HDelIf, as builders.Hash does.
type emailIndex struct{ key string }

func (e emailIndex) Key() string { return e.key }

func (e emailIndex) Build(c *index.Commands, users []User) error {
	temp, err := c.Temp(e.key)
	if err != nil {
		return err
	}
	for _, u := range users {
		c.Add(c.B().Hset().Key(temp).FieldValue().FieldValue(u.Email, u.ID).Build(), 1)
	}
	return nil
}

func (e emailIndex) Diff(w *index.Writes, old, new *User) error {
	if old != nil && (new == nil || old.Email != new.Email) {
		if err := w.HDelIf(e.key, old.Email, old.ID); err != nil {
			return err
		}
	}
	if new != nil {
		return w.HSet(e.key, new.Email, new.ID)
	}
	return nil
}

// An email passes from one user to another: user 1 changes to a new one,
// then user 2 takes the old one, and the application applies user 2's
// change first (the changes of two items may come in either order). User
// 1's removal of x@example.com finds it holding user 2's id, and leaves it.
func ExampleWrites_HDelIf() {
	client := env.ExampleClient()
	defer client.Close()
	ctx := context.Background()

	r, err := rebuild.New[User](client, rebuild.Options{}, emailIndex{"users:by-email"})
	if err != nil {
		log.Fatal(err)
	}
	ann := User{ID: "1", Email: "x@example.com"}
	bob := User{ID: "2", Email: "w@example.com"}
	if _, err := r.Run(ctx, sources.Slice([]User{ann, bob})); err != nil {
		log.Fatal(err)
	}
	annMoved, bobMoved := ann, bob
	annMoved.Email, bobMoved.Email = "y@example.com", "x@example.com"
	if err := r.Apply(ctx, index.Update(bob, bobMoved)); err != nil {
		log.Fatal(err)
	}
	if err := r.Apply(ctx, index.Update(ann, annMoved)); err != nil {
		log.Fatal(err)
	}
	printHash(ctx, client, "users:by-email")
	// Output:
	// x@example.com=2
	// y@example.com=1
}

// The builders of package builders say through Order what the runner may do
// with the order of their batches; a builder without an Order method is
// InOrder.
func ExampleOrdered() {
	for _, b := range []index.Builder[User]{
		builders.Hash("users:by-email", func(u User) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SetIndex("users:by-country", func(u User) (string, string, bool) { return u.Country, u.ID, true }),
		emailIndex{"users:by-email"},
	} {
		order := index.InOrder
		if o, ok := b.(index.Ordered); ok {
			order = o.Order()
		}
		fmt.Printf("%s: %v\n", b.Key(), order)
	}
	// Output:
	// users:by-email: ByEntry
	// users:by-country: AnyOrder
	// users:by-email: InOrder
}

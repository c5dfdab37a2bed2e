package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/reader"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// A group: two indexes of one Rebuilder, with no common hash tag. Their
// pointers hang off the group's tag, "{users}", so that one script flips
// both; their data keys keep their own names and, on a cluster, spread
// over every master. Readers give the same group: the group's run claimed
// each index, so a reader without it refuses the index, naming the group,
// and so does a run without it.
func ExampleOptions_group() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	byEmail := builders.Hash("users:by-email", func(u User) (string, string, bool) { return u.Email, u.ID, true })
	byCountry := builders.SetIndex("users:by-country", func(u User) (string, string, bool) { return u.Country, u.ID, true })
	opts := rebuild.Options{Publish: rebuild.Generations, Group: "users", Grace: time.Millisecond}
	r, err := rebuild.New(client, opts, byEmail, byCountry)
	if err != nil {
		log.Fatal(err)
	}
	users := []User{{ID: "1", Email: "ada@example.com", Country: "fr"}, {ID: "2", Email: "bob@example.com", Country: "de"}}
	if _, err := r.Run(ctx, sources.Slice(users)); err != nil {
		log.Fatal(err)
	}
	for _, k := range []string{"{users}:rebuild-group:users:by-email:rebuild-ptr", "{users}:rebuild-group:users:by-country:rebuild-ptr"} {
		ptr, _ := client.Do(ctx, client.B().Get().Key(k).Build()).ToString()
		fmt.Println(k, "=", ptr)
	}

	rd, err := reader.New(client, reader.Options{Group: "users"})
	if err != nil {
		log.Fatal(err)
	}
	id, _, _ := rd.HGet(ctx, reader.Plain("users:by-email"), "bob@example.com")
	key, _ := rd.Bucket(ctx, "users:by-country", "fr")
	fmt.Println("bob:", id, "; fr is in", key)

	// Without the group: the index's own pointer holds the group's claim.
	plain, _ := reader.New(client, reader.Options{})
	_, err = plain.Key(ctx, "users:by-email")
	fmt.Println(errors.Is(err, reader.ErrGroupConflict), err)
	own, err := rebuild.New(client, rebuild.Options{Publish: rebuild.Generations}, byEmail)
	if err != nil {
		log.Fatal(err)
	}
	_, err = own.Run(ctx, sources.Slice(users))
	fmt.Println(errors.Is(err, rebuild.ErrGroupConflict))

	// A group with a brace would not be the hash tag.
	_, err = rebuild.New(client, rebuild.Options{Publish: rebuild.Generations, Group: "{users}"}, byEmail)
	fmt.Println(err)
	// Output:
	// {users}:rebuild-group:users:by-email:rebuild-ptr = 1
	// {users}:rebuild-group:users:by-country:rebuild-ptr = 1
	// bob: 2 ; fr is in users:by-country:rebuild-g:1:fr
	// true keyswap: reader: resolve users:by-email:rebuild-ptr: the index belongs to another group, or to none, or its base to another index: the index is in group "users" (users:by-email:rebuild-ptr holds "group:users"): read it with Options.Group "users"
	// true
	// keyswap: config users:by-email: Group: bad group: "{users}" holds a brace: the group must be the whole hash tag, {group}, of its indexes' control keys
}

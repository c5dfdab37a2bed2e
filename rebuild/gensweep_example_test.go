package rebuild_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// Sweep removes what runs in Generations mode left: here a retired
// generation that the run did not remove itself (a negative Grace leaves
// it to a sweep).
func ExampleRebuilder_Sweep() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	country := builders.SetIndex("users:by-country", func(u User) (string, string, bool) {
		return u.Country, u.ID, true
	})
	r, err := rebuild.New(client, rebuild.Options{Publish: rebuild.Generations, Grace: -1}, country)
	if err != nil {
		log.Fatal(err)
	}
	for _, users := range [][]User{{{ID: "1", Country: "fr"}}, {{ID: "2", Country: "de"}}} {
		if _, err := r.Run(ctx, sources.Slice(users)); err != nil {
			log.Fatal(err)
		}
	}
	// A sweeper with a short grace, so that the example need not wait ten
	// seconds: generation 1 was retired by the second run.
	sweeper, err := rebuild.New(client, rebuild.Options{Publish: rebuild.Generations, Grace: time.Millisecond}, country)
	if err != nil {
		log.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // the grace period
	stats, err := sweeper.Sweep(ctx)
	if err != nil {
		log.Fatal(err)
	}
	s := stats.Indexes["users:by-country"]
	fmt.Println("removed:", s.Removed, "keys:", s.Keys)
	for _, k := range s.Kept {
		fmt.Println("kept:", k.Gen, k.State)
	}
	// Output:
	// removed: [1] keys: 1
	// kept: 2 current
}

// Switching an index from RenameInPlace to Generations: once readers
// resolve the pointer (package reader), the first Generations run creates
// it, and DropPlain deletes the keys of the rename-in-place shape.
func ExampleRebuilder_DropPlain() {
	client := exampleClient()
	defer client.Close()
	ctx := context.Background()

	country := builders.SetIndex("users:by-country", func(u User) (string, string, bool) {
		return u.Country, u.ID, true
	})
	users := []User{{ID: "1", Country: "fr"}, {ID: "2", Country: "de"}}
	for _, mode := range []rebuild.PublishMode{rebuild.RenameInPlace, rebuild.Generations} {
		r, err := rebuild.New(client, rebuild.Options{Publish: mode, Grace: time.Millisecond}, country)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := r.Run(ctx, sources.Slice(users)); err != nil {
			log.Fatal(err)
		}
		if mode == rebuild.Generations {
			stats, err := r.DropPlain(ctx)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Println("plain keys dropped:", stats.Keys)
		}
	}
	ks, _ := client.Do(ctx, client.B().Keys().Pattern("users:by-country:*").Build()).AsStrSlice()
	slices.Sort(ks)
	for _, k := range ks {
		fmt.Println(k)
	}
	// Output:
	// plain keys dropped: 2
	// users:by-country:rebuild-g:1:de
	// users:by-country:rebuild-g:1:fr
	// users:by-country:rebuild-gen
	// users:by-country:rebuild-gens
	// users:by-country:rebuild-l:1
	// users:by-country:rebuild-m:1
	// users:by-country:rebuild-ptr
}

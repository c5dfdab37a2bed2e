package builders_test

// The examples run under go test as documentation, against the package's
// test server.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"maps"
	"math"
	"slices"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// Profile is the record type of the example.
type Profile struct {
	ID     string   `json:"id"`
	Name   string   `json:"name"`
	Tags   []string `json:"tags"`
	Rating float64  `json:"rating"`
}

// Keep each profile as a JSON document in one hash, id → JSON. The mapping
// can fail (json.Marshal refuses an infinite rating), so it goes to
// HashErr: an item that cannot be encoded fails the run, and the live hash
// keeps what it held.
func ExampleHashErr() {
	ctx := context.Background()
	client := env.ExampleClient()
	defer client.Close()

	profiles := builders.HashErr("profiles", func(p Profile) (field, value string, ok bool, err error) {
		doc, err := json.Marshal(p)
		if err != nil {
			return "", "", false, fmt.Errorf("profile %s: %w", p.ID, err)
		}
		return p.ID, string(doc), true, nil
	})
	r, err := rebuild.New(client, rebuild.Options{}, profiles)
	if err != nil {
		log.Fatal(err)
	}
	src := []Profile{
		{ID: "u1", Name: "Ann", Tags: []string{"admin"}, Rating: 4.5},
		{ID: "u2", Name: "Bob", Tags: []string{}, Rating: 3},
	}
	if _, err := r.Run(ctx, sources.Slice(src)); err != nil {
		log.Fatal(err)
	}
	printHash := func() {
		h, err := client.Do(ctx, client.B().Hgetall().Key("profiles").Build()).AsStrMap()
		if err != nil {
			log.Fatal(err)
		}
		for _, id := range slices.Sorted(maps.Keys(h)) {
			fmt.Printf("  %s: %s\n", id, h[id])
		}
	}
	fmt.Println("profiles:")
	printHash()

	// One value json.Marshal refuses: nothing is published.
	src = append(src, Profile{ID: "u3", Name: "Cy", Rating: math.Inf(1)})
	_, err = r.Run(ctx, sources.Slice(src))
	var unsupported *json.UnsupportedValueError
	fmt.Println("error:", err)
	fmt.Println("errors.As finds the json error:", errors.As(err, &unsupported))
	fmt.Println("profiles, unchanged:")
	printHash()
	// Output:
	// profiles:
	//   u1: {"id":"u1","name":"Ann","tags":["admin"],"rating":4.5}
	//   u2: {"id":"u2","name":"Bob","tags":[],"rating":3}
	// error: keyswap: build profiles: mapping an item: profile u3: json: unsupported value: +Inf
	// errors.As finds the json error: true
	// profiles, unchanged:
	//   u1: {"id":"u1","name":"Ann","tags":["admin"],"rating":4.5}
	//   u2: {"id":"u2","name":"Bob","tags":[],"rating":3}
}

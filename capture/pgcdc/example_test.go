package pgcdc_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/capture/pgcdc"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// A relay of the table users into an index of emails. It needs a
// PostgreSQL with wal_level = logical, so it only compiles here; see
// examples/postgres-cdc for one that runs.
func Example() {
	ctx := context.Background()
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	type User struct{ ID, Email string }
	r, err := rebuild.New(client, rebuild.Options{},
		builders.Hash("users:by-email", func(u User) (string, string, bool) { return u.Email, u.ID, !builders.Blank(u.Email) }))
	if err != nil {
		log.Fatal(err)
	}
	// ALTER TABLE users REPLICA IDENTITY FULL;
	// CREATE PUBLICATION keyswap FOR TABLE users;
	// SELECT pg_create_logical_replication_slot('keyswap_users', 'pgoutput');
	relay, err := pgcdc.New(os.Getenv("DATABASE_URL"), r, pgcdc.Options{Slot: "keyswap_users", Publication: "keyswap"},
		pgcdc.Table[User]{Name: "users", Change: pgcdc.Decode(func(row pgcdc.Row) (User, error) {
			id, ok := row["id"].(int64)
			if !ok {
				return User{}, fmt.Errorf("id is %T", row["id"])
			}
			email, _ := row["email"].(string) // nil for NULL
			return User{ID: strconv.FormatInt(id, 10), Email: email}, nil
		})})
	if err != nil {
		log.Fatal(err)
	}
	switch err := relay.Run(ctx); {
	case errors.Is(err, pgcdc.ErrSetup): // the database needs a change: the error says which
	case errors.Is(err, pgcdc.ErrRebuildRequired): // changes were lost (the slot was invalidated): rebuild
	case errors.Is(err, pgcdc.ErrRejected): // the function rejected a row: the relay stopped before it
	default:
		log.Print(err)
	}
}

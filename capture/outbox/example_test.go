package outbox_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/capture/outbox"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// The application writes each change into the outbox in its own
// transaction, and one relay applies them. It needs a Redis, so it only
// compiles here.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:app.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	type User struct{ ID, Email string }
	ob, err := outbox.New[User](outbox.Options{Dialect: outbox.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Create(ctx, db); err != nil {
		log.Fatal(err)
	}

	// The application: the change and its outbox row commit together. The
	// version comes from a counter that never goes back (the one-row table
	// user_versions), taken after the change to the row.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE users SET email = ? WHERE id = ?`, "b@example.com", "42"); err != nil {
		log.Fatal(err)
	}
	var version int64
	if err := tx.QueryRowContext(ctx, `UPDATE user_versions SET v = v + 1 RETURNING v`).Scan(&version); err != nil {
		log.Fatal(err)
	}
	old, new := User{ID: "42", Email: "a@example.com"}, User{ID: "42", Email: "b@example.com"}
	if err := ob.Write(ctx, tx, "user:42", version, index.Update(old, new)); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// One relay, in one process.
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	r, err := rebuild.New(client, rebuild.Options{},
		builders.Hash("users:by-email", func(u User) (string, string, bool) { return u.Email, u.ID, !builders.Blank(u.Email) }))
	if err != nil {
		log.Fatal(err)
	}
	log.Print(ob.Relay(db, r, outbox.RelayOptions{}).Run(ctx))
}

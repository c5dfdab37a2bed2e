// Postgres-cdc keeps Redis indexes of a PostgreSQL table up to date from
// the database's own log of changes (logical replication), with no Apply
// call in the application, and rebuilds them while changes keep coming.
//
//	go run ./examples/postgres-cdc -pg postgres://postgres@127.0.0.1:5432/postgres   # embedded Redis
//	go run ./examples/postgres-cdc -pg "$DATABASE_URL" -redis redis://127.0.0.1:6379
//
// It needs a PostgreSQL (13 or later) with wal_level = logical and a user
// with the REPLICATION attribute (a superuser has it). To start one:
//
//	# Debian or Ubuntu, as root: a throw-away server on port 5433
//	apt-get install postgresql
//	mkdir -p /tmp/pg && chown postgres /tmp/pg
//	su postgres -c '/usr/lib/postgresql/*/bin/initdb -D /tmp/pg/data -A trust'
//	su postgres -c '/usr/lib/postgresql/*/bin/pg_ctl -D /tmp/pg/data -o "-p 5433 -c wal_level=logical -k /tmp/pg" -l /tmp/pg/log start'
//	go run ./examples/postgres-cdc -pg postgres://postgres@127.0.0.1:5433/postgres
//
//	# or with Docker
//	docker run -d -p 5433:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16 -c wal_level=logical
//
// The program creates a table cdc_users (REPLICA IDENTITY FULL), a
// publication and a replication slot, starts a pgcdc relay, and only then
// loads the users and rebuilds the index (a slot streams only what is
// committed after it exists). A writer then changes users in the table,
// with plain SQL, while the relay applies the changes and a second rebuild
// runs. At the end the program compares the index with the table, entry by
// entry, prints how many were lost or stale (0), drops the slot, the
// publication and the table, and exits with status 1 on any difference.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"maps"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/capture/pgcdc"
	"github.com/keyswap/keyswap/examples/internal/connect"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "postgres-cdc:", err)
		os.Exit(1)
	}
}

// User is a row of cdc_users.
type User struct {
	ID, Email, Country string
}

// The keys of the index.
const (
	byEmail   = "cdc:users:by-email"   // hash email → id
	byCountry = "cdc:users:by-country" // one set of ids per country
)

const slot, publication = "keyswap_cdc_example", "keyswap_cdc_example"

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("postgres-cdc", flag.ContinueOnError)
	dsn := fs.String("pg", os.Getenv("DATABASE_URL"), "PostgreSQL `URL` (default $DATABASE_URL); wal_level must be logical")
	redisURL := connect.Flag(fs)
	users := fs.Int("users", 20000, "users in the table")
	changes := fs.Int("changes", 2000, "changes the writer makes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dsn == "" {
		return errors.New("no PostgreSQL: pass -pg postgres://user@host:port/db (see the comment at the top of main.go for how to start one)")
	}
	client, where, closeRedis, err := connect.Open(*redisURL)
	if err != nil {
		return err
	}
	defer closeRedis()
	fmt.Fprintf(out, "Redis: %s\n", where)

	db, err := pgx.Connect(ctx, *dsn)
	if err != nil {
		return err
	}
	defer db.Close(context.WithoutCancel(ctx))
	if err := setup(ctx, db); err != nil {
		return err
	}
	defer teardown(context.WithoutCancel(ctx), db)

	r, err := rebuild.New(client, rebuild.Options{},
		builders.Hash(byEmail, func(u User) (string, string, bool) { return u.Email, u.ID, !builders.Blank(u.Email) }),
		builders.SetIndex(byCountry, func(u User) (string, string, bool) { return u.Country, u.ID, !builders.Blank(u.Country) }),
	)
	if err != nil {
		return err
	}

	// 1. The relay, on the slot created above.
	// BatchSize 50: the embedded Redis's Lua runs out of room for the
	// arguments of 500 changes in one script; a real Redis takes them.
	relay, err := pgcdc.New(*dsn, r, pgcdc.Options{Slot: slot, Publication: publication, StatusInterval: time.Second, BatchSize: 50},
		pgcdc.Table[User]{Name: "cdc_users", Change: pgcdc.Decode(userFromRow)})
	if err != nil {
		return err
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	defer func() { stopRelay(); <-relayDone }()

	// 2. Load the users, then rebuild the index from the table: the slot
	// existed before, so nothing falls between the two.
	if _, err := db.Exec(ctx, `INSERT INTO cdc_users (id, email, country)
		SELECT g, 'user' || g || '@example.com', (ARRAY['fr','de','nl','be'])[1 + g % 4] FROM generate_series(1, $1) g`, *users); err != nil {
		return err
	}
	stats, err := r.Run(ctx, sources.Seq2(source(ctx, *dsn)))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "rebuilt the index from %d users\n", stats.Items)

	// 3. A writer changes users with plain SQL, while a second rebuild runs.
	written := make(chan error, 1)
	go func() { written <- write(ctx, db, *users, *changes) }()
	stats, err = r.Run(ctx, sources.Seq2(source(ctx, *dsn)))
	if err != nil {
		return err
	}
	if err := <-written; err != nil {
		return err
	}
	fmt.Fprintf(out, "rebuilt again while the writer made %d changes; %d of them were applied by the relay during the run and replayed by it\n", *changes, stats.Changes)

	// 4. Wait for the relay to catch up, then compare.
	lost, stale, err := compare(ctx, db, client, relay)
	if err != nil {
		return err
	}
	st := relay.Status()
	fmt.Fprintf(out, "relay: %d changes applied, position %s, last lag %v\n", st.Applied, st.Position, st.Lag.Round(time.Millisecond))
	fmt.Fprintf(out, "index vs table: %d lost, %d stale\n", lost, stale)
	if lost+stale > 0 {
		return fmt.Errorf("%d entries lost, %d stale", lost, stale)
	}
	return nil
}

// setup creates the table, the publication and the slot, dropping those a
// previous run left.
func setup(ctx context.Context, db *pgx.Conn) error {
	teardown(ctx, db)
	for _, q := range []string{
		`CREATE TABLE cdc_users (id bigint PRIMARY KEY, email text, country text)`,
		`ALTER TABLE cdc_users REPLICA IDENTITY FULL`,
		`CREATE PUBLICATION ` + publication + ` FOR TABLE cdc_users`,
		`SELECT pg_create_logical_replication_slot('` + slot + `', 'pgoutput')`,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// teardown drops what setup created.
func teardown(ctx context.Context, db *pgx.Conn) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The relay's connection may take a moment to go away.
	for range 50 {
		if _, err := db.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, _ = db.Exec(ctx, `DROP PUBLICATION IF EXISTS `+publication)
	_, _ = db.Exec(ctx, `DROP TABLE IF EXISTS cdc_users`)
}

// userFromRow decodes a row of cdc_users.
func userFromRow(row pgcdc.Row) (User, error) {
	id, ok := row["id"].(int64)
	if !ok {
		return User{}, fmt.Errorf("id is %T", row["id"])
	}
	email, _ := row["email"].(string)
	country, _ := row["country"].(string)
	return User{ID: strconv.FormatInt(id, 10), Email: email, Country: country}, nil
}

// source reads cdc_users on a connection of its own, when the run pulls it
// (after the run took its locks).
func source(ctx context.Context, dsn string) iter.Seq2[User, error] {
	return func(yield func(User, error) bool) {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			yield(User{}, err)
			return
		}
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, `SELECT id, coalesce(email, ''), coalesce(country, '') FROM cdc_users`)
		if err != nil {
			yield(User{}, err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			var u User
			if err := rows.Scan(&id, &u.Email, &u.Country); err != nil {
				yield(User{}, err)
				return
			}
			u.ID = strconv.FormatInt(id, 10)
			if !yield(u, nil) {
				return
			}
		}
		if err := rows.Err(); err != nil {
			yield(User{}, err)
		}
	}
}

// write makes n changes to random users: new emails and countries, some
// deletes and re-inserts.
func write(ctx context.Context, db *pgx.Conn, users, n int) error {
	rng := rand.New(rand.NewPCG(1, 2))
	countries := []string{"fr", "de", "nl", "be", "es"}
	for i := range n {
		id := 1 + rng.IntN(users)
		var err error
		if rng.IntN(10) == 0 {
			_, err = db.Exec(ctx, `DELETE FROM cdc_users WHERE id = $1`, id)
		} else {
			_, err = db.Exec(ctx, `INSERT INTO cdc_users (id, email, country) VALUES ($1, $2, $3)
				ON CONFLICT (id) DO UPDATE SET email = excluded.email, country = excluded.country`,
				id, fmt.Sprintf("user%d.%d@example.com", id, i), countries[rng.IntN(len(countries))])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// compare waits until the relay applied every change committed so far, then
// compares the index with the table, and returns the entries of the table
// missing from the index and those of the index the table lacks.
func compare(ctx context.Context, db *pgx.Conn, client rueidis.Client, relay *pgcdc.Relay[User]) (lost, stale int, err error) {
	var lsn string
	if err := db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return 0, 0, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var caught bool
		if err := db.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2`, lsn, slot).Scan(&caught); err != nil {
			return 0, 0, err
		}
		if caught && relay.Status().Pending == 0 {
			break
		}
		if st := relay.Status(); st.Err != nil && !st.Connected {
			return 0, 0, fmt.Errorf("relay: %w", st.Err)
		}
		if time.Now().After(deadline) {
			return 0, 0, errors.New("the relay did not catch up within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	want := map[string]bool{}
	rows, err := db.Query(ctx, `SELECT id, coalesce(email, ''), coalesce(country, '') FROM cdc_users`)
	if err != nil {
		return 0, 0, err
	}
	for rows.Next() {
		var id int64
		var email, country string
		if err := rows.Scan(&id, &email, &country); err != nil {
			return 0, 0, err
		}
		if email != "" {
			want["email "+email+" "+strconv.FormatInt(id, 10)] = true
		}
		if country != "" {
			want["country "+country+" "+strconv.FormatInt(id, 10)] = true
		}
	}
	if err := rows.Err(); err != nil {
		return 0, 0, err
	}
	got := map[string]bool{}
	emails, err := client.Do(ctx, client.B().Hgetall().Key(byEmail).Build()).AsStrMap()
	if err != nil {
		return 0, 0, err
	}
	for e, id := range emails {
		got["email "+e+" "+id] = true
	}
	for _, c := range []string{"fr", "de", "nl", "be", "es"} {
		ids, err := client.Do(ctx, client.B().Smembers().Key(byCountry+":"+c).Build()).AsStrSlice()
		if err != nil {
			return 0, 0, err
		}
		for _, id := range ids {
			got["country "+c+" "+id] = true
		}
	}
	for _, e := range slices.Sorted(maps.Keys(want)) {
		if !got[e] {
			lost++
		}
	}
	for e := range got {
		if !want[e] {
			stale++
		}
	}
	return lost, stale, nil
}

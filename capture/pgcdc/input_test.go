package pgcdc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/keyswap/keyswap/capture/pgcdc"
	"github.com/keyswap/keyswap/capture/pgtest"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
)

// runErr runs r until it returns, which must be within the test's
// deadline, and returns its error.
func runErr(t *testing.T, r *pgcdc.Relay[user]) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), redistest.Timeout)
	defer cancel()
	err := r.Run(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run did not return within %v", redistest.Timeout)
	}
	return err
}

// confirmed returns the slot's confirmed position.
func (f *fixture) confirmed(t *testing.T) string {
	t.Helper()
	var lsn string
	ctx := context.Background()
	c, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if err := c.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// TestUpdatesMoveEntries: two users swap their emails in one transaction,
// and a country's set loses and gains members. The hash's removal of the
// old email must not remove the entry the other user just wrote (this
// needs Apply's conditional removals).
func TestUpdatesMoveEntries(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	running(t, f.relay(t, f.options()))
	pg.Exec(t, f.dsn,
		`INSERT INTO users (id, email, country, score) VALUES (1, 'a@example.com', 'fr', 1), (2, 'b@example.com', 'de', 2)`,
		`UPDATE users SET email = CASE id WHEN 1 THEN 'b@example.com' ELSE 'a@example.com' END, country = CASE id WHEN 1 THEN 'de' ELSE 'fr' END`,
	)
	f.waitIndex(t)
	redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"b@example.com": "1", "a@example.com": "2"})
}

// TestRejectedRow: a row the table's function rejects stops the relay
// before it: the changes committed before it are applied, none after,
// and the slot is not acknowledged past it. A relay whose function skips
// the row then goes on.
func TestRejectedRow(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	pg.Exec(t, f.dsn,
		`INSERT INTO users (id, email) VALUES (1, 'a@example.com')`,
		`INSERT INTO users (id, email) VALUES (2, 'bad')`,
		`INSERT INTO users (id, email) VALUES (3, 'c@example.com')`,
	)
	rejecting := func(r pgcdc.Row) (user, error) {
		u, err := decodeUser(r)
		if err == nil && !strings.Contains(u.Email, "@") {
			err = fmt.Errorf("user %s: email %q has no @", u.ID, u.Email)
		}
		return u, err
	}
	r, err := pgcdc.New(f.dsn, f.rb, f.options(), pgcdc.Table[user]{Name: "public.users", Change: pgcdc.Decode(rejecting)})
	if err != nil {
		t.Fatal(err)
	}
	err = runErr(t, r)
	if !errors.Is(err, pgcdc.ErrRejected) || !strings.Contains(err.Error(), `email "bad" has no @`) || !strings.Contains(err.Error(), "table public.users") {
		t.Fatalf("Run: %v; want ErrRejected naming the table and the function's error", err)
	}
	if st := r.Status(); st.Err == nil || st.Connected {
		t.Errorf("status %+v: want the error, not connected", st)
	}
	redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"a@example.com": "1"})
	before := f.confirmed(t)
	// Run again: the same row stops it again, and nothing moves.
	r2, _ := pgcdc.New(f.dsn, f.rb, f.options(), pgcdc.Table[user]{Name: "users", Change: pgcdc.Decode(rejecting)})
	if err := runErr(t, r2); !errors.Is(err, pgcdc.ErrRejected) {
		t.Fatalf("second Run: %v", err)
	}
	if after := f.confirmed(t); after != before {
		t.Fatalf("the slot moved from %s to %s past a rejected row", before, after)
	}
	redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"a@example.com": "1"})
	// A function that skips such rows goes on.
	skipping := func(old, new pgcdc.Row) (rebuild.Change[user], bool, error) {
		if u, _ := decodeUser(new); !strings.Contains(u.Email, "@") {
			return rebuild.Change[user]{}, false, nil
		}
		return pgcdc.Decode(decodeUser)(old, new)
	}
	r3, _ := pgcdc.New(f.dsn, f.rb, f.options(), pgcdc.Table[user]{Name: "users", Change: skipping})
	running(t, r3)
	waitFor(t, "the rows after the rejected one", func() bool { return len(redistest.HGetAll(t, f.client, f.prefix+"by-email")) == 2 })
	redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"a@example.com": "1", "c@example.com": "3"})
}

// TestSetupErrors: Run refuses a database that is not set up for it,
// with an error that says what to change, and applies nothing.
func TestSetupErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup []string
		opts  func(*pgcdc.Options)
		table string
		want  string
	}{
		{name: "no slot", opts: func(o *pgcdc.Options) { o.Slot = "ks_missing" }, want: `replication slot "ks_missing" does not exist; create it with SELECT pg_create_logical_replication_slot('ks_missing', 'pgoutput')`},
		{name: "no publication", opts: func(o *pgcdc.Options) { o.Publication = "nothing" }, want: `publication "nothing" does not exist`},
		{name: "no table", table: "orders", want: "table public.orders does not exist"},
		{name: "table not published", setup: []string{`CREATE TABLE other (id bigint PRIMARY KEY, email text, country text, score float8)`, `ALTER TABLE other REPLICA IDENTITY FULL`}, table: "other", want: `publication "keyswap" does not include table public.other; add it with ALTER PUBLICATION "keyswap" ADD TABLE "public"."other"`},
		{name: "replica identity", setup: []string{`ALTER TABLE users REPLICA IDENTITY DEFAULT`}, want: `table public.users has REPLICA IDENTITY DEFAULT; the relay needs the whole old row`},
		{name: "no updates published", setup: []string{`ALTER PUBLICATION keyswap SET (publish = 'insert, delete')`}, want: `publication "keyswap" does not publish update`},
		{name: "column list", setup: []string{`ALTER PUBLICATION keyswap SET TABLE users (id, email)`}, want: `without the columns country, score, bio`},
		{name: "row filter", setup: []string{`ALTER PUBLICATION keyswap SET TABLE users WHERE (score > 0)`}, want: `with a row filter`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, pg, env.Standalone.Client(t))
			pg.Exec(t, f.dsn, tc.setup...)
			pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (1, 'a@example.com')`)
			opts := f.options()
			if tc.opts != nil {
				tc.opts(&opts)
			}
			table := usersTable()
			if tc.table != "" {
				table.Name = tc.table
			}
			r, err := pgcdc.New(f.dsn, f.rb, opts, table)
			if err != nil {
				t.Fatal(err)
			}
			err = runErr(t, r)
			if !errors.Is(err, pgcdc.ErrSetup) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v\nwant ErrSetup, and %q", err, tc.want)
			}
			redistest.WantClean(t, f.client, f.prefix)
			if keys := redistest.Keys(t, f.client, f.prefix); len(keys) != 0 {
				t.Fatalf("applied something: %v", keys)
			}
		})
	}
}

// TestCreateSlot: with Options.CreateSlot the relay creates a missing
// slot, and streams what is committed after it.
func TestCreateSlot(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	opts := f.options()
	opts.Slot, opts.CreateSlot = f.slot+"_new", true
	r := f.relay(t, opts)
	running(t, r)
	waitFor(t, "the relay to connect", func() bool { return r.Status().Connected })
	pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (1, 'a@example.com')`)
	f.waitIndex(t)
}

// TestTableDropped: a captured table dropped while the relay runs stops it
// with an error naming the table; a relay started then refuses to run.
func TestTableDropped(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (1, 'a@example.com')`)
	r := f.relay(t, f.options())
	done := make(chan error, 1)
	go func() { done <- runErr(t, r) }()
	f.waitIndex(t)
	pg.Exec(t, f.dsn, `DROP TABLE users`)
	var err error
	select {
	case err = <-done:
	case <-time.After(redistest.Timeout):
		t.Fatal("the relay did not stop after the table was dropped")
	}
	if !errors.Is(err, pgcdc.ErrSetup) || !strings.Contains(err.Error(), "table public.users does not exist (was it dropped?)") {
		t.Fatalf("Run: %v; want ErrSetup naming the dropped table", err)
	}
	redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"a@example.com": "1"})
	if err := runErr(t, f.relay(t, f.options())); !errors.Is(err, pgcdc.ErrSetup) {
		t.Fatalf("a new relay: %v, want ErrSetup", err)
	}
}

// TestTruncate: a TRUNCATE of a captured table stops the relay with
// ErrRebuildRequired after applying every change before it, unless
// Options.Truncate handles it; here it rebuilds the index from the table.
func TestTruncate(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (1, 'a@example.com')`, `TRUNCATE users`, `INSERT INTO users (id, email) VALUES (2, 'b@example.com')`)
	err := runErr(t, f.relay(t, f.options()))
	if !errors.Is(err, pgcdc.ErrRebuildRequired) || !strings.Contains(err.Error(), "TRUNCATE of public.users") {
		t.Fatalf("Run: %v; want ErrRebuildRequired naming the table", err)
	}
	redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"a@example.com": "1"})
	opts := f.options()
	var truncated []string
	opts.Truncate = func(ctx context.Context, tables []string) error {
		truncated = tables
		_, err := f.rb.Run(ctx, rebuild.FromSeq2(f.source(ctx)))
		return err
	}
	running(t, f.relay(t, opts))
	f.waitIndex(t)
	if fmt.Sprint(truncated) != "[public.users]" {
		t.Errorf("Truncate got %v", truncated)
	}
}

// source reads the users table, for a rebuild.
func (f *fixture) source(ctx context.Context) func(func(user, error) bool) {
	return func(yield func(user, error) bool) {
		c, err := pgx.Connect(ctx, f.dsn)
		if err != nil {
			yield(user{}, err)
			return
		}
		defer c.Close(ctx)
		rows, err := c.Query(ctx, `SELECT id, email, country, score FROM users`)
		if err != nil {
			yield(user{}, err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				yield(user{}, err)
				return
			}
			u, err := decodeUser(pgcdc.Row{"id": vals[0], "email": vals[1], "country": vals[2], "score": vals[3]})
			if !yield(u, err) || err != nil {
				return
			}
		}
		if err := rows.Err(); err != nil {
			yield(user{}, err)
		}
	}
}

// TestLostSlot: a slot that PostgreSQL invalidated (its WAL removed past
// max_slot_wal_keep_size) is reported as an error that says a rebuild is
// required.
func TestLostSlot(t *testing.T) {
	srv := pgtest.Own(t, "max_slot_wal_keep_size=1MB", "min_wal_size=32MB", "max_wal_size=32MB")
	f := newFixture(t, srv, env.Standalone.Client(t))
	// Write and switch WAL segments until a checkpoint removes what the
	// slot holds.
	deadline := time.Now().Add(redistest.Timeout)
	for {
		var status string
		srv.Exec(t, f.dsn, `INSERT INTO users (id, email, bio) SELECT g, 'x', repeat('y', 1000) FROM generate_series(1, 5000) g ON CONFLICT (id) DO UPDATE SET bio = excluded.bio || 'z'`,
			`SELECT pg_switch_wal()`, `CHECKPOINT`)
		c, err := pgx.Connect(context.Background(), f.dsn)
		if err != nil {
			t.Fatal(err)
		}
		err = c.QueryRow(context.Background(), `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&status)
		c.Close(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if status == "lost" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot is still %q", status)
		}
	}
	err := runErr(t, f.relay(t, f.options()))
	if !errors.Is(err, pgcdc.ErrRebuildRequired) || !strings.Contains(err.Error(), "invalidated the replication slot") {
		t.Fatalf("Run: %v; want ErrRebuildRequired", err)
	}
	redistest.WantClean(t, f.client, f.prefix)
	if keys := redistest.Keys(t, f.client, f.prefix); len(keys) != 0 {
		t.Fatalf("applied something: %v", keys)
	}
}

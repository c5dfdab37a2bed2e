package pgcdc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/keyswap/keyswap/capture/pgcdc"
	"github.com/keyswap/keyswap/capture/pgtest"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/sources"
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

// runInBackground runs r until it returns or the test ends, and returns a
// channel of Run's error.
func runInBackground(t *testing.T, r *pgcdc.Relay[user]) <-chan error {
	ctx, cancel := context.WithCancel(context.Background())
	done, finished := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(finished)
		done <- r.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-finished })
	return done
}

// confirmed returns the slot's confirmed position.
func (f *fixture) confirmed(t *testing.T) string {
	t.Helper()
	return f.query(t, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, f.slot)
}

// query returns the one text value the query sql returns.
func (f *fixture) query(t *testing.T, sql string, args ...any) string {
	t.Helper()
	var v string
	ctx := context.Background()
	c, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if err := c.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// lsn parses an LSN the server gave.
func lsn(t *testing.T, s string) pglogrepl.LSN {
	t.Helper()
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
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
	)
	// The end of the WAL once the rejected row is committed: past the
	// start of its commit record. A slot acknowledged at or past that
	// start would never send the row again; before it, the server
	// decodes the transaction again (a keepalive between the row and its
	// commit may move the slot within the transaction, harmlessly).
	rejectedEnd := lsn(t, f.query(t, `SELECT pg_current_wal_lsn()::text`))
	pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (3, 'c@example.com')`)
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
	if lsn(t, before) >= rejectedEnd {
		t.Fatalf("the slot was acknowledged at %s, past the rejected row (its commit ends at %s)", before, rejectedEnd)
	}
	// Run again: the same row stops it again, and the slot stays before it.
	r2, _ := pgcdc.New(f.dsn, f.rb, f.options(), pgcdc.Table[user]{Name: "users", Change: pgcdc.Decode(rejecting)})
	if err := runErr(t, r2); !errors.Is(err, pgcdc.ErrRejected) {
		t.Fatalf("second Run: %v", err)
	}
	if after := f.confirmed(t); lsn(t, after) >= rejectedEnd {
		t.Fatalf("the slot moved from %s to %s, past the rejected row (its commit ends at %s)", before, after, rejectedEnd)
	}
	redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"a@example.com": "1"})
	// A function that skips such rows goes on.
	skipping := func(old, new pgcdc.Row) (index.Change[user], bool, error) {
		if u, _ := decodeUser(new); !strings.Contains(u.Email, "@") {
			return index.Change[user]{}, false, nil
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
	done := runInBackground(t, r)
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
		_, err := f.rb.Run(ctx, sources.Seq2(f.source(ctx)))
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

// TestServerOutputSettings: the database's own DateStyle, IntervalStyle,
// extra_float_digits and bytea_output (set for the database, so the
// relay's connections inherit them) change how PostgreSQL prints values;
// the relay sets the ones pgx decodes on its replication connection, so
// that Change gets the same values whatever the server prints by default
// (a timestamp in DMY order could not be decoded at all, a float8 would be
// rounded).
func TestServerOutputSettings(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	db := f.dsn[strings.LastIndex(f.dsn, "/")+1 : strings.Index(f.dsn, "?")]
	pg.Exec(t, f.dsn,
		`CREATE TABLE events (id bigint PRIMARY KEY, at timestamptz, day date, took interval, ratio float8, raw bytea)`,
		`ALTER TABLE events REPLICA IDENTITY FULL`,
		`ALTER PUBLICATION keyswap ADD TABLE events`,
		`ALTER DATABASE `+db+` SET DateStyle = 'SQL, DMY'`,
		`ALTER DATABASE `+db+` SET IntervalStyle = 'iso_8601'`,
		`ALTER DATABASE `+db+` SET extra_float_digits = -3`,
		`ALTER DATABASE `+db+` SET bytea_output = 'escape'`,
	)
	pg.Exec(t, f.dsn, `INSERT INTO events VALUES (1, '2024-03-01 12:34:56.789+00', '2024-03-01', '1 year 2 mons 3 days 04:05:06', 0.1::float8 + 0.2::float8, '\x00ff10')`)
	rows := make(chan pgcdc.Row, 10)
	// A setting of the connection string itself gives way too.
	r, err := pgcdc.New(f.dsn+"&datestyle=German", f.rb, f.options(), usersTable(), pgcdc.Table[user]{Name: "events", Change: func(_, new pgcdc.Row) (index.Change[user], bool, error) {
		rows <- new
		return index.Change[user]{}, false, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	running(t, r)
	var got pgcdc.Row
	select {
	case got = <-rows:
	case <-time.After(redistest.Timeout):
		t.Fatalf("no row within %v; relay status %+v", redistest.Timeout, r.Status())
	}
	if st := r.Status(); st.Reconnects != 0 {
		t.Errorf("status %+v: want no reconnect", st)
	}
	at, _ := got["at"].(time.Time)
	day, _ := got["day"].(time.Time)
	if !at.Equal(time.Date(2024, 3, 1, 12, 34, 56, 789e6, time.UTC)) || !day.Equal(time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("at %v, day %v: want 2024-03-01 12:34:56.789 UTC and 2024-03-01", got["at"], got["day"])
	}
	if want := (pgtype.Interval{Months: 14, Days: 3, Microseconds: (4*3600 + 5*60 + 6) * 1e6, Valid: true}); got["took"] != want {
		t.Errorf("took %#v, want %#v", got["took"], want)
	}
	a, b := 0.1, 0.2
	if want := a + b; got["ratio"] != want { // 0.30000000000000004, which extra_float_digits = -3 prints as 0.3
		t.Errorf("ratio %v, want %v", got["ratio"], want)
	}
	if raw, _ := got["raw"].([]byte); string(raw) != "\x00\xff\x10" {
		t.Errorf("raw %#v, want 00ff10", got["raw"])
	}
}

// TestUndecodableRowStops: a row with a value pgx cannot decode (a jsonb
// number beyond float64's range) stops the relay with ErrRejected, naming
// the column, after the changes before it are applied; it does not
// reconnect over and over, and the slot is not acknowledged past it.
func TestUndecodableRowStops(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	pg.Exec(t, f.dsn,
		`ALTER TABLE users ADD COLUMN extra jsonb`,
		`INSERT INTO users (id, email) VALUES (1, 'a@example.com')`,
	)
	lsn := f.commitAt(t, `INSERT INTO users (id, email, extra) VALUES (2, 'b@example.com', '{"n": 1e400}')`)
	pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (3, 'c@example.com')`)
	r := f.relay(t, f.options())
	err := runErr(t, r)
	if !errors.Is(err, pgcdc.ErrRejected) || !strings.Contains(err.Error(), "column extra") || !strings.Contains(err.Error(), "table public.users") {
		t.Fatalf("Run: %v; want ErrRejected naming the table and the column", err)
	}
	if st := r.Status(); st.Reconnects != 0 {
		t.Errorf("status %+v: want no reconnect", st)
	}
	redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"a@example.com": "1"})
	if diff, _ := f.slotProgress(t, lsn); diff >= 0 {
		t.Fatalf("the slot was acknowledged %d bytes past the row that cannot be decoded", diff)
	}
}

// TestTableRenamed: a captured table renamed while the relay runs stops it
// at once (checks far apart do not matter), with an error that names the
// new name; the changes made under the new name are not skipped: a relay
// given the table again resumes with them, 0 lost, 0 stale.
func TestTableRenamed(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	opts := f.options()
	opts.CheckInterval = time.Hour // only the stream can tell in time
	pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (1, 'a@example.com')`)
	r := f.relay(t, opts)
	done := runInBackground(t, r)
	f.waitIndex(t)
	pg.Exec(t, f.dsn, `ALTER TABLE users RENAME TO people`, `INSERT INTO people (id, email) VALUES (2, 'b@example.com')`, `UPDATE people SET email = 'a2@example.com' WHERE id = 1`)
	var err error
	select {
	case err = <-done:
	case <-time.After(redistest.Timeout):
		t.Fatalf("the relay did not stop within %v after the table was renamed; status %+v", redistest.Timeout, r.Status())
	}
	if !errors.Is(err, pgcdc.ErrSetup) || !strings.Contains(err.Error(), "table public.users was renamed to public.people") {
		t.Fatalf("Run: %v; want ErrSetup naming the new name", err)
	}
	// Renamed back (or given the new name), a relay resumes: the changes
	// made under the other name reach the index.
	pg.Exec(t, f.dsn, `ALTER TABLE people RENAME TO users`)
	running(t, f.relay(t, opts))
	f.waitIndex(t)
	redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"a2@example.com": "1", "b@example.com": "2"})
}

// TestTableRecreated: a captured table dropped and created again while the
// relay runs is another table: the entries of the old one's rows are still
// in the index, so the relay stops with ErrRebuildRequired, and applies
// none of the new table's changes: at its first change, whatever the
// checks' interval, or at the next check when there is none.
func TestTableRecreated(t *testing.T) {
	for _, tc := range []struct {
		name   string
		check  time.Duration
		insert bool
		want   string
	}{
		{"a change", time.Hour, true, "not the table of that name the relay captures"},
		{"no change", 0, false, "is not the table the relay captured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, pg, env.Standalone.Client(t))
			opts := f.options()
			if tc.check != 0 {
				opts.CheckInterval = tc.check
			}
			pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (1, 'a@example.com')`)
			r := f.relay(t, opts)
			done := runInBackground(t, r)
			f.waitIndex(t)
			pg.Exec(t, f.dsn, `DROP TABLE users`, schema[0], schema[1], `ALTER PUBLICATION keyswap ADD TABLE users`)
			if tc.insert {
				pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (2, 'b@example.com')`)
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(redistest.Timeout):
				t.Fatalf("the relay did not stop within %v after the table was created again; status %+v", redistest.Timeout, r.Status())
			}
			if !errors.Is(err, pgcdc.ErrRebuildRequired) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v; want ErrRebuildRequired, and %q", err, tc.want)
			}
			redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"a@example.com": "1"})
		})
	}
}

package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/capture/outbox"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// options are the relay's options in tests.
func options() outbox.RelayOptions {
	return outbox.RelayOptions{PollInterval: 10 * time.Millisecond, CheckInterval: 50 * time.Millisecond}
}

// TestVersionOrder: the rows of an item are applied in version order, not
// in the order of their ids (which is not the commit order), and a row
// that comes late, with a version at or below the one applied, is dropped.
func TestVersionOrder(t *testing.T) {
	for name, open := range dialects(t) {
		t.Run(name, func(t *testing.T) {
			x := open(t)
			client, prefix := env.Standalone.Client(t), redistest.Prefix(t)
			redistest.ClearContaining(t, client, prefix) // keys an earlier run left (go test -count=N)
			ctx := redistest.Ctx(t)
			a := user{ID: "1", Email: "a@example.com", Country: "fr"}
			b := user{ID: "1", Email: "b@example.com", Country: "de"}
			// Version 2 got the lower id: its transaction started first and
			// committed last.
			for _, w := range []struct {
				v int64
				c index.Change[user]
			}{{2, index.Update(a, b)}, {1, index.Insert(a)}} {
				if err := x.ob.Write(ctx, x.sql, "user:1", w.v, w.c); err != nil {
					t.Fatal(err)
				}
			}
			rb := redistest.Rebuilder(t, client, rebuild.Options{}, indexes(prefix)...)
			r := x.ob.Relay(x.sql, rb, options())
			running(t, r)
			waitFor(t, "the outbox to empty", func() bool { return x.outboxRows(t) == 0 })
			redistest.WantHash(t, client, prefix+"by-email", map[string]string{"b@example.com": "1"})
			if got := redistest.SMembers(t, client, prefix+"by-country:de"); len(got) != 1 || redistest.Exists(t, client, prefix+"by-country:fr") {
				t.Fatalf("by-country: de %v, fr exists %v; want only de", got, redistest.Exists(t, client, prefix+"by-country:fr"))
			}
			// A row of version 2 that comes now is stale: dropped.
			c := user{ID: "1", Email: "c@example.com", Country: "nl"}
			if err := x.ob.Write(ctx, x.sql, "user:1", 2, index.Update(b, c)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the late row to be dropped", func() bool { return x.outboxRows(t) == 0 })
			redistest.WantHash(t, client, prefix+"by-email", map[string]string{"b@example.com": "1"})
			var v int64
			if err := x.sql.QueryRow(`SELECT version FROM ` + x.ob.Table() + `_applied WHERE item = 'user:1'`).Scan(&v); err != nil || v != 2 {
				t.Fatalf("applied version %d, %v; want 2", v, err)
			}
			st := r.Status()
			if st.Applied != 2 || st.Dropped != 1 || st.Pending != 0 || st.Position == "" || st.Err != nil {
				t.Errorf("status %+v: want 2 rows applied, 1 dropped, none pending", st)
			}
		})
	}
}

// TestAppKilledBeforeApply: the application commits a change with its
// outbox row and is killed before it could call Apply; the relay applies
// it.
func TestAppKilledBeforeApply(t *testing.T) {
	for name, open := range dialects(t) {
		t.Run(name, func(t *testing.T) {
			x := open(t)
			client, prefix := env.Standalone.Client(t), redistest.Prefix(t)
			redistest.ClearContaining(t, client, prefix) // keys an earlier run left (go test -count=N)
			app := startProcess(t, "app", x.processEnv(prefix))
			app.wait(t, "committed")
			app.kill()
			if got := redistest.HGetAll(t, client, prefix+"by-email"); len(got) != 0 {
				t.Fatalf("before the relay ran, the index holds %v", got)
			}
			rb := redistest.Rebuilder(t, client, rebuild.Options{}, indexes(prefix)...)
			running(t, x.ob.Relay(x.sql, rb, options()))
			x.waitIndex(t, client, prefix)
			redistest.WantHash(t, client, prefix+"by-email", map[string]string{"app42@example.com": "42"})
		})
	}
}

// TestRelayKilled: a relay process killed with SIGKILL while a writer
// changes users, three times, and started again: 0 lost, 0 stale, and the
// outbox empty.
func TestRelayKilled(t *testing.T) {
	for name, open := range dialects(t) {
		t.Run(name, func(t *testing.T) {
			x := open(t)
			client, prefix := env.Standalone.Client(t), redistest.Prefix(t)
			redistest.ClearContaining(t, client, prefix) // keys an earlier run left (go test -count=N)
			w := startWriter(t, x, 7)
			for round := range 3 {
				relay := startProcess(t, "relay", x.processEnv(prefix))
				deadline := time.Now().Add(redistest.Timeout)
				for time.Now().Before(deadline) {
					line := relay.wait(t, "applied ")
					if n, _ := strconv.Atoi(line[len("applied "):]); n >= 100 {
						break
					}
				}
				relay.kill()
				t.Logf("round %d: killed the relay; %d transactions committed", round, w.commits.Load())
			}
			if err := w.stop(); err != nil {
				t.Fatal(err)
			}
			startProcess(t, "relay", x.processEnv(prefix))
			x.waitIndex(t, client, prefix)
		})
	}
}

// TestRejectedRow: a row the relay cannot decode stops it, after the rows
// before it are applied, and is left in the outbox with those after it.
func TestRejectedRow(t *testing.T) {
	for name, open := range dialects(t) {
		t.Run(name, func(t *testing.T) {
			x := open(t)
			client, prefix := env.Standalone.Client(t), redistest.Prefix(t)
			redistest.ClearContaining(t, client, prefix) // keys an earlier run left (go test -count=N)
			ctx := redistest.Ctx(t)
			if err := x.ob.Write(ctx, x.sql, "user:1", 1, index.Insert(user{ID: "1", Email: "a@example.com"})); err != nil {
				t.Fatal(err)
			}
			if _, err := x.sql.Exec(x.q(`INSERT INTO `+x.ob.Table()+` (item, version, new, written_us) VALUES ('user:2', 1, $1, 0)`), []byte("{not json")); err != nil {
				t.Fatal(err)
			}
			rb := redistest.Rebuilder(t, client, rebuild.Options{}, indexes(prefix)...)
			// Each round reads a batch of one row, so the first is applied.
			opts := options()
			opts.BatchSize = 1
			r := x.ob.Relay(x.sql, rb, opts)
			err := r.Run(ctx)
			if !errors.Is(err, outbox.ErrRejected) || !strings.Contains(err.Error(), `row 2 of keyswap_outbox (item "user:2")`) {
				t.Fatalf("Run: %v; want ErrRejected naming row 2", err)
			}
			redistest.WantHash(t, client, prefix+"by-email", map[string]string{"a@example.com": "1"})
			if n := x.outboxRows(t); n != 1 {
				t.Fatalf("%d rows left in the outbox, want the rejected one", n)
			}
		})
	}
}

// TestSecondRelayWaits: on PostgreSQL a second relay of the same outbox
// waits while the first runs (its status says why), and takes over once
// the first stopped.
func TestSecondRelayWaits(t *testing.T) {
	x := dialects(t)["postgres"](t)
	client, prefix := env.Standalone.Client(t), redistest.Prefix(t)
	redistest.ClearContaining(t, client, prefix) // keys an earlier run left (go test -count=N)
	rb := redistest.Rebuilder(t, client, rebuild.Options{}, indexes(prefix)...)
	first := x.ob.Relay(x.sql, rb, options())
	stop := running(t, first)
	waitFor(t, "the first relay to run", func() bool { return first.Status().Connected })
	ctx := redistest.Ctx(t)
	second := x.ob.Relay(x.sql, rb, options())
	running(t, second)
	waitFor(t, "the second relay to wait", func() bool { return errors.Is(second.Status().Err, outbox.ErrRelayRunning) })
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := x.change(ctx, "1", &user{ID: "1", Email: "a@example.com"}); err != nil {
		t.Fatal(err)
	}
	x.waitIndex(t, client, prefix)
	if st := second.Status(); !st.Connected || st.Applied != 1 {
		t.Errorf("second relay's status %+v: want it connected, 1 row applied", st)
	}
}

// TestItemsKeepIDOrder: rows of different items are applied in the order
// of their ids, and an item's rows are sorted by version only among the
// positions they hold. Item 2 gives up an email (row 4) that item 1 then
// takes (row 5): applied the other way round, item 2's removal of the
// email would remove item 1's entry.
func TestItemsKeepIDOrder(t *testing.T) {
	for name, open := range dialects(t) {
		t.Run(name, func(t *testing.T) {
			x := open(t)
			client, prefix := env.Standalone.Client(t), redistest.Prefix(t)
			redistest.ClearContaining(t, client, prefix) // keys an earlier run left (go test -count=N)
			ctx := redistest.Ctx(t)
			u := func(id, email string) user { return user{ID: id, Email: email} }
			for _, w := range []struct {
				item string
				v    int64
				c    index.Change[user]
			}{
				{"user:1", 1, index.Insert(u("1", "e0"))},               // row 1
				{"user:2", 1, index.Insert(u("2", "e1"))},               // row 2
				{"user:1", 2, index.Update(u("1", "e0"), u("1", "e2"))}, // row 3
				{"user:2", 2, index.Update(u("2", "e1"), u("2", "e3"))}, // row 4: gives up e1
				{"user:1", 3, index.Update(u("1", "e2"), u("1", "e1"))}, // row 5: takes e1
				// Item 3's version 2 got the lower id (row 6): item 3's rows
				// swap their positions, 6 and 8, around item 4's row 7.
				{"user:3", 2, index.Update(u("3", "c1"), u("3", "c2"))}, // row 6
				{"user:4", 1, index.Insert(u("4", "d1"))},               // row 7
				{"user:3", 1, index.Insert(u("3", "c1"))},               // row 8
			} {
				if err := x.ob.Write(ctx, x.sql, w.item, w.v, w.c); err != nil {
					t.Fatal(err)
				}
			}
			rec := &recorder{key: prefix + "order"}
			rb := redistest.Rebuilder(t, client, rebuild.Options{}, append(indexes(prefix), index.Builder[user](rec))...)
			running(t, x.ob.Relay(x.sql, rb, options()))
			waitFor(t, "the outbox to empty", func() bool { return x.outboxRows(t) == 0 })
			want := []string{"1:->e0", "2:->e1", "1:e0>e2", "2:e1>e3", "1:e2>e1", "3:->c1", "4:->d1", "3:c1>c2"}
			if got := rec.changes(); !slices.Equal(got, want) {
				t.Errorf("applied in the order\n%v\nwant\n%v", got, want)
			}
			redistest.WantHash(t, client, prefix+"by-email", map[string]string{"e1": "1", "e3": "2", "c2": "3", "d1": "4"})
		})
	}
}

// TestValuesMoveBetweenItems: writers move a few emails (unique in the
// table) between users: a user gives up an email in one transaction, and
// another takes it in the next, while the relay applies a backlog in small
// batches. The relay must apply each give-up before the take that waited
// for it: checked on the order in which the changes were applied, and on
// the index, which must end as the table.
func TestValuesMoveBetweenItems(t *testing.T) {
	for name, open := range dialects(t) {
		t.Run(name, func(t *testing.T) {
			x := open(t)
			client, prefix := env.Standalone.Client(t), redistest.Prefix(t)
			redistest.ClearContaining(t, client, prefix) // keys an earlier run left (go test -count=N)
			var commits atomic.Int64
			done := make(chan struct{})
			var wg sync.WaitGroup
			var werr error
			var errOnce sync.Once
			for seed := range uint64(2) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := moveEmails(x, seed, done, &commits); err != nil {
						errOnce.Do(func() { werr = err })
					}
				}()
			}
			stopWriters := func() error {
				select {
				case <-done:
				default:
					close(done)
				}
				wg.Wait()
				return werr
			}
			t.Cleanup(func() { _ = stopWriters() })
			// A backlog first, then the relay while the writers go on.
			waitFor(t, "a backlog", func() bool { return commits.Load() >= 300 || werr != nil })
			rec := &recorder{key: prefix + "order"}
			rb := redistest.Rebuilder(t, client, rebuild.Options{}, append(indexes(prefix), index.Builder[user](rec))...)
			opts := options()
			opts.BatchSize = 7
			running(t, x.ob.Relay(x.sql, rb, opts))
			waitFor(t, "more changes", func() bool { return commits.Load() >= 600 || werr != nil })
			if err := stopWriters(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the outbox to empty", func() bool { return x.outboxRows(t) == 0 })
			// Replay the order applied: an email is taken only once its
			// holder gave it up.
			holder := map[string]string{}
			moves := 0
			for i, c := range rec.changes() {
				id, emails, _ := strings.Cut(c, ":")
				old, new, _ := strings.Cut(emails, ">")
				if holder[old] == id {
					delete(holder, old)
				}
				if new == "-" || new == "" {
					continue
				}
				if h, ok := holder[new]; ok && h != id {
					t.Fatalf("change %d (%s): user %s took %s while user %s still held it in the order applied", i, c, id, new, h)
				}
				if old != new {
					moves++
				}
				holder[new] = id
			}
			t.Logf("%d transactions, %d changes applied, %d emails taken", commits.Load(), len(rec.changes()), moves)
			x.waitIndex(t, client, prefix)
		})
	}
}

// moveEmails moves emails between users until done: it picks a user and
// an email of a small pool; the email's holder, if another user, gives it
// up (no email) and commits, then the user takes it. A take that loses a
// race for the email (the unique constraint) is rolled back.
func moveEmails(x *db, seed uint64, done <-chan struct{}, commits *atomic.Int64) error {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 99))
	for {
		select {
		case <-done:
			return nil
		default:
		}
		id := fmt.Sprint(1 + rng.IntN(12))
		email := fmt.Sprintf("e%d@example.com", rng.IntN(8))
		var holder string
		err := x.sql.QueryRowContext(ctx, x.q(`SELECT id FROM users WHERE email = $1`), email).Scan(&holder)
		if err != nil && err != sql.ErrNoRows {
			return err
		}
		if holder == id {
			continue
		}
		if holder != "" {
			if err := x.change(ctx, holder, &user{ID: holder}); err != nil && !unique(err) {
				return err
			}
			commits.Add(1)
		}
		if err := x.change(ctx, id, &user{ID: id, Email: email, Country: "fr"}); err != nil {
			if unique(err) {
				continue
			}
			return err
		}
		commits.Add(1)
	}
}

// unique reports whether err is a unique constraint's violation.
func unique(err error) bool {
	return strings.Contains(strings.ToLower(err.Error()), "unique")
}

// TestDroppedRowReported: an item deleted and inserted again with its
// version restarted (a version column of the row) has its insert dropped,
// as a row older than the delete applied: the relay never drops it
// silently, but counts it, records the metric and logs a warning that
// names the row.
func TestDroppedRowReported(t *testing.T) {
	for name, open := range dialects(t) {
		t.Run(name, func(t *testing.T) {
			x := open(t)
			client, prefix := env.Standalone.Client(t), redistest.Prefix(t)
			redistest.ClearContaining(t, client, prefix) // keys an earlier run left (go test -count=N)
			ctx := redistest.Ctx(t)
			a := user{ID: "1", Email: "a@example.com"}
			b := user{ID: "1", Email: "b@example.com"}
			for _, w := range []struct {
				v int64
				c index.Change[user]
			}{{1, index.Insert(a)}, {2, index.Update(a, b)}, {3, index.Delete(b)}} {
				if err := x.ob.Write(ctx, x.sql, "user:1", w.v, w.c); err != nil {
					t.Fatal(err)
				}
			}
			var logs syncBuffer
			reader := sdkmetric.NewManualReader()
			opts := options()
			opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			opts.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			rb := redistest.Rebuilder(t, client, rebuild.Options{}, indexes(prefix)...)
			r := x.ob.Relay(x.sql, rb, opts)
			stop := running(t, r)
			waitFor(t, "the outbox to empty", func() bool { return x.outboxRows(t) == 0 })
			// Inserted again, with the version a version column starts at.
			if err := x.ob.Write(ctx, x.sql, "user:1", 1, index.Insert(a)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the row to be dropped", func() bool { return x.outboxRows(t) == 0 && r.Status().Pending == 0 })
			redistest.WantAbsent(t, client, prefix+"by-email")
			if st := r.Status(); st.Applied != 3 || st.Dropped != 1 {
				t.Errorf("status %+v: want 3 rows applied, 1 dropped", st)
			}
			if got := logs.String(); !strings.Contains(got, "dropped rows whose version is not above the one applied") ||
				!strings.Contains(got, "row=4 item=user:1 version=1 applied_version=3") {
				t.Errorf("log:\n%s\nwant a warning naming row 4 of user:1, version 1 below 3", got)
			}
			var rm metricdata.ResourceMetrics
			if err := reader.Collect(ctx, &rm); err != nil {
				t.Fatal(err)
			}
			if got := counter(rm, "keyswap.relay.dropped"); got != 1 {
				t.Errorf("keyswap.relay.dropped %d, want 1", got)
			}
			if !observed(rm, "keyswap.relay.pending") {
				t.Error("keyswap.relay.pending is not observed while the relay runs")
			}
			// Once Run returned, its gauges are no longer observed.
			if err := stop(); !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
			if err := reader.Collect(ctx, &rm); err != nil {
				t.Fatal(err)
			}
			if observed(rm, "keyswap.relay.pending") {
				t.Error("keyswap.relay.pending is still observed after Run returned")
			}
		})
	}
}

// observed reports whether a gauge of the relays' metrics has a value.
func observed(rm metricdata.ResourceMetrics, name string) bool {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == name && len(d.DataPoints) > 0 {
				return true
			}
		}
	}
	return false
}

// counter returns the value of a counter of the relays' metrics.
func counter(rm metricdata.ResourceMetrics, name string) int64 {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				var n int64
				for _, p := range d.DataPoints {
					n += p.Value
				}
				return n
			}
		}
	}
	return 0
}

// syncBuffer is a buffer safe for the relay's goroutine to write while the
// test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// roles numbers the PostgreSQL roles the tests create.
var roles atomic.Int64

// relayGrants are the rights a relay needs on the outbox's tables.
var relayGrants = []string{
	`GRANT SELECT, DELETE ON keyswap_outbox TO %s`,
	`GRANT SELECT, INSERT, UPDATE ON keyswap_outbox_applied TO %s`,
}

// asRole creates a PostgreSQL role with grants (each with a %s for the
// role's name), and returns the database as that role, and the role.
func (x *db) asRole(t *testing.T, grants ...string) (*db, string) {
	t.Helper()
	role := fmt.Sprintf("relay_%d_%d", os.Getpid(), roles.Add(1))
	if _, err := x.sql.Exec(`CREATE ROLE ` + role + ` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = x.sql.Exec(`DROP OWNED BY ` + role)
		_, _ = x.sql.Exec(`DROP ROLE ` + role)
	})
	for _, g := range grants {
		if _, err := x.sql.Exec(fmt.Sprintf(g, role)); err != nil {
			t.Fatal(err)
		}
	}
	return openDB(t, outbox.Postgres, "pgx", strings.Replace(x.source, "postgres@", role+"@", 1), false), role
}

// TestPermanentErrors: database errors that would come back stop the
// relay with an error that names them, instead of making it connect again
// and again: a table of the outbox missing, a right missing.
func TestPermanentErrors(t *testing.T) {
	for _, tc := range []struct {
		name, dialect string
		setup         func(t *testing.T, x *db) *db // the relay's database
		want          string
		applied       bool // the change reached the contents before the error
	}{
		{name: "no applied table", dialect: "sqlite", want: "no such table: keyswap_outbox_applied",
			setup: func(t *testing.T, x *db) *db { x.exec(t, `DROP TABLE keyswap_outbox_applied`); return x }},
		{name: "no applied table", dialect: "postgres", want: `relation "keyswap_outbox_applied" does not exist`,
			setup: func(t *testing.T, x *db) *db { x.exec(t, `DROP TABLE keyswap_outbox_applied`); return x }},
		{name: "no delete right", dialect: "postgres", want: "permission denied for table keyswap_outbox", applied: true,
			setup: func(t *testing.T, x *db) *db {
				rx, _ := x.asRole(t, `GRANT SELECT ON keyswap_outbox TO %s`, `GRANT SELECT, INSERT, UPDATE ON keyswap_outbox_applied TO %s`)
				return rx
			}},
	} {
		t.Run(tc.dialect+"/"+tc.name, func(t *testing.T) {
			x := dialects(t)[tc.dialect](t)
			client, prefix := env.Standalone.Client(t), redistest.Prefix(t)
			redistest.ClearContaining(t, client, prefix) // keys an earlier run left (go test -count=N)
			if err := x.change(redistest.Ctx(t), "1", &user{ID: "1", Email: "a@example.com"}); err != nil {
				t.Fatal(err)
			}
			rx := tc.setup(t, x)
			r := x.ob.Relay(rx.sql, redistest.Rebuilder(t, client, rebuild.Options{}, indexes(prefix)...), options())
			ctx, cancel := context.WithTimeout(context.Background(), redistest.Timeout)
			defer cancel()
			err := r.Run(ctx)
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Run did not return within %v; status %+v", redistest.Timeout, r.Status())
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v; want an error with %q", err, tc.want)
			}
			if st := r.Status(); st.Reconnects != 0 || st.Err == nil || st.Connected {
				t.Errorf("status %+v: want the error, no reconnect, not connected", st)
			}
			if n := x.outboxRows(t); n != 1 {
				t.Errorf("%d rows in the outbox, want the row left", n)
			}
			if tc.applied {
				redistest.WantHash(t, client, prefix+"by-email", map[string]string{"a@example.com": "1"})
			} else {
				redistest.WantClean(t, client, prefix)
				redistest.WantAbsent(t, client, prefix+"by-email")
			}
		})
	}
}

// TestSQLiteBusy: on a SQLite database opened without busy_timeout, the
// relay's write meets the application's write transaction: the relay
// waits for it (it sets busy_timeout on its own connection) instead of
// failing with SQLITE_BUSY and connecting again.
func TestSQLiteBusy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.db")
	x := openDB(t, outbox.SQLite, "sqlite", "file:"+path+"?_pragma=journal_mode(WAL)", true)
	app := openDB(t, outbox.SQLite, "sqlite", "file:"+path+"?_pragma=journal_mode(WAL)", false)
	client, prefix := env.Standalone.Client(t), redistest.Prefix(t)
	redistest.ClearContaining(t, client, prefix) // keys an earlier run left (go test -count=N)
	ctx := redistest.Ctx(t)
	if err := x.ob.Write(ctx, x.sql, "user:1", 1, index.Insert(user{ID: "1", Email: "a@example.com"})); err != nil {
		t.Fatal(err)
	}
	// The application holds SQLite's write lock.
	conn, err := app.sql.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	r := x.ob.Relay(x.sql, redistest.Rebuilder(t, client, rebuild.Options{}, indexes(prefix)...), options())
	running(t, r)
	// The relay read the row and applied it; its delete now waits for the
	// lock, which the application holds a little longer (well within the
	// relay's busy_timeout).
	waitFor(t, "the change applied", func() bool { return len(redistest.HGetAll(t, client, prefix+"by-email")) == 1 })
	time.Sleep(300 * time.Millisecond) // holds the lock; waits for nothing
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the outbox to empty", func() bool { return x.outboxRows(t) == 0 })
	if st := r.Status(); st.Reconnects != 0 || st.Applied != 1 {
		t.Errorf("status %+v: want 1 row applied, no reconnect", st)
	}
}

// TestLostLockAbandonsBatch: a relay retries a batch while Redis is
// unreachable to it, and its database connection dies, which releases its
// lock; a second relay takes over and applies the batch and a newer change
// of the same user. When Redis is reachable again, the first relay must not
// apply its old batch over the newer change: it checks its lock before
// each Apply, and abandons the batch.
func TestLostLockAbandonsBatch(t *testing.T) {
	x := dialects(t)["postgres"](t)
	client, prefix := env.Standalone.Client(t), redistest.Prefix(t)
	redistest.ClearContaining(t, client, prefix) // keys an earlier run left (go test -count=N)
	ctx := redistest.Ctx(t)
	// The first relay connects as a role of its own, which the test can
	// then forbid to log in again: the second one takes the lock for sure.
	firstDB, role := x.asRole(t, relayGrants...)
	// Redis is unreachable to the first relay while cut is set: its apply
	// script fails as on a reset connection, and is not sent.
	var cut atomic.Bool
	hooked := rueidishook.WithHook(env.Standalone.Client(t), redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			if name := cmd.Commands()[0]; cut.Load() && (name == "EVALSHA" || name == "EVAL") {
				return rueidis.NewErrorResult(&net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET})
			}
			return c.Do(ctx, cmd)
		},
	})
	first := x.ob.Relay(firstDB.sql, redistest.Rebuilder(t, hooked, rebuild.Options{}, indexes(prefix)...), options())
	running(t, first)
	if err := x.change(ctx, "1", &user{ID: "1", Email: "a@example.com", Country: "fr"}); err != nil {
		t.Fatal(err)
	}
	x.waitIndex(t, client, prefix)

	cut.Store(true)
	if err := x.change(ctx, "1", &user{ID: "1", Email: "b@example.com", Country: "de"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first relay to retry its batch", func() bool { return first.Status().Retries > 0 })
	if err := x.change(ctx, "1", &user{ID: "1", Email: "c@example.com", Country: "nl"}); err != nil {
		t.Fatal(err)
	}
	// Its connection dies, and so does its lock.
	for _, q := range []string{`ALTER ROLE ` + role + ` NOLOGIN`, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '` + role + `'`} {
		if _, err := x.sql.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	second := x.ob.Relay(x.sql, redistest.Rebuilder(t, client, rebuild.Options{}, indexes(prefix)...), options())
	running(t, second)
	x.waitIndex(t, client, prefix)
	redistest.WantHash(t, client, prefix+"by-email", map[string]string{"c@example.com": "1"})

	// Redis is reachable again: the first relay finds that it lost its
	// connection, and never applies its batch.
	cut.Store(false)
	waitFor(t, "the first relay to find its connection lost", func() bool { return first.Status().Reconnects > 0 })
	if st := second.Status(); st.Applied != 2 {
		t.Errorf("second relay's status %+v: want the 2 rows applied", st)
	}
	want := x.tableIndex(t)
	if got := redisIndex(t, client, prefix); !cmp.Equal(want, got) {
		t.Fatalf("the first relay applied its old batch over the newer change; index (-table +redis):\n%s", cmp.Diff(want, got))
	}
	if st := first.Status(); st.Applied != 1 || st.Pending != 0 {
		t.Errorf("first relay's status %+v: want 1 row applied (before the cut), none pending", st)
	}
}

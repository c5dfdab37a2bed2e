package pgcdc_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"testing"

	"github.com/keyswap/keyswap/capture/pgcdc"
	"github.com/keyswap/keyswap/capture/pgtest"
	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
)

// TestRelayKilled: a relay process killed with SIGKILL while it streams a
// steady flow of changes, three times, and started again each time: the
// index ends exactly as the table, 0 lost, 0 stale.
func TestRelayKilled(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	procEnv := []string{dsnEnv + "=" + f.dsn, redisEnv + "=" + env.Standalone.Addr, prefixEnv + "=" + f.prefix, slotEnv + "=" + f.slot}
	w := startWriter(t, f.dsn, 1, 0)
	for round := range 3 {
		relay := startProcess(t, "relay", procEnv...)
		// Kill it mid-stream: once it applied some changes, while the writer
		// goes on.
		want := int64(200 * (round + 1))
		for {
			line := relay.wait(t, "applied ")
			if n, _ := strconv.ParseInt(line[len("applied "):], 10, 64); n >= want {
				break
			}
		}
		relay.kill(t)
		t.Logf("round %d: killed the relay; %d transactions committed so far", round, w.commits.Load())
	}
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	startProcess(t, "relay", procEnv...)
	f.waitIndex(t)
}

// TestRelayPostgresRestart: PostgreSQL crashes and restarts while the relay
// streams a steady flow of changes; the relay connects again and resumes
// from its slot: 0 lost, 0 stale.
func TestRelayPostgresRestart(t *testing.T) {
	srv := pgtest.Own(t)
	f := newFixture(t, srv, env.Standalone.Client(t))
	r := f.relay(t, f.options())
	stop := running(t, r)
	w := startWriter(t, f.dsn, 2, 0)
	for round := range 2 {
		applied := r.Status().Applied
		waitFor(t, "changes applied", func() bool { return r.Status().Applied > applied+100 })
		if err := srv.Crash(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the relay to connect again", func() bool { return r.Status().Reconnects > int64(round) && r.Status().Connected })
	}
	committed := w.commits.Load()
	waitFor(t, "the writer to commit after the restart", func() bool { return w.commits.Load() > committed+50 })
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	f.waitIndex(t)
	if st := r.Status(); st.Reconnects < 2 {
		t.Errorf("status %+v: want 2 reconnects", st)
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
}

// TestRelayConnectionCut: the network between the relay and PostgreSQL
// is cut (a TCP reset, with no error message from the server) three times
// while the relay streams a steady flow of changes: the relay connects
// again, resumes from its slot, and the index ends exactly as the table.
// A cut connection is one pgconn closes in the background; the relay must
// not write to it after that (under -race, a standby status update sent on
// it raced pgconn's own Terminate).
func TestRelayConnectionCut(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	u, err := url.Parse(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	u.Host = proxy.Addr()
	r, err := pgcdc.New(u.String(), f.rb, f.options(), usersTable())
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, r)
	w := startWriter(t, f.dsn, 5, 0)
	for round := range 3 {
		applied := r.Status().Applied
		waitFor(t, "changes applied", func() bool { return r.Status().Applied > applied+100 })
		// PostgreSQL appears gone: the cut, then connections refused (the
		// cancel request pgconn sends on a broken connection fails at once).
		proxy.Refuse(true)
		proxy.CutAll()
		waitFor(t, "the relay to lose its connection", func() bool { return !r.Status().Connected })
		proxy.Refuse(false)
		waitFor(t, "the relay to connect again", func() bool { return r.Status().Reconnects > int64(round) && r.Status().Connected })
	}
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	f.waitIndex(t)
	if st := r.Status(); st.Reconnects < 3 {
		t.Errorf("status %+v: want 3 reconnects", st)
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
}

// TestAppKilledBeforeApply: the application commits a change and is killed
// before it could call Apply; the relay applies the change.
func TestAppKilledBeforeApply(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	app := startProcess(t, "app", dsnEnv+"="+f.dsn, redisEnv+"="+env.Standalone.Addr, prefixEnv+"="+f.prefix, idEnv+"=42")
	app.wait(t, "committed")
	app.kill(t)
	if got := redistest.HGetAll(t, f.client, f.prefix+"by-email"); len(got) != 0 {
		t.Fatalf("before the relay ran, the index holds %v", got)
	}
	running(t, f.relay(t, f.options()))
	f.waitIndex(t)
	redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"app42@example.com": "42"})
}

// TestRebuildRacingRelay: rebuilds of the index run while a writer changes
// the table at a high rate and the relay applies the changes: every run
// keeps every change, and the index ends as the table.
func TestRebuildRacingRelay(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	// Enough users that a run lasts while the writer changes some.
	pg.Exec(t, f.dsn, `INSERT INTO users (id, email, country, score) SELECT g, 'seed' || g || '@example.com', 'fr', g FROM generate_series(1, 50000) g`)
	r := f.relay(t, f.options())
	running(t, r)
	f.waitIndex(t)
	w, w2 := startWriter(t, f.dsn, 3, 0), startWriter(t, f.dsn, 4, 0)
	pool := f.pool(t)
	ctx := redistest.Ctx(t)
	var logged int64
	for run := range 3 {
		// The source reads the table when the run pulls it, after the run
		// took its locks.
		src := func(yield func(user, error) bool) {
			rows, err := pool.Query(ctx, `SELECT id, coalesce(email, ''), coalesce(country, ''), score FROM users`)
			if err != nil {
				yield(user{}, err)
				return
			}
			defer rows.Close()
			for rows.Next() {
				var id int64
				var u user
				if err := rows.Scan(&id, &u.Email, &u.Country, &u.Score); err != nil {
					yield(user{}, err)
					return
				}
				u.ID = strconv.FormatInt(id, 10)
				if !yield(u, nil) {
					return
				}
			}
			if err := rows.Err(); err != nil {
				yield(user{}, err)
			}
		}
		stats, err := f.rb.Run(ctx, rebuild.FromSeq2(src))
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		logged += stats.Changes
		t.Logf("run %d: %d users, %d changes applied by the relay during the run", run, stats.Items, stats.Changes)
	}
	if err := errors.Join(w.stop(), w2.stop()); err != nil {
		t.Fatal(err)
	}
	if logged == 0 {
		t.Fatal("no change was applied during the runs: the race did not happen")
	}
	f.waitIndex(t)
	redistest.WantClean(t, f.client, f.prefix)
}

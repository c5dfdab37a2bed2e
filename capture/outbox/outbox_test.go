package outbox_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/capture/outbox"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
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
			ctx := redistest.Ctx(t)
			a := user{ID: "1", Email: "a@example.com", Country: "fr"}
			b := user{ID: "1", Email: "b@example.com", Country: "de"}
			// Version 2 got the lower id: its transaction started first and
			// committed last.
			for _, w := range []struct {
				v int64
				c rebuild.Change[user]
			}{{2, rebuild.Update(a, b)}, {1, rebuild.Insert(a)}} {
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
			if err := x.ob.Write(ctx, x.sql, "user:1", 2, rebuild.Update(b, c)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the late row to be dropped", func() bool { return x.outboxRows(t) == 0 })
			redistest.WantHash(t, client, prefix+"by-email", map[string]string{"b@example.com": "1"})
			var v int64
			if err := x.sql.QueryRow(`SELECT version FROM ` + x.ob.Table() + `_applied WHERE item = 'user:1'`).Scan(&v); err != nil || v != 2 {
				t.Fatalf("applied version %d, %v; want 2", v, err)
			}
			st := r.Status()
			if st.Applied != 3 || st.Pending != 0 || st.Position == "" || st.Err != nil {
				t.Errorf("status %+v: want 3 rows applied, none pending", st)
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
			ctx := redistest.Ctx(t)
			if err := x.ob.Write(ctx, x.sql, "user:1", 1, rebuild.Insert(user{ID: "1", Email: "a@example.com"})); err != nil {
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

package pgcdc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// slotProgress is the slot's confirmed position relative to lsn (negative:
// before it), and the time of the last standby status update its
// walsender received.
func (f *fixture) slotProgress(t *testing.T, lsn string) (diff int64, reply time.Time) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	err = c.QueryRow(ctx, `SELECT pg_wal_lsn_diff(s.confirmed_flush_lsn, $2::pg_lsn)::bigint, coalesce(r.reply_time, 'epoch')
		FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, f.slot, lsn).Scan(&diff, &reply)
	if err != nil {
		t.Fatal(err)
	}
	return diff, reply
}

// commitAt runs sql (one transaction) and returns the WAL position right
// after its commit record: the position that acknowledges it, unless
// another session wrote WAL in between (then a later one).
func (f *fixture) commitAt(t *testing.T, sql string) string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	var lsn string
	if err := c.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// wantHeldBack checks, over several standby status updates, that the slot
// stays before lsn: the relay keeps telling PostgreSQL where it is, and
// never acknowledges the change it could not apply.
func (f *fixture) wantHeldBack(t *testing.T, lsn string) {
	t.Helper()
	var replies []time.Time
	waitFor(t, "three standby status updates", func() bool {
		diff, reply := f.slotProgress(t, lsn)
		if diff >= 0 {
			t.Fatalf("the slot was acknowledged %d bytes past a change that is not applied", diff)
		}
		if len(replies) == 0 || reply.After(replies[len(replies)-1]) {
			replies = append(replies, reply)
		}
		return len(replies) >= 3
	})
}

// TestRedisDownRetriesWithoutAcknowledging: while Redis is down, the relay
// retries its Apply, keeps sending standby status updates, and never
// acknowledges the change; once Redis is back, it applies it.
func TestRedisDownRetriesWithoutAcknowledging(t *testing.T) {
	srv := redistest.OwnServer(t, "--appendonly", "yes", "--appendfsync", "always")
	f := newFixture(t, pg, srv.Client(t))
	r := f.relay(t, f.options())
	running(t, r)
	pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (1, 'a@example.com')`)
	f.waitIndex(t)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	lsn := f.commitAt(t, `INSERT INTO users (id, email) VALUES (2, 'b@example.com')`)
	waitFor(t, "the relay to retry", func() bool { return r.Status().Retries > 1 })
	f.wantHeldBack(t, lsn)
	if st := r.Status(); st.Err == nil || st.Pending != 1 || st.Oldest.IsZero() {
		t.Errorf("status %+v: want the error, 1 change pending since its commit", st)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	f.waitIndex(t)
	waitFor(t, "the slot acknowledged past the change", func() bool { diff, _ := f.slotProgress(t, lsn); return diff >= 0 })
	if st := r.Status(); st.Err != nil || st.Pending != 0 {
		t.Errorf("status %+v: want no error, nothing pending", st)
	}
}

// TestRefusedChangeRetried: while a rebuild that does not log changes (the
// single-key API of package store) holds a key's lock, Apply refuses the
// change (ErrInProgress); the relay retries it, without acknowledging it,
// until the lock is released. (This needs Apply to refuse such changes.)
func TestRefusedChangeRetried(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	r := f.relay(t, f.options())
	running(t, r)
	ctx := redistest.Ctx(t)
	s := store.New(f.client, store.Options{})
	lock, err := s.Acquire(ctx, f.prefix+"by-email", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lsn := f.commitAt(t, `INSERT INTO users (id, email) VALUES (1, 'a@example.com')`)
	waitFor(t, "the relay to retry the refused change", func() bool { return r.Status().Retries > 1 })
	f.wantHeldBack(t, lsn)
	if got := redistest.HGetAll(t, f.client, f.prefix+"by-email"); len(got) != 0 {
		t.Fatalf("a change was applied while the lock was held: %v", got)
	}
	if err := s.Release(ctx, lock); err != nil {
		t.Fatal(err)
	}
	f.waitIndex(t)
}

// TestMetrics: the relay records its changes, its lag per transaction,
// and its pending changes and backlog.
func TestMetrics(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	reader := sdkmetric.NewManualReader()
	opts := f.options()
	opts.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	r := f.relay(t, opts)
	stop := running(t, r)
	pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (1, 'a@example.com'), (2, 'b@example.com')`, `DELETE FROM users WHERE id = 2`)
	f.waitIndex(t)
	waitFor(t, "3 changes applied", func() bool { return r.Status().Applied == 3 })
	want := attribute.NewSet(attribute.String("keyswap.relay", "postgres"), attribute.String("keyswap.source", f.slot))
	got := collect(t, reader, want)
	if got["keyswap.relay.changes"] != int64(3) || got["keyswap.relay.lag"] != uint64(2) || got["keyswap.relay.pending"] != int64(0) || got["keyswap.relay.falling_behind"] != int64(0) {
		t.Errorf("metrics %v: want 3 changes, the lag of 2 transactions, 0 pending, not falling behind", got)
	}
	if _, ok := got["keyswap.relay.backlog"]; !ok {
		t.Errorf("metrics %v: no backlog", got)
	}
	// Once Run returned, the relay's gauges are no longer observed: the
	// MeterProvider does not keep the relay.
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	got = collect(t, reader, want)
	for _, name := range []string{"keyswap.relay.pending", "keyswap.relay.backlog", "keyswap.relay.falling_behind"} {
		if v, ok := got[name]; ok {
			t.Errorf("after Run returned, %s is still observed (%v)", name, v)
		}
	}
	if got["keyswap.relay.changes"] != int64(3) {
		t.Errorf("metrics %v after Run returned: want the 3 changes counted", got)
	}
}

// collect collects the metrics of the relays' scope with the attributes
// want: a counter's value, a gauge's value, a histogram's count, by name.
func collect(t *testing.T, reader *sdkmetric.ManualReader, want attribute.Set) map[string]any {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]any{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != "github.com/keyswap/keyswap/capture" {
			continue
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if p.Attributes.Equals(&want) {
						got[m.Name] = p.Value
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if p.Attributes.Equals(&want) {
						got[m.Name] = p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if p.Attributes.Equals(&want) {
						got[m.Name] = p.Count
					}
				}
			}
		}
	}
	return got
}

package pgcdc_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/keyswap/keyswap/capture/pgcdc"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// BenchmarkRelay measures the relay on this machine's PostgreSQL and Redis
// (started by the tests): its throughput draining a backlog, and the
// commit-to-visible lag at a steady rate, idle and while rebuilds of the
// index run. Run it once:
//
//	go test -run '^$' -bench BenchmarkRelay -benchtime 1x ./pgcdc
func BenchmarkRelay(b *testing.B) {
	b.Run("throughput/one-row-transactions", func(b *testing.B) { throughput(b, 1) })
	b.Run("throughput/1000-row-transactions", func(b *testing.B) { throughput(b, 1000) })
	b.Run("lag/idle", func(b *testing.B) { lag(b, false) })
	b.Run("lag/rebuilding", func(b *testing.B) { lag(b, true) })
}

// throughput commits 40,000 inserts and 40,000 updates, in transactions of
// rows rows, while no relay runs, then times a relay applying them all.
func throughput(b *testing.B, rows int) {
	const n = 40_000
	f := newFixture(b, pg, env.Standalone.Client(b))
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	for from := 1; from <= n; from += 1000 {
		var sb strings.Builder
		for id := from; id < from+1000; id += rows {
			fmt.Fprintf(&sb, "BEGIN; INSERT INTO users (id, email, country, score) SELECT g, 'u' || g || '@example.com', 'c' || (g %% 50), g FROM generate_series(%d, %d) g; COMMIT;", id, id+rows-1)
			fmt.Fprintf(&sb, "BEGIN; UPDATE users SET email = 'v' || id || '@example.com', country = 'd' || (id %% 50), score = score + 1 WHERE id BETWEEN %d AND %d; COMMIT;", id, id+rows-1)
		}
		if _, err := conn.PgConn().Exec(ctx, sb.String()).ReadAll(); err != nil {
			b.Fatal(err)
		}
	}
	r := f.relay(b, f.options())
	for b.Loop() {
		start := time.Now()
		running(b, r)
		waitFor(b, "every change applied", func() bool { return r.Status().Applied >= 2*n })
		elapsed := time.Since(start)
		b.ReportMetric(float64(2*n)/elapsed.Seconds(), "changes/s")
	}
	f.waitIndex(b)
}

// lag changes users at a steady rate (about 500 changes/s, in transactions
// of 1 to 3 rows) for 10 s, and reports the lag of each transaction, from
// its commit (the server's timestamp) to the return of the Apply that made
// it visible, while the relay runs; with rebuilding, while rebuilds of a
// table of 200,000 users run one after another.
func lag(b *testing.B, rebuilding bool) {
	f := newFixture(b, pg, env.Standalone.Client(b))
	f.rb = mustRebuilder(b, f)
	pg.Exec(b, f.dsn, `INSERT INTO users (id, email, country, score) SELECT g, 'seed' || g || '@example.com', 'c' || (g % 50), g FROM generate_series(1, 200000) g`)
	r := f.relay(b, f.options())
	var mu sync.Mutex
	var lags []time.Duration
	measuring := false
	pgcdc.SetOnApplied(r, func(commits []time.Time, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if measuring {
			for _, c := range commits {
				lags = append(lags, at.Sub(c))
			}
		}
	})
	running(b, r)
	f.waitIndex(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs sync.WaitGroup
	var rebuilds, changesLogged int64
	if rebuilding {
		runs.Add(1)
		go func() {
			defer runs.Done()
			for ctx.Err() == nil {
				stats, err := f.rb.Run(ctx, sources.Seq2(f.source(ctx)))
				if err == nil {
					rebuilds++
					changesLogged += stats.Changes
				}
			}
		}()
	}
	for b.Loop() {
		w := startWriter(b, f.dsn, 9, 250)
		mu.Lock()
		measuring = true
		mu.Unlock()
		time.Sleep(10 * time.Second) // the measurement's duration, not a wait for a condition
		mu.Lock()
		measuring = false
		mu.Unlock()
		if err := w.stop(); err != nil {
			b.Fatal(err)
		}
	}
	cancel()
	runs.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(lags) == 0 {
		b.Fatal("no transaction measured")
	}
	slices.Sort(lags)
	q := func(p float64) float64 { return float64(lags[int(p*float64(len(lags)-1))].Microseconds()) / 1000 }
	b.ReportMetric(float64(len(lags))/10, "txn/s")
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	if rebuilding {
		b.ReportMetric(float64(rebuilds), "rebuilds")
		b.Logf("%d rebuilds of 200,000 users completed during the measurement; %d changes logged and replayed", rebuilds, changesLogged)
	}
}

// mustRebuilder returns the fixture's Rebuilder, with a catch-up bound
// that a run of 200,000 users meets on a loaded machine.
func mustRebuilder(b *testing.B, f *fixture) *rebuild.Rebuilder[user] {
	r, err := rebuild.New(f.client, rebuild.Options{CatchUpTimeout: 5 * time.Minute}, indexes(f.prefix)...)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

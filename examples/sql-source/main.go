// Sql-source rebuilds Redis indexes from rows streamed out of a SQL
// database through database/sql, here an in-memory SQLite (the pure-Go
// modernc.org/sqlite driver, so it runs anywhere).
//
//	go run ./examples/sql-source              # embedded Redis, in-memory SQLite
//	go run ./examples/sql-source -redis redis://127.0.0.1:6379
//
// rows.Next feeds the Rebuilder one row at a time: the source is pulled only
// as fast as Redis takes the writes, so memory stays at a few batches
// however big the table is. A scan error stops the run, and then nothing is
// published.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"iter"
	"os"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/examples/internal/cli"
	"github.com/keyswap/keyswap/examples/internal/connect"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	_ "modernc.org/sqlite"
)

func main() {
	cli.Main("sql-source", func() error { return run(context.Background(), os.Args[1:], os.Stdout) })
}

// Order is a row of the orders table.
type Order struct {
	ID       int64
	Customer string
	Status   string
	Total    float64
}

// orders streams the orders table. It yields a query or scan error at most
// once, and closes the rows when the consumer stops early.
func orders(ctx context.Context, db *sql.DB) iter.Seq2[Order, error] {
	return func(yield func(Order, error) bool) {
		rows, err := db.QueryContext(ctx, `SELECT id, customer, status, total FROM orders ORDER BY id`)
		if err != nil {
			yield(Order{}, err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			var o Order
			if err := rows.Scan(&o.ID, &o.Customer, &o.Status, &o.Total); err != nil {
				yield(Order{}, err)
				return
			}
			if !yield(o, nil) {
				return
			}
		}
		if err := rows.Err(); err != nil {
			yield(Order{}, err)
		}
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("sql-source", flag.ContinueOnError)
	url := connect.Flag(fs)
	n := fs.Int("orders", 20000, "number of orders in the table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	db, err := sql.Open("sqlite", "file::memory:")
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // one connection: one in-memory database
	if err := seed(ctx, db, *n); err != nil {
		return err
	}

	c, where, closeFn, err := connect.Open(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	prefix := "sql-source:"
	if c.Mode() == rueidis.ClientModeCluster {
		prefix = "{sql-source}:"
	}
	fmt.Fprintf(stdout, "sql-source on %s and an in-memory SQLite with %d orders\n", where, *n)

	byTotal := builders.SortedSet(prefix+"orders:by-total", func(o Order) (string, float64, bool) {
		return fmt.Sprint(o.ID), o.Total, true
	})
	byStatus := builders.SetIndex(prefix+"orders:by-status", func(o Order) (string, string, bool) {
		return o.Status, fmt.Sprint(o.ID), !builders.Blank(o.Status)
	})
	r, err := rebuild.New(c, rebuild.Options{}, byTotal, byStatus)
	if err != nil {
		return err
	}
	stats, err := r.Run(ctx, sources.Seq2(orders(ctx, db)))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "streamed %d rows in %d batches, published %d keys\n", stats.Items, stats.Batches, len(stats.Outcomes))

	// Compare with what SQL says.
	rows, err := db.QueryContext(ctx, `SELECT status, COUNT(*) FROM orders GROUP BY status ORDER BY status`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var status string
		var want int64
		if err := rows.Scan(&status, &want); err != nil {
			return err
		}
		got, err := c.Do(ctx, c.B().Scard().Key(prefix+"orders:by-status:"+status).Build()).AsInt64()
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "  %-10s SQL %5d  Redis %5d\n", status, want, got)
		if got != want {
			return fmt.Errorf("status %s: Redis has %d orders, SQL %d", status, got, want)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	top, err := c.Do(ctx, c.B().Zrange().Key(prefix+"orders:by-total").Min("+inf").Max("-inf").Byscore().Rev().Limit(0, 3).Build()).AsStrSlice()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "biggest orders: %v\n", top)
	return nil
}

// seed creates the orders table with n rows.
func seed(ctx context.Context, db *sql.DB, n int) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, status TEXT, total REAL)`); err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO orders (id, customer, status, total) VALUES (?, ?, ?, ?)`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	statuses := []string{"new", "paid", "shipped", "returned"}
	for i := 1; i <= n; i++ {
		if _, err := stmt.ExecContext(ctx, i, fmt.Sprintf("c%d", i%997), statuses[i%len(statuses)], float64(i%500)+0.5); err != nil {
			return err
		}
	}
	return tx.Commit()
}

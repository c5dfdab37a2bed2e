package sources

import (
	"context"
	"database/sql"
	"iter"
)

// Rows returns a source that runs query with Run's context and yields
// what scan makes of each row, such as
//
//	sources.Rows(func(ctx context.Context) (*sql.Rows, error) {
//		return db.QueryContext(ctx, `SELECT id, email FROM users`)
//	}, func(rows *sql.Rows) (User, error) {
//		var u User
//		err := rows.Scan(&u.ID, &u.Email)
//		return u, err
//	})
//
// The query runs when Run pulls the source, after the locks are taken, and
// is cancelled with the run. The source stops at the first error of query,
// scan or the rows (rows.Err), and yields it; it closes the rows on every
// path.
func Rows[T any](query func(ctx context.Context) (*sql.Rows, error), scan func(rows *sql.Rows) (T, error)) Source[T] {
	return func(ctx context.Context) iter.Seq2[T, error] {
		return func(yield func(T, error) bool) {
			var zero T
			rows, err := query(ctx)
			if err != nil {
				yield(zero, err)
				return
			}
			defer rows.Close()
			for rows.Next() {
				item, err := scan(rows)
				if err != nil {
					yield(zero, err)
					return
				}
				if !yield(item, nil) {
					return
				}
			}
			if err := rows.Err(); err != nil {
				yield(zero, err)
			}
		}
	}
}

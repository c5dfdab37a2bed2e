// Package outbox is a transactional outbox for keyswap indexes, for any
// database/sql database (PostgreSQL and SQLite are tested): the
// application writes each change of an item into an outbox table in the
// transaction that changes the data, and a [Relay] applies the rows
// through rebuild.Rebuilder.Apply and deletes them. A change committed is
// then applied even if the process that committed it dies before it could
// call Apply, and no code path that writes the data can forget to.
//
//	ob, err := outbox.New[User](outbox.Options{Dialect: outbox.Postgres})
//	err = ob.Create(ctx, db) // the tables, if missing
//
//	// In the application's transaction:
//	tx, err := db.BeginTx(ctx, nil)
//	err = tx.QueryRowContext(ctx, `UPDATE users SET email = $1, version = version + 1 WHERE id = $2 RETURNING version`, email, id).Scan(&version)
//	err = ob.Write(ctx, tx, "user:"+id, version, rebuild.Update(old, new))
//	err = tx.Commit()
//
//	// In one process:
//	err = ob.Relay(db, rebuilder, outbox.RelayOptions{}).Run(ctx)
//
// # Ordering
//
// The rows' serial ids are not the commit order: a transaction that took
// an id first may commit last. So the application gives each change a
// version, which orders the changes of one item (a version column
// incremented under the row's lock is the usual one). The relay applies
// each item's changes in version order, whatever order their rows were
// written or committed in, and remembers, per item, the version it applied
// last (in the table <outbox>_applied, written in the transaction that
// deletes the rows): a row whose version is not above it came late and is
// dropped, never applied over a newer change. What holds: per item, the
// index ends at the change with the highest version, and passes only
// through changes in increasing version order. Across items there is no
// order beyond the rows' ids: changes to different items are applied in
// the order of their items' first rows in each batch. The <outbox>_applied
// table keeps one row per item ever changed.
//
// # Concurrency
//
// One relay per outbox table. On PostgreSQL the relay holds an advisory
// lock while it runs, and a second one waits for it (a standby, whose
// Status.Err matches ErrRelayRunning meanwhile); on SQLite nothing stops a
// second relay, so run one (a second one could apply an item's changes out
// of order). Write is safe for concurrent use,
// as the database's transactions are.
//
// # Errors
//
// Run returns an error matching ErrRejected for a row it cannot decode
// (the relay stops before it: fix or delete the row), or an Apply error that would come back; it retries everything else: Redis
// unreachable, a change refused while a rebuild that does not log changes
// holds a lock, a lost database connection. See package capture for the
// status, the metrics, and what a rebuild of the index needs while the
// relay runs.
package outbox

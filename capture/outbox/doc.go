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
//	// In the application's transaction: the change to the data, then a
//	// version from a sequence, then the outbox row.
//	tx, err := db.BeginTx(ctx, nil)
//	_, err = tx.ExecContext(ctx, `UPDATE users SET email = $1 WHERE id = $2`, email, id)
//	err = tx.QueryRowContext(ctx, `SELECT nextval('user_versions')`).Scan(&version)
//	err = ob.Write(ctx, tx, "user:"+id, version, index.Update(old, new))
//	err = tx.Commit()
//
//	// In one process:
//	err = ob.Relay(db, rebuilder, outbox.RelayOptions{}).Run(ctx)
//
// # Ordering
//
// The relay applies the rows in the order of their ids, except that each
// item's rows are sorted by version among the positions they hold. Write
// the outbox row after the statement that changes the data, in the same
// transaction: a transaction that had to wait for another one (the row's
// lock, or a unique index holding a value the other one gives up) then
// takes its row's id after the other one took its own, so the ids order
// the changes that depend on each other, such as an email that one user
// gives up and another takes. Ids are not the commit order otherwise (a
// transaction that took an id first may commit last), and transactions
// that do not wait for each other change different entries, so applying
// them in either order gives the same index.
//
// The version orders an item's own changes: it must increase with each
// change of the item, over the item's whole life, across a delete and an
// insert of the same item too. Take it, after the statement that changes
// the item's row (so that the row's lock orders the transactions), from a
// counter that never goes back: on PostgreSQL a sequence (CREATE SEQUENCE
// user_versions, with its default CACHE 1), on SQLite, whose transactions
// write one at a time, a one-row table incremented in the transaction. A
// version column of the row incremented by the UPDATE does not do: it
// starts again at its default when the row is deleted and inserted again.
//
// The relay remembers, per item, the version it applied last (in the
// table <outbox>_applied, written in the transaction that deletes the
// rows): a row whose version is not above it is dropped, never applied
// over a newer change. It counts such rows (Status.Dropped, the metric
// keyswap.relay.dropped) and logs a warning naming them: either a row
// that came late (its version was applied from a row with a lower id, and
// it is stale), or versions that went back (an item's change lost to the
// index: rebuild it, and fix the versions). What holds: per item, the
// index ends at the change with the highest version, and passes only
// through changes in increasing version order. The <outbox>_applied table
// keeps one row per item ever changed.
//
// # Concurrency
//
// One relay per outbox table. On PostgreSQL the relay holds an advisory
// lock while it runs, and a second one waits for it (a standby, whose
// Status.Err matches ErrRelayRunning meanwhile); on SQLite nothing stops a
// second relay, so run one (a second one could apply an item's changes out
// of order). Write is safe for concurrent use, as the database's
// transactions are.
//
// The lock is the session's: it goes when the relay's connection dies (a
// restart, pg_terminate_backend, an idle timeout), and a standby then takes
// over and applies the rows the first relay had read and not deleted,
// followed by newer ones. So, before each Apply call, tries again
// included, the relay checks on its connection that it still holds the
// lock, and abandons its batch when it does not: a relay that was retrying
// an Apply (Redis unreachable) when it lost its connection never applies
// its old batch over the newer changes. What no check on the database can
// exclude is a relay that stops right between that check and its Apply's
// arrival in Redis (a paused process, a write held up in the network) for
// as long as it takes another relay to take over and apply newer changes
// of the same items: that would need Redis itself to refuse the writes of
// a relay that lost its lock.
//
// # Errors
//
// Run returns an error matching ErrRejected for a row it cannot decode
// (the relay stops before it: fix or delete the row), an Apply error that
// would come back, or a database error that would (a missing table or
// right, a failed authentication). It retries everything else: Redis
// unreachable, a change refused while a rebuild that does not log changes
// holds a lock, a lost database connection, SQLite busy. On SQLite the
// relay sets a busy_timeout of 5 s on its own connection when it has none,
// so that its writes wait for the application's transactions instead of
// failing. See package capture for the status, the metrics, and what a
// rebuild of the index needs while the relay runs.
package outbox

// Package pgcdc feeds the row changes of PostgreSQL tables into a keyswap
// index, from a logical replication slot: no application code calls
// Rebuilder.Apply, and a process that dies between its commit and its
// Apply loses nothing.
//
//	r, err := pgcdc.New(dsn, rebuilder, pgcdc.Options{Slot: "keyswap_users", Publication: "keyswap"},
//		pgcdc.Table[User]{Name: "users", Change: pgcdc.Decode(func(row pgcdc.Row) (User, error) {
//			return User{ID: fmt.Sprint(row["id"]), Email: row["email"].(string)}, nil
//		})})
//	err = r.Run(ctx) // until ctx ends, or an error that would come back
//
// # Setup
//
// The relay reads a slot of the pgoutput plugin through a publication, as
// PostgreSQL's own logical replication does:
//
//	-- postgresql.conf: wal_level = logical (then restart)
//	ALTER TABLE users REPLICA IDENTITY FULL;
//	CREATE PUBLICATION keyswap FOR TABLE users;
//	SELECT pg_create_logical_replication_slot('keyswap_users', 'pgoutput');
//
// and connects as a user with the REPLICATION attribute. REPLICA IDENTITY
// FULL makes PostgreSQL send the whole old row of each update and delete,
// which the relay needs to remove the old entries (an email that changed).
// Run checks all of this first, and then every Options.CheckInterval, and
// returns an error matching ErrSetup that says what to change: wal_level,
// a missing slot (or Options.CreateSlot creates it), a slot of another
// plugin or database, a missing publication or one that does not publish
// inserts, updates and deletes, a table that does not exist (or was
// dropped), is not in the publication, is published with a row filter or a
// column list, or lacks REPLICA IDENTITY FULL.
//
// The relay knows a captured table by its OID, as the checks find it: a
// table renamed while the relay runs stops it at once with ErrSetup naming
// the new name (its changes under the new name are never skipped as
// another table's: given the table's name, the relay resumes with them),
// and another table under a captured name (the table was dropped and
// created again) stops it with ErrRebuildRequired before its first change.
//
// A slot streams only what is committed after it was created: create it,
// then rebuild the index (see package capture, "Rebuilds").
//
// # Order and acknowledgement
//
// PostgreSQL sends each transaction once it committed, in commit order.
// The relay turns each row change into an item's change through the
// table's Change function, and applies the changes in that order, as many
// at a time as have come while the previous Apply ran (Options.BatchSize
// at most), one Apply at a time. It acknowledges a position to the slot
// (a standby status update, every Options.StatusInterval) only once every
// change before it is applied: the end of the last transaction applied,
// or, between transactions, the server's position, so that the slot does
// not hold the WAL of other tables. A relay that stops or is killed
// resumes from the slot: it loses nothing and applies again, in order, only
// what it had applied and not yet acknowledged; applying a change twice is
// harmless.
//
// A column whose value is TOASTed and did not change arrives without a
// value in an update: the relay takes it from the old row, so Change gets
// whole rows.
//
// # Errors
//
// Run retries, with a backoff, what may go away: Redis unreachable, a lost
// reply (rebuild.ErrOutcomeUnknown), a change refused while a rebuild that
// does not log changes holds a lock (rebuild.ErrInProgress), and Redis
// loading, busy or failing over; it keeps sending standby status updates
// meanwhile, never acknowledging past the change. It connects again when
// it loses PostgreSQL (a restart). It returns:
//
//   - ErrSetup, as above;
//   - ErrRebuildRequired when changes were lost: PostgreSQL invalidated the
//     slot (max_slot_wal_keep_size), a captured table was truncated
//     without Options.Truncate, or dropped and created again;
//   - ErrRejected when a table's Change function returned an error for a
//     row, or a value of the row cannot be decoded: the changes before it
//     are applied, and the relay stops before it;
//   - an Apply error that would come back (a builder's error, a key of
//     another type, a missing right), and PostgreSQL refusing the
//     connection for good.
//
// A slot that falls behind past Options.MaxBacklog is reported in Status,
// the metrics and the log; the relay never drops a slot nor skips what it
// holds.
//
// # Concurrency
//
// One Run per Relay at a time, and one relay per slot: PostgreSQL refuses
// a second reader of a slot while the first streams, and the relay retries
// until the slot is free. Status is safe to call from any goroutine.
package pgcdc

// Package capture holds what the relays of module
// github.com/keyswap/keyswap/capture share: their [Status].
//
// The module feeds changes committed to a database into
// rebuild.Rebuilder.Apply, so that no application code has to call Apply
// after each commit, and a process that dies between its commit and its
// Apply loses nothing:
//
//   - package pgcdc reads a PostgreSQL logical replication slot (the
//     pgoutput plugin and a publication) and applies the row changes of the
//     tables it is given, in commit order;
//   - package outbox is a transactional outbox for any database/sql
//     database (PostgreSQL and SQLite are tested): the application writes
//     each change into an outbox table in the transaction that changes the
//     data, and the relay applies the rows and deletes them.
//
// It is a module of its own so that programs that do not use it never have
// a PostgreSQL driver or OpenTelemetry in their module graph.
//
// # Rebuilds
//
// A relay applies its changes with Rebuilder.Apply, so a rebuild of the
// same keys that runs meanwhile logs them and replays them before it
// publishes, as it does for any Apply: a rebuild while the relay runs
// keeps every change. What the rebuild's source must read is what Apply
// always asks: the primary database, read after the run took its locks
// (a query run by the source, not rows loaded before Run was called). The
// relay may lag behind the database by any amount: a change committed
// before the source read it and applied by the relay during the run is
// replayed over the source's read of the same item, and one applied after
// the publish goes to the published keys; either way the last change of
// each item wins. What bounds the run is how many changes it may log
// (rebuild.Options.MaxChanges) and how long its catch-up may take
// (rebuild.Options.CatchUpTimeout): a relay that applies a large backlog
// during a run can make it fail with rebuild.ErrFallingBehind, and it is
// then run again. A change that was never captured cannot be replayed:
// PostgreSQL streams only what was committed after the slot was created,
// so the first rebuild of an index fed by a slot starts after the slot
// exists, and a slot that PostgreSQL invalidated (max_slot_wal_keep_size)
// lost changes, which only a rebuild restores.
//
// # Metrics
//
// Each relay records OpenTelemetry metrics, with the instrumentation scope
// "github.com/keyswap/keyswap/capture", and the attributes keyswap.relay
// ("postgres" or "outbox") and keyswap.source (the slot's name, or the
// outbox table's):
//
//	keyswap.relay.changes         counter    {change}  changes applied
//	keyswap.relay.dropped         counter    {change}  outbox rows dropped as stale (version not above the one applied)
//	keyswap.relay.lag             histogram  s         commit to visible in Redis, per transaction (PostgreSQL) or row (outbox)
//	keyswap.relay.pending         gauge      {change}  changes read and not yet applied
//	keyswap.relay.backlog         gauge      By/{row}  WAL the slot holds (By), or rows in the outbox ({row})
//	keyswap.relay.falling_behind  gauge      {relay}   1 while the backlog is past its threshold
//	keyswap.relay.retries         counter    {call}    Apply calls tried again, with error.type
//	keyswap.relay.reconnects      counter    {connection}  sources lost and connected again, with error.type
//
// The gauges are observed while the relay's Run runs, and no longer once it
// returned, so that a relay one is done with leaves nothing registered
// with the MeterProvider.
package capture

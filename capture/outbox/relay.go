package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/capture"
	"github.com/keyswap/keyswap/capture/internal/track"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
	"go.opentelemetry.io/otel/metric"
)

// Defaults of RelayOptions.
const (
	DefaultBatchSize     = 500
	DefaultPollInterval  = 100 * time.Millisecond
	DefaultCheckInterval = 10 * time.Second
	DefaultMaxBacklog    = 100_000
)

// ErrRelayRunning is the error in Status while a relay waits for another
// relay of the same outbox table to stop (on PostgreSQL, where the relay
// holds an advisory lock while it runs).
var ErrRelayRunning = errors.New("another relay runs for this outbox")

// ErrRejected: a row of the outbox cannot be decoded into a change. The
// relay stops before it; the error names the row's id.
var ErrRejected = errors.New("an outbox row was rejected")

// RelayOptions configures a Relay. The zero value of each field means its
// default.
type RelayOptions struct {
	// BatchSize is the most rows the relay reads, applies in one Apply
	// call, and deletes at a time. Zero: 500.
	BatchSize int
	// PollInterval is how long the relay waits after finding the outbox
	// empty before it reads it again. Zero: 100 ms. It bounds the lag that
	// the relay adds when it keeps up.
	PollInterval time.Duration
	// CheckInterval is the time between two counts of the rows in the
	// outbox (Status.Backlog). Zero: 10 s.
	CheckInterval time.Duration
	// MaxBacklog is the number of rows in the outbox past which the relay
	// reports that it is falling behind (Status.FallingBehind, the metric
	// keyswap.relay.falling_behind, a warning in Logger). Zero: 100,000.
	MaxBacklog int64
	// Logger receives the relay's warnings. Zero: discard.
	Logger *slog.Logger
	// MeterProvider records the relay's metrics (see package capture).
	// Zero: the global provider.
	MeterProvider metric.MeterProvider
}

// Relay applies the rows of an outbox to a Rebuilder's index, and deletes
// them once applied.
type Relay[T any] struct {
	o     *Outbox[T]
	db    *sql.DB
	rb    *rebuild.Rebuilder[T]
	opts  RelayOptions
	track *track.Tracker

	running atomic.Bool
}

// Relay returns a relay of the outbox in db that applies its changes
// through r. It does no I/O.
func (o *Outbox[T]) Relay(db *sql.DB, r *rebuild.Rebuilder[T], opts RelayOptions) *Relay[T] {
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = DefaultCheckInterval
	}
	if opts.MaxBacklog <= 0 {
		opts.MaxBacklog = DefaultMaxBacklog
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Relay[T]{o: o, db: db, rb: r, opts: opts, track: track.New("outbox", o.table, "{row}", opts.MeterProvider)}
}

// Status returns the relay's status: see capture.Status. Its changes are
// the outbox's rows: Applied counts the rows applied, Dropped those
// dropped as stale (see the package documentation, "Ordering"),
// Pending the rows read and not yet deleted, Lag runs from the time the
// application wrote a row (its clock, before the commit), Position is the
// highest row id deleted, and Backlog the rows in the outbox at the last
// count.
func (r *Relay[T]) Status() capture.Status { return r.track.Status() }

// Run applies the outbox's rows until ctx ends or an error that would come
// back stops it. Each round reads the oldest rows (by id), sorts each
// item's rows by version among the positions they hold (see the package
// documentation, "Ordering"), drops the rows whose version is not above
// the one applied last for their item, applies the others through the
// Rebuilder's Apply, in one call, then, in one transaction, records each
// item's version and deletes the rows. A relay killed before that
// transaction applies the same rows again when it restarts, in the same
// order, which is harmless.
//
// One relay runs per outbox table. On PostgreSQL, Run holds an advisory
// lock for the table on a connection of its own while it runs; while
// another relay holds it, Run waits (Status.Err matches ErrRelayRunning),
// so a second relay is a standby that takes over when the first stops or
// its connection dies. Before each Apply call, Run checks that its
// connection still holds the lock, and abandons its batch (and connects
// again) when it does not. On SQLite nothing stops a second relay: run one.
//
// Run rides out what may go away: an Apply that fails for a reason that may
// pass is tried again, with a backoff, before anything is deleted; a
// database error that may pass (a lost connection, a restart, a lock
// timeout) makes it connect again. It returns context.Cause(ctx) when ctx
// ends, an error matching ErrRejected for a row it cannot decode, an Apply
// error that would come back (a builder's error, a key of another type, a
// missing right), or a database error that would (a missing table or
// privilege, a failed authentication: on PostgreSQL, SQLSTATE classes 28,
// 3D, 42 and 0A; on SQLite, with modernc.org/sqlite, SQLITE_ERROR and the
// like). Only one Run of a Relay may run at a time.
func (r *Relay[T]) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox: Run is already running")
	}
	defer r.running.Store(false)
	defer r.track.Connected(false)
	defer r.track.Observe()()
	failures := 0
	for {
		progressed, err := r.session(ctx)
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if errors.Is(err, ErrRejected) || !track.Retryable(err) && isApplyError(err) || permanent(err) {
			r.track.Failed(err)
			return err
		}
		if errors.Is(err, ErrRelayRunning) {
			r.track.Failed(err)
			if err := track.Sleep(ctx, r.opts.PollInterval*10); err != nil {
				return err
			}
			continue
		}
		r.track.Drop()
		r.track.Reconnect(ctx, err)
		r.opts.Logger.Warn("keyswap: the outbox relay lost its database connection; connecting again", "table", r.o.table, "err", err)
		if progressed {
			failures = 0
		}
		delay := track.Backoff(failures + 3)
		failures++
		if err := track.Sleep(ctx, delay); err != nil {
			return err
		}
	}
}

// permanent reports whether err, an error of the database, would come back
// if the relay connected again, so that it must stop rather than retry:
// PostgreSQL's SQLSTATE classes 28 (authentication), 3D (an unknown
// database), 42 (a missing table, function or privilege, a syntax error)
// and 0A (not supported), from a driver whose errors have a SQLState
// method (pgx's); SQLite's SQLITE_ERROR (a missing table, a syntax error),
// PERM, READONLY, CORRUPT, CANTOPEN, MISMATCH, AUTH and NOTADB, from a
// driver whose errors have a Code method (modernc.org/sqlite's). Anything
// else, such as a lost connection, SQLITE_BUSY or a serialization
// failure, may pass.
func permanent(err error) bool {
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		state := pg.SQLState()
		return len(state) >= 2 && slices.Contains([]string{"28", "3D", "42", "0A"}, state[:2])
	}
	var lite interface{ Code() int }
	if errors.As(err, &lite) {
		switch lite.Code() & 0xff { // the primary result code
		case 1, 3, 8, 11, 14, 20, 23, 26:
			return true
		}
	}
	return false
}

// applyError is an error of Apply that would come back.
type applyError struct{ err error }

func (e applyError) Error() string { return e.err.Error() }
func (e applyError) Unwrap() error { return e.err }

func isApplyError(err error) bool {
	var a applyError
	return errors.As(err, &a)
}

// session takes a connection (and, on PostgreSQL, the advisory lock on
// it), and relays until an error or the end of ctx. It reports whether it
// applied anything.
func (r *Relay[T]) session(ctx context.Context) (progressed bool, err error) {
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return false, fmt.Errorf("outbox: connect: %w", err)
	}
	defer conn.Close()
	if r.o.dialect == Postgres {
		var ok bool
		key := r.lockKey()
		if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, key).Scan(&ok); err != nil {
			return false, fmt.Errorf("outbox: take the relay's lock: %w", err)
		}
		if !ok {
			return false, fmt.Errorf("outbox: %w: table %s (advisory lock hashtextextended('%s', 0))", ErrRelayRunning, r.o.table, key)
		}
		defer func() {
			_, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, key)
		}()
	}
	if r.o.dialect == SQLite {
		restore, err := r.waitWhenBusy(ctx, conn)
		if err != nil {
			return false, err
		}
		defer restore()
	}
	r.track.Connected(true)
	defer r.track.Connected(false)
	var checked time.Time
	for {
		if time.Since(checked) >= r.opts.CheckInterval {
			if err := r.count(ctx, conn); err != nil {
				return progressed, err
			}
			checked = time.Now()
		}
		n, err := r.round(ctx, conn)
		if err != nil {
			return progressed, err
		}
		if n > 0 {
			progressed = true
			continue
		}
		if err := track.Sleep(ctx, r.opts.PollInterval); err != nil {
			return progressed, err
		}
	}
}

// lockKey is the text whose hash is the key of the relay's advisory lock
// (PostgreSQL).
func (r *Relay[T]) lockKey() string { return "keyswap-outbox:" + r.o.table }

// errLockLost: the relay no longer holds its advisory lock, so another
// relay may have taken over.
var errLockLost = errors.New("the relay lost its lock")

// lockCheckTimeout bounds the check of the lock: a connection that does
// not answer within it may be gone, and its lock with it.
const lockCheckTimeout = 5 * time.Second

// holdsLock returns nil if the relay's connection conn still holds its
// advisory lock (PostgreSQL), and an error matching errLockLost if it does
// not, or cannot tell. A session's advisory lock goes with its connection:
// a relay whose connection died (a restart, pg_terminate_backend, an idle
// timeout) while it retried an Apply must not apply its batch, which a
// relay that took over may have applied already, followed by newer
// changes.
func (r *Relay[T]) holdsLock(ctx context.Context, conn *sql.Conn) error {
	cctx, cancel := context.WithTimeout(ctx, lockCheckTimeout)
	defer cancel()
	var held bool
	err := conn.QueryRowContext(cctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
		AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0))`, r.lockKey()).Scan(&held)
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fmt.Errorf("outbox: %w: check the relay's lock on table %s before applying: %w", errLockLost, r.o.table, err)
	case !held:
		return fmt.Errorf("outbox: %w: its connection no longer holds the advisory lock of table %s", errLockLost, r.o.table)
	}
	return nil
}

// busyTimeout is the busy_timeout the relay sets on its SQLite connection
// when the connection has none.
const busyTimeout = 5 * time.Second

// waitWhenBusy sets busy_timeout on conn, a SQLite connection, when it is 0
// (SQLite's default), and returns the function that sets it back: without
// it, the relay's every write that meets the application's write
// transaction fails at once with SQLITE_BUSY.
func (r *Relay[T]) waitWhenBusy(ctx context.Context, conn *sql.Conn) (restore func(), err error) {
	var ms int64
	if err := conn.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&ms); err != nil {
		return nil, fmt.Errorf("outbox: read busy_timeout: %w", err)
	}
	if ms != 0 {
		return func() {}, nil
	}
	if _, err := conn.ExecContext(ctx, `PRAGMA busy_timeout = `+strconv.FormatInt(busyTimeout.Milliseconds(), 10)); err != nil {
		return nil, fmt.Errorf("outbox: set busy_timeout: %w", err)
	}
	return func() {
		// The connection goes back to the application's pool as it came.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(cctx, `PRAGMA busy_timeout = 0`)
	}, nil
}

// count counts the rows in the outbox.
func (r *Relay[T]) count(ctx context.Context, conn *sql.Conn) error {
	var n int64
	if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM `+r.o.table).Scan(&n); err != nil {
		return fmt.Errorf("outbox: count the rows of %s: %w", r.o.table, err)
	}
	falling := n > r.opts.MaxBacklog
	if falling && !r.track.Status().FallingBehind {
		r.opts.Logger.Warn("keyswap: the outbox relay is falling behind: the outbox holds more rows than RelayOptions.MaxBacklog",
			"table", r.o.table, "rows", n, "max_backlog", r.opts.MaxBacklog)
	}
	r.track.Backlog(n, falling)
	return nil
}

// row is a row of the outbox.
type row struct {
	id, version, written int64
	item                 string
	old, new             []byte
	applied              sql.NullInt64 // the item's version applied last
}

// round reads, applies and deletes one batch of rows, and returns how
// many rows it read.
func (r *Relay[T]) round(ctx context.Context, conn *sql.Conn) (int, error) {
	q := `SELECT o.id, o.item, o.version, o.old, o.new, o.written_us, a.version
		FROM ` + r.o.table + ` o LEFT JOIN ` + r.o.applied + ` a ON a.item = o.item
		ORDER BY o.id LIMIT ` + strconv.Itoa(r.opts.BatchSize)
	rs, err := conn.QueryContext(ctx, q)
	if err != nil {
		return 0, fmt.Errorf("outbox: read %s: %w", r.o.table, err)
	}
	var rows []row
	for rs.Next() {
		var w row
		if err := rs.Scan(&w.id, &w.item, &w.version, &w.old, &w.new, &w.written, &w.applied); err != nil {
			rs.Close()
			return 0, fmt.Errorf("outbox: read %s: %w", r.o.table, err)
		}
		rows = append(rows, w)
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return 0, fmt.Errorf("outbox: read %s: %w", r.o.table, err)
	}
	if len(rows) == 0 {
		return 0, nil
	}
	r.track.Read(len(rows), time.UnixMicro(rows[0].written))

	var changes []index.Change[T]
	var commits []time.Time
	versions := map[string]int64{}
	ids := make([]int64, 0, len(rows))
	var dropped []row
	for _, w := range inOrder(rows) {
		ids = append(ids, w.id)
		if w.applied.Valid && w.version <= w.applied.Int64 {
			dropped = append(dropped, w)
			continue
		}
		if v, ok := versions[w.item]; !ok || w.version > v {
			versions[w.item] = w.version
		}
		c, err := r.decode(w)
		if err != nil {
			return 0, err
		}
		changes = append(changes, c)
		commits = append(commits, time.UnixMicro(w.written))
	}
	if len(changes) > 0 {
		var check func(context.Context) error
		if r.o.dialect == Postgres {
			check = func(ctx context.Context) error { return r.holdsLock(ctx, conn) }
		}
		if err := track.Apply(ctx, r.track, r.rb, changes, check); err != nil {
			if ctx.Err() != nil || errors.Is(err, errLockLost) {
				return 0, err
			}
			return 0, applyError{fmt.Errorf("outbox: apply the changes of rows %d..%d: %w", ids[0], rows[len(rows)-1].id, err)}
		}
	}
	if err := r.done(ctx, conn, versions, ids); err != nil {
		return 0, err
	}
	if len(dropped) > 0 {
		// Never silent: a row that came late is harmless, but versions
		// that went back lose a change to the index.
		w := dropped[0]
		r.opts.Logger.Warn("keyswap: the outbox relay dropped rows whose version is not above the one applied for their item: rows that came late, "+
			"or versions that went back (an item deleted and inserted again with its version restarted), whose changes are then missing from the index: "+
			"rebuild it, and take versions from a counter that never goes back",
			"table", r.o.table, "rows", len(dropped), "row", w.id, "item", w.item, "version", w.version, "applied_version", w.applied.Int64)
		r.track.Dropped(ctx, len(dropped))
	}
	r.track.Applied(ctx, len(rows)-len(dropped), commits)
	r.track.Position(strconv.FormatInt(rows[len(rows)-1].id, 10))
	return len(rows), nil
}

// inOrder returns rows, read in id order, in the order to apply them: the
// rows of different items stay in id order, and each item's rows are
// sorted by version (rows of one version by id) among the positions the
// item's rows hold. The order of ids is the order in which conflicting
// transactions wrote their rows, when each writes its outbox row after the
// change to the data: a transaction that waits for another (a row lock, a
// unique index that a value leaves) takes its id after the other took its
// own. So an item that takes a value another item gave up is applied after
// it; the versions order an item's own changes only.
func inOrder(rows []row) []row {
	positions := map[string][]int{}
	var items []string
	for i, w := range rows {
		if _, ok := positions[w.item]; !ok {
			items = append(items, w.item)
		}
		positions[w.item] = append(positions[w.item], i)
	}
	out := make([]row, len(rows))
	for _, item := range items {
		at := positions[item]
		its := make([]row, len(at))
		for j, i := range at {
			its[j] = rows[i]
		}
		slices.SortStableFunc(its, func(a, b row) int {
			if a.version != b.version {
				return cmpInt(a.version, b.version)
			}
			return cmpInt(a.id, b.id)
		})
		for j, i := range at {
			out[i] = its[j]
		}
	}
	return out
}

// decode decodes a row into a change.
func (r *Relay[T]) decode(w row) (index.Change[T], error) {
	var c index.Change[T]
	if w.old == nil && w.new == nil {
		return c, fmt.Errorf("outbox: %w: row %d of %s (item %q) has neither an old nor a new value", ErrRejected, w.id, r.o.table, w.item)
	}
	for _, v := range []struct {
		data []byte
		dst  **T
		name string
	}{{w.old, &c.Old, "old"}, {w.new, &c.New, "new"}} {
		if v.data == nil {
			continue
		}
		var t T
		if err := json.Unmarshal(v.data, &t); err != nil {
			return c, fmt.Errorf("outbox: %w: row %d of %s (item %q): decode the %s value: %w", ErrRejected, w.id, r.o.table, w.item, v.name, err)
		}
		*v.dst = &t
	}
	return c, nil
}

// done records the versions applied and deletes the rows, in one
// transaction.
func (r *Relay[T]) done(ctx context.Context, conn *sql.Conn, versions map[string]int64, ids []int64) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	upsert := `INSERT INTO ` + r.o.applied + ` AS a (item, version) VALUES (` + r.o.params(1, 2) + `)
		ON CONFLICT (item) DO UPDATE SET version = excluded.version WHERE excluded.version > a.version`
	for item, v := range versions {
		if _, err := tx.ExecContext(ctx, upsert, item, v); err != nil {
			return fmt.Errorf("outbox: record the version of %q: %w", item, err)
		}
	}
	for start := 0; start < len(ids); start += 500 {
		chunk := ids[start:min(start+500, len(ids))]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+r.o.table+` WHERE id IN (`+r.o.params(1, len(chunk))+`)`, args...); err != nil {
			return fmt.Errorf("outbox: delete the rows applied: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox: delete the rows applied: %w", err)
	}
	return nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

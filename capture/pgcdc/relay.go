package pgcdc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/keyswap/keyswap/capture"
	"github.com/keyswap/keyswap/capture/internal/track"
	"github.com/keyswap/keyswap/rebuild"
	"go.opentelemetry.io/otel/metric"
)

// Defaults of Options.
const (
	DefaultBatchSize      = 500
	DefaultStatusInterval = 10 * time.Second
	DefaultCheckInterval  = 10 * time.Second
	DefaultMaxBacklog     = 1 << 30
)

// Options configures a Relay. The zero value of each field but Slot and
// Publication means its default.
type Options struct {
	// Slot is the name of the logical replication slot, of the pgoutput
	// plugin, in the database of the connection string. Required.
	Slot string
	// Publication is the name of the publication that covers the tables.
	// Required.
	Publication string
	// CreateSlot creates the slot when it does not exist. Zero: a missing
	// slot is an error matching ErrSetup. A new slot streams only what is
	// committed after it was created: rebuild the index after that.
	CreateSlot bool
	// BatchSize is the most changes one Apply call carries. Zero: 500. The
	// relay applies what it has read when the previous Apply returns, up to
	// this many changes at a time, so at a low rate each Apply carries one
	// transaction, and under load it carries many.
	BatchSize int
	// StatusInterval is the time between two standby status updates, which
	// tell PostgreSQL the position up to which every change is applied (it
	// may then remove the WAL before it). Zero: 10 s. The updates go on
	// while an Apply is retried. It must be shorter than the server's
	// wal_sender_timeout (60 s by default).
	StatusInterval time.Duration
	// CheckInterval is the time between two checks of the slot (its backlog
	// and whether PostgreSQL invalidated it) and of the tables (that they
	// still exist, in the publication, with REPLICA IDENTITY FULL). Zero:
	// 10 s.
	CheckInterval time.Duration
	// MaxBacklog is the WAL, in bytes, from the slot's confirmed position
	// to the server's current one, past which the relay reports that it is
	// falling behind (Status.FallingBehind, the metric
	// keyswap.relay.falling_behind, a warning in Logger). Zero: 1 GiB. The
	// relay never drops or advances a slot to catch up.
	MaxBacklog int64
	// Truncate is called, in commit order, for a TRUNCATE of captured
	// tables (by their qualified names), after every change before it is
	// applied; the relay goes on when it returns nil. A TRUNCATE carries no
	// rows, so the index cannot follow it change by change: rebuilding the
	// index from the tables is the usual answer. Zero: the relay stops with
	// an error matching ErrRebuildRequired.
	Truncate func(ctx context.Context, tables []string) error
	// Logger receives the relay's warnings (a reconnect, a backlog past
	// MaxBacklog, a created slot). Zero: discard.
	Logger *slog.Logger
	// MeterProvider records the relay's metrics (see package capture).
	// Zero: the global provider.
	MeterProvider metric.MeterProvider
}

// slotName is what PostgreSQL accepts as a slot's name.
var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// Relay applies the changes of PostgreSQL tables to a Rebuilder's index,
// from a logical replication slot.
type Relay[T any] struct {
	rb     *rebuild.Rebuilder[T]
	opts   Options
	config *pgx.ConnConfig // the connection string's
	tables map[string]Table[T]
	names  []string // qualified, in the order given
	track  *track.Tracker

	running atomic.Bool
	acked   atomic.Uint64 // every change up to this LSN is applied

	mu   sync.Mutex
	oids map[string]uint32 // the tables' OIDs by qualified name, as the checks found them

	// onApplied, when set (by tests), is called after each Apply with the
	// commit times of the transactions it completed.
	onApplied func(commits []time.Time, at time.Time)
}

// New returns a Relay that reads the slot opts.Slot of the database that
// connString names (a URL or key=value pairs, as pgx accepts; the relay
// opens a replication connection and a plain one to it), and applies the
// changes of tables through r. The connection's user needs the REPLICATION
// attribute (or to be a superuser), and to read the catalogs.
//
// New does no I/O; Run checks the database. It returns an error for a
// connection string pgx cannot parse, a missing or invalid slot or
// publication name, no table, a table without Change, or a table given
// twice.
func New[T any](connString string, r *rebuild.Rebuilder[T], opts Options, tables ...Table[T]) (*Relay[T], error) {
	if r == nil {
		return nil, errors.New("pgcdc: nil Rebuilder")
	}
	if !slotName.MatchString(opts.Slot) {
		return nil, fmt.Errorf("pgcdc: slot name %q: PostgreSQL accepts 1 to 63 lower-case letters, digits and underscores", opts.Slot)
	}
	if opts.Publication == "" {
		return nil, errors.New("pgcdc: no publication")
	}
	if len(tables) == 0 {
		return nil, errors.New("pgcdc: no table")
	}
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("pgcdc: %w", err)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.StatusInterval <= 0 {
		opts.StatusInterval = DefaultStatusInterval
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
	rl := &Relay[T]{rb: r, opts: opts, config: cfg, tables: map[string]Table[T]{}, oids: map[string]uint32{}}
	for _, t := range tables {
		q := qualified(t.Name)
		if t.Change == nil {
			return nil, fmt.Errorf("pgcdc: table %s has no Change function", q)
		}
		if s, n := splitName(q); s == "" || n == "" {
			return nil, fmt.Errorf("pgcdc: table name %q", t.Name)
		}
		if _, dup := rl.tables[q]; dup {
			return nil, fmt.Errorf("pgcdc: table %s given twice", q)
		}
		rl.tables[q] = t
		rl.names = append(rl.names, q)
	}
	rl.track = track.New("postgres", opts.Slot, "By", opts.MeterProvider)
	return rl, nil
}

// oid returns the OID the checks found for the table name (qualified).
func (r *Relay[T]) oid(name string) (uint32, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	oid, ok := r.oids[name]
	return oid, ok
}

// setOID records the OID a check found for the table name.
func (r *Relay[T]) setOID(name string, oid uint32) {
	r.mu.Lock()
	r.oids[name] = oid
	r.mu.Unlock()
}

// captured returns the name the relay was given for the table whose OID is
// oid, and false for a table it does not capture. A captured table is the
// one the checks found, whatever name the stream gives it: the stream's
// catalog is the one of the time of each change, so it may show an older
// name (a table since renamed).
func (r *Relay[T]) captured(oid uint32) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, o := range r.oids {
		if o == oid {
			return name, true
		}
	}
	return "", false
}

// Status returns the relay's status: see capture.Status. Position is the
// LSN acknowledged to the slot (or about to be, at the next standby status
// update), and Backlog the bytes of WAL the slot holds behind the server's
// current position.
func (r *Relay[T]) Status() capture.Status { return r.track.Status() }

// Run reads the slot and applies its changes until ctx ends or an error
// that would come back stops it. It first checks the database (see
// ErrSetup), then streams the transactions committed since the slot's
// confirmed position, in commit order, applies their changes through the
// Rebuilder's Apply, and acknowledges a position to the slot only once
// every change up to it is applied. So a relay that stops, or is killed, at
// any point resumes from the slot where it left off: it loses nothing, and
// applies again, in order, at most what it had applied and not yet
// acknowledged, which is harmless.
//
// Run rides out what may go away: an Apply that fails for a reason that may
// pass (Redis unreachable, a lost reply, a change refused while a rebuild
// that does not log changes holds the lock) is tried again, with a backoff,
// without acknowledging past it; a lost connection to PostgreSQL (a
// restart) is opened again. Status reports both.
//
// Run returns context.Cause(ctx) when ctx ends, or an error matching
// ErrSetup, ErrRebuildRequired or ErrRejected, or an Apply error that would
// come back (a builder's error, a key of another type, a missing right:
// rebuild's sentinels match it), or PostgreSQL refusing the connection for
// good (authentication, an unknown database, a missing privilege). Only
// one Run of a Relay may run at a time.
func (r *Relay[T]) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("pgcdc: Run is already running")
	}
	defer r.running.Store(false)
	defer r.track.Connected(false)
	defer r.track.Observe()()
	failures := 0
	for {
		before := r.acked.Load()
		err := r.session(ctx)
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if !transient(err) {
			r.track.Failed(err)
			return err
		}
		r.track.Drop()
		r.track.Reconnect(ctx, err)
		r.opts.Logger.Warn("keyswap: the relay lost its connection to PostgreSQL; connecting again", "slot", r.opts.Slot, "err", err)
		if r.acked.Load() != before {
			failures = 0
		}
		delay := track.Backoff(failures + 3) // from 80 ms to 2 s
		failures++
		if err := track.Sleep(ctx, delay); err != nil {
			return err
		}
	}
}

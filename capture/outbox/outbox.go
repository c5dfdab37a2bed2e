package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/index"
)

// Dialect is the SQL dialect of the database that holds the outbox.
type Dialect int

// The dialects.
const (
	// Postgres is PostgreSQL (any database/sql driver: pgx's stdlib, lib/pq).
	Postgres Dialect = iota + 1
	// SQLite is SQLite (modernc.org/sqlite, mattn/go-sqlite3).
	SQLite
)

// DefaultTable is the outbox table's name when Options.Table is empty.
const DefaultTable = "keyswap_outbox"

// Options configures an Outbox.
type Options struct {
	// Table is the outbox table's name; the relay also uses a table of the
	// same name followed by "_applied" (see Outbox.Create). Letters,
	// digits and underscores, with an optional "schema." before. Zero:
	// "keyswap_outbox".
	Table string
	// Dialect is the database's SQL dialect. Required.
	Dialect Dialect
}

// Execer is what Write writes with: the application's *sql.Tx (or a
// *sql.Conn, *sql.DB).
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Outbox is a transactional outbox of changes to items of type T. Items are
// stored as JSON (encoding/json), so T's exported fields must carry
// everything the index's builders read.
type Outbox[T any] struct {
	table, applied string
	dialect        Dialect
}

// tableName is what Options.Table accepts.
var tableName = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]*$`)

// New returns the Outbox that opts describe. It does no I/O. It returns an
// error for an invalid table name or dialect.
func New[T any](opts Options) (*Outbox[T], error) {
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if !tableName.MatchString(opts.Table) {
		return nil, fmt.Errorf("outbox: table name %q: use letters, digits and underscores, with an optional schema", opts.Table)
	}
	if opts.Dialect != Postgres && opts.Dialect != SQLite {
		return nil, fmt.Errorf("outbox: unknown dialect %d", opts.Dialect)
	}
	return &Outbox[T]{table: opts.Table, applied: opts.Table + "_applied", dialect: opts.Dialect}, nil
}

// Table returns the outbox table's name.
func (o *Outbox[T]) Table() string { return o.table }

// Schema returns the statements that create the outbox table, its index on
// item, and the table of the versions applied per item, if they do not
// exist. Create runs them; run them with your migrations instead if you
// prefer.
func (o *Outbox[T]) Schema() []string {
	id, blob := "BIGSERIAL PRIMARY KEY", "BYTEA"
	if o.dialect == SQLite {
		id, blob = "INTEGER PRIMARY KEY AUTOINCREMENT", "BLOB"
	}
	index := strings.ReplaceAll(o.table, ".", "_") + "_item"
	if schema, _, ok := strings.Cut(o.table, "."); ok && o.dialect == SQLite {
		index = schema + "." + index // SQLite names an index's schema on the index
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + o.table + ` (
	id ` + id + `,
	item TEXT NOT NULL,
	version BIGINT NOT NULL,
	old ` + blob + `,
	new ` + blob + `,
	written_us BIGINT NOT NULL
)`,
		`CREATE INDEX IF NOT EXISTS ` + index + ` ON ` + strings.TrimPrefix(o.table, o.schemaOf()) + ` (item)`,
		`CREATE TABLE IF NOT EXISTS ` + o.applied + ` (
	item TEXT PRIMARY KEY,
	version BIGINT NOT NULL
)`,
	}
}

// schemaOf returns "schema." of a SQLite table, which its CREATE INDEX
// names on the index instead, and "" otherwise.
func (o *Outbox[T]) schemaOf() string {
	if schema, _, ok := strings.Cut(o.table, "."); ok && o.dialect == SQLite {
		return schema + "."
	}
	return ""
}

// Create creates the outbox's tables (Schema) if they do not exist.
func (o *Outbox[T]) Create(ctx context.Context, db Execer) error {
	for _, q := range o.Schema() {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("outbox: create %s: %w", o.table, err)
		}
	}
	return nil
}

// Write records change c of item in the outbox, through tx: call it in the
// transaction that makes the change to the data, after the statement that
// changes it, so that both commit or neither does. item names the item
// (its table and key, "user:42"), and version orders the changes of one
// item: each change must carry a version higher than every earlier change
// of the item, across a delete and an insert of the item too, such as a
// value of a sequence taken after the statement that changes the item's
// row (see the package documentation, "Ordering"). The relay applies the
// rows in id order, each item's rows in version order, and drops a change
// whose version is not above one it already applied for the item.
//
// Write returns an error for an empty item, a change with neither an old
// nor a new value, a value encoding/json cannot encode, or the insert's
// error.
func (o *Outbox[T]) Write(ctx context.Context, tx Execer, item string, version int64, c index.Change[T]) error {
	if item == "" {
		return errors.New("outbox: empty item")
	}
	if c.Old == nil && c.New == nil {
		return fmt.Errorf("outbox: the change of %q has neither an old nor a new value", item)
	}
	var old, new []byte
	var err error
	if c.Old != nil {
		if old, err = json.Marshal(c.Old); err != nil {
			return fmt.Errorf("outbox: encode the old value of %q: %w", item, err)
		}
	}
	if c.New != nil {
		if new, err = json.Marshal(c.New); err != nil {
			return fmt.Errorf("outbox: encode the new value of %q: %w", item, err)
		}
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO `+o.table+` (item, version, old, new, written_us) VALUES (`+o.params(1, 5)+`)`,
		item, version, old, new, time.Now().UnixMicro())
	if err != nil {
		return fmt.Errorf("outbox: write the change of %q: %w", item, err)
	}
	return nil
}

// params returns n placeholders from the from-th, comma-separated.
func (o *Outbox[T]) params(from, n int) string {
	p := make([]string, n)
	for i := range p {
		if o.dialect == Postgres {
			p[i] = "$" + strconv.Itoa(from+i)
		} else {
			p[i] = "?"
		}
	}
	return strings.Join(p, ", ")
}

package pgcdc

import (
	"fmt"
	"strings"

	"github.com/keyswap/keyswap/index"
)

// Row is a row of a captured table, by column name. Values are decoded
// from PostgreSQL's text format as pgx decodes them (int4 as int32, int8 as
// int64, text and varchar as string, bool, float8 as float64, timestamptz as
// time.Time, numeric as pgtype.Numeric, ...); a type pgx does not know is a
// string; NULL is nil. The relay's replication connection sets the
// settings that decide how PostgreSQL prints values (DateStyle ISO,
// IntervalStyle postgres, extra_float_digits 3, bytea_output hex,
// client_encoding UTF8) whatever the server's or the database's defaults,
// so that values decode alike on every server.
type Row map[string]any

// Table is a table whose row changes the relay captures.
type Table[T any] struct {
	// Name is the table's name, "schema.table", or "table" for a table of
	// the schema public. Names are not quoted: they are matched as
	// PostgreSQL stores them (lower case, unless created quoted).
	Name string
	// Change turns a row change into the change of an item: old is nil for
	// an INSERT, new is nil for a DELETE, and an UPDATE has both (the whole
	// old row: the table must have REPLICA IDENTITY FULL). It returns ok
	// false to skip the row change, and an error to stop the relay before
	// it (the error Run returns matches ErrRejected). It is called from one
	// goroutine, in commit order.
	Change func(old, new Row) (c index.Change[T], ok bool, err error)
}

// Decode returns a Table.Change for a table whose rows are items one to
// one: INSERT is index.Insert(decode(new)), UPDATE index.Update, DELETE
// index.Delete(decode(old)). An error of decode rejects the row.
func Decode[T any](decode func(Row) (T, error)) func(old, new Row) (index.Change[T], bool, error) {
	return func(old, new Row) (index.Change[T], bool, error) {
		var c index.Change[T]
		if old != nil {
			v, err := decode(old)
			if err != nil {
				return c, false, fmt.Errorf("old row: %w", err)
			}
			c.Old = &v
		}
		if new != nil {
			v, err := decode(new)
			if err != nil {
				return c, false, fmt.Errorf("new row: %w", err)
			}
			c.New = &v
		}
		return c, true, nil
	}
}

// qualified returns name as "schema.table".
func qualified(name string) string {
	if strings.Contains(name, ".") {
		return name
	}
	return "public." + name
}

// splitName splits "schema.table".
func splitName(q string) (schema, table string) {
	schema, table, _ = strings.Cut(q, ".")
	return schema, table
}

package pgcdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// slotState is what a check learns of the slot.
type slotState struct {
	confirmed uint64 // confirmed_flush_lsn
	backlog   int64  // bytes of WAL from it to the server's current position
}

// check checks that the database is set up for the relay (see ErrSetup)
// and that the slot is not lost (ErrRebuildRequired), creating the slot
// if it is missing and Options.CreateSlot is set. Every query is a plain
// one on conn.
func (r *Relay[T]) check(ctx context.Context, conn *pgx.Conn) (slotState, error) {
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return slotState{}, fmt.Errorf("pgcdc: read wal_level: %w", err)
	}
	if level != "logical" {
		return slotState{}, fmt.Errorf("pgcdc: %w: wal_level is %q; logical replication needs wal_level = logical (in postgresql.conf, then restart the server)", ErrSetup, level)
	}
	st, err := r.checkSlot(ctx, conn)
	if err != nil {
		return slotState{}, err
	}
	if err := r.checkPublication(ctx, conn); err != nil {
		return slotState{}, err
	}
	for _, name := range r.names {
		if err := r.checkTable(ctx, conn, name); err != nil {
			return slotState{}, err
		}
	}
	return st, nil
}

// checkSlot checks the slot, and creates it if asked.
func (r *Relay[T]) checkSlot(ctx context.Context, conn *pgx.Conn) (slotState, error) {
	slot := r.opts.Slot
	// to_jsonb reads the columns this server has (wal_status since 13).
	const q = `SELECT to_jsonb(s), current_database(),
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint
		FROM pg_replication_slots s WHERE slot_name = $1`
	var (
		row     map[string]any
		db      string
		backlog int64
	)
	err := conn.QueryRow(ctx, q, slot).Scan(&row, &db, &backlog)
	if errors.Is(err, pgx.ErrNoRows) {
		if !r.opts.CreateSlot {
			return slotState{}, fmt.Errorf("pgcdc: %w: replication slot %q does not exist; create it with SELECT pg_create_logical_replication_slot('%s', 'pgoutput') (or set Options.CreateSlot), then rebuild the index: changes committed before the slot existed are never streamed", ErrSetup, slot, slot)
		}
		var lsn string
		if err := conn.QueryRow(ctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`, slot).Scan(&lsn); err != nil {
			return slotState{}, fmt.Errorf("pgcdc: create replication slot %q: %w", slot, err)
		}
		r.opts.Logger.Warn("keyswap: created the replication slot; changes committed before it are not streamed: rebuild the index now", "slot", slot, "lsn", lsn)
		err = conn.QueryRow(ctx, q, slot).Scan(&row, &db, &backlog)
	}
	if err != nil {
		return slotState{}, fmt.Errorf("pgcdc: read replication slot %q: %w", slot, err)
	}
	str := func(k string) string { s, _ := row[k].(string); return s }
	switch {
	case str("slot_type") != "logical":
		return slotState{}, fmt.Errorf("pgcdc: %w: replication slot %q is a %s slot, not a logical one", ErrSetup, slot, str("slot_type"))
	case str("plugin") != "pgoutput":
		return slotState{}, fmt.Errorf("pgcdc: %w: replication slot %q uses the plugin %q, not pgoutput", ErrSetup, slot, str("plugin"))
	case str("database") != db:
		return slotState{}, fmt.Errorf("pgcdc: %w: replication slot %q belongs to the database %q, not %q", ErrSetup, slot, str("database"), db)
	case str("wal_status") == "lost" || str("conflicting") == "true" || row["conflicting"] == true:
		return slotState{}, fmt.Errorf("pgcdc: %w: PostgreSQL invalidated the replication slot %q (wal_status %q): the WAL it held was removed (max_slot_wal_keep_size), so changes were never streamed; drop the slot, create it again, then rebuild the index", ErrRebuildRequired, slot, str("wal_status"))
	}
	confirmed, err := pglogrepl.ParseLSN(str("confirmed_flush_lsn"))
	if err != nil {
		return slotState{}, fmt.Errorf("pgcdc: replication slot %q: confirmed_flush_lsn %q: %w", slot, str("confirmed_flush_lsn"), err)
	}
	return slotState{confirmed: uint64(confirmed), backlog: backlog}, nil
}

// checkPublication checks that the publication exists and publishes
// inserts, updates and deletes.
func (r *Relay[T]) checkPublication(ctx context.Context, conn *pgx.Conn) error {
	pub := r.opts.Publication
	var ins, upd, del bool
	err := conn.QueryRow(ctx, `SELECT pubinsert, pubupdate, pubdelete FROM pg_publication WHERE pubname = $1`, pub).Scan(&ins, &upd, &del)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("pgcdc: %w: publication %q does not exist; create it with CREATE PUBLICATION %s FOR TABLE %s", ErrSetup, pub, pgx.Identifier{pub}.Sanitize(), strings.Join(r.names, ", "))
	}
	if err != nil {
		return fmt.Errorf("pgcdc: read publication %q: %w", pub, err)
	}
	var missing []string
	for _, p := range []struct {
		on   bool
		name string
	}{{ins, "insert"}, {upd, "update"}, {del, "delete"}} {
		if !p.on {
			missing = append(missing, p.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("pgcdc: %w: publication %q does not publish %s; the relay needs inserts, updates and deletes", ErrSetup, pub, strings.Join(missing, ", "))
	}
	return nil
}

// checkTable checks that the table exists, is in the publication with all
// its rows and columns, and has REPLICA IDENTITY FULL.
func (r *Relay[T]) checkTable(ctx context.Context, conn *pgx.Conn, name string) error {
	schema, table := splitName(name)
	ident := pgx.Identifier{schema, table}.Sanitize()
	var (
		oid       uint32
		replident string
		cols      []string
	)
	err := conn.QueryRow(ctx, `SELECT c.oid, c.relreplident::text,
		array(SELECT attname::text FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`, schema, table).Scan(&oid, &replident, &cols)
	if errors.Is(err, pgx.ErrNoRows) {
		if was, ok := r.oid(name); ok {
			var now string
			err := conn.QueryRow(ctx, `SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`, was).Scan(&now)
			if err == nil {
				return fmt.Errorf("pgcdc: %w: table %s was renamed to %s; give the relay its new name (Table.Name) and run it again: it resumes where it stopped", ErrSetup, name, now)
			}
		}
		return fmt.Errorf("pgcdc: %w: table %s does not exist (was it dropped?); the index has no source for its changes: give the relay the tables that exist, and rebuild the index", ErrSetup, name)
	}
	if err != nil {
		return fmt.Errorf("pgcdc: read table %s: %w", name, err)
	}
	if was, ok := r.oid(name); ok && was != oid {
		return fmt.Errorf("pgcdc: %w: table %s is not the table the relay captured (OID %d, now %d): it was dropped and created again, or another table took its name, and the rows of the old one are still in the index; drop the slot, create it again, then rebuild the index", ErrRebuildRequired, name, was, oid)
	}
	r.setOID(name, oid)
	var published map[string]any
	err = conn.QueryRow(ctx, `SELECT to_jsonb(p) FROM pg_publication_tables p WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`,
		r.opts.Publication, schema, table).Scan(&published)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("pgcdc: %w: publication %q does not include table %s; add it with ALTER PUBLICATION %s ADD TABLE %s", ErrSetup, r.opts.Publication, name, pgx.Identifier{r.opts.Publication}.Sanitize(), ident)
	}
	if err != nil {
		return fmt.Errorf("pgcdc: read publication %q: %w", r.opts.Publication, err)
	}
	// A row filter and a column list (PostgreSQL 15) would hide rows or
	// columns that the index may be built from.
	if f, ok := published["rowfilter"]; ok && f != nil {
		return fmt.Errorf("pgcdc: %w: publication %q publishes table %s with a row filter (WHERE %v); the relay needs every row", ErrSetup, r.opts.Publication, name, f)
	}
	if names, ok := published["attnames"].([]any); ok && names != nil {
		var missing []string
		for _, c := range cols {
			if !slices.Contains(names, any(c)) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("pgcdc: %w: publication %q publishes table %s without the columns %s; the relay needs every column", ErrSetup, r.opts.Publication, name, strings.Join(missing, ", "))
		}
	}
	if replident != "f" {
		kind := map[string]string{"d": "DEFAULT", "n": "NOTHING", "i": "USING INDEX"}[replident]
		return fmt.Errorf("pgcdc: %w: table %s has REPLICA IDENTITY %s; the relay needs the whole old row of each update and delete to remove the old entries, which PostgreSQL sends only with ALTER TABLE %s REPLICA IDENTITY FULL", ErrSetup, name, kind, ident)
	}
	return nil
}

package pgcdc

import "errors"

var (
	// ErrSetup: the database is not set up as the relay needs: wal_level is
	// not logical, the slot or the publication does not exist or does not
	// fit, a table does not exist (or was dropped, or renamed), is not in
	// the publication, or has no REPLICA IDENTITY FULL. The error names
	// what to change. Found at start, nothing was applied; found while the
	// relay runs, it stops, and a relay run again resumes where it stopped.
	ErrSetup = errors.New("the database is not set up for the relay")
	// ErrRebuildRequired: changes were lost to the index, and only a rebuild
	// restores it: PostgreSQL invalidated the slot (max_slot_wal_keep_size:
	// the WAL it held was removed), a captured table was truncated and
	// Options.Truncate is not set, or a captured table was dropped and
	// created again (the old one's rows were never deleted from the index).
	ErrRebuildRequired = errors.New("changes were lost: the index needs a rebuild")
	// ErrRejected: a row change cannot be turned into a change of an item:
	// a table's Change function returned an error for it, or the relay
	// cannot decode it (a value pgx cannot decode, such as a jsonb number
	// beyond float64's range; the error names the column). The relay stops
	// before that change, after applying every change before it, and a
	// restarted relay meets it again: change the function (to skip such
	// rows, for instance), or the row.
	ErrRejected = errors.New("a row was rejected")
)

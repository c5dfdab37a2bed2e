package pgcdc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/keyswap/keyswap/capture/internal/track"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
)

// entry is what the stream hands the applier, in commit order: a change,
// or a marker that carries a position (a commit, or a keepalive between
// transactions), or a truncate.
type entry[T any] struct {
	change   index.Change[T]
	isChange bool
	ack      uint64    // a position every change before it completes
	commit   time.Time // a transaction's commit time, with its ack
	truncate []string
	stop     error // the stream stops here: apply what came before, then fail
}

// rowError is an error of the stream at a row change (a rejected row, one
// that cannot be decoded or lacks its old row): the changes before it are
// applied before the relay stops. Its error matches ErrRejected or
// ErrSetup, which transient reports as errors that would come back.
type rowError struct{ err error }

func (e rowError) Error() string { return e.err.Error() }
func (e rowError) Unwrap() error { return e.err }

// pipe holds the entries read and not yet applied. The stream appends to
// it, the applier takes from it what has come while it applied the
// previous batch: a slow Apply makes the next batch larger.
type pipe[T any] struct {
	mu      sync.Mutex
	entries []entry[T]
	changes int           // how many of entries are changes
	ready   chan struct{} // signalled when entries were added
	space   chan struct{} // signalled when entries were taken
}

func newPipe[T any]() *pipe[T] {
	return &pipe[T]{ready: make(chan struct{}, 1), space: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// push appends e. A keepalive marker right after another replaces it.
func (p *pipe[T]) push(e entry[T]) {
	p.mu.Lock()
	if n := len(p.entries); n > 0 && e.keepalive() {
		if last := &p.entries[n-1]; last.keepalive() {
			last.ack = e.ack
			p.mu.Unlock()
			return
		}
	}
	p.entries = append(p.entries, e)
	if e.isChange {
		p.changes++
	}
	p.mu.Unlock()
	signal(p.ready)
}

// keepalive reports whether e is a marker of a keepalive.
func (e entry[T]) keepalive() bool {
	return !e.isChange && e.truncate == nil && e.stop == nil && e.commit.IsZero()
}

// full reports whether the pipe holds limit changes or more.
func (p *pipe[T]) full(limit int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changes >= limit
}

// take removes and returns the oldest entries, with at most max changes,
// and never a truncate after other entries.
func (p *pipe[T]) take(max int) []entry[T] {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, changes := 0, 0
	for n < len(p.entries) {
		e := p.entries[n]
		alone := e.truncate != nil || e.stop != nil // taken alone
		if alone && n > 0 {
			break
		}
		if e.isChange {
			if changes == max {
				break
			}
			changes++
		}
		n++
		if alone {
			break
		}
	}
	out := make([]entry[T], n)
	copy(out, p.entries)
	p.entries = append(p.entries[:0], p.entries[n:]...)
	p.changes -= changes
	signal(p.space)
	return out
}

// relation is a table as the stream describes it.
type relation struct {
	name     string // qualified, as the stream names it
	table    string // the name the relay was given for it, "" when not captured
	identity uint8
	columns  []*pglogrepl.RelationMessageColumn
}

// session checks the database, then streams and applies changes until an
// error or the end of ctx.
func (r *Relay[T]) session(ctx context.Context) (err error) {
	check, err := pgx.ConnectConfig(ctx, r.config.Copy())
	if err != nil {
		return fmt.Errorf("pgcdc: connect: %w", err)
	}
	defer func() { _ = check.Close(context.WithoutCancel(ctx)) }()
	st, err := r.check(ctx, check)
	if err != nil {
		return err
	}
	r.noteBacklog(st)
	for {
		a := r.acked.Load()
		if a >= st.confirmed || r.acked.CompareAndSwap(a, st.confirmed) {
			break
		}
	}
	rc := r.config.Config.Copy()
	rc.RuntimeParams = replicationParams(rc.RuntimeParams)
	repl, err := pgconn.ConnectConfig(ctx, rc)
	if err != nil {
		return fmt.Errorf("pgcdc: open a replication connection: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		// Best effort: a restarted relay then applies less again. Not on a
		// connection that broke: pgconn closes it in the background, writing
		// its own goodbye, and a write of ours would race that one.
		if !repl.IsClosed() {
			_ = r.sendStatus(repl, false)
		}
		_ = repl.Close(cctx)
	}()
	pub := strings.ReplaceAll(r.opts.Publication, `'`, `''`)
	err = pglogrepl.StartReplication(ctx, repl, r.opts.Slot, pglogrepl.LSN(r.acked.Load()), pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'"},
	})
	if err != nil {
		return r.startError(err)
	}
	r.track.Connected(true)
	defer r.track.Connected(false)

	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	p := newPipe[T]()
	checkNow := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		cancel(r.apply(sctx, p))
	}()
	go func() {
		defer wg.Done()
		cancel(r.watch(sctx, check, checkNow))
	}()
	err = r.stream(sctx, repl, p, checkNow)
	var rowErr rowError
	if errors.As(err, &rowErr) {
		// Apply what came before the row, then stop with its error.
		p.push(entry[T]{stop: rowErr.err})
	} else {
		cancel(err)
	}
	wg.Wait()
	return context.Cause(sctx)
}

// outputParams are the settings of the replication connection that decide
// how PostgreSQL prints the values of the rows it streams, set to what
// pgx's decoding of the text format reads: the server's or the database's
// own defaults could be DateStyle 'SQL, DMY' (a timestamp pgx cannot
// parse), IntervalStyle 'iso_8601', bytea_output 'escape', or a low
// extra_float_digits (a float8 printed rounded: a wrong value, not an
// error), and the client encoding the database's.
var outputParams = map[string]string{
	"DateStyle":          "ISO",
	"IntervalStyle":      "postgres",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
	"client_encoding":    "UTF8",
}

// replicationParams returns the startup parameters of the replication
// connection: the connection string's, with replication=database and
// outputParams instead of any of the same names (PostgreSQL's parameter
// names ignore case).
func replicationParams(params map[string]string) map[string]string {
	out := map[string]string{"replication": "database"}
	for k, v := range params {
		if _, ours := out[strings.ToLower(k)]; ours {
			continue
		}
		out[k] = v
	}
	for k, v := range outputParams {
		for have := range out {
			if strings.EqualFold(have, k) {
				delete(out, have)
			}
		}
		out[k] = v
	}
	return out
}

// startError maps an error of START_REPLICATION.
func (r *Relay[T]) startError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "55000" && strings.Contains(pgErr.Message, "can no longer get changes"):
			return fmt.Errorf("pgcdc: %w: PostgreSQL invalidated the replication slot %q (%s %s): drop the slot, create it again, then rebuild the index", ErrRebuildRequired, r.opts.Slot, pgErr.Message, pgErr.Detail)
		case pgErr.Code == "42704":
			return fmt.Errorf("pgcdc: %w: replication slot %q does not exist: %w", ErrSetup, r.opts.Slot, err)
		}
	}
	return fmt.Errorf("pgcdc: start replication from slot %q: %w", r.opts.Slot, err)
}

// sendStatus sends a standby status update with the position every change
// up to which is applied.
func (r *Relay[T]) sendStatus(repl *pgconn.PgConn, reply bool) error {
	lsn := pglogrepl.LSN(r.acked.Load())
	if lsn == 0 {
		return nil
	}
	r.track.Position(lsn.String())
	return pglogrepl.SendStandbyStatusUpdate(context.Background(), repl, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn, ReplyRequested: reply,
	})
}

// stream reads the replication stream into p, and sends the standby status
// updates, until an error or the end of ctx. It waits, still sending the
// updates, while p holds more than a few batches. It signals checkNow when
// a captured table comes under another name (renamed).
func (r *Relay[T]) stream(ctx context.Context, repl *pgconn.PgConn, p *pipe[T], checkNow chan struct{}) error {
	s := &streamState[T]{
		r: r, repl: repl, p: p, checkNow: checkNow,
		types: pgtype.NewMap(), rels: map[uint32]*relation{}, next: time.Now(),
	}
	limit := 4 * r.opts.BatchSize
	for {
		if !time.Now().Before(s.next) {
			if err := s.status(); err != nil {
				return err
			}
		}
		if err := s.waitSpace(ctx, limit); err != nil {
			return err
		}
		data, err := s.receive(ctx)
		if err != nil {
			return err
		}
		if len(data) == 0 {
			continue
		}
		if err := s.message(data); err != nil {
			return err
		}
	}
}

// streamState is what [Relay.stream] keeps between two messages.
type streamState[T any] struct {
	r        *Relay[T]
	repl     *pgconn.PgConn
	p        *pipe[T]
	checkNow chan struct{}
	types    *pgtype.Map
	rels     map[uint32]*relation
	// inTx is set between a BEGIN and its COMMIT, whose time is commitTime.
	inTx       bool
	commitTime time.Time
	// next is when the next standby status update is due.
	next time.Time
}

// status sends a standby status update, and sets when the next one is due.
func (s *streamState[T]) status() error {
	if err := s.r.sendStatus(s.repl, false); err != nil {
		return fmt.Errorf("pgcdc: send a standby status update: %w", err)
	}
	s.next = time.Now().Add(s.r.opts.StatusInterval)
	return nil
}

// waitSpace waits while the pipe holds more than limit entries, sending
// the standby status updates as they fall due.
func (s *streamState[T]) waitSpace(ctx context.Context, limit int) error {
	for s.p.full(limit) {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-s.p.space:
		case <-time.After(time.Until(s.next)):
			if err := s.status(); err != nil {
				return err
			}
		}
	}
	return nil
}

// receive reads one message until the next status update is due, and
// returns its CopyData, or nil for none (a timeout, another message).
func (s *streamState[T]) receive(ctx context.Context) ([]byte, error) {
	rctx, cancel := context.WithDeadline(ctx, s.next)
	msg, err := s.repl.ReceiveMessage(rctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if pgconn.Timeout(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("pgcdc: read the replication stream: %w", err)
	}
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		return msg.Data, nil
	case *pgproto3.ErrorResponse:
		return nil, s.r.startError(pgconn.ErrorResponseToPgError(msg))
	case *pgproto3.CopyDone:
		return nil, errors.New("pgcdc: the server ended the replication stream")
	}
	return nil, nil
}

// message handles one CopyData of the stream: a keepalive or a WAL
// message.
func (s *streamState[T]) message(data []byte) error {
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("pgcdc: %w", err)
		}
		// Between transactions, everything up to the server's position
		// was sent: once applied, that position may be acknowledged,
		// so that the slot does not hold the WAL of other tables.
		if !s.inTx {
			s.p.push(entry[T]{ack: uint64(ka.ServerWALEnd)})
		}
		if ka.ReplyRequested {
			s.next = time.Now()
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("pgcdc: %w", err)
		}
		m, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			return fmt.Errorf("pgcdc: decode a message at %s: %w", xld.WALStart, err)
		}
		return s.logical(m, xld.WALStart)
	}
	return nil
}

// logical handles one decoded WAL message, at: a relation, a transaction's
// bounds, a row change or a truncate.
func (s *streamState[T]) logical(m pglogrepl.Message, at pglogrepl.LSN) error {
	r, p := s.r, s.p
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		return r.relation(s.rels, m, at, s.checkNow)
	case *pglogrepl.BeginMessage:
		s.inTx, s.commitTime = true, m.CommitTime
	case *pglogrepl.CommitMessage:
		s.inTx = false
		p.push(entry[T]{ack: uint64(m.TransactionEndLSN), commit: s.commitTime})
	case *pglogrepl.InsertMessage:
		return r.change(p, s.types, s.rels, m.RelationID, "INSERT", at, s.commitTime, nil, 0, m.Tuple)
	case *pglogrepl.UpdateMessage:
		return r.change(p, s.types, s.rels, m.RelationID, "UPDATE", at, s.commitTime, m.OldTuple, m.OldTupleType, m.NewTuple)
	case *pglogrepl.DeleteMessage:
		return r.change(p, s.types, s.rels, m.RelationID, "DELETE", at, s.commitTime, m.OldTuple, m.OldTupleType, nil)
	case *pglogrepl.TruncateMessage:
		var names []string
		for _, id := range m.RelationIDs {
			if rel, ok := s.rels[id]; ok && rel.table != "" {
				names = append(names, rel.table)
			}
		}
		if names != nil {
			p.push(entry[T]{truncate: names})
		}
	}
	return nil
}

// relation records the table that m describes. A table is captured by
// its OID, the one the checks found for a name the relay was given, so
// that its changes are never skipped as those of another table when it is
// renamed: a captured table under another name makes the watcher check the
// tables now (and stop the relay, with an error that names the new name,
// if the rename is not only in the past of the stream). A table of
// another OID under a captured name is another table than the one the
// index was built from (the captured one was dropped and created again,
// or another one took its name): the relay stops before its changes.
func (r *Relay[T]) relation(rels map[uint32]*relation, m *pglogrepl.RelationMessage, at pglogrepl.LSN, checkNow chan struct{}) error {
	rel := &relation{name: m.Namespace + "." + m.RelationName, identity: m.ReplicaIdentity, columns: m.Columns}
	rels[m.RelationID] = rel
	if table, ok := r.captured(m.RelationID); ok {
		rel.table = table
		if rel.name != table {
			signal(checkNow)
		}
		return nil
	}
	if _, ok := r.tables[rel.name]; ok {
		was, _ := r.oid(rel.name)
		return rowError{fmt.Errorf("pgcdc: %w: at %s the stream has table %s of OID %d, not the table of that name the relay captures (OID %d): "+
			"the table was dropped and created again, or another table took its name, and the rows of the old one are still in the index; drop the slot, create it again, then rebuild the index",
			ErrRebuildRequired, at, rel.name, m.RelationID, was)}
	}
	return nil
}

// change turns a row change of a captured table into an item's change,
// through the table's function, and hands it to the applier.
func (r *Relay[T]) change(p *pipe[T], types *pgtype.Map, rels map[uint32]*relation, id uint32, op string, at pglogrepl.LSN, commit time.Time, oldTuple *pglogrepl.TupleData, oldType uint8, newTuple *pglogrepl.TupleData) error {
	rel, ok := rels[id]
	if !ok {
		return rowError{fmt.Errorf("pgcdc: %w: %s at %s of relation %d, which the stream never described", ErrRejected, op, at, id)}
	}
	if rel.table == "" {
		return nil // another table of the publication
	}
	t := r.tables[rel.table]
	var old, new Row
	var err error
	if op != "INSERT" {
		// Only REPLICA IDENTITY FULL sends the whole old row ('O'); without
		// it an update or delete cannot remove the old entries.
		if oldTuple == nil || oldType != pglogrepl.UpdateMessageTupleTypeOld {
			return rowError{fmt.Errorf("pgcdc: %w: %s at %s of table %s came without the whole old row: the table's REPLICA IDENTITY is not FULL (ALTER TABLE %s REPLICA IDENTITY FULL)", ErrSetup, op, at, rel.name, rel.name)}
		}
		if old, err = decodeRow(types, rel, oldTuple, nil); err != nil {
			return rowError{fmt.Errorf("pgcdc: %w: %s at %s of table %s: old row: %w", ErrRejected, op, at, rel.name, err)}
		}
	}
	if newTuple != nil {
		if new, err = decodeRow(types, rel, newTuple, old); err != nil {
			return rowError{fmt.Errorf("pgcdc: %w: %s at %s of table %s: new row: %w", ErrRejected, op, at, rel.name, err)}
		}
	}
	c, ok, err := t.Change(old, new)
	if err != nil {
		return rowError{fmt.Errorf("pgcdc: %w: %s at %s of table %s: %w", ErrRejected, op, at, rel.name, err)}
	}
	if !ok {
		return nil
	}
	if c.Old == nil && c.New == nil {
		return rowError{fmt.Errorf("pgcdc: %w: %s at %s of table %s: the change has neither an old nor a new value", ErrRejected, op, at, rel.name)}
	}
	r.track.Read(1, commit) // before the applier can take it
	p.push(entry[T]{change: c, isChange: true})
	return nil
}

// decodeRow decodes a tuple of rel. A column whose TOAST value did not
// change comes without a value: it is taken from old.
func decodeRow(types *pgtype.Map, rel *relation, tuple *pglogrepl.TupleData, old Row) (Row, error) {
	if len(tuple.Columns) != len(rel.columns) {
		return nil, fmt.Errorf("%d columns, the relation has %d", len(tuple.Columns), len(rel.columns))
	}
	row := make(Row, len(rel.columns))
	for i, col := range tuple.Columns {
		c := rel.columns[i]
		switch col.DataType {
		case pglogrepl.TupleDataTypeNull:
			row[c.Name] = nil
		case pglogrepl.TupleDataTypeToast:
			v, ok := old[c.Name]
			if !ok {
				return nil, fmt.Errorf("column %s is an unchanged TOAST value and there is no old row to take it from", c.Name)
			}
			row[c.Name] = v
		case pglogrepl.TupleDataTypeText, pglogrepl.TupleDataTypeBinary:
			format := int16(pgtype.TextFormatCode)
			if col.DataType == pglogrepl.TupleDataTypeBinary {
				format = pgtype.BinaryFormatCode
			}
			if dt, ok := types.TypeForOID(c.DataType); ok {
				v, err := dt.Codec.DecodeValue(types, c.DataType, format, col.Data)
				if err != nil {
					return nil, fmt.Errorf("column %s: %w", c.Name, err)
				}
				row[c.Name] = v
			} else {
				row[c.Name] = string(col.Data)
			}
		default:
			return nil, fmt.Errorf("column %s: unknown tuple data type %q", c.Name, col.DataType)
		}
	}
	return row, nil
}

// apply applies the entries of p, in order, and moves the acknowledged
// position past each marker once every change before it is applied.
func (r *Relay[T]) apply(ctx context.Context, p *pipe[T]) error {
	var changes []index.Change[T]
	var commits []time.Time
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-p.ready:
		}
		for {
			batch := p.take(r.opts.BatchSize)
			if len(batch) == 0 {
				break
			}
			if err := batch[0].stop; err != nil {
				return err
			}
			if t := batch[0].truncate; t != nil {
				if r.opts.Truncate == nil {
					return fmt.Errorf("pgcdc: %w: TRUNCATE of %s: the relay cannot remove the entries of rows it was not sent (set Options.Truncate to rebuild the index)", ErrRebuildRequired, strings.Join(t, ", "))
				}
				if err := r.opts.Truncate(ctx, t); err != nil {
					return fmt.Errorf("pgcdc: TRUNCATE of %s: %w", strings.Join(t, ", "), err)
				}
				continue
			}
			changes, commits = changes[:0], commits[:0]
			var ack uint64
			for _, e := range batch {
				switch {
				case e.isChange:
					changes = append(changes, e.change)
				default:
					ack = max(ack, e.ack)
					if !e.commit.IsZero() {
						commits = append(commits, e.commit)
					}
				}
			}
			if len(changes) > 0 {
				if err := track.Apply(ctx, r.track, r.rb, changes, nil); err != nil {
					return err
				}
			}
			r.track.Applied(ctx, len(changes), commits)
			if r.onApplied != nil && len(commits) > 0 {
				r.onApplied(commits, time.Now())
			}
			for {
				a := r.acked.Load()
				if ack <= a || r.acked.CompareAndSwap(a, ack) {
					break
				}
			}
		}
	}
}

// watch checks the database every CheckInterval, and when signalled on
// now: the slot's backlog, and whether the slot was invalidated or a table
// dropped, renamed or changed.
func (r *Relay[T]) watch(ctx context.Context, conn *pgx.Conn, now chan struct{}) error {
	ticker := time.NewTicker(r.opts.CheckInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-ticker.C:
		case <-now:
		}
		st, err := r.check(ctx, conn)
		if err != nil {
			return err
		}
		r.noteBacklog(st)
	}
}

// noteBacklog records the slot's backlog, and warns when it goes past
// MaxBacklog.
func (r *Relay[T]) noteBacklog(st slotState) {
	falling := st.backlog > r.opts.MaxBacklog
	if falling && !r.track.Status().FallingBehind {
		r.opts.Logger.Warn("keyswap: the relay is falling behind: the replication slot holds more WAL than Options.MaxBacklog",
			"slot", r.opts.Slot, "backlog_bytes", st.backlog, "max_backlog", r.opts.MaxBacklog)
	}
	r.track.Backlog(st.backlog, falling)
}

// transient reports whether err, which ended a session, may go away when
// the relay connects again: a lost connection, a server shutting down or
// starting, a slot still held by a connection that is going away. Errors
// of the database's setup, lost changes, rejected rows, Apply errors that
// would come back, and PostgreSQL refusing the connection for good are
// not.
func transient(err error) bool {
	if err == nil {
		return true
	}
	if errors.Is(err, ErrSetup) || errors.Is(err, ErrRebuildRequired) || errors.Is(err, ErrRejected) {
		return false
	}
	var applyErr *rebuild.Error
	if errors.As(err, &applyErr) && !track.Retryable(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "28", "3D", "42", "0A": // authentication, unknown database, privilege or name, not supported
			return false
		}
		return true
	}
	return true // a lost connection, a network error, a timeout
}

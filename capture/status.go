package capture

import "time"

// Status is what a relay reports about itself: how far behind its source
// the index is, in changes and in time, what it applied last, and its last
// error. The relays' Status methods return a copy, safe to keep.
type Status struct {
	// Connected is true while the relay reads its source: false before Run
	// connects, while it reconnects, and after it returned.
	Connected bool
	// Position is the source's position up to which every change is
	// applied: for the PostgreSQL relay, the log sequence number it
	// acknowledges to its slot ("0/1A2B3C8"); for the outbox relay, the
	// highest row id it applied and deleted. Empty until the first one.
	Position string
	// Applied counts the changes applied since Run started.
	Applied int64
	// Dropped counts the changes dropped as stale since Run started: outbox
	// rows whose version was not above the one applied for their item
	// (always 0 for the PostgreSQL relay).
	Dropped int64
	// Pending counts the changes read from the source and not yet applied:
	// the relay's lag in changes.
	Pending int64
	// Lag is the time from the commit of the last change applied to the
	// return of its Apply: commit to visible in Redis. It is measured with
	// the source's clock at one end and the relay's at the other (the
	// database server's commit timestamp; for an outbox row, the time the
	// application wrote it), so the clocks' skew adds to it.
	Lag time.Duration
	// Oldest is the commit time of the oldest pending change, zero when
	// none is pending: the index lacks every change committed since.
	Oldest time.Time
	// LastApplied is when the last Apply returned, zero before the first.
	LastApplied time.Time
	// Backlog is how much the source holds for the relay, measured at each
	// check: for the PostgreSQL relay, the bytes of WAL from the slot's
	// confirmed position to the server's current one; for the outbox
	// relay, the rows in the outbox.
	Backlog int64
	// FallingBehind is true while Backlog is past the relay's threshold
	// (its Options.MaxBacklog).
	FallingBehind bool
	// Retries counts the Apply calls that failed and were tried again since
	// Run started: Redis unreachable, a lost reply, a change refused while a
	// rebuild that does not log changes holds the lock.
	Retries int64
	// Reconnects counts the times the relay lost its source (a database
	// restart, a dropped connection) and connected again.
	Reconnects int64
	// Err is the last error: one being retried, one that made the relay
	// reconnect, or the one Run returned. It is cleared when a change is
	// applied after it, unless Run returned.
	Err error
	// ErrAt is when Err happened.
	ErrAt time.Time
}

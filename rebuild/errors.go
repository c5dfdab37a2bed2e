package rebuild

import (
	"errors"
	"fmt"

	"github.com/keyswap/keyswap/internal/protocol"
)

// The errors a run can return. They are the same values as those of
// package store, so either package's sentinels match them.
var (
	// ErrInProgress: another rebuild holds the lock of one of the keys. Run
	// fails at once, without writing anything.
	ErrInProgress = protocol.ErrInProgress
	// ErrLockLost: the run lost its lease (a stall longer than TTL, or
	// another process took the lock over). Nothing was published. It also
	// matches ErrInProgress.
	ErrLockLost = protocol.ErrLockLost
	// ErrTempKeyLost: a populated temp key disappeared before the publish
	// (expired, evicted, swept), or was lost and re-created. Nothing was
	// published.
	ErrTempKeyLost = protocol.ErrTempKeyLost
	// ErrOutcomeUnknown: the publish script's reply was lost and Redis
	// could not be reached to find out whether it ran. Every live key holds
	// its old value or every one its new value: the script is atomic. When
	// Redis could be reached, Run found out: a publish that ran is a
	// success, one that did not is the original error. From Apply: the
	// change's reply was lost; it was applied whole or not at all, and
	// applying it again is safe.
	ErrOutcomeUnknown = protocol.ErrOutcomeUnknown
	// ErrWritesLost: Redis lost writes of the run that it had acknowledged
	// (a failover to a replica that was behind, a restart from an older
	// snapshot or AOF), so the temp keys hold only part of the run. Nothing
	// was published. It also matches ErrTempKeyLost.
	ErrWritesLost = protocol.ErrWritesLost
	// ErrNoPermission: Redis would refuse a command the run needs, because
	// the user lacks the right (ACL) or the command is renamed or disabled.
	// The error names the command and the key. It is found before anything
	// is written, or, for the publish, before its first write: nothing was
	// published.
	ErrNoPermission = protocol.ErrNoPermission
	// ErrNotDurable: Options.Durability could not be met: too few replicas
	// acknowledged the writes, or fsynced them, within the timeout, or the
	// server cannot give it (WAITAOF needs Redis 7.2). Nothing was
	// published.
	ErrNotDurable = protocol.ErrNotDurable
	// ErrFallingBehind: the run could not keep up with the changes applied
	// to its keys while it ran (Rebuilder.Apply): a log of changes reached
	// Options.MaxChanges, or the catch-up took longer than
	// Options.CatchUpTimeout. Nothing was published; the live keys hold
	// every change.
	ErrFallingBehind = protocol.ErrFallingBehind
	// ErrTampered: a key keyswap relies on, a run's log of changes or its
	// record, holds what keyswap did not write: a log entry naming a key
	// the run does not rebuild or a command no builder writes, more log
	// entries than Apply counted, or a record whose token is not the run's.
	// Nothing was published; the live keys were left as they were.
	ErrTampered = protocol.ErrTampered
)

// ErrTooManyKeys reports a run that would publish more keys than
// Options.MaxKeys: a family with more buckets (or stale buckets to delete)
// than one atomic publish should touch; or a rollback that would swap more.
// Nothing was published, or rolled back.
var ErrTooManyKeys = protocol.ErrTooManyKeys

// ErrNotIncremental is what Apply returns when one of the Rebuilder's
// builders cannot turn a change into writes: it does not implement
// [index.Incremental] (builders.Func and builders.Compat do not).
var ErrNotIncremental = errors.New("the builder cannot apply changes: it does not implement index.Incremental")

// ErrStalled reports that the source yielded no item for
// Options.StallTimeout. Nothing was published. It does not match
// ErrInProgress: no other process is involved.
var ErrStalled = errors.New("the source stalled")

// ErrAborted reports that an operator cancelled the run ("keyswap
// cancel"), before its publish. Nothing was published. It does not match
// ErrInProgress.
var ErrAborted = protocol.ErrAborted

// Outcome is what the publish did to a live key; see Stats.Outcomes.
type Outcome = protocol.Outcome

// The outcomes of a publish.
const (
	// Swapped: the live key now holds the rebuilt value.
	Swapped = protocol.Swapped
	// Emptied: the live key was deleted: its builder produced nothing for
	// it, or it was a family bucket the run no longer produced.
	Emptied = protocol.Emptied
)

// Error is the error type of a failed run. Op names the step that failed:
//
//	config   invalid options or builders (from New) or source (from Run);
//	         nothing was sent
//	acquire  taking the locks (ErrInProgress: another rebuild holds one)
//	source   the source yielded an error
//	build    a builder returned an error or wrote outside its keys
//	write    Redis refused a batch, or a temp key was lost and re-created
//	lease    renewing the lease failed or found it lost (ErrLockLost,
//	         ErrTempKeyLost); "touch" when the last renewal did
//	run      the caller's context was cancelled (its cause is wrapped)
//	scan     the SCAN for a family's live keys failed
//	catch-up replaying the changes applied during the run (ErrFallingBehind,
//	         ErrTampered, ErrWritesLost, ErrTooManyKeys)
//	publish  the publish script (ErrLockLost, ErrTempKeyLost, ErrTampered,
//	         ErrWritesLost, ErrAborted, or its own error)
//	apply    Rebuilder.Apply: a change was refused (ErrNotIncremental,
//	         ErrInProgress while a rebuild that does not log changes holds
//	         a lock, ErrNoPermission, a key of the wrong type), or its reply
//	         lost (ErrOutcomeUnknown); nothing of it was applied, or, for a
//	         lost reply, all of it or nothing
//
// Key is the builders' keys, or the one key concerned, and Err the cause.
type Error = protocol.Error

// PanicError is what Run panics with after cleaning up, when a builder
// panicked in a goroutine of the run: the original value and the stack of
// the goroutine that panicked, which would otherwise be lost. A panic in the
// source happens in Run's own goroutine and propagates unchanged.
type PanicError struct {
	Value any
	Stack []byte
}

func (p *PanicError) Error() string {
	return fmt.Sprintf("keyswap: builder panicked: %v\n\n%s", p.Value, p.Stack)
}

// Unwrap returns Value if it is an error.
func (p *PanicError) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}

// errNilSource is Run's error for a nil Source.
var errNilSource = errors.New("nil source")

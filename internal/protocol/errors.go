package protocol

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/rueidis"
)

// ErrInProgress reports that another rebuild holds a key's lock. Acquiring
// never waits for it.
var ErrInProgress = errors.New("rebuild already in progress")

// ErrLockLost reports that a rebuild no longer holds its lock: it expired
// during a stall, or another rebuild took it over. A rebuild that lost its
// lock never publishes.
//
// ErrLockLost also matches [ErrInProgress] under [errors.Is], as Familia's
// RebuildLockLostError subclasses RebuildInProgressError: either way, some
// other rebuild owns the key.
var ErrLockLost error = lockLostError{}

// ErrTempKeyLost reports that a populated temp key disappeared (it expired,
// was evicted or was swept), or was lost and re-created, before or during
// the publish. The live key is left unchanged: reading the missing key as an
// empty rebuild would delete it.
var ErrTempKeyLost = errors.New("temp key lost")

// ErrOutcomeUnknown reports that a script that writes live keys was sent
// but its reply never came (a dropped connection, a timeout, a cancelled
// context), and that Redis could not tell afterwards whether it ran. The
// script is atomic: a publish left the live keys all old or all new, never
// a mixture, and a change was applied whole or not at all.
var ErrOutcomeUnknown = errors.New("outcome unknown: the reply was lost and Redis could not be asked")

// ErrFallingBehind reports that a run could not keep up with the changes
// applied to its keys while it ran: a log of changes reached its bound, or
// catching up took too long. Nothing was published; the live keys have
// every change.
var ErrFallingBehind = errors.New("the rebuild fell behind the changes applied meanwhile")

// ErrWritesLost reports that Redis lost writes of the run that it had
// acknowledged: its temp keys went back to an earlier state of themselves,
// as after a failover to a replica that was behind, or a restart from an
// older snapshot or AOF. Nothing was published. It also matches
// [ErrTempKeyLost].
var ErrWritesLost error = writesLostError{}

// ErrNoPermission reports that Redis would refuse a command a rebuild needs:
// the user lacks the right (ACL), or the command is renamed or disabled. The
// error names the command and the key. It is found before anything is
// written: a publish that failed halfway would leave the live keys worse.
var ErrNoPermission = errors.New("a command keyswap needs is refused")

// ErrTampered reports that a key keyswap relies on, a run's log of changes
// or its record, holds what keyswap did not write: a log entry that names a
// key the run does not rebuild, or a command no builder writes; more log
// entries than were counted as they were appended (a direct RPUSH, or an
// older keyswap that logs without counting); or a record whose token is not
// the run's. The run fails closed: nothing was published, and the live keys
// were left as they were.
var ErrTampered = errors.New("a key keyswap relies on (a run's log of changes or its record) holds what keyswap did not write")

// ErrAborted reports that an operator cancelled the run ("keyswap
// cancel"), before its publish: nothing was published.
var ErrAborted = errors.New("the run was cancelled by an operator")

type writesLostError struct{}

func (writesLostError) Error() string {
	return "Redis lost acknowledged writes of the rebuild"
}

func (writesLostError) Is(target error) bool { return target == ErrTempKeyLost }

type lockLostError struct{}

func (lockLostError) Error() string {
	return "rebuild lock lost: it expired or another rebuild took over"
}

func (lockLostError) Is(target error) bool { return target == ErrInProgress }

// Error is the error type of keyswap's operations. Op names the operation
// ("acquire", "touch", "swap", "publish", ...), Key the live key (or keys)
// it was working on, and Err the cause: one of the sentinels above, a Redis
// or transport error, or a description of bad input.
type Error struct {
	Op  string
	Key string
	Err error
}

func (e *Error) Error() string {
	if e.Key == "" {
		return "keyswap: " + e.Op + ": " + e.Err.Error()
	}
	return "keyswap: " + e.Op + " " + e.Key + ": " + e.Err.Error()
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// Fail wraps err, the error of a command sent with ctx, in an *Error. When
// ctx was cancelled with a cause of its own (context.WithCancelCause), the
// cause is wrapped too, so that errors.Is finds both it and
// context.Canceled.
func Fail(ctx context.Context, op, key string, err error) error {
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) && cause != ctx.Err() {
		err = fmt.Errorf("%w (%w)", err, cause)
	}
	return &Error{Op: op, Key: key, Err: err}
}

// Wrap returns err as an *Error of op on key, unless it already is one.
func Wrap(op, key string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return &Error{Op: op, Key: key, Err: err}
}

// Refused returns err as an error matching ErrNoPermission when it is
// Redis refusing a command for this user's rights (NOPERM, or, inside a
// script, "can't run this command"), and nil otherwise.
func Refused(err error) error {
	rerr, ok := rueidis.IsRedisErr(err)
	if !ok {
		return nil
	}
	msg := rerr.Error()
	if strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "can't run this command") {
		return fmt.Errorf("%w: %w", ErrNoPermission, err)
	}
	return nil
}

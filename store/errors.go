package store

import (
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
)

// ErrInProgress reports that another rebuild holds the key's lock. Acquire
// never waits for it.
var ErrInProgress = protocol.ErrInProgress

// ErrLockLost reports that a rebuild no longer holds its lock: it expired
// during a stall, or another rebuild took it over. A rebuild that lost its
// lock never publishes.
//
// ErrLockLost also matches [ErrInProgress] under [errors.Is], as Familia's
// RebuildLockLostError subclasses RebuildInProgressError: either way, some
// other rebuild owns the key.
var ErrLockLost = protocol.ErrLockLost

// ErrTempKeyLost reports that a populated temp key disappeared (it expired,
// was evicted or was swept), or was lost and re-created, before or during
// the swap. The live key is left unchanged: reading the missing key as an
// empty rebuild would delete it.
var ErrTempKeyLost = protocol.ErrTempKeyLost

// ErrOutcomeUnknown reports that a swap script was sent but its reply never
// came (a dropped connection, a timeout, a cancelled context), and that
// keyswap could not find out afterwards whether it ran, because Redis could
// not be reached. The live key holds either the old value or the new one:
// the script is atomic.
var ErrOutcomeUnknown = protocol.ErrOutcomeUnknown

// Error is the error type returned by [Store] methods. Op names the
// operation ("acquire", "touch", "swap", ...), Key the live key it was
// working on, and Err the cause, which may be one of the sentinels above, a
// Redis or transport error, or a description of bad input.
type Error = protocol.Error

// ErrGroupConflict reports, on Redis Cluster, that the live key shares its
// base with another index that owns it (SPEC C104): the untagged "X" and
// the tagged "{X}" have one lock, one meta and one owner stamp, and a run
// of the other in Generations mode stamped the base with its name. The
// Store refuses the key before it writes anything. It is the same error
// as rebuild.ErrGroupConflict.
var ErrGroupConflict = keys.ErrGroupConflict

// ErrTampered reports that a key keyswap relies on holds what keyswap did
// not write, such as an owner stamp of another type than a string. It is
// the same error as rebuild.ErrTampered.
var ErrTampered = protocol.ErrTampered

package keyswapotel

import (
	"context"
	"errors"

	"github.com/keyswap/keyswap/guards"
	"github.com/keyswap/keyswap/rebuild"
)

// kinds maps the errors of a run to their ErrorType, in the order they are
// tried: an error that matches two sentinels (ErrLockLost also matches
// ErrInProgress, ErrWritesLost ErrTempKeyLost) gets the first, the more
// specific; keyswap's own causes come before the context's, because a run
// that fails for one of them often cancels work in flight too.
var kinds = []struct {
	err  error
	kind string
}{
	{rebuild.ErrLockLost, "lock_lost"},
	{rebuild.ErrInProgress, "in_progress"},
	{rebuild.ErrWritesLost, "writes_lost"},
	{rebuild.ErrTempKeyLost, "temp_key_lost"},
	{rebuild.ErrOutcomeUnknown, "outcome_unknown"},
	{rebuild.ErrNoPermission, "no_permission"},
	{rebuild.ErrNotDurable, "not_durable"},
	{rebuild.ErrFallingBehind, "falling_behind"},
	{rebuild.ErrStalled, "stalled"},
	{rebuild.ErrAborted, "aborted"},
	{guards.ErrRefused, "refused"},
	{rebuild.ErrDiscarded, "discarded"},
	{context.Canceled, "canceled"},
	{context.DeadlineExceeded, "deadline_exceeded"},
}

// ErrorType returns the kind of a run's error, the value of the attribute
// error.type: one of lock_lost, in_progress, writes_lost, temp_key_lost,
// outcome_unknown, no_permission, not_durable, falling_behind, stalled,
// aborted, refused, discarded (the sentinels of package rebuild, matched
// with errors.Is), canceled, deadline_exceeded (the context's), or other.
// It returns "" for nil.
//
// The kinds are few and stable, so that they can label metrics; the error
// itself, with its keys, is in the run's span.
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.kind
		}
	}
	return "other"
}

package keyswapotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/keyswap/keyswap/guards"
	keyswapotel "github.com/keyswap/keyswap/otel"
	"github.com/keyswap/keyswap/rebuild"
)

// TestErrorType: each sentinel, wrapped as runs wrap it, gets its kind;
// an error matching two gets the more specific; keyswap's causes win over
// the context's.
func TestErrorType(t *testing.T) {
	t.Parallel()
	wrap := func(op string, err error) error { return &rebuild.Error{Op: op, Key: "k", Err: err} }
	tests := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("boom"), "other"},
		{wrap("acquire", rebuild.ErrInProgress), "in_progress"},
		{wrap("lease", rebuild.ErrLockLost), "lock_lost"},
		{errors.Join(wrap("lease", rebuild.ErrLockLost), fmt.Errorf("EXEC: %w", context.Canceled)), "lock_lost"},
		{wrap("publish", rebuild.ErrTempKeyLost), "temp_key_lost"},
		{wrap("publish", rebuild.ErrWritesLost), "writes_lost"},
		{wrap("publish", rebuild.ErrOutcomeUnknown), "outcome_unknown"},
		{wrap("acquire", rebuild.ErrNoPermission), "no_permission"},
		{wrap("publish", rebuild.ErrNotDurable), "not_durable"},
		{wrap("catch-up", rebuild.ErrFallingBehind), "falling_behind"},
		{wrap("run", rebuild.ErrStalled), "stalled"},
		{wrap("run", rebuild.ErrAborted), "aborted"},
		{wrap("publish", fmt.Errorf("%w: RefuseEmpty", guards.ErrRefused)), "refused"},
		{wrap("publish", rebuild.ErrDiscarded), "discarded"},
		{wrap("run", context.Canceled), "canceled"},
		{wrap("run", context.DeadlineExceeded), "deadline_exceeded"},
		{wrap("source", errors.New("connection reset")), "other"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.err), func(t *testing.T) {
			if got := keyswapotel.ErrorType(tt.err); got != tt.want {
				t.Errorf("ErrorType(%v): got %q, want %q", tt.err, got, tt.want)
			}
		})
	}
	if !errors.Is(rebuild.ErrWritesLost, rebuild.ErrTempKeyLost) || !errors.Is(rebuild.ErrLockLost, rebuild.ErrInProgress) {
		t.Error("ErrWritesLost no longer matches ErrTempKeyLost, or ErrLockLost ErrInProgress: the order of the kinds may be obsolete")
	}
}

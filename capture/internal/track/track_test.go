package track

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/keyswap/keyswap/rebuild"
)

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("apply: %w", rebuild.ErrOutcomeUnknown), true},
		{fmt.Errorf("apply: %w", rebuild.ErrInProgress), true},
		{fmt.Errorf("apply: %w", rebuild.ErrLockLost), true},
		{fmt.Errorf("apply: %w", rebuild.ErrNoPermission), false},
		{fmt.Errorf("apply: %w", rebuild.ErrNotIncremental), false},
		{errors.New("a builder's error"), false},
	} {
		if got := Retryable(tc.err); got != tc.want {
			t.Errorf("Retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestPending(t *testing.T) {
	tr := New("test", "src", "{row}", nil)
	c0 := time.Unix(100, 0)
	tr.Read(2, c0)
	tr.Read(3, c0.Add(time.Second))
	if st := tr.Status(); st.Pending != 5 || !st.Oldest.Equal(c0) {
		t.Fatalf("status %+v: want 5 pending since %v", st, c0)
	}
	tr.Applied(context.Background(), 3, []time.Time{c0})
	if st := tr.Status(); st.Pending != 2 || !st.Oldest.Equal(c0.Add(time.Second)) || st.Applied != 3 {
		t.Fatalf("status %+v: want 2 pending since %v, 3 applied", st, c0.Add(time.Second))
	}
	tr.Drop()
	if st := tr.Status(); st.Pending != 0 || !st.Oldest.IsZero() {
		t.Fatalf("status %+v after Drop: want nothing pending", st)
	}
}

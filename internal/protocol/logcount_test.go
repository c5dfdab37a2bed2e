package protocol_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/protocol"
)

func TestLogsCheck(t *testing.T) {
	// C73: a log is as long as its count, which never goes back: a shorter
	// log, or a count below the highest seen (a restart rolled both back),
	// lost entries (ErrWritesLost); a longer one holds entries nobody
	// counted (ErrTampered). Each error names the log and both numbers.
	ls := protocol.NewLogs([]string{"a:rebuild-lock:log", "b:rebuild-lock:log"})
	for i, step := range []struct {
		log    int
		c      protocol.LogCount
		target error
	}{
		{0, protocol.LogCount{}, nil},
		{0, protocol.LogCount{Len: 3, Logged: 3}, nil},
		{1, protocol.LogCount{Len: 5, Logged: 5}, nil},
		{0, protocol.LogCount{Len: 4, Logged: 4}, nil},
		{0, protocol.LogCount{Len: 2, Logged: 4}, protocol.ErrWritesLost}, // shortened
		{0, protocol.LogCount{Len: 0, Logged: 0}, protocol.ErrWritesLost}, // deleted, and the record rolled back
		{0, protocol.LogCount{Len: 3, Logged: 3}, protocol.ErrWritesLost}, // both rolled back
		{0, protocol.LogCount{Len: 5, Logged: 4}, protocol.ErrTampered},   // appended, not counted
		{1, protocol.LogCount{Len: 5, Logged: 5}, nil},
		{0, protocol.LogCount{Len: 6, Logged: 6}, nil},
	} {
		err := ls.Check(step.log, step.c)
		switch {
		case step.target == nil && err != nil:
			t.Errorf("step %d: got %v, want nil", i, err)
		case step.target != nil && !errors.Is(err, step.target):
			t.Errorf("step %d: got %v, want %v", i, err, step.target)
		case err != nil && !strings.Contains(err.Error(), "a:rebuild-lock:log"):
			t.Errorf("step %d: %v does not name the log", i, err)
		}
	}
	if got := ls.Highest(0); got != 6 {
		t.Errorf("Highest(0) = %d, want 6", got)
	}
	if got := ls.Highest(1); got != 5 {
		t.Errorf("Highest(1) = %d, want 5", got)
	}
}

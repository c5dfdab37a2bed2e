package run_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/run"
)

func TestLogsCheck(t *testing.T) {
	// C73: a log is as long as its count, which never goes back: a shorter
	// log, or a count below the highest seen (a restart rolled both back),
	// lost entries (ErrWritesLost); a longer one holds entries nobody
	// counted (ErrTampered). Each error names the log and both numbers.
	ls := run.NewLogs([]string{"a:rebuild-lock:log", "b:rebuild-lock:log"})
	for i, step := range []struct {
		log    int
		c      run.LogCount
		target error
	}{
		{0, run.LogCount{}, nil},
		{0, run.LogCount{Len: 3, Logged: 3}, nil},
		{1, run.LogCount{Len: 5, Logged: 5}, nil},
		{0, run.LogCount{Len: 4, Logged: 4}, nil},
		{0, run.LogCount{Len: 2, Logged: 4}, run.ErrWritesLost}, // shortened
		{0, run.LogCount{Len: 0, Logged: 0}, run.ErrWritesLost}, // deleted, and the record rolled back
		{0, run.LogCount{Len: 3, Logged: 3}, run.ErrWritesLost}, // both rolled back
		{0, run.LogCount{Len: 5, Logged: 4}, run.ErrTampered},   // appended, not counted
		{1, run.LogCount{Len: 5, Logged: 5}, nil},
		{0, run.LogCount{Len: 6, Logged: 6}, nil},
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

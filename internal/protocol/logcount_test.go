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
		// Each read is sent after the last one was checked.
		step.c.Seen = ls.Seen()[step.log]
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

// TestLogsCheckConcurrentReads: a count is compared only with the counts
// seen before its read was sent (C73). Reads go out concurrently (the
// heartbeats and the catch-up's): one that Redis ran first may be checked
// after a later one, and its lower count is older, not lost. A read sent
// after the higher count was seen, that finds a lower one, lost entries.
func TestLogsCheckConcurrentReads(t *testing.T) {
	ls := protocol.NewLogs([]string{"a:rebuild-lock:log"})
	if err := ls.Check(0, protocol.LogCount{Len: 10, Logged: 10, Seen: ls.Seen()[0]}); err != nil {
		t.Fatalf("first read: got %v, want nil", err)
	}
	early := ls.Seen()[0] // a read sent now, which Redis runs at count 12
	late := ls.Seen()[0]  // a read sent next, which Redis runs at count 15
	if err := ls.Check(0, protocol.LogCount{Len: 15, Logged: 15, Seen: late}); err != nil {
		t.Fatalf("later read, checked first: got %v, want nil", err)
	}
	if err := ls.Check(0, protocol.LogCount{Len: 12, Logged: 12, Seen: early}); err != nil {
		t.Errorf("earlier read, checked last: got %v, want nil (its count is older, not lost)", err)
	}
	if got := ls.Highest(0); got != 15 {
		t.Errorf("Highest(0) = %d, want 15 (an older count does not lower it)", got)
	}
	err := ls.Check(0, protocol.LogCount{Len: 12, Logged: 12, Seen: ls.Seen()[0]})
	if !errors.Is(err, protocol.ErrWritesLost) || !strings.Contains(err.Error(), "where Apply counted 12 (and the run saw 15 counted") {
		t.Errorf("read sent after 15 was seen, finding 12: got %v, want ErrWritesLost naming 12 and 15", err)
	}
}

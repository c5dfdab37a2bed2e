package protocol

import (
	"fmt"
	"sync/atomic"
)

// LogCount is what one read of a lock's log of changes found, in one
// atomic step: its length, and the entries Apply counted in the lock's
// record as it appended them; and Seen, the highest count the reader had
// seen of the log when it sent the read ([Logs.Seen]).
type LogCount struct {
	Len, Logged int64
	Seen        int64
}

// Logs checks the counts of a run's logs of changes, one per lock, as the
// heartbeats, the catch-up and the publish read them. It keeps the highest
// count of logged entries seen of each log: a restart from an older
// snapshot rolls a log and its counter back together, which only that
// comparison catches. It is safe for concurrent use.
type Logs struct {
	keys    []string
	highest []atomic.Int64
}

// NewLogs returns the Logs of the logs keys, none counted yet.
func NewLogs(keys []string) *Logs {
	return &Logs{keys: keys, highest: make([]atomic.Int64, len(keys))}
}

// Highest returns the highest count of logged entries seen of log i.
func (l *Logs) Highest(i int) int64 { return l.highest[i].Load() }

// Seen returns the highest count of each log seen so far. Take it before
// sending a read of the counts, and give the read's counts to Check with
// it (LogCount.Seen): a count may only be compared with counts seen before
// its read was sent. Reads are sent concurrently (the heartbeats and the
// catch-up's): one that Redis ran before another may be checked after it,
// and its lower count is then older, not lost.
func (l *Logs) Seen() []int64 {
	seen := make([]int64, len(l.highest))
	for i := range l.highest {
		seen[i] = l.highest[i].Load()
	}
	return seen
}

// Check compares c, read of log i in one step, with what was counted, and
// records its count. A log shorter than its count, or a count below c.Seen,
// one seen before the read was sent, lost entries: the error matches
// [ErrWritesLost]. A log
// longer than its count holds entries nobody counted (appended directly,
// or by an older keyswap that logs without counting): the error matches
// [ErrTampered].
func (l *Logs) Check(i int, c LogCount) error {
	switch {
	case c.Len < c.Logged || c.Logged < c.Seen:
		return fmt.Errorf("%w: %s holds %d entries, where Apply counted %d (and the run saw %d counted before reading): the log lost changes applied during the run (evicted, deleted, or rolled back by a restart); every live key left unchanged, and they hold every change", ErrWritesLost, l.keys[i], c.Len, c.Logged, c.Seen)
	case c.Len > c.Logged:
		return fmt.Errorf("%w: %s holds %d entries, but Apply counted %d: entries nobody counted were appended (directly, or by an older keyswap, which logs without counting: upgrade every process that applies changes); every live key left unchanged", ErrTampered, l.keys[i], c.Len, c.Logged)
	}
	h := &l.highest[i]
	seen := h.Load()
	for seen < c.Logged && !h.CompareAndSwap(seen, c.Logged) {
		seen = h.Load()
	}
	return nil
}

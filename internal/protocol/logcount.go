package protocol

import (
	"fmt"
	"sync/atomic"
)

// LogCount is what one read of a lock's log of changes found, in one
// atomic step: its length, and the entries Apply counted in the lock's
// record as it appended them.
type LogCount struct {
	Len, Logged int64
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

// Check compares c, read of log i in one step, with what was counted, and
// records its count. A log shorter than its count, or a count below one
// seen before, lost entries: the error matches [ErrWritesLost]. A log
// longer than its count holds entries nobody counted (appended directly,
// or by an older keyswap that logs without counting): the error matches
// [ErrTampered].
func (l *Logs) Check(i int, c LogCount) error {
	h := &l.highest[i]
	seen := h.Load()
	switch {
	case c.Len < c.Logged || c.Logged < seen:
		return fmt.Errorf("%w: %s holds %d entries, where Apply counted %d (and the run saw %d counted): the log lost changes applied during the run (evicted, deleted, or rolled back by a restart); every live key left unchanged, and they hold every change", ErrWritesLost, l.keys[i], c.Len, c.Logged, seen)
	case c.Len > c.Logged:
		return fmt.Errorf("%w: %s holds %d entries, but Apply counted %d: entries nobody counted were appended (directly, or by an older keyswap, which logs without counting: upgrade every process that applies changes); every live key left unchanged", ErrTampered, l.keys[i], c.Len, c.Logged)
	}
	for seen < c.Logged && !h.CompareAndSwap(seen, c.Logged) {
		seen = h.Load()
	}
	return nil
}

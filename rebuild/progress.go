package rebuild

import (
	"sync/atomic"
	"time"
)

// progress is what a run has done so far, as the pump and the sender count
// it, and its phase: the heartbeats read it for the run's status, the
// observer and Options.Progress are told of it, and the stats end with it.
type progress struct {
	start   time.Time
	pulled  atomic.Int64 // items pulled from the source
	done    atomic.Int64 // items in batches written and accounted
	written atomic.Int64 // entries in batches Redis acknowledged
	batches atomic.Int64 // batches written and accounted, in source order
	acked   atomic.Int64 // batches whose transaction Redis acknowledged
	phase   atomic.Value // Phase
	entries []int64      // entries written per builder; only the sender writes
	skipped []int64      // entries skipped for a reserved key, per builder; only the sender writes
	rates   *rateMeter   // the current rate, for the record
	obs     RunObserver
	report  func(Progress) // Options.Progress, or nil
}

// setPhase enters phase p: in the run's status, for the observer, and for
// Progress.
func (x *progress) setPhase(p Phase) {
	x.phase.Store(p)
	x.obs.Phase(p)
	if x.report != nil && p != PhaseBuilding {
		elapsed := time.Since(x.start)
		items := x.done.Load()
		x.report(Progress{Phase: p, Items: items, Batches: x.batches.Load(), Elapsed: elapsed, Rate: float64(items) / elapsed.Seconds()})
	}
}

// account records a written batch, recycles its buffer and reports progress.
func (x *progress) account(b *batch) {
	var entries int64
	for i, n := range b.c.entries {
		x.entries[i] += n
		x.skipped[i] += b.c.skipped[i]
		entries += n
	}
	x.written.Add(entries)
	items := x.done.Add(int64(b.items))
	batches := x.batches.Add(1)
	b.release()
	x.obs.Batch(int64(b.items), entries)
	if p := x.report; p != nil {
		elapsed := time.Since(x.start)
		p(Progress{Phase: PhaseBuilding, Items: items, Batches: batches, Elapsed: elapsed, Rate: float64(items) / elapsed.Seconds()})
	}
}

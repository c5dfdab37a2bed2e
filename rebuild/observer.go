package rebuild

import (
	"context"
	"time"
)

// Observer receives the events of runs, for metrics and traces: see
// Options.Observer. The module github.com/keyswap/keyswap/otel implements
// it with OpenTelemetry, for programs that want it; the library itself
// does not depend on OpenTelemetry.
type Observer interface {
	// Start is called as a run starts, before it takes its locks, with
	// Run's (or Build's) context and the builders' keys. What it returns
	// receives the rest of that run's events; End is always called.
	Start(ctx context.Context, key string) RunObserver
}

// RunObserver receives the events of one run. Its methods may be called
// from the run's goroutines concurrently, and must return quickly: the run
// waits for them.
type RunObserver interface {
	// Phase is called as the run enters a phase: building once it holds
	// its locks, then catching up, held, publishing.
	Phase(p Phase)
	// Batch is called as a batch of the source is written: its items and
	// the entries it wrote.
	Batch(items, entries int64)
	// Published is called after the publish script returned, with how
	// long its round trip took: the longest readers may wait behind it.
	Published(pause time.Duration)
	// End is called once, as the run returns, with its Stats and error.
	End(stats Stats, err error)
}

// noObserver observes nothing.
type noObserver struct{}

func (noObserver) Start(context.Context, string) RunObserver { return noObserver{} }
func (noObserver) Phase(Phase)                               {}
func (noObserver) Batch(int64, int64)                        {}
func (noObserver) Published(time.Duration)                   {}
func (noObserver) End(Stats, error)                          {}

package keyswapotel

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keyswap/keyswap/rebuild"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// run observes one run: the rebuild.RunObserver that Start returns.
type run struct {
	o     *observer
	start time.Time
	attrs []attribute.KeyValue     // of every measurement
	set   metric.MeasurementOption // attrs, as a set
	span  trace.Span               // the run's

	mu    sync.Mutex
	phase rebuild.Phase
	child trace.Span // the phase's span; nil before the first phase
	ended bool
}

// ctx returns a context carrying the run's span, for the measurements
// (exemplars) and as the phases' parent. The run's own context is not kept:
// it is the caller's, and only its span matters here.
func (r *run) ctx() context.Context {
	return trace.ContextWithSpan(context.Background(), r.span)
}

// Phase ends the previous phase's span, and starts p's, a child of the
// run's. A phase entered again right after itself (the run catches up
// twice in a row) goes on in the same span.
func (r *run) Phase(p rebuild.Phase) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended || r.child != nil && p == r.phase {
		return
	}
	if r.child != nil {
		r.child.End()
	}
	r.phase = p
	_, r.child = r.o.tracer.Start(r.ctx(), phaseSpanName(p),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(phaseAttr.String(string(p))))
}

// phaseSpanName returns the name of p's span: "keyswap." and the phase,
// with underscores for spaces ("keyswap.catching_up").
func phaseSpanName(p rebuild.Phase) string {
	return "keyswap." + strings.ReplaceAll(string(p), " ", "_")
}

// Batch counts a written batch, its items and entries.
func (r *run) Batch(items, entries int64) {
	ctx := r.ctx()
	r.o.items.Add(ctx, items, r.set)
	r.o.entries.Add(ctx, entries, r.set)
	r.o.batches.Add(ctx, 1, r.set)
}

// Published records the publish's pause, and adds it to the phase's span
// as an event.
func (r *run) Published(pause time.Duration) {
	r.o.pause.Record(r.ctx(), pause.Seconds(), r.set)
	r.mu.Lock()
	span := r.child
	r.mu.Unlock()
	if span == nil {
		span = r.span
	}
	span.AddEvent("keyswap.published", trace.WithAttributes(pauseAttr.Float64(pause.Seconds())))
}

// End records the run's duration, changes and failure, and ends its spans:
// the phase's, then the run's, with stats as attributes and err as their
// status.
//
// The duration is the observer's own, from Start to End, rather than
// Stats.Elapsed, which starts once the locks are taken: a run that fails
// to take them has none.
func (r *run) End(stats rebuild.Stats, err error) {
	elapsed := time.Since(r.start)
	ctx := r.ctx()
	kind := ErrorType(err)
	set := r.set
	if err != nil {
		set = metric.WithAttributeSet(attribute.NewSet(append(slices.Clone(r.attrs), errorAttr.String(kind))...))
	}
	r.o.changes.Add(ctx, stats.Changes, r.set)
	r.o.duration.Record(ctx, elapsed.Seconds(), set)
	if err != nil {
		r.o.failures.Add(ctx, 1, set)
	}
	r.o.active.Add(ctx, -1, r.set)

	r.mu.Lock()
	r.ended = true
	child := r.child
	r.mu.Unlock()
	r.span.SetAttributes(statsAttrs(stats)...)
	if err != nil {
		if child != nil {
			child.SetAttributes(errorAttr.String(kind))
			child.SetStatus(codes.Error, err.Error())
		}
		r.span.SetAttributes(errorAttr.String(kind))
		r.span.RecordError(err)
		r.span.SetStatus(codes.Error, err.Error())
	}
	if child != nil {
		child.End()
	}
	r.span.End()
}

// statsAttrs returns the run span's attributes for stats: counts, and each
// key's new generation as "key=generation", sorted.
func statsAttrs(stats rebuild.Stats) []attribute.KeyValue {
	var entries, skipped int64
	for _, n := range stats.Entries {
		entries += n
	}
	for _, n := range stats.Skipped {
		skipped += n
	}
	attrs := []attribute.KeyValue{
		itemsAttr.Int64(stats.Items), batchesAttr.Int64(stats.Batches), entriesAttr.Int64(entries),
		changesAttr.Int64(stats.Changes),
	}
	if skipped > 0 {
		attrs = append(attrs, skippedAttr.Int64(skipped))
	}
	if len(stats.Generations) > 0 {
		var gens []string
		for _, k := range slices.Sorted(maps.Keys(stats.Generations)) {
			gens = append(gens, fmt.Sprintf("%s=%d", k, stats.Generations[k]))
		}
		attrs = append(attrs, gensAttr.StringSlice(gens))
	}
	return attrs
}

package keyswapotel

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/keyswap/keyswap/rebuild"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
)

// scope is the instrumentation scope of the meter and the tracer: the
// module's import path, as OpenTelemetry recommends.
const scope = "github.com/keyswap/keyswap/otel"

// The attributes. error.type is OpenTelemetry's own (semantic conventions).
const (
	keyAttr     = attribute.Key("keyswap.key")
	errorAttr   = attribute.Key("error.type")
	phaseAttr   = attribute.Key("keyswap.phase")
	itemsAttr   = attribute.Key("keyswap.items")
	batchesAttr = attribute.Key("keyswap.batches")
	entriesAttr = attribute.Key("keyswap.entries")
	changesAttr = attribute.Key("keyswap.changes")
	skippedAttr = attribute.Key("keyswap.skipped")
	gensAttr    = attribute.Key("keyswap.generations")
	pauseAttr   = attribute.Key("keyswap.pause")
)

// The histograms' bucket boundaries, in seconds: a run takes from less
// than a second to hours, a publish's pause from a millisecond to seconds.
var (
	durationBuckets = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200}
	pauseBuckets    = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
)

// observer is what New returns.
type observer struct {
	tracer    trace.Tracer
	attrs     []attribute.KeyValue // WithAttributes'
	keyMetric bool

	items, entries, batches, changes, failures metric.Int64Counter
	active                                     metric.Int64UpDownCounter
	duration, pause                            metric.Float64Histogram
}

// New returns a rebuild.Observer that records the runs it observes as
// OpenTelemetry metrics and spans (see the package documentation), for
// rebuild.Options.Observer. Without options it uses the global providers.
// One Observer may serve any number of Rebuilders, concurrently.
//
// The instruments are created once, here. An error creating one (only a
// misbehaving MeterProvider gives one) goes to otel.Handle, and that
// instrument records nothing.
func New(opts ...Option) rebuild.Observer {
	c := config{keyMetric: true}
	for _, opt := range opts {
		opt(&c)
	}
	if c.meters == nil {
		c.meters = otel.GetMeterProvider()
	}
	if c.tracers == nil {
		c.tracers = otel.GetTracerProvider()
	}
	m := c.meters.Meter(scope)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		i, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			errs = append(errs, err)
		}
		if i == nil {
			return noop.Int64Counter{}
		}
		return i
	}
	histogram := func(name, desc string, bounds []float64) metric.Float64Histogram {
		i, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bounds...))
		if err != nil {
			errs = append(errs, err)
		}
		if i == nil {
			return noop.Float64Histogram{}
		}
		return i
	}
	o := &observer{
		tracer:    c.tracers.Tracer(scope),
		attrs:     slices.Clone(c.attrs),
		keyMetric: c.keyMetric,
		items:     counter("keyswap.run.items", "{item}", "Source items in the batches runs wrote, skipped items included."),
		entries:   counter("keyswap.run.entries", "{entry}", "Entries (hash fields, set and sorted-set members) runs wrote to their temp keys."),
		batches:   counter("keyswap.run.batches", "{batch}", "Batches runs wrote."),
		changes:   counter("keyswap.run.changes", "{change}", "Changes applied during runs (Rebuilder.Apply) that the runs replayed before publishing."),
		failures:  counter("keyswap.run.failures", "{run}", "Runs that failed, by error.type."),
		duration:  histogram("keyswap.run.duration", "Duration of runs, from start to end, failed runs included (with error.type).", durationBuckets),
		pause:     histogram("keyswap.publish.pause", "Round trip of the publish script: the longest readers may wait behind a publish.", pauseBuckets),
	}
	active, err := m.Int64UpDownCounter("keyswap.run.active", metric.WithUnit("{run}"), metric.WithDescription("Runs in progress, held runs included."))
	if err != nil {
		errs = append(errs, err)
	}
	o.active = active
	if active == nil {
		o.active = noop.Int64UpDownCounter{}
	}
	if err := errors.Join(errs...); err != nil {
		otel.Handle(err)
	}
	return o
}

// Start starts the run's span, a child of ctx's, and counts the run as
// active.
func (o *observer) Start(ctx context.Context, key string) rebuild.RunObserver {
	attrs := slices.Clone(o.attrs)
	if o.keyMetric {
		attrs = append(attrs, keyAttr.String(key))
	}
	_, span := o.tracer.Start(ctx, "keyswap.run",
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(append(slices.Clone(o.attrs), keyAttr.String(key))...))
	r := &run{o: o, start: time.Now(), attrs: attrs, set: metric.WithAttributeSet(attribute.NewSet(attrs...)), span: span}
	o.active.Add(r.ctx(), 1, r.set)
	return r
}

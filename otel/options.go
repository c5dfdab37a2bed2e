package keyswapotel

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Option configures New.
//
// Functional options, unlike rebuild.Options: they are the convention of
// OpenTelemetry instrumentation (otelhttp, otelgrpc), and no type
// parameter is involved here.
type Option func(*config)

// config is what the options set.
type config struct {
	meters    metric.MeterProvider
	tracers   trace.TracerProvider
	attrs     []attribute.KeyValue
	keyMetric bool // record keyswap.key on the metrics
}

// WithMeterProvider records the metrics with mp. Without it, or with nil,
// New uses the global provider (otel.GetMeterProvider) as it is when New
// is called.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meters = mp }
}

// WithTracerProvider records the spans with tp. Without it, or with nil,
// New uses the global provider (otel.GetTracerProvider) as it is when New
// is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracers = tp }
}

// WithAttributes adds attrs to every metric and to every run's span, such
// as the name of the job that runs the rebuilds. They should have few
// distinct values, as keyswap.key should (see the package documentation,
// "Cardinality"). Calls add up.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, attrs...) }
}

// WithoutKeyInMetrics leaves the attribute keyswap.key out of the metrics,
// for programs that rebuild many distinct keys (one index per tenant, say):
// each key is a time series of every metric. The spans keep it.
func WithoutKeyInMetrics() Option {
	return func(c *config) { c.keyMetric = false }
}

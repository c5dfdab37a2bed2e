// Package keyswapotel records keyswap's rebuilds as OpenTelemetry metrics
// and traces. It is a module of its own, github.com/keyswap/keyswap/otel,
// so that programs that do not use it never have OpenTelemetry in their
// module graph:
//
//	import keyswapotel "github.com/keyswap/keyswap/otel"
//
//	r, err := rebuild.New(client, rebuild.Options{Observer: keyswapotel.New()}, emails, scores)
//
// [New] returns a rebuild.Observer. Without options it records with the
// global MeterProvider and TracerProvider; [WithMeterProvider] and
// [WithTracerProvider] choose others, [WithAttributes] adds attributes,
// and [WithoutKeyInMetrics] drops the key from the metrics. One Observer
// serves any number of Rebuilders.
//
// # Metrics
//
// The instrumentation scope is "github.com/keyswap/keyswap/otel". Every
// metric has the attribute keyswap.key, the builders' keys joined by ", "
// ("users:by-email, users:by-score"), and those of WithAttributes:
//
//	keyswap.run.items      counter    {item}    source items in the batches written, skipped items included
//	keyswap.run.entries    counter    {entry}   entries (fields, members) written to the temp keys
//	keyswap.run.batches    counter    {batch}   batches written
//	keyswap.run.changes    counter    {change}  changes applied during the run (Rebuilder.Apply) and replayed
//	keyswap.run.failures   counter    {run}     failed runs, with error.type
//	keyswap.run.active     updown     {run}     runs in progress, held runs included
//	keyswap.run.duration   histogram  s         each run, from start to end; failed runs with error.type
//	keyswap.publish.pause  histogram  s         each publish script's round trip, which readers may wait behind
//
// The counters of items, entries and batches grow as batches are written,
// so a long run shows its progress; at the end of a successful run they
// have grown by its Stats' Items, Batches and Entries (summed over the
// builders). error.type is a stable, low-cardinality kind of the error:
// see [ErrorType]. A run refused before it starts (a nil source, a
// Durability the server cannot give: an *Error of Op "config") is not
// observed.
//
// # Spans
//
// Each run is a span named "keyswap.run", a child of the span of the
// context given to Run (or Build), with the attribute keyswap.key. Each
// phase the run enters is a child span of it, which ends when the next
// phase starts or the run ends:
//
//	keyswap.building      pulling the source and writing the temp keys
//	keyswap.catching_up   replaying the changes applied during the run
//	keyswap.held          a run of Rebuilder.Build, waiting for Publish or Discard
//	keyswap.publishing    waiting for durability, if asked, and publishing
//
// A phase span has the attribute keyswap.phase ("catching up"), and the
// publishing span an event "keyswap.published" per publish script, with
// its round trip in seconds as keyswap.pause. A run that catches up again
// after a publish found too many changes to replay has a second
// catching_up and publishing span. The time before the first phase is the
// taking of the locks.
//
// When the run ends, its span gets the attributes keyswap.items,
// keyswap.batches, keyswap.entries and keyswap.changes (the run's Stats),
// keyswap.skipped when entries were skipped, and keyswap.generations
// ("key=generation" per key published). A failed run's span, and the span
// of the phase it failed in, have the status Error with the error's
// message and the attribute error.type; the run's span also records the
// error as an exception event.
//
// # Cardinality
//
// Each distinct value of keyswap.key is a time series of every metric (of
// every bucket of a histogram), times the values of error.type for
// failures and durations. A program with a fixed set of Rebuilders has a
// few; one that rebuilds an index per tenant or per day has one per
// tenant or day, which metric backends bill and slow down for. Such a
// program should use [WithoutKeyInMetrics], and add a low-cardinality
// attribute of its own with [WithAttributes] if it needs one. Spans keep
// the key either way: a trace backend stores attributes per span, not per
// series.
//
// # Concurrency
//
// The Observer and the RunObservers it returns are safe for concurrent
// use, as rebuild.Options.Observer requires. They only record into the
// providers, and the run waits for that: use the SDK's batching span
// processor (sdktrace.WithBatcher), not a synchronous one, so that no
// export happens in the run's path.
package keyswapotel

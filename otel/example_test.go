package keyswapotel_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"strings"

	"github.com/keyswap/keyswap/builders"
	keyswapotel "github.com/keyswap/keyswap/otel"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A program plugs the Observer into rebuild.Options, with its own
// providers or the global ones. Here the providers keep what they record
// in memory, to print it: the SDK's ManualReader for the metrics, a
// SpanRecorder for the spans. A program would give them exporters
// instead (OTLP, Prometheus). The example runs against the test suite's
// Redis.
func Example() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer meters.Shutdown(ctx)
	spans := tracetest.NewSpanRecorder()
	tracers := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tracers.Shutdown(ctx)

	type User struct{ ID, Email string }
	users := []User{{"1", "ada@example.com"}, {"2", "grace@example.com"}, {"3", "alan@example.com"}}
	emails := builders.Hash("users:by-email", func(u User) (field, value string, ok bool) {
		return u.Email, u.ID, true
	})
	client := env.ExampleClient() // a rueidis.Client
	defer client.Close()
	observer := keyswapotel.New(keyswapotel.WithMeterProvider(meters), keyswapotel.WithTracerProvider(tracers))
	r, err := rebuild.New(client, rebuild.Options{Observer: observer}, emails)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := r.Run(ctx, sources.Slice(users)); err != nil {
		log.Fatal(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			if m.Name == "keyswap.run.items" {
				key, _ := d.DataPoints[0].Attributes.Value("keyswap.key")
				fmt.Println("keyswap.key:", key.String())
			}
			lines = append(lines, fmt.Sprintf("%-22s %d %s", m.Name, d.DataPoints[0].Value, m.Unit))
		case metricdata.Histogram[float64]: // durations: print how many
			lines = append(lines, fmt.Sprintf("%-22s %d sample, in %s", m.Name, d.DataPoints[0].Count, m.Unit))
		}
	}
	slices.Sort(lines)
	fmt.Println(strings.Join(lines, "\n"))
	for _, s := range spans.Ended() {
		fmt.Println("span", s.Name())
	}
	// Output:
	// keyswap.key: users:by-email
	// keyswap.publish.pause  1 sample, in s
	// keyswap.run.active     0 {run}
	// keyswap.run.batches    1 {batch}
	// keyswap.run.changes    0 {change}
	// keyswap.run.duration   1 sample, in s
	// keyswap.run.entries    3 {entry}
	// keyswap.run.items      3 {item}
	// span keyswap.building
	// span keyswap.catching_up
	// span keyswap.publishing
	// span keyswap.run
}

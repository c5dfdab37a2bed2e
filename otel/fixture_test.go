package keyswapotel_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	keyswapotel "github.com/keyswap/keyswap/otel"
	"github.com/keyswap/keyswap/rebuild"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// user is the item type of the tests.
type user struct {
	ID, Email string
	Score     float64
}

// users returns n users with distinct ids and emails.
func users(n int) []user {
	out := make([]user, n)
	for i := range out {
		out[i] = user{ID: fmt.Sprintf("u%06d", i), Email: fmt.Sprintf("user%06d@example.com", i), Score: float64(i)}
	}
	return out
}

// twoBuilders returns a hash and a sorted set under prefix, and the key
// their Rebuilder reports: both keys, joined by ", ".
func twoBuilders(prefix string) ([]index.Builder[user], string) {
	email, score := prefix+"by-email", prefix+"by-score"
	return []index.Builder[user]{
		builders.Hash(email, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SortedSet(score, func(u user) (string, float64, bool) { return u.ID, u.Score, true }),
	}, email + ", " + score
}

// recorder keeps what an Observer records in memory: the SDK's
// ManualReader for the metrics, a SpanRecorder for the spans.
type recorder struct {
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

// newRecorder returns a recorder whose providers shut down when t ends.
func newRecorder(t *testing.T) *recorder {
	r := &recorder{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	r.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	t.Cleanup(func() {
		if err := r.mp.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
		if err := r.tp.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return r
}

// observer returns an Observer recording into r, with opts.
func (r *recorder) observer(opts ...keyswapotel.Option) rebuild.Observer {
	return keyswapotel.New(append([]keyswapotel.Option{keyswapotel.WithMeterProvider(r.mp), keyswapotel.WithTracerProvider(r.tp)}, opts...)...)
}

// units is the unit of each metric, as the package documentation gives it.
var units = map[string]string{
	"keyswap.run.items":     "{item}",
	"keyswap.run.entries":   "{entry}",
	"keyswap.run.batches":   "{batch}",
	"keyswap.run.changes":   "{change}",
	"keyswap.run.failures":  "{run}",
	"keyswap.run.active":    "{run}",
	"keyswap.run.duration":  "s",
	"keyswap.publish.pause": "s",
}

// points returns every data point recorded, keyed "name{attributes}":
// a counter's value, a histogram's count. It fails t on a metric of an
// unknown name or unit or another scope, on a histogram whose sum is not
// positive (a run or a publish takes some time), and on a counter that is
// not monotonic.
func (r *recorder) points(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != "github.com/keyswap/keyswap/otel" {
			t.Errorf("scope: got %q, want the module's path", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			if want, ok := units[m.Name]; !ok || m.Unit != want {
				t.Errorf("metric %s: got unit %q, want %q", m.Name, m.Unit, want)
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if d.IsMonotonic != (m.Name != "keyswap.run.active") {
					t.Errorf("metric %s: got monotonic %v", m.Name, d.IsMonotonic)
				}
				for _, p := range d.DataPoints {
					out[m.Name+"{"+encode(p.Attributes)+"}"] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if p.Count > 0 && p.Sum <= 0 {
						t.Errorf("metric %s{%s}: got sum %v, want > 0", m.Name, encode(p.Attributes), p.Sum)
					}
					out[m.Name+"{"+encode(p.Attributes)+"}"] = int64(p.Count)
				}
			default:
				t.Errorf("metric %s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// encode returns attrs as "k=v,k=v", sorted by key, unescaped.
func encode(attrs attribute.Set) string {
	var kvs []string
	for _, kv := range attrs.ToSlice() {
		kvs = append(kvs, string(kv.Key)+"="+kv.Value.String())
	}
	return strings.Join(kvs, ",")
}

// ended returns the spans ended, in the order they ended, each as its name
// and its parent's: "keyswap.building < keyswap.run" (nothing after "<"
// for a root).
func (r *recorder) ended() []string {
	spans := r.spans.Ended()
	names := map[trace.SpanID]string{}
	for _, s := range spans {
		names[s.SpanContext().SpanID()] = s.Name()
	}
	var out []string
	for _, s := range spans {
		parent := ""
		if s.Parent().IsValid() {
			parent = names[s.Parent().SpanID()]
			if parent == "" {
				parent = "(not ended)"
			}
		}
		out = append(out, s.Name()+" < "+parent)
	}
	return out
}

// span returns the only span named name, or fails t.
func (r *recorder) span(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("spans named %s: got %d, want 1", name, len(found))
	}
	return found[0]
}

// attrs returns a span's attributes, each value as the SDK prints it.
func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes() {
		out[string(kv.Key)] = kv.Value.String()
	}
	return out
}

// events returns the names of a span's events.
func events(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range s.Events() {
		out = append(out, e.Name)
	}
	return out
}

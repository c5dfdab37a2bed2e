package keyswapotel_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/redistest"
	keyswapotel "github.com/keyswap/keyswap/otel"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/keyswap/keyswap/store"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

// The tests' runs: runN users in batches of runBatch, so that a run writes
// several batches, concurrently.
const (
	runN     = 2500
	runBatch = 1000
)

// TestRun: a successful run records exactly its Stats (items, entries,
// batches, changes), one duration and one publish pause, and no failure;
// its span is a child of the caller's, with one child span per phase in
// order, and the Stats as attributes. Without the key in the metrics, the
// metrics carry only WithAttributes', and the spans still carry the key.
func TestRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		opts  []keyswapotel.Option
		attrs func(key string) string // of every metric, encoded
		span  map[string]string       // the run span's other attributes
	}{
		{name: "default", attrs: func(key string) string { return "keyswap.key=" + key }},
		{
			name:  "without key",
			opts:  []keyswapotel.Option{keyswapotel.WithoutKeyInMetrics(), keyswapotel.WithAttributes(attribute.String("job", "nightly"))},
			attrs: func(string) string { return "job=nightly" },
			span:  map[string]string{"job": "nightly"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := newRecorder(t)
			client := env.Standalone.Client(t)
			bs, key := twoBuilders(redistest.Prefix(t))
			r := redistest.Rebuilder(t, client, rebuild.Options{BatchSize: runBatch, Observer: rec.observer(tt.opts...)}, bs...)

			ctx, parent := rec.tp.Tracer("test").Start(redistest.Ctx(t), "test")
			stats, err := r.Run(ctx, sources.Slice(users(runN)))
			parent.End()
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			entries := sum(stats.Entries)
			if stats.Items != runN || stats.Batches != 3 || entries != 2*runN {
				t.Fatalf("Stats: got %d items, %d batches, %d entries, want %d, 3, %d", stats.Items, stats.Batches, entries, runN, 2*runN)
			}

			a := "{" + tt.attrs(key) + "}"
			want := map[string]int64{
				"keyswap.run.items" + a:     stats.Items,
				"keyswap.run.entries" + a:   entries,
				"keyswap.run.batches" + a:   stats.Batches,
				"keyswap.run.changes" + a:   stats.Changes,
				"keyswap.run.active" + a:    0,
				"keyswap.run.duration" + a:  1,
				"keyswap.publish.pause" + a: 1,
			}
			if diff := cmp.Diff(want, rec.points(t)); diff != "" {
				t.Errorf("metrics (-want +got):\n%s", diff)
			}

			wantSpans := []string{
				"keyswap.building < keyswap.run",
				"keyswap.catching_up < keyswap.run",
				"keyswap.publishing < keyswap.run",
				"keyswap.run < test",
				"test < ",
			}
			if diff := cmp.Diff(wantSpans, rec.ended()); diff != "" {
				t.Errorf("spans, as they ended (-want +got):\n%s", diff)
			}
			run := rec.span(t, "keyswap.run")
			if run.SpanContext().TraceID() != parent.SpanContext().TraceID() {
				t.Error("the run's span is in another trace than the caller's")
			}
			var gens []string
			for _, k := range slices.Sorted(maps.Keys(stats.Generations)) {
				gens = append(gens, fmt.Sprintf("%q", fmt.Sprintf("%s=%d", k, stats.Generations[k])))
			}
			wantAttrs := map[string]string{
				"keyswap.key":         key,
				"keyswap.items":       fmt.Sprint(stats.Items),
				"keyswap.batches":     fmt.Sprint(stats.Batches),
				"keyswap.entries":     fmt.Sprint(entries),
				"keyswap.changes":     "0",
				"keyswap.generations": "[" + strings.Join(gens, ",") + "]",
			}
			maps.Copy(wantAttrs, tt.span)
			if diff := cmp.Diff(wantAttrs, attrs(run)); diff != "" {
				t.Errorf("the run span's attributes (-want +got):\n%s", diff)
			}
			if len(gens) != 2 {
				t.Errorf("Stats.Generations: got %v, want one per key", stats.Generations)
			}
			if s := run.Status(); s.Code != codes.Unset {
				t.Errorf("the run span's status: got %v, want Unset", s)
			}
			for _, phase := range []string{"building", "catching_up", "publishing"} {
				s := rec.span(t, "keyswap."+phase)
				if got, want := attrs(s)["keyswap.phase"], strings.ReplaceAll(phase, "_", " "); got != want {
					t.Errorf("span %s: got keyswap.phase %q, want %q", s.Name(), got, want)
				}
				if s.Status().Code != codes.Unset {
					t.Errorf("span %s: got status %v, want Unset", s.Name(), s.Status())
				}
			}
			if got := events(rec.span(t, "keyswap.publishing")); !slices.Equal(got, []string{"keyswap.published"}) {
				t.Errorf("the publishing span's events: got %q, want one keyswap.published", got)
			}
		})
	}
}

// TestRunFails: a run that finds its lock held by another process fails
// with ErrInProgress before any phase: it counts a failure and a duration
// with error.type in_progress, and nothing written; its span, the only
// one, has the status Error, error.type and the error as an exception.
func TestRunFails(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	client, other := env.Standalone.Client(t), env.Standalone.Client(t)
	bs, key := twoBuilders(redistest.Prefix(t))
	lock := store.New(other, store.Options{}).LockKey(bs[1].Key())
	redistest.Cmd(t, other, "SET", lock, "someone-else", "EX", "60")
	r := redistest.Rebuilder(t, client, rebuild.Options{BatchSize: runBatch, Observer: rec.observer()}, bs...)

	ctx, parent := rec.tp.Tracer("test").Start(redistest.Ctx(t), "test")
	stats, err := r.Run(ctx, sources.Slice(users(runN)))
	parent.End()
	if !errors.Is(err, rebuild.ErrInProgress) || errors.Is(err, rebuild.ErrLockLost) {
		t.Fatalf("Run: got %v, want ErrInProgress", err)
	}

	a, failed := "{keyswap.key="+key+"}", "{error.type=in_progress,keyswap.key="+key+"}"
	want := map[string]int64{
		"keyswap.run.failures" + failed: 1,
		"keyswap.run.duration" + failed: 1,
		"keyswap.run.changes" + a:       0,
		"keyswap.run.active" + a:        0,
	}
	if diff := cmp.Diff(want, rec.points(t)); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"keyswap.run < test", "test < "}, rec.ended()); diff != "" {
		t.Errorf("spans, as they ended (-want +got):\n%s", diff)
	}
	run := rec.span(t, "keyswap.run")
	if s := run.Status(); s.Code != codes.Error || s.Description != err.Error() {
		t.Errorf("the run span's status: got %v, want Error %q", s, err)
	}
	wantAttrs := map[string]string{
		"keyswap.key": key, "error.type": "in_progress",
		"keyswap.items": fmt.Sprint(stats.Items), "keyswap.batches": "0", "keyswap.entries": "0", "keyswap.changes": "0",
	}
	if diff := cmp.Diff(wantAttrs, attrs(run)); diff != "" {
		t.Errorf("the run span's attributes (-want +got):\n%s", diff)
	}
	if got := events(run); !slices.Equal(got, []string{"exception"}) {
		t.Errorf("the run span's events: got %q, want one exception", got)
	}
}

// TestHeld: a run of Rebuilder.Build has a held phase between two
// catch-ups. Published, it records as a run does; discarded, it counts a
// failure with error.type discarded, and the held span, where it ended,
// has the status Error too.
func TestHeld(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		publish bool
		spans   []string
	}{
		{name: "published", publish: true, spans: []string{
			"keyswap.building < keyswap.run",
			"keyswap.catching_up < keyswap.run",
			"keyswap.held < keyswap.run",
			"keyswap.catching_up < keyswap.run",
			"keyswap.publishing < keyswap.run",
			"keyswap.run < ",
		}},
		{name: "discarded", spans: []string{
			"keyswap.building < keyswap.run",
			"keyswap.catching_up < keyswap.run",
			"keyswap.held < keyswap.run",
			"keyswap.run < ",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := newRecorder(t)
			client := env.Standalone.Client(t)
			bs, key := twoBuilders(redistest.Prefix(t))
			r := redistest.Rebuilder(t, client, rebuild.Options{BatchSize: runBatch, Observer: rec.observer()}, bs...)
			ctx := redistest.Ctx(t)
			held, _, err := r.Build(ctx, sources.Slice(users(runN)))
			if err != nil {
				t.Fatalf("Build: %v", err)
			}

			a := "{keyswap.key=" + key + "}"
			want := map[string]int64{
				"keyswap.run.items" + a:   runN,
				"keyswap.run.entries" + a: 2 * runN,
				"keyswap.run.batches" + a: 3,
				"keyswap.run.changes" + a: 0,
				"keyswap.run.active" + a:  0,
			}
			if tt.publish {
				stats, err := held.Publish(ctx)
				if err != nil {
					t.Fatalf("Publish: %v", err)
				}
				if stats.Items != runN || stats.Batches != 3 || sum(stats.Entries) != 2*runN {
					t.Errorf("Stats: got %d items, %d batches, %d entries, want %d, 3, %d", stats.Items, stats.Batches, sum(stats.Entries), runN, 2*runN)
				}
				want["keyswap.run.duration"+a] = 1
				want["keyswap.publish.pause"+a] = 1
			} else {
				if err := held.Discard(ctx); err != nil {
					t.Fatalf("Discard: %v", err)
				}
				failed := "{error.type=discarded,keyswap.key=" + key + "}"
				want["keyswap.run.failures"+failed] = 1
				want["keyswap.run.duration"+failed] = 1
			}
			if diff := cmp.Diff(want, rec.points(t)); diff != "" {
				t.Errorf("metrics (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.spans, rec.ended()); diff != "" {
				t.Errorf("spans, as they ended (-want +got):\n%s", diff)
			}
			wantCode := codes.Unset
			if !tt.publish {
				wantCode = codes.Error
			}
			for _, name := range []string{"keyswap.held", "keyswap.run"} {
				s := rec.span(t, name)
				if s.Status().Code != wantCode {
					t.Errorf("span %s: got status %v, want %v", name, s.Status(), wantCode)
				}
				if got, want := attrs(s)["error.type"], map[bool]string{true: "", false: "discarded"}[tt.publish]; got != want {
					t.Errorf("span %s: got error.type %q, want %q", name, got, want)
				}
			}
		})
	}
}

// sum returns the sum of m's values.
func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

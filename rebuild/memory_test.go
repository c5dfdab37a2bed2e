package rebuild_test

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// memPeak is what memMeasure saw of the Go heap during one run.
type memPeak struct {
	base    uint64 // live heap before the run, after two forced GCs
	live    uint64 // highest live heap measured by a GC during the run
	objects uint64 // highest heap occupied by objects, garbage included
	samples int    // measurements (forced GCs) during the run
	elapsed time.Duration
}

// memMeasure runs f while a goroutine measures the Go heap every
// memEvery: it reads the heap occupied by objects, then forces a GC and
// reads the live heap that GC found.
//
// The bound is asserted on the live heap after a forced GC
// (/gc/heap/live:bytes): the bytes reachable at that instant, exact (marked
// bytes, not an estimate) and independent of GOGC pacing, unlike the heap
// occupied by objects, which also counts garbage not yet collected
// (/memory/classes/heap/objects:bytes, logged for information). A streaming
// run allocates its input as it goes, so each measurement sees what the
// run holds at that moment: its items in flight, their commands, replies
// and buffers. The highest measurement is the run's peak. If the Rebuilder
// kept anything per item, the peak would grow with the source. Forcing the
// GCs on a clock, rather than waiting for the allocation-paced ones, gives
// the short run as many measurements per second as the long one.
func memMeasure(t *testing.T, f func()) memPeak {
	t.Helper()
	samples := []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
	}
	read := func() (live, objects uint64) {
		metrics.Read(samples)
		for _, s := range samples {
			if s.Value.Kind() != metrics.KindUint64 {
				t.Fatalf("metric %s: unsupported on this runtime", s.Name)
			}
		}
		return samples[0].Value.Uint64(), samples[1].Value.Uint64()
	}
	runtime.GC()
	runtime.GC()
	var p memPeak
	p.base, _ = read()

	stop := make(chan struct{})
	done := make(chan memPeak)
	go func() {
		var q memPeak
		tick := time.NewTicker(memEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- q
				return
			case <-tick.C:
			}
			_, objects := read()
			runtime.GC()
			live, _ := read()
			q.live, q.objects, q.samples = max(q.live, live), max(q.objects, objects), q.samples+1
		}
	}()
	start := time.Now()
	f()
	p.elapsed = time.Since(start)
	close(stop)
	q := <-done
	p.live, p.objects, p.samples = q.live, q.objects, q.samples
	return p
}

// memEvery is the period of memMeasure's measurements.
const memEvery = 2 * time.Millisecond

// memSource generates n items without holding them: a sources.Seq generator,
// not a slice, so that the source itself costs no memory per item.
func memSource(n int) sources.Source[int] {
	return sources.Seq(func(yield func(int) bool) {
		for i := range n {
			if !yield(i) {
				return
			}
		}
	})
}

// TestMemoryBoundedBySourceSize (Guarantee 8, Options.Writers): a run holds about Writers × BatchSize items
// whatever the source's size. 2,000,000 generated items streamed through a
// Hash builder must peak at no more than 1.5 × the live heap of a
// 200,000-item run with the same options.
//
// Not parallel: heap metrics are process-wide, and the package's other
// top-level tests (whose deployment subtests are parallel only among
// themselves) do not overlap a sequential test. It runs on a server of its
// own, so that 2M fields do not weigh on the shared one.
func TestMemoryBoundedBySourceSize(t *testing.T) {
	srv := redistest.OwnServer(t)
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const key = "mem:by-id"
	// Large batches keep the per-batch overhead low under -race, and the
	// value is one byte. Fields repeat modulo memFields (the last write
	// wins, C50): every item still becomes its own field string and HSET
	// argument, so the Go side does the same work and holds the same data
	// per item, but the server updates a hash of memFields fields instead of
	// growing one of 2M, which takes it several times longer per entry.
	const memFields = 50_000
	r := redistest.Rebuilder(t, c, rebuild.Options{BatchSize: 5000, Writers: 4},
		builders.Hash(key, func(i int) (string, string, bool) { return strconv.Itoa(i % memFields), "1", true }))

	run := func(n int) memPeak {
		t.Helper()
		var stats rebuild.Stats
		var err error
		p := memMeasure(t, func() { stats, err = r.Run(ctx, memSource(n)) })
		if err != nil {
			t.Fatalf("run of %d items: %v", n, err)
		}
		if stats.Items != int64(n) || stats.Entries[key] != int64(n) {
			t.Fatalf("run of %d items: got Items %d, Targets %d, want %d and %d", n, stats.Items, stats.Entries[key], n, n)
		}
		if got, err := c.Do(ctx, c.B().Hlen().Key(key).Build()).AsInt64(); err != nil || got != int64(min(n, memFields)) {
			t.Fatalf("HLEN %s after %d items: got %d, %v, want %d", key, n, got, err, min(n, memFields))
		}
		memUnlink(t, c, key)
		return p
	}
	run(20_000) // warm up: connections, pipelines, scripts, buffers
	small := run(200_000)
	large := run(2_000_000)
	const mib = 1 << 20
	for _, x := range []struct {
		name string
		p    memPeak
	}{{"200k", small}, {"2M", large}} {
		t.Logf("%s items: %v, %d measurements; live heap: base %.1f MiB, peak %.1f MiB; heap objects peak %.1f MiB",
			x.name, x.p.elapsed.Round(time.Millisecond), x.p.samples,
			float64(x.p.base)/mib, float64(x.p.live)/mib, float64(x.p.objects)/mib)
	}
	// Enough measurements that each peak is the maximum of many, not of
	// one or two that happened to fall between batches.
	if small.samples < 10 {
		t.Fatalf("the 200k run had %d measurements, want at least 10 for a meaningful peak", small.samples)
	}
	// No absolute slack is needed: the peak is set by the items and
	// commands in flight, about (Writers+1) × BatchSize, which both runs
	// reach many times over (measured: 7.5 and 8.0 MiB under -race). The
	// margin, half the short run's peak (about 4 MiB), would be used up by
	// 2 bytes retained for each of the 1.8M extra items; retaining the
	// items themselves (8 bytes), their field strings (16) or their
	// commands would exceed it several times over.
	if limit := small.live * 3 / 2; large.live > limit {
		t.Errorf("peak live heap of the 2M-item run: got %.1f MiB, want at most 1.5 × %.1f MiB (the 200k run) = %.1f MiB",
			float64(large.live)/mib, float64(small.live)/mib, float64(limit)/mib)
	}
}

// memUnlink deletes key, to free the server between runs.
func memUnlink(t *testing.T, c rueidis.Client, key string) {
	t.Helper()
	if err := c.Do(context.Background(), c.B().Unlink().Key(key).Build()).Error(); err != nil {
		t.Fatalf("UNLINK %s: %v", key, err)
	}
}

// TestMemoryItemsInFlightBounded (Guarantee 8; Options.Writers: "a run
// holds at most about (Writers+1) × BatchSize items, whatever the size of
// the source"): the source counts the items it has yielded, Progress the
// items of batches written, and their difference, measured at every yield,
// is what the run holds. A slow server (the hook holds each of the first
// batch DoMultis for up to 300 ms, or until the bound is broken) lets the
// pipeline fill up completely. The count must reach beyond Writers
// batches (so the pipeline did fill) and stay within Writers+1.
func TestMemoryItemsInFlightBounded(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		const batch, writers = 100, 4
		const bound = (writers + 1) * batch
		var written, maxHeld atomic.Int64
		over := make(chan struct{})
		var overOnce sync.Once
		var sends atomic.Int64
		client := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				if pipeIsBatch(multi) && sends.Add(1) <= 3 {
					slow := time.NewTimer(300 * time.Millisecond) // a slow server: that is the test
					select {
					case <-slow.C:
					case <-over:
					}
					slow.Stop()
				}
				return c.DoMulti(ctx, multi...)
			},
		})
		us := users(20 * batch)
		src := func(yield func(user, error) bool) {
			for i, u := range us {
				held := int64(i+1) - written.Load() // this item included
				if held > maxHeld.Load() {
					maxHeld.Store(held) // only this goroutine stores
				}
				if held > bound {
					overOnce.Do(func() { close(over) })
				}
				if !yield(u, nil) {
					return
				}
			}
		}
		k := pipeNames(d)
		_, err := pipeRebuilder(t, client, k, rebuild.Options{BatchSize: batch, Writers: writers,
			Progress: func(p rebuild.Progress) { written.Store(p.Items) }}).Run(ctx, sources.Seq2(src))
		if err != nil {
			t.Fatal(err)
		}
		got := maxHeld.Load()
		t.Logf("at most %d items held (%.1f batches of %d) with Writers = %d", got, float64(got)/batch, batch, writers)
		if got <= writers*batch {
			t.Errorf("got at most %d items held, want more than Writers × BatchSize = %d: the slow server should have filled the pipeline", got, writers*batch)
		}
		if got > bound {
			t.Errorf("got %d items held at once (%.1f batches), want at most (Writers+1) × BatchSize = %d, as Options.Writers documents", got, float64(got)/batch, bound)
		}
		pipeWant(t, d.Other, k, us)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// TestMemoryPerBucket (Guarantee 8; Options.Publish: in Generations mode
// "MaxKeys does not bind", so a family may have a million buckets): what a
// run keeps per bucket of a family until its publish is measured as the
// difference between two Generations runs of the same 200,000 items
// through the same SetIndex, one spread over 200,000 buckets, one in a
// single bucket. Both hold the same items and commands in flight, and
// MaxMerged is small in both, so that the difference is the per-bucket
// state: its target, the bucket's names (live and generation) and its entry
// in the family's index. It must stay within 320 bytes per bucket
// (measured 281-289 quiet, 276-301 under -race on a loaded 2-core
// machine); a run that kept a merge buffer or a second map entry per
// bucket until the publish exceeds it (measured 382 when targets still
// did).
//
// The runs are measured in a child process of this test binary
// (memPerBucketChild), which runs nothing else: the heap is process-wide,
// and in this one it also holds what the package's earlier tests left
// (goroutines that end after them, the buffers of their clients), which
// comes and goes while the runs are measured, by up to 80 bytes per
// bucket on a loaded machine.
func TestMemoryPerBucket(t *testing.T) {
	if os.Getenv(memChildEnv) != "" {
		memPerBucketChild(t)
		return
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestMemoryPerBucket$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), memChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child process that measures the runs failed: %v\n%s", err, out)
	}
	t.Logf("child process:\n%s", out)
	var per float64
	found := false
	for line := range strings.Lines(string(out)) {
		var v string
		if _, v, found = strings.Cut(line, memPerBucketLine); found {
			if per, err = strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil {
				t.Fatalf("the child's result %q: %v", line, err)
			}
			break
		}
	}
	if !found {
		t.Fatalf("the child process printed no %q line", memPerBucketLine)
	}
	if per > 320 {
		t.Errorf("a run keeps %.0f bytes per bucket of a family until its publish, want at most 320", per)
	}
}

// memChildEnv, set in its environment, makes TestMemoryPerBucket the
// child process that measures the runs.
const memChildEnv = "KEYSWAP_MEMORY_CHILD"

// memPerBucketLine precedes the bytes per bucket in the child's output.
const memPerBucketLine = "bytes per bucket: "

// memPerBucketChild measures TestMemoryPerBucket's runs, and logs the
// bytes per bucket after memPerBucketLine.
func memPerBucketChild(t *testing.T) {
	srv := redistest.OwnServer(t)
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const items = 200_000
	run := func(prefix string, buckets int) memPeak {
		t.Helper()
		r := redistest.Rebuilder(t, c, rebuild.Options{Publish: rebuild.Generations, Grace: time.Millisecond, MaxMerged: 10_000},
			builders.SetIndex(prefix, func(i int) (string, string, bool) { return strconv.Itoa(i % buckets), strconv.Itoa(i), true }))
		var stats rebuild.Stats
		var err error
		p := memMeasure(t, func() { stats, err = r.Run(ctx, memSource(items)) })
		if err != nil {
			t.Fatalf("run over %d buckets: %v", buckets, err)
		}
		if stats.Entries[prefix] != items {
			t.Fatalf("run over %d buckets: %d entries, want %d", buckets, stats.Entries[prefix], items)
		}
		if err := c.Do(ctx, c.B().Flushall().Build()).Error(); err != nil {
			t.Fatalf("FLUSHALL: %v", err)
		}
		return p
	}
	// The least peak of three runs: what a run holds beyond the memory
	// its buckets need (batches built or in flight when a measurement
	// falls, which a slow server makes more of) only ever adds, and a
	// machine under load made one run's peak vary by a tenth.
	least := func(prefix string, buckets int) memPeak {
		t.Helper()
		best := run(prefix, buckets)
		for range 2 {
			if p := run(prefix, buckets); p.live < best.live {
				best = p
			}
		}
		return best
	}
	run("w", 100) // warm up: connections, pipelines, scripts, buffers
	one := least("o", 1)
	many := least("m", items)
	const mib = 1 << 20
	t.Logf("peak live heap: one bucket %.1f MiB (%d measurements), %d buckets %.1f MiB (%d)",
		float64(one.live)/mib, one.samples, items, float64(many.live)/mib, many.samples)
	if many.samples < 10 {
		t.Fatalf("the run over %d buckets had %d measurements, want at least 10 for a meaningful peak", items, many.samples)
	}
	t.Logf("%s%.1f", memPerBucketLine, (float64(many.live)-float64(one.live))/items)
}

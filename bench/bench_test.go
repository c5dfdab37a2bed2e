package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/keyswap/keyswap/rebuild"
)

// benchItems is the size of one benchmark iteration: a whole run.
const benchItems = 100_000

// BenchmarkClient measures what a run costs the client, per item, for the
// raw method and for keyswap: CPU time (getrusage of the test process,
// which also generates the items) and allocations. The server is real, so
// ns/op varies with it; client-µs/1k-items and allocs/item are the numbers
// to compare with benchstat.
func BenchmarkClient(b *testing.B) {
	srv, err := openServer(context.Background(), env.Standalone.Addr, -1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.close() })
	d := newDataset(benchItems, 1000)
	for _, w := range allWorkloads(1000) {
		for _, m := range []method{methodRaw, methodKeyswap} {
			b.Run(fmt.Sprintf("%s/%s", w.name, m), func(b *testing.B) {
				ctx := context.Background()
				var cpu, allocs, bytes float64
				for range b.N {
					b.StopTimer()
					if err := srv.reset(ctx); err != nil {
						b.Fatal(err)
					}
					fn := func() error { return runRaw(ctx, srv.client, w, d) }
					if m == methodKeyswap {
						if err := preload(ctx, srv.client, w, d); err != nil {
							b.Fatal(err)
						}
						r, err := rebuilder(srv.client, w, rebuild.Options{})
						if err != nil {
							b.Fatal(err)
						}
						fn = func() error { return runKeyswap(ctx, r, w, d) }
					}
					cpu0, m0 := rusage(), readMetrics()
					b.StartTimer()
					err := fn()
					b.StopTimer()
					cpu1, m1 := rusage(), readMetrics()
					if err != nil {
						b.Fatal(err)
					}
					cpu += float64(cpu1 - cpu0)
					allocs += float64(m1.allocs - m0.allocs)
					bytes += float64(m1.allocBytes - m0.allocBytes)
				}
				items := float64(b.N * benchItems)
				b.ReportMetric(cpu/items, "client-ns/item")
				b.ReportMetric(allocs/items, "allocs/item")
				b.ReportMetric(bytes/items, "B/item")
				b.ReportMetric(items/b.Elapsed().Seconds(), "items/s")
			})
		}
	}
}

// BenchmarkDataset measures the source alone: what generating one item
// costs every in-process method.
func BenchmarkDataset(b *testing.B) {
	d := newDataset(b.N, 1000)
	b.ReportAllocs()
	n := 0
	for it := range d.all() {
		if it.member != "" {
			n++
		}
	}
	if n != b.N {
		b.Fatalf("got %d items, want %d", n, b.N)
	}
}

// BenchmarkCommands measures building the raw method's commands, 1000
// entries per command, without sending them.
func BenchmarkCommands(b *testing.B) {
	for _, w := range allWorkloads(1000) {
		b.Run(w.name, func(b *testing.B) {
			d := newDataset(benchItems, 1000)
			b.ReportAllocs()
			for b.Loop() {
				if err := w.commands(d, perCommand, func(string, string, []string, int) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchItems), "ns/item")
		})
	}
}

package main

import (
	"context"
	"runtime"
	"runtime/metrics"
	"sync"
	"syscall"
	"time"
)

// heapSampleEvery is the period of the peak-heap sampler.
const heapSampleEvery = 2 * time.Millisecond

// sample is one measured run of one method.
type sample struct {
	Items   int           `json:"items"`
	Elapsed time.Duration `json:"elapsed_ns"`
	// ServerCPU is the CPU time of every server thread during the run
	// (INFO cpu: used_cpu_user + used_cpu_sys).
	ServerCPU time.Duration `json:"server_cpu_ns"`
	// ClientCPU is the CPU time of the bench process during the run
	// (getrusage), or of redis-cli for the limit.
	ClientCPU time.Duration `json:"client_cpu_ns"`
	// PeakHeap is the peak of the Go heap's live and unswept objects
	// (runtime/metrics /memory/classes/heap/objects:bytes), sampled every
	// heapSampleEvery; for the limit, redis-cli's maximum resident set.
	PeakHeap uint64 `json:"peak_heap_bytes"`
	// Allocs and AllocBytes are the heap allocations of the run (zero for
	// the limit).
	Allocs     uint64 `json:"allocs"`
	AllocBytes uint64 `json:"alloc_bytes"`
	// Commands is the server's INFO commandstats during the run.
	Commands map[string]commandStat `json:"server_commands"`
}

// Rate returns items per second.
func (s sample) Rate() float64 { return float64(s.Items) / s.Elapsed.Seconds() }

// child is what a method run in another process used.
type child struct {
	cpu    time.Duration
	maxRSS uint64
}

// measure runs fn, which writes items entries, and measures it. fn returns
// the usage of the child process that did the work, or nil when the work
// ran in this process. The server must be idle: measure does not wait for
// it. A non-empty profile is the file for a CPU profile of the run.
func measure(ctx context.Context, s *server, items int, profile string, fn func() (*child, error)) (sample, error) {
	runtime.GC() // Each run starts from the same heap, and pays for its own garbage.
	before, err := s.usage(ctx)
	if err != nil {
		return sample{}, err
	}
	stopProfile := func() error { return nil }
	if profile != "" {
		if stopProfile, err = startProfile(profile); err != nil {
			return sample{}, err
		}
	}
	ru0 := rusage()
	m0 := readMetrics()
	peak := startHeapSampler()

	start := time.Now()
	ch, err := fn()
	elapsed := time.Since(start)

	heap := peak()
	if perr := stopProfile(); err == nil {
		err = perr
	}
	m1 := readMetrics()
	ru1 := rusage()
	if err != nil {
		return sample{}, err
	}
	after, err := s.usage(ctx)
	if err != nil {
		return sample{}, err
	}
	used := after.since(before)
	out := sample{
		Items:      items,
		Elapsed:    elapsed,
		ServerCPU:  used.cpu,
		ClientCPU:  ru1 - ru0,
		PeakHeap:   heap,
		Allocs:     m1.allocs - m0.allocs,
		AllocBytes: m1.allocBytes - m0.allocBytes,
		Commands:   used.commands,
	}
	if ch != nil {
		out.ClientCPU, out.PeakHeap, out.Allocs, out.AllocBytes = ch.cpu, ch.maxRSS, 0, 0
	}
	return out, nil
}

// rusage returns the CPU time this process has used.
func rusage() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapMetrics are cumulative allocation counters.
type heapMetrics struct{ allocs, allocBytes uint64 }

func readMetrics() heapMetrics {
	ms := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(ms)
	return heapMetrics{allocs: ms[0].Value.Uint64(), allocBytes: ms[1].Value.Uint64()}
}

// startHeapSampler samples the heap until the returned function is called,
// which returns the peak.
func startHeapSampler() func() uint64 {
	ms := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 {
		metrics.Read(ms)
		return ms[0].Value.Uint64()
	}
	var peak uint64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(heapSampleEvery)
		defer t.Stop()
		for {
			peak = max(peak, read())
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return func() uint64 {
		cancel()
		wg.Wait()
		return max(peak, read())
	}
}

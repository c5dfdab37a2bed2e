package main

import (
	"context"
	"os"
	"slices"
)

// throughputResult is the throughput section: every method on every
// workload, interleaved in rounds.
type throughputResult struct {
	Items     int                  `json:"items"`
	Rounds    int                  `json:"rounds"`
	Buckets   int                  `json:"buckets"`
	Workloads []throughputWorkload `json:"workloads"`
}

// throughputWorkload is one workload's methods.
type throughputWorkload struct {
	Name    string         `json:"name"`
	Title   string         `json:"title"`
	Methods []methodSeries `json:"methods"`
}

// methodSeries is one method's series.
type methodSeries struct {
	Method method `json:"method"`
	series
}

// method returns the series of m, or nil.
func (w throughputWorkload) method(m method) *methodSeries {
	for i := range w.Methods {
		if w.Methods[i].Method == m {
			return &w.Methods[i]
		}
	}
	return nil
}

// throughput runs the throughput section: in each round, each workload,
// each method, all on the same dataset.
func (r *runner) throughput(ctx context.Context) (*throughputResult, error) {
	cfg := r.cfg
	d := newDataset(cfg.n, cfg.buckets)
	ws, ms := r.workloads(), r.methods()
	resps := make([]respFile, len(ws))
	if slices.Contains(ms, methodLimit) {
		for i, w := range ws {
			r.bar.describe("throughput: writing RESP of %s", w.name)
			f, err := writeRESP(w, d)
			if err != nil {
				return nil, err
			}
			defer os.Remove(f.path)
			resps[i] = f
		}
	}
	samples := make([][][]sample, len(ws))
	for i := range samples {
		samples[i] = make([][]sample, len(ms))
	}
	for round := range cfg.rounds {
		for wi, w := range ws {
			for mi, m := range ms {
				s, err := r.runOnce(ctx, sectionThroughput, round, w.name+" "+string(m), m, w, d, resps[wi], cfg.keyswap)
				if err != nil {
					return nil, err
				}
				samples[wi][mi] = append(samples[wi][mi], s)
			}
		}
	}
	res := &throughputResult{Items: cfg.n, Rounds: cfg.rounds, Buckets: cfg.buckets}
	for wi, w := range ws {
		var limit []sample
		if li := slices.Index(ms, methodLimit); li >= 0 {
			limit = samples[wi][li]
		}
		tw := throughputWorkload{Name: w.name, Title: w.title}
		for mi, m := range ms {
			tw.Methods = append(tw.Methods, methodSeries{Method: m, series: newSeries(samples[wi][mi], limit)})
		}
		res.Workloads = append(res.Workloads, tw)
	}
	return res, nil
}

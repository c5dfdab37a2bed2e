package main

import (
	"slices"
	"time"
)

// series is one method's runs of one configuration, one per round, and
// their summary.
type series struct {
	Samples []sample `json:"samples"`
	Summary summary  `json:"summary"`
}

// summary condenses a series. Rates are items per second.
type summary struct {
	Rate    float64 `json:"items_per_s_median"`
	RateMin float64 `json:"items_per_s_min"`
	RateMax float64 `json:"items_per_s_max"`
	// Ratio is the median over rounds of this round's rate over the
	// limit's rate in the same round; zero without a limit.
	Ratio    float64 `json:"ratio_to_limit_median,omitempty"`
	RatioMin float64 `json:"ratio_to_limit_min,omitempty"`
	RatioMax float64 `json:"ratio_to_limit_max,omitempty"`
	// NsPerItem is the median wall time per item.
	NsPerItem float64 `json:"ns_per_item_median"`
	// ServerCPU and ClientCPU are medians over rounds.
	ServerCPU time.Duration `json:"server_cpu_ns_median"`
	ClientCPU time.Duration `json:"client_cpu_ns_median"`
	// ServerUtil is the median of server CPU over wall time: how busy the
	// server was, 1 being one core for the whole run.
	ServerUtil float64 `json:"server_util_median"`
	// PeakHeap is the largest peak over rounds.
	PeakHeap      uint64  `json:"peak_heap_bytes_max"`
	AllocsPerItem float64 `json:"allocs_per_item_median"`
	BytesPerItem  float64 `json:"alloc_bytes_per_item_median"`
}

// newSeries summarises samples. limit, if not nil, holds the limit's runs
// of the same rounds, in the same order, for the ratios.
func newSeries(samples, limit []sample) series {
	s := series{Samples: samples}
	if len(samples) == 0 {
		return s
	}
	var rates, ns, srv, cli, util, allocs, bytes, ratios []float64
	for i, x := range samples {
		rates = append(rates, x.Rate())
		ns = append(ns, float64(x.Elapsed.Nanoseconds())/float64(x.Items))
		srv = append(srv, float64(x.ServerCPU))
		cli = append(cli, float64(x.ClientCPU))
		util = append(util, x.ServerCPU.Seconds()/x.Elapsed.Seconds())
		allocs = append(allocs, float64(x.Allocs)/float64(x.Items))
		bytes = append(bytes, float64(x.AllocBytes)/float64(x.Items))
		s.Summary.PeakHeap = max(s.Summary.PeakHeap, x.PeakHeap)
		if i < len(limit) {
			ratios = append(ratios, x.Rate()/limit[i].Rate())
		}
	}
	s.Summary.Rate, s.Summary.RateMin, s.Summary.RateMax = median(rates), slices.Min(rates), slices.Max(rates)
	if len(ratios) > 0 {
		s.Summary.Ratio, s.Summary.RatioMin, s.Summary.RatioMax = median(ratios), slices.Min(ratios), slices.Max(ratios)
	}
	s.Summary.NsPerItem = median(ns)
	s.Summary.ServerCPU = time.Duration(median(srv))
	s.Summary.ClientCPU = time.Duration(median(cli))
	s.Summary.ServerUtil = median(util)
	s.Summary.AllocsPerItem = median(allocs)
	s.Summary.BytesPerItem = median(bytes)
	return s
}

// median returns the median of xs (the mean of the middle two for an even
// count), or 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianDuration returns the median of ds.
func medianDuration(ds []time.Duration) time.Duration {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d)
	}
	return time.Duration(median(xs))
}

package main

import (
	"context"
	"fmt"
	"os"

	"github.com/keyswap/keyswap/rebuild"
)

// knobsResult is the knobs section: keyswap on a hash with every
// combination of BatchSize and Writers.
type knobsResult struct {
	Items      int     `json:"items"`
	Rounds     int     `json:"rounds"`
	BatchSizes []int   `json:"batch_sizes"`
	Writers    []int   `json:"writers"`
	Limit      *series `json:"limit,omitempty"`
	// Cells[i][j] is BatchSizes[i] × Writers[j].
	Cells [][]series `json:"cells"`
}

// knobs runs the knobs section: in each round, the limit, then keyswap with
// each BatchSize × Writers.
func (r *runner) knobs(ctx context.Context) (*knobsResult, error) {
	cfg := r.cfg
	w := hashWorkload()
	d := newDataset(cfg.n, 1)
	var resp respFile
	if r.hasLimit() {
		r.bar.describe("knobs: writing RESP")
		f, err := writeRESP(w, d)
		if err != nil {
			return nil, err
		}
		defer os.Remove(f.path)
		resp = f
	}
	var limit []sample
	cells := make([][][]sample, len(cfg.batchSizes))
	for i := range cells {
		cells[i] = make([][]sample, len(cfg.writers))
	}
	for round := range cfg.rounds {
		if r.hasLimit() {
			s, err := r.runOnce(ctx, sectionKnobs, round, "limit", methodLimit, w, d, resp, rebuild.Options{})
			if err != nil {
				return nil, err
			}
			limit = append(limit, s)
		}
		for i, bs := range cfg.batchSizes {
			for j, wr := range cfg.writers {
				label := fmt.Sprintf("keyswap BatchSize %d Writers %d", bs, wr)
				s, err := r.runOnce(ctx, sectionKnobs, round, label, methodKeyswap, w, d, respFile{}, rebuild.Options{BatchSize: bs, Writers: wr})
				if err != nil {
					return nil, err
				}
				cells[i][j] = append(cells[i][j], s)
			}
		}
	}
	res := &knobsResult{Items: cfg.n, Rounds: cfg.rounds, BatchSizes: cfg.batchSizes, Writers: cfg.writers}
	if limit != nil {
		l := newSeries(limit, nil)
		res.Limit = &l
	}
	for i := range cfg.batchSizes {
		var row []series
		for j := range cfg.writers {
			row = append(row, newSeries(cells[i][j], limit))
		}
		res.Cells = append(res.Cells, row)
	}
	return res, nil
}

package main

import (
	"context"
	"fmt"
	"os"

	"github.com/keyswap/keyswap/rebuild"
)

// scalingResult is the scaling section: the limit and keyswap on a hash at
// several sizes.
type scalingResult struct {
	Rounds int           `json:"rounds"`
	Sizes  []scalingSize `json:"sizes"`
}

// scalingSize is one size's series.
type scalingSize struct {
	Items   int     `json:"items"`
	Limit   *series `json:"limit,omitempty"`
	Keyswap series  `json:"keyswap"`
}

// scaling runs the scaling section: in each round, each size, the limit
// then keyswap.
func (r *runner) scaling(ctx context.Context) (*scalingResult, error) {
	cfg := r.cfg
	w := hashWorkload()
	datasets := make([]dataset, len(cfg.sizes))
	resps := make([]respFile, len(cfg.sizes))
	for i, n := range cfg.sizes {
		datasets[i] = newDataset(n, 1)
		if r.hasLimit() {
			r.bar.describe("scaling: writing RESP of %d fields", n)
			f, err := writeRESP(w, datasets[i])
			if err != nil {
				return nil, err
			}
			defer os.Remove(f.path)
			resps[i] = f
		}
	}
	limits := make([][]sample, len(cfg.sizes))
	keyswaps := make([][]sample, len(cfg.sizes))
	for round := range cfg.rounds {
		for i, d := range datasets {
			if r.hasLimit() {
				s, err := r.runOnce(ctx, sectionScaling, round, fmt.Sprintf("%d limit", d.n), methodLimit, w, d, resps[i], rebuild.Options{})
				if err != nil {
					return nil, err
				}
				limits[i] = append(limits[i], s)
			}
			s, err := r.runOnce(ctx, sectionScaling, round, fmt.Sprintf("%d keyswap", d.n), methodKeyswap, w, d, respFile{}, cfg.keyswap)
			if err != nil {
				return nil, err
			}
			keyswaps[i] = append(keyswaps[i], s)
		}
	}
	res := &scalingResult{Rounds: cfg.rounds}
	for i, n := range cfg.sizes {
		sz := scalingSize{Items: n, Keyswap: newSeries(keyswaps[i], limits[i])}
		if r.hasLimit() {
			l := newSeries(limits[i], nil)
			sz.Limit = &l
		}
		res.Sizes = append(res.Sizes, sz)
	}
	return res, nil
}

package main

import (
	"context"
	"maps"
	"sync"

	"github.com/redis/rueidis"
)

// observations is what the concurrent reader saw.
type observations struct {
	polls   int // atomic snapshots of every index's size
	missing int // snapshots with the email or score index absent: a gap
	mixed   int // snapshots that were neither yesterday's nor today's
}

// startReader polls the sizes of every index, each poll one atomic read,
// until the returned function is called, which returns what it saw. Every
// snapshot must be exactly before (yesterday's sizes) or exactly after
// (today's): anything else means a reader saw one index rebuilt and another
// not yet, or a half-built one.
func startReader(ctx context.Context, c rueidis.Client, ix indexes, before, after map[string]int64) func() observations {
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg  sync.WaitGroup
		obs observations
	)
	wg.Go(func() {
		for {
			sizes, err := ix.counts(ctx, c, allCountries)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				continue
			}
			obs.polls++
			if sizes[ix.byEmail] < 0 || sizes[ix.byScore] < 0 {
				obs.missing++
			}
			if !maps.Equal(sizes, before) && !maps.Equal(sizes, after) {
				obs.mixed++
			}
		}
	})
	return func() observations {
		cancel()
		wg.Wait()
		return obs
	}
}

// expectedSizes returns the size of every index built from users, -1 for an
// index that must be absent (a country nobody lives in).
func (ix indexes) expectedSizes(users []User) map[string]int64 {
	emails, ids := map[string]bool{}, map[string]bool{}
	countries := map[string]map[string]bool{}
	for _, u := range users {
		if !blank(u.Email) {
			emails[u.Email] = true
		}
		ids[u.ID] = true
		if countries[u.Country] == nil {
			countries[u.Country] = map[string]bool{}
		}
		countries[u.Country][u.ID] = true
	}
	out := map[string]int64{ix.byEmail: int64(len(emails)), ix.byScore: int64(len(ids))}
	for _, cc := range allCountries {
		out[ix.byCountry+":"+cc] = -1
		if n := len(countries[cc]); n > 0 {
			out[ix.byCountry+":"+cc] = int64(n)
		}
	}
	return out
}

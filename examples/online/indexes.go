package main

import (
	"context"
	"strconv"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/redis/rueidis"
)

// indexes are the keys of the three indexes.
type indexes struct{ byEmail, byScore, byCountry string }

func newIndexes(prefix string) indexes {
	return indexes{prefix + "users:by-email", prefix + "users:by-score", prefix + "users:by-country"}
}

// builders define the indexes once: they rebuild them (Run) and maintain
// them (Apply).
func (ix indexes) builders() []index.Builder[user] {
	return []index.Builder[user]{
		builders.Hash(ix.byEmail, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SortedSet(ix.byScore, func(u user) (string, float64, bool) { return u.ID, u.Score, true }),
		builders.SetIndex(ix.byCountry, func(u user) (string, string, bool) { return u.Country, u.ID, true }),
	}
}

// verify compares every index with users entry by entry, and returns how
// many entries differ (missing, wrong, or stale).
func (ix indexes) verify(ctx context.Context, c rueidis.Client, users []user) (int, error) {
	wantEmail := map[string]string{}
	wantScore := map[string]string{}
	wantCountry := map[string]map[string]bool{}
	for _, u := range users {
		wantEmail[u.Email] = u.ID
		wantScore[u.ID] = strconv.FormatFloat(u.Score, 'g', -1, 64)
		if wantCountry[u.Country] == nil {
			wantCountry[u.Country] = map[string]bool{}
		}
		wantCountry[u.Country][u.ID] = true
	}
	gotEmail, err := c.Do(ctx, c.B().Hgetall().Key(ix.byEmail).Build()).AsStrMap()
	if err != nil {
		return 0, err
	}
	scores, err := c.Do(ctx, c.B().Zrange().Key(ix.byScore).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		return 0, err
	}
	gotScore := map[string]string{}
	for _, z := range scores {
		gotScore[z.Member] = strconv.FormatFloat(z.Score, 'g', -1, 64)
	}
	differ := count(wantEmail, gotEmail) + count(wantScore, gotScore)
	for _, country := range countries {
		members, err := c.Do(ctx, c.B().Smembers().Key(ix.byCountry+":"+country).Build()).AsStrSlice()
		if err != nil {
			return 0, err
		}
		got := map[string]bool{}
		for _, m := range members {
			got[m] = true
		}
		differ += count(wantCountry[country], got)
	}
	return differ, nil
}

// count returns the entries that differ between want and got.
func count[V comparable](want, got map[string]V) int {
	n := 0
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			n++
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			n++
		}
	}
	return n
}

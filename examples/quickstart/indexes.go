package main

import (
	"context"
	"fmt"
	"maps"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/redis/rueidis"
)

// indexes names the three indexes of the users table.
type indexes struct {
	byEmail, byScore, byCountry string
}

// newIndexes returns the index names under prefix.
func newIndexes(prefix string) indexes {
	return indexes{byEmail: prefix + "users:by-email", byScore: prefix + "users:by-score", byCountry: prefix + "users:by-country"}
}

// builders returns one builder per index.
func (ix indexes) builders() []index.Builder[User] {
	return []index.Builder[User]{
		builders.Hash(ix.byEmail, func(u User) (string, string, bool) {
			return u.Email, u.ID, !builders.Blank(u.Email)
		}),
		builders.SortedSet(ix.byScore, func(u User) (string, float64, bool) {
			return u.ID, u.Score, true
		}),
		builders.SetIndex(ix.byCountry, func(u User) (string, string, bool) {
			return u.Country, u.ID, !builders.Blank(u.Country)
		}),
	}
}

// counts reads the size of every index in one Lua script, so that the
// counts are one consistent snapshot.
func (ix indexes) counts(ctx context.Context, c rueidis.Client, countries []string) (map[string]int64, error) {
	keys := []string{ix.byEmail, ix.byScore}
	for _, cc := range countries {
		keys = append(keys, ix.byCountry+":"+cc)
	}
	sizes, err := countScript.Exec(ctx, c, keys, nil).AsIntSlice()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for i, k := range keys {
		out[k] = sizes[i]
	}
	return out, nil
}

// countScript returns, per key, its size: -1 when the key is missing.
var countScript = rueidis.NewLuaScriptReadOnly(`
local out = {}
for i, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k)['ok']
  if t == 'hash' then out[i] = redis.call('HLEN', k)
  elseif t == 'zset' then out[i] = redis.call('ZCARD', k)
  elseif t == 'set' then out[i] = redis.call('SCARD', k)
  else out[i] = -1 end
end
return out`)

var allCountries = []string{"br", "de", "fr", "jp", "us"}

// verify checks that every index holds exactly what today's users say.
func (ix indexes) verify(ctx context.Context, c rueidis.Client, today []User) error {
	emails := map[string]string{}
	scores := map[string]float64{}
	countries := map[string]map[string]bool{}
	for _, u := range today {
		if !builders.Blank(u.Email) {
			emails[u.Email] = u.ID
		}
		scores[u.ID] = u.Score
		if countries[u.Country] == nil {
			countries[u.Country] = map[string]bool{}
		}
		countries[u.Country][u.ID] = true
	}
	gotEmails, err := c.Do(ctx, c.B().Hgetall().Key(ix.byEmail).Build()).AsStrMap()
	if err != nil {
		return err
	}
	if !maps.Equal(gotEmails, emails) {
		return fmt.Errorf("%s has %d entries, want %d", ix.byEmail, len(gotEmails), len(emails))
	}
	zs, err := c.Do(ctx, c.B().Zrange().Key(ix.byScore).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		return err
	}
	gotScores := map[string]float64{}
	for _, z := range zs {
		gotScores[z.Member] = z.Score
	}
	if !maps.Equal(gotScores, scores) {
		return fmt.Errorf("%s has %d members, want %d", ix.byScore, len(gotScores), len(scores))
	}
	for _, cc := range allCountries {
		ms, err := c.Do(ctx, c.B().Smembers().Key(ix.byCountry+":"+cc).Build()).AsStrSlice()
		if err != nil {
			return err
		}
		got := map[string]bool{}
		for _, m := range ms {
			got[m] = true
		}
		if want := countries[cc]; !maps.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			return fmt.Errorf("%s:%s has %d members, want %d", ix.byCountry, cc, len(got), len(want))
		}
	}
	return nil
}

// blank is builders.Blank: Familia does not index blank values.
func blank(s string) bool { return builders.Blank(s) }

package redistest

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/rueidis"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// User is the item type of the tests of keyswap's indexes: a hash of
// emails, a sorted set of scores and a set index of countries are built of
// users.
type User struct {
	ID      string
	Email   string
	Country string
	Score   float64
}

// Users returns n users with distinct ids (u000000...) and emails,
// countries cycling over fr, de, us, and scores equal to their index.
func Users(n int) []User {
	out := make([]User, n)
	for i := range out {
		out[i] = User{
			ID:      fmt.Sprintf("u%06d", i),
			Email:   fmt.Sprintf("user%06d@example.com", i),
			Country: []string{"fr", "de", "us"}[i%3],
			Score:   float64(i),
		}
	}
	return out
}

// The online model: a source of truth, a hash of users by id whose values
// are EncodeUser's, and an application (App) that changes users in it and
// applies each change through a Rebuilder, as the package documentation of
// rebuild asks: commit first, then apply.

// EncodeUser returns u as the source of truth holds it, email|score|country.
func EncodeUser(u User) string {
	return u.Email + "|" + strconv.FormatFloat(u.Score, 'g', -1, 64) + "|" + u.Country
}

// DecodeUser returns the user id whose value in the source of truth is v.
func DecodeUser(id, v string) (User, error) {
	f := strings.Split(v, "|")
	if len(f) != 3 {
		return User{}, fmt.Errorf("user %s: %q is not email|score|country", id, v)
	}
	score, err := strconv.ParseFloat(f[1], 64)
	if err != nil {
		return User{}, fmt.Errorf("user %s: %w", id, err)
	}
	return User{ID: id, Email: f[0], Score: score, Country: f[2]}, nil
}

// ReadTruth returns the source of truth db, by id.
func ReadTruth(ctx context.Context, c rueidis.Client, db string) (map[string]User, error) {
	m, err := c.Do(ctx, c.B().Hgetall().Key(db).Build()).AsStrMap()
	if err != nil {
		return nil, err
	}
	out := make(map[string]User, len(m))
	for id, v := range m {
		if out[id], err = DecodeUser(id, v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// OnlineUser returns user i of the application with tag tag: its id is the
// tag and i on six digits, its email holds its id, its country is one of
// countries buckets c00, c01, ...
func OnlineUser(tag string, i, countries int, rng *rand.Rand) User {
	return User{
		ID:      fmt.Sprintf("%s%06d", tag, i),
		Email:   fmt.Sprintf("%s%06d.%d@example.com", tag, i, rng.IntN(1_000_000)),
		Score:   float64(rng.IntN(1_000_000)),
		Country: fmt.Sprintf("c%02d", rng.IntN(countries)),
	}
}

// SeedTruth adds n users of each of tags to the source of truth db, drawn
// from seed, in HSETs of per users.
func SeedTruth(tb testing.TB, c rueidis.Client, db string, n, countries, per int, seed uint64, tags ...string) {
	tb.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	var cmds rueidis.Commands
	for _, tag := range tags {
		for start := 0; start < n; start += per {
			fv := c.B().Hset().Key(db).FieldValue()
			for i := start; i < min(n, start+per); i++ {
				u := OnlineUser(tag, i, countries, rng)
				fv = fv.FieldValue(u.ID, EncodeUser(u))
			}
			cmds = append(cmds, fv.Build())
		}
	}
	for _, res := range c.DoMulti(Ctx(tb), cmds...) {
		if err := res.Error(); err != nil {
			tb.Fatal(err)
		}
	}
}

// TruthSource reads the source of truth db when the run starts it (after
// the run took its locks: a snapshot as of the run's start), calls held,
// if not nil, which returns false to end the source, and yields the
// snapshot in id order, calling each, if not nil, with each id before it
// yields it; each returns an error to fail the source there.
func TruthSource(c rueidis.Client, db string, held func(ctx context.Context) bool, each func(i int, id string) error) sources.Source[User] {
	return func(ctx context.Context) iter.Seq2[User, error] {
		return func(yield func(User, error) bool) {
			m, err := ReadTruth(ctx, c, db)
			if err != nil {
				yield(User{}, err)
				return
			}
			if held != nil && !held(ctx) {
				return
			}
			for i, id := range slices.Sorted(maps.Keys(m)) {
				if each != nil {
					if err := each(i, id); err != nil {
						yield(User{}, err)
						return
					}
				}
				if !yield(m[id], nil) {
					return
				}
			}
		}
	}
}

// App is the application of the online tests: it changes its own users
// (those whose id starts with its tag) in the source of truth, then
// applies each change through its Rebuilder. It is the only writer of its
// users, so it keeps a copy of them. An App is not safe for concurrent
// use; Applied is.
type App struct {
	// Rebuilder applies the changes.
	Rebuilder *rebuild.Rebuilder[User]
	// Users are the app's users by id, and IDs their ids: a test that
	// commits and applies a change itself records it there.
	Users map[string]User
	IDs   []string

	c         rueidis.Client
	db, tag   string
	countries int
	rng       *rand.Rand
	next      int
	// Patient makes a change that Apply refuses with ErrInProgress (a lock
	// held by a run that would not replay it, a thief's) wait, with the
	// changes after it, to be applied again by a later Step or Flush, as
	// the package documentation asks. Without it, Step returns the error.
	Patient bool
	// Pending are the changes committed and not applied yet.
	Pending []index.Change[User]
	// Before, if set, is called with each change after its commit and
	// before it is applied.
	Before func(index.Change[User])
	// Applied counts the changes applied.
	Applied atomic.Int64
}

// NewApp returns the application of tag's users in the source of truth db,
// which it reads, changing them with r, its countries among countries,
// drawn from seed.
func NewApp(ctx context.Context, c rueidis.Client, r *rebuild.Rebuilder[User], db, tag string, countries int, seed uint64) (*App, error) {
	all, err := ReadTruth(ctx, c, db)
	if err != nil {
		return nil, err
	}
	a := &App{Rebuilder: r, c: c, db: db, tag: tag, countries: countries, rng: rand.New(rand.NewPCG(seed, 2)), Users: map[string]User{}}
	// Past every id of its users in the source of truth, which also holds
	// the users an earlier run of the test inserted (-count): an insert of
	// an id that exists would leave its old entries behind.
	for id, u := range all {
		if n, err := strconv.Atoi(strings.TrimPrefix(id, tag)); err == nil && strings.HasPrefix(id, tag) {
			a.Users[id] = u
			a.next = max(a.next, n+1)
		}
	}
	a.IDs = slices.Sorted(maps.Keys(a.Users))
	return a, nil
}

// Step makes one change: an insert, a delete, or an update of the email,
// the score, the country, or several of them. It commits it to the source
// of truth, then applies it (Flush).
func (a *App) Step(ctx context.Context) error {
	var change index.Change[User]
	var commit rueidis.Completed
	switch roll := a.rng.IntN(100); {
	case roll < 10 || len(a.IDs) == 0:
		u := OnlineUser(a.tag, a.next, a.countries, a.rng)
		a.next++
		a.Users[u.ID] = u
		a.IDs = append(a.IDs, u.ID)
		change, commit = index.Insert(u), a.c.B().Hset().Key(a.db).FieldValue().FieldValue(u.ID, EncodeUser(u)).Build()
	case roll < 20:
		i := a.rng.IntN(len(a.IDs))
		u := a.Users[a.IDs[i]]
		delete(a.Users, u.ID)
		a.IDs[i] = a.IDs[len(a.IDs)-1]
		a.IDs = a.IDs[:len(a.IDs)-1]
		change, commit = index.Delete(u), a.c.B().Hdel().Key(a.db).Field(u.ID).Build()
	default:
		old := a.Users[a.IDs[a.rng.IntN(len(a.IDs))]]
		u := old
		what := a.rng.IntN(7) + 1 // a non-empty subset of email, score, country
		if what&1 != 0 {
			u.Email = fmt.Sprintf("%s.%d@example.com", u.ID, a.rng.IntN(1_000_000))
		}
		if what&2 != 0 {
			u.Score = float64(a.rng.IntN(1_000_000))
		}
		if what&4 != 0 {
			u.Country = fmt.Sprintf("c%02d", a.rng.IntN(a.countries))
		}
		a.Users[u.ID] = u
		change, commit = index.Update(old, u), a.c.B().Hset().Key(a.db).FieldValue().FieldValue(u.ID, EncodeUser(u)).Build()
	}
	// Commit to the source of truth first, then apply.
	if err := a.c.Do(ctx, commit).Error(); err != nil {
		return err
	}
	if a.Before != nil {
		a.Before(change)
	}
	a.Pending = append(a.Pending, change)
	return a.Flush(ctx)
}

// Flush applies the changes committed and not applied yet, in order.
func (a *App) Flush(ctx context.Context) error {
	for len(a.Pending) > 0 {
		err := a.Rebuilder.Apply(ctx, a.Pending[0])
		if a.Patient && errors.Is(err, rebuild.ErrInProgress) {
			return nil
		}
		if err != nil {
			return err
		}
		a.Pending = a.Pending[1:]
		a.Applied.Add(1)
	}
	return nil
}

// Steps makes n changes.
func (a *App) Steps(ctx context.Context, n int) error {
	for range n {
		if err := a.Step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// RunUntil makes changes until stop is closed, each after wait returns
// (nil: as fast as it can); an error of wait ends it.
func (a *App) RunUntil(ctx context.Context, stop <-chan struct{}, wait func(context.Context) error) error {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		if wait != nil {
			if err := wait(ctx); err != nil {
				return err
			}
		}
		if err := a.Step(ctx); err != nil {
			return err
		}
	}
}

// IsCatchUpRead reports whether multi is a catch-up's read of its logs: a
// readlog script (the length and the counts) and an LRANGE of the entries
// of each.
func IsCatchUpRead(multi []rueidis.Completed) bool {
	if len(multi) == 0 {
		return false
	}
	// Sent as EVAL (protocol.ReadLogCommands); its text, not its SHA1, which
	// FIPS 140-only mode does not allow.
	args := multi[0].Commands()
	return len(args) > 1 && args[0] == "EVAL" && args[1] == protocol.Source("readlog")
}

// OnlineIndexes are the keys of the online model: the source of truth and
// its three indexes, a hash of emails (email → id), a sorted set of scores
// (id → score) and a set index of countries (<Family>:<country> → ids).
type OnlineIndexes struct{ DB, Hash, Zset, Family string }

// Builders returns the builders of the three indexes of k.
func (k OnlineIndexes) Builders() []index.Builder[User] {
	return []index.Builder[User]{
		builders.Hash(k.Hash, func(u User) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SortedSet(k.Zset, func(u User) (string, float64, bool) { return u.ID, u.Score, true }),
		builders.SetIndex(k.Family, func(u User) (string, string, bool) { return u.Country, u.ID, true }),
	}
}

// OnlineDiff compares the indexes of k with the source of truth and
// returns the entries lost (missing, or with another value) and the stale
// ones (that should be gone, or with a TTL), described and sorted, and the
// number of users.
func OnlineDiff(t testing.TB, c rueidis.Client, k OnlineIndexes) (lost, stale []string, users int) {
	t.Helper()
	truth, err := ReadTruth(Ctx(t), c, k.DB)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, u := range truth {
		want["hash field "+u.Email] = u.ID
		want["sorted-set member "+u.ID] = strconv.FormatFloat(u.Score, 'g', -1, 64)
		want["bucket "+k.Family+":"+u.Country+" "+u.ID] = ""
	}
	got := map[string]string{}
	for f, v := range HGetAll(t, c, k.Hash) {
		got["hash field "+f] = v
	}
	for m, s := range ZScores(t, c, k.Zset) {
		got["sorted-set member "+m] = strconv.FormatFloat(s, 'g', -1, 64)
	}
	buckets := LiveKeys(t, c, k.Family+":")
	for _, b := range buckets {
		for _, m := range SMembers(t, c, b) {
			got["bucket "+b+" "+m] = ""
		}
	}
	for _, key := range append(buckets, k.Hash, k.Zset) {
		if pttl := PTTL(t, c, key); pttl != -1 {
			stale = append(stale, fmt.Sprintf("%s has PTTL %v, want none", key, pttl))
		}
	}
	for e, v := range want {
		if g, ok := got[e]; !ok || g != v {
			lost = append(lost, fmt.Sprintf("%s: got %q, want %q", e, g, v))
		}
	}
	for e, g := range got {
		if _, ok := want[e]; !ok {
			stale = append(stale, fmt.Sprintf("%s = %q", e, g))
		}
	}
	slices.Sort(lost)
	slices.Sort(stale)
	return lost, stale, len(truth)
}

// WantOnline fails t unless the indexes of k hold exactly what the source
// of truth holds, each key without a TTL, naming the first ten entries that
// differ, and returns the counts.
func WantOnline(t testing.TB, c rueidis.Client, k OnlineIndexes) (lost, stale int) {
	t.Helper()
	l, s, users := OnlineDiff(t, c, k)
	t.Logf("%d users: %d lost changes, %d stale entries", users, len(l), len(s))
	for i, d := range append(l, s...) {
		if i == 10 {
			t.Errorf("... and %d more", len(l)+len(s)-10)
			break
		}
		t.Error(d)
	}
	return len(l), len(s)
}

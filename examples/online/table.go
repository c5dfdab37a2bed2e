package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
)

// user is a row of the users table.
type user struct {
	ID, Email, Country string
	Score              float64
}

var countries = []string{"de", "es", "fr", "it", "nl", "pl", "pt", "se"}

// table is the source of truth: the application's users table.
type table struct {
	mu    sync.Mutex
	users map[string]user
	ids   []string // the keys of users, for picking one at random
	next  int
	rng   *rand.Rand
}

func newTable(n int) *table {
	t := &table{users: map[string]user{}, rng: rand.New(rand.NewPCG(1, 2))}
	for range n {
		t.insertLocked()
	}
	return t
}

func (t *table) newUserLocked() user {
	t.next++
	return user{
		ID:      fmt.Sprintf("u%07d", t.next),
		Email:   fmt.Sprintf("user%07d@example.com", t.next),
		Country: countries[t.rng.IntN(len(countries))],
		Score:   float64(t.rng.IntN(100_000)),
	}
}

func (t *table) insertLocked() user {
	u := t.newUserLocked()
	t.users[u.ID] = u
	t.ids = append(t.ids, u.ID)
	return u
}

// snapshot returns every user, in id order: what a query of the table
// returns.
func (t *table) snapshot() []user {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]user, 0, len(t.users))
	for _, id := range slices.Sorted(maps.Keys(t.users)) {
		out = append(out, t.users[id])
	}
	return out
}

func (t *table) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.users)
}

// change commits one random change to the table and returns it: an insert,
// a delete, or an update of a user's email, score or country.
func (t *table) change() index.Change[user] {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch roll := t.rng.IntN(10); {
	case roll == 0 || len(t.ids) == 0:
		return index.Insert(t.insertLocked())
	case roll == 1:
		i := t.rng.IntN(len(t.ids))
		old := t.users[t.ids[i]]
		delete(t.users, old.ID)
		t.ids[i] = t.ids[len(t.ids)-1]
		t.ids = t.ids[:len(t.ids)-1]
		return index.Delete(old)
	default:
		old := t.users[t.ids[t.rng.IntN(len(t.ids))]]
		u := old
		switch t.rng.IntN(3) {
		case 0:
			u.Email = fmt.Sprintf("%s.%d@example.org", u.ID, t.rng.IntN(1_000_000))
		case 1:
			u.Score = float64(t.rng.IntN(100_000))
		default:
			u.Country = countries[t.rng.IntN(len(countries))]
		}
		t.users[u.ID] = u
		return index.Update(old, u)
	}
}

// writer is the application: it changes users in the table, and applies
// each change to the indexes, in the order it committed them.
type writer struct {
	table     *table
	app       *rebuild.Rebuilder[user]
	perSecond float64
	applied   atomic.Int64
}

func (w *writer) run(ctx context.Context) error {
	lim := rate.NewLimiter(rate.Limit(w.perSecond), 1)
	for {
		if err := lim.Wait(ctx); err != nil {
			return err
		}
		// Commit first, then apply: a rebuild whose source read the table
		// before this commit replays the change; one that reads it after
		// sees it in its source. A change committed is applied even if the
		// program is stopping: the table and the indexes must agree.
		c := w.table.change()
		if err := w.app.Apply(context.WithoutCancel(ctx), c); err != nil {
			return err
		}
		w.applied.Add(1)
	}
}

// waitFor waits until n changes were applied.
func (w *writer) waitFor(ctx context.Context, n int64) error {
	for w.applied.Load() < n {
		if err := ctx.Err(); err != nil {
			return err
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

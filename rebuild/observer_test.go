package rebuild_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// recorder is an Observer that records what it is told.
type recorder struct {
	mu        sync.Mutex
	started   []string
	phases    []rebuild.Phase
	items     int64
	entries   int64
	batches   int
	published int
	ended     int
	endErr    error
	endStats  rebuild.Stats
}

func (r *recorder) Start(_ context.Context, key string) rebuild.RunObserver {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started = append(r.started, key)
	return r
}
func (r *recorder) Phase(p rebuild.Phase) { r.mu.Lock(); r.phases = append(r.phases, p); r.mu.Unlock() }
func (r *recorder) Batch(items, entries int64) {
	r.mu.Lock()
	r.items, r.entries, r.batches = r.items+items, r.entries+entries, r.batches+1
	r.mu.Unlock()
}
func (r *recorder) Published(pause time.Duration) {
	r.mu.Lock()
	if pause > 0 {
		r.published++
	}
	r.mu.Unlock()
}
func (r *recorder) End(s rebuild.Stats, err error) {
	r.mu.Lock()
	r.ended, r.endErr, r.endStats = r.ended+1, err, s
	r.mu.Unlock()
}

func TestObserverSeesTheRun(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "observed"
		rec := &recorder{}
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 100, Observer: rec},
			builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
		stats, err := r.Run(redistest.Ctx(t), sources.Slice(users(250)))
		if err != nil {
			t.Fatal(err)
		}
		want := []rebuild.Phase{rebuild.PhaseBuilding, rebuild.PhaseCatchingUp, rebuild.PhasePublishing}
		if !slices.Equal(rec.started, []string{key}) || !slices.Equal(rec.phases, want) {
			t.Errorf("started %v, phases %v; want [%s] and %v", rec.started, rec.phases, key, want)
		}
		if rec.items != 250 || rec.entries != 250 || int64(rec.batches) != stats.Batches || rec.published != 1 {
			t.Errorf("items %d, entries %d, batches %d (Stats %d), publishes %d; want 250, 250, 3, 1", rec.items, rec.entries, rec.batches, stats.Batches, rec.published)
		}
		if rec.ended != 1 || rec.endErr != nil || rec.endStats.Items != 250 {
			t.Errorf("End: %d calls, err %v, %d items; want one, nil, 250", rec.ended, rec.endErr, rec.endStats.Items)
		}

		// A run that panics ends failed, and the panic goes on.
		rec = &recorder{}
		r = redistest.Rebuilder(t, d.Client, rebuild.Options{Observer: rec},
			builders.Func(key, func(*index.Commands, []user) error { panic("boom") }))
		func() {
			defer func() {
				if recover() == nil {
					t.Error("the builder's panic did not reach the caller")
				}
			}()
			_, _ = r.Run(redistest.Ctx(t), sources.Slice(users(3)))
		}()
		if rec.ended != 1 || rec.endErr == nil {
			t.Errorf("End after a panic: %d calls, err %v; want one, with an error", rec.ended, rec.endErr)
		}
		// A run that cannot take its locks ends with that error.
		rec = &recorder{}
		r = redistest.Rebuilder(t, d.Client, rebuild.Options{Observer: rec},
			builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
		lock := keys.LockKey(key, d.Cluster)
		redistest.Do(t, d.Other, d.Other.B().Set().Key(lock).Value("someone-else").Ex(time.Minute).Build())
		if _, err := r.Run(redistest.Ctx(t), sources.Slice(users(3))); !errors.Is(err, rebuild.ErrInProgress) || !errors.Is(rec.endErr, rebuild.ErrInProgress) {
			t.Errorf("Run %v, End %v; want ErrInProgress for both", err, rec.endErr)
		}
		redistest.Do(t, d.Other, d.Other.B().Del().Key(lock).Build())
	})
}

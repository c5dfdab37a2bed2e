package rebuild_test

// Apply during a run in Generations mode (C95): the change is written to
// the current generation and logged for the run, which replays it onto its
// own generation before its flip.

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
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

// genChanges returns the changes of TestGenerationsApplyDuringRun to us:
// inserts of new users, updates that move users to another bucket, and
// deletes; and us with them applied, in the order given.
func genChanges(us []user, buckets int) (changes []index.Change[user], after []user) {
	byID := map[string]user{}
	order := []string{}
	for _, u := range us {
		byID[u.ID] = u
		order = append(order, u.ID)
	}
	extra := genUsers(len(us)+20, buckets)[len(us):]
	for i := range extra {
		u := extra[i]
		changes = append(changes, index.Change[user]{New: &u})
		byID[u.ID] = u
		order = append(order, u.ID)
	}
	for i := range 20 {
		old, moved := us[i], us[i]
		moved.Country = fmt.Sprintf("b%02d", (i+1)%buckets)
		changes = append(changes, index.Change[user]{Old: &old, New: &moved})
		byID[moved.ID] = moved
	}
	for i := 20; i < 40; i++ {
		old := us[i]
		changes = append(changes, index.Change[user]{Old: &old})
		delete(byID, old.ID)
	}
	for _, id := range order {
		if u, ok := byID[id]; ok {
			after = append(after, u)
		}
	}
	return changes, after
}

// pausedSource yields us, calling start after the item at index from and
// wait after the item at index to.
func pausedSource(us []user, from, to int, start, wait func()) sources.Source[user] {
	return func(ctx context.Context) iter.Seq2[user, error] {
		return func(yield func(user, error) bool) {
			for j, u := range us {
				if !yield(u, nil) {
					return
				}
				switch j {
				case from:
					start()
				case to:
					wait()
				}
			}
		}
	}
}

// applying applies changes, in order, from a goroutine.
type applying struct {
	r       *rebuild.Rebuilder[user]
	changes []index.Change[user]
	wg      sync.WaitGroup
	err     error // the first Apply's error, once wg is done
}

// start starts applying the changes.
func (a *applying) start(ctx context.Context) {
	a.wg.Go(func() {
		for _, c := range a.changes {
			if err := a.r.Apply(ctx, c); err != nil {
				a.err = err
				return
			}
		}
	})
}

func TestGenerationsApplyDuringRun(t *testing.T) {
	// C95, C88, C94, C97: changes applied from a goroutine while a
	// Generations run builds (inserts, updates that move an item to
	// another bucket, deletes) are written to the current generation and
	// logged; the run replays them onto its generation, whose size check
	// they do not fail, and the published generation equals the source
	// plus the changes. A change logged between the last catch-up and the
	// flip is replayed by the flip itself, in its one attempt (the keys
	// share the locks' slot). A change applied after the flip lands in the
	// new generation. On the cluster the family carries a hash tag (the
	// locks' slot).
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		prefix := d.Prefix + "users:by-bucket"
		const buckets = 10
		us := genUsers(300, buckets)
		changes, after := genChanges(us, buckets)
		late := genUsers(len(us)+21, buckets)[len(us)+20]
		after = append(after, late)

		var mu sync.Mutex
		var armed bool // the second run's
		var phases []rebuild.Phase
		var lateErr error
		var r *rebuild.Rebuilder[user]
		r = genRebuilder(t, d, prefix, rebuild.Options{Progress: func(p rebuild.Progress) {
			mu.Lock()
			phases = append(phases, p.Phase)
			first := armed && p.Phase == rebuild.PhasePublishing && !slices.Contains(phases[:len(phases)-1], rebuild.PhasePublishing)
			mu.Unlock()
			if first {
				// Between the last catch-up and the flip.
				lateErr = r.Apply(ctx, index.Change[user]{New: &late})
			}
		}})
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("first Run: %v", err)
		}
		mu.Lock()
		phases, armed = nil, true
		mu.Unlock()

		a := &applying{r: r, changes: changes}
		stats, err := r.Run(ctx, pausedSource(us, 50, 250, func() { a.start(ctx) }, a.wg.Wait))
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if applyErr := a.err; applyErr != nil {
			t.Fatalf("Apply during the run: %v", applyErr)
		}
		if lateErr != nil {
			t.Fatalf("Apply before the flip: %v", lateErr)
		}
		if want := int64(len(changes) + 1); stats.Changes != want {
			t.Errorf("Stats.Changes = %d, want %d", stats.Changes, want)
		}
		mu.Lock()
		got := slices.Clone(phases)
		mu.Unlock()
		if at := slices.Index(got, rebuild.PhasePublishing); at < 0 || at != len(got)-1 {
			t.Errorf("phases %v: want one publish, last", got)
		}
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, after)
		wantNoGeneration(t, d, prefix, 1)
		wantGenClean(t, d, prefix, 2)

		// After the flip: the new generation.
		gone := after[0]
		if err := r.Apply(ctx, index.Change[user]{Old: &gone}); err != nil {
			t.Fatalf("Apply after the flip: %v", err)
		}
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, after[1:])
		wantGenClean(t, d, prefix, 2)
	})
}

func TestGenerationsApplyForgedRecord(t *testing.T) {
	// C95, C74, C96: while a Generations run holds the lock, a record that
	// does not carry the lock's token makes Apply refuse the whole change
	// with ErrInProgress, writing nothing, as in RenameInPlace mode (and
	// across slots, at the first step); the run then fails closed with
	// ErrTampered, the pointer untouched.
	forEachShape(t, func(t *testing.T, d deployment, prefix string) {
		ctx := redistest.Ctx(t)
		r := genRebuilder(t, d, prefix, rebuild.Options{})
		us := genUsers(60, 3)
		h := runThenBuild(ctx, t, r, us)
		lock := keys.LockKey(prefix, d.Cluster)
		redistest.Cmd(t, d.Other, "HSET", keys.RecordKey(lock), "token", "forged")
		before := redistest.Snapshot(t, d.Other, keys.GenPrefix(prefix, 1))
		extra := genUsers(61, 3)[60]
		err := r.Apply(ctx, index.Change[user]{New: &extra})
		redistest.WantErr(t, err, rebuild.ErrInProgress)
		t.Logf("Apply: %v", err)
		redistest.WantUnchanged(t, d.Other, keys.GenPrefix(prefix, 1), before)
		if n, err := redistest.Cmd(t, d.Other, "LLEN", keys.LogKey(lock)).AsInt64(); err != nil || n != 0 {
			t.Errorf("LLEN %s = %d, %v; want 0", keys.LogKey(lock), n, err)
		}
		_, err = h.Publish(ctx)
		redistest.WantErr(t, err, rebuild.ErrTampered)
		t.Logf("Publish: %v", err)
		wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent}, us)
		wantNoGeneration(t, d, prefix, 2)
		wantGenClean(t, d, prefix, 1)
	})
}

func TestGenerationsApplyConditionalRemovals(t *testing.T) {
	// C95, C94: the conditional removals of a Hash's and a SortedSet's
	// Diff (HDELIF, ZREMIF), logged during a Generations run, are replayed
	// by a script onto the run's generation: they leave their keys out of
	// the size check, so that a correct run does not fail it, and the
	// published generation holds the source plus the changes.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		email, score := d.Prefix+"users:by-email", d.Prefix+"users:by-score"
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{Publish: rebuild.Generations, Grace: time.Millisecond, BatchSize: 50},
			builders.Hash(email, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
			builders.SortedSet(score, func(u user) (string, float64, bool) { return u.ID, u.Score, true }))
		us := users(200)
		changes, after := movesAndDeletes(us)
		a := &applying{r: r, changes: changes}
		stats, err := r.Run(ctx, pausedSource(us, 10, 150, func() { a.start(ctx) }, a.wg.Wait))
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if applyErr := a.err; applyErr != nil {
			t.Fatalf("Apply during the run: %v", applyErr)
		}
		// One log entry per change and index.
		if stats.Changes != int64(2*len(changes)) {
			t.Errorf("Stats.Changes = %d, want %d", stats.Changes, 2*len(changes))
		}
		wantEmailScore(t, d, email, score, 1, slices.Collect(maps.Values(after)))
		redistest.WantString(t, d.Other, keys.PointerKey(email, d.Cluster), "1")
		redistest.WantString(t, d.Other, keys.PointerKey(score, d.Cluster), "1")
		for _, l := range []string{email, score} {
			for _, k := range redistest.Keys(t, d.Other, keys.LockKey(l, d.Cluster)) {
				t.Errorf("left behind: %s", k)
			}
		}
	})
}

func TestGenerationsApplyLogFull(t *testing.T) {
	// C95, C96: past Options.MaxChanges entries in the log, Apply still
	// writes the current generation (with a hash tag or across slots),
	// and the run fails with ErrFallingBehind, the pointer untouched and
	// its generation removed.
	forEachShape(t, func(t *testing.T, d deployment, prefix string) {
		ctx := redistest.Ctx(t)
		r := genRebuilder(t, d, prefix, rebuild.Options{MaxChanges: 3})
		us := genUsers(60, 3)
		h := runThenBuild(ctx, t, r, us)
		more := genUsers(65, 3)[60:]
		for i := range more {
			if err := r.Apply(ctx, index.Change[user]{New: &more[i]}); err != nil {
				t.Fatalf("Apply %d: %v", i, err)
			}
		}
		_, err := h.Publish(ctx)
		redistest.WantErr(t, err, rebuild.ErrFallingBehind)
		t.Logf("Publish: %v", err)
		wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent}, append(slices.Clone(us), more...))
		wantNoGeneration(t, d, prefix, 2)
		wantGenClean(t, d, prefix, 1)
	})
}

// movesAndDeletes returns the changes of the tests of a Hash by email and a
// SortedSet by score: us[:20] change email and score, us[20:40] are
// deleted; and us with them applied, by ID.
func movesAndDeletes(us []user) ([]index.Change[user], map[string]user) {
	var changes []index.Change[user]
	after := map[string]user{}
	for _, u := range us {
		after[u.ID] = u
	}
	for i := range 20 {
		old, moved := us[i], us[i]
		moved.Email = "moved." + old.Email
		moved.Score = old.Score + 1000
		changes = append(changes, index.Change[user]{Old: &old, New: &moved})
		after[moved.ID] = moved
	}
	for i := 20; i < 40; i++ {
		old := us[i]
		changes = append(changes, index.Change[user]{Old: &old})
		delete(after, old.ID)
	}
	return changes, after
}

// wantEmailScore checks that generation gen of the Hash email and the
// SortedSet score holds exactly the entries of us.
func wantEmailScore(t *testing.T, d deployment, email, score string, gen int64, us []user) {
	t.Helper()
	emails, scores := map[string]string{}, map[string]float64{}
	for _, u := range us {
		emails[u.Email], scores[u.ID] = u.ID, u.Score
	}
	redistest.WantHash(t, d.Other, keys.GenKey(email, gen), emails)
	if got := redistest.ZScores(t, d.Other, keys.GenKey(score, gen)); !maps.Equal(got, scores) {
		t.Errorf("%s holds %d members, want %d", keys.GenKey(score, gen), len(got), len(scores))
	}
}

// applyUntilDone applies change with r until Apply returns nil, as after a
// cut connection, where the first tries may go out on the broken one:
// each failed try must match ErrOutcomeUnknown.
func applyUntilDone(ctx context.Context, t *testing.T, r *rebuild.Rebuilder[user], change index.Change[user]) {
	t.Helper()
	for try := 1; ; try++ {
		err := r.Apply(ctx, change)
		if err == nil {
			return
		}
		if !errors.Is(err, rebuild.ErrOutcomeUnknown) || try == 10 {
			t.Fatalf("Apply again (try %d): %v", try, err)
		}
	}
}

// forEachShape runs f per deployment for a family with a hash tag on the
// cluster ("tagged": every key in the locks' slot, one script per change)
// and one without ("spread": its buckets over every slot, a change in
// steps across slots, C96; on the standalone server the same one script),
// each with a prefix of its own.
func forEachShape(t *testing.T, f func(t *testing.T, d deployment, prefix string)) {
	t.Helper()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		t.Run("tagged", func(t *testing.T) {
			d := ownPrefix(t, d)
			d.Clear(t) // an earlier go test -count=N left keys under the same names
			f(t, d, d.Prefix+"users:by-bucket")
		})
		t.Run("spread", func(t *testing.T) {
			d := ownPrefix(t, d)
			d.Clear(t)
			f(t, d, genPrefix(d))
		})
	})
}

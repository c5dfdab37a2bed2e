package rebuild_test

// The flip under a steady stream of Apply: in the locks' slot it replays
// the tail of the log itself (C97); across slots the run cuts over, and
// Apply waits for it (C98).

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// steady applies changes with r from goroutines, one after the other
// without a pause, until stop: inserts of new users, and every third change
// a move of the goroutine's last user to another bucket. It keeps each
// user as the last change that returned nil left it: the application's
// data, which a run's source reads (source).
type steady struct {
	r       *rebuild.Rebuilder[user]
	buckets int
	stopped chan struct{}
	wg      sync.WaitGroup
	// txn is held for reading by each change from its Apply until it is
	// kept, and for writing by a read of the data: as a database's
	// transactions, a read sees every change that returned before it,
	// and none in flight.
	txn     sync.RWMutex
	mu      sync.Mutex
	users   map[string]user
	order   []string
	applied atomic.Int64
	slowest atomic.Int64 // the longest Apply, in nanoseconds
	err     error        // the first Apply's error
}

// startSteady starts n goroutines applying changes with r, and returns
// once each has applied one.
func startSteady(ctx context.Context, t testing.TB, r *rebuild.Rebuilder[user], n, buckets int) *steady {
	t.Helper()
	s := &steady{r: r, buckets: buckets, stopped: make(chan struct{}), users: map[string]user{}}
	for g := range n {
		s.wg.Go(func() { s.apply(ctx, g) })
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.applied.Load() < int64(n) {
		if s.failed() != nil || time.Now().After(deadline) {
			s.stop()
			t.Fatalf("Apply before the run: %d applied, error %v", s.applied.Load(), s.failed())
		}
		pollPause()
	}
	return s
}

// apply is goroutine g of s.
func (s *steady) apply(ctx context.Context, g int) {
	var last *user
	for k := 0; ; k++ {
		select {
		case <-s.stopped:
			return
		default:
		}
		c := index.Change[user]{}
		u := user{ID: fmt.Sprintf("s%d-%06d", g, k), Country: fmt.Sprintf("b%02d", k%s.buckets)}
		if last != nil && k%3 == 2 {
			moved := *last
			moved.Country = fmt.Sprintf("b%02d", (k+1)%s.buckets)
			c.Old, c.New, u = last, &moved, moved
		} else {
			c.New = &u
		}
		s.txn.RLock()
		began := time.Now()
		err := s.r.Apply(ctx, c)
		took := int64(time.Since(began))
		for old := s.slowest.Load(); took > old && !s.slowest.CompareAndSwap(old, took); old = s.slowest.Load() {
		}
		s.mu.Lock()
		if err != nil && s.err == nil {
			s.err = fmt.Errorf("goroutine %d, change %d: %w", g, k, err)
		}
		if err == nil {
			if _, ok := s.users[u.ID]; !ok {
				s.order = append(s.order, u.ID)
			}
			s.users[u.ID] = u
		}
		s.mu.Unlock()
		s.txn.RUnlock()
		if err != nil {
			return
		}
		s.applied.Add(1)
		last = &u
	}
}

// source returns a source of base and the users the changes left, read
// when the run pulls it (once it holds its locks): as an application's
// source reads its database, which holds every change applied before.
func (s *steady) source(base []user) sources.Source[user] {
	return func(ctx context.Context) iter.Seq2[user, error] {
		s.txn.Lock()
		all := append(slices.Clone(base), s.snapshot()...)
		s.txn.Unlock()
		return sources.Slice(all)(ctx)
	}
}

// snapshot returns the users as the changes kept so far left them.
func (s *steady) snapshot() []user {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]user, 0, len(s.order))
	for _, id := range s.order {
		out = append(out, s.users[id])
	}
	return out
}

// failed returns the first Apply's error.
func (s *steady) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// stop stops the goroutines, and returns the users as the changes left
// them.
func (s *steady) stop() []user {
	close(s.stopped)
	s.wg.Wait()
	return s.snapshot()
}

func TestGenerationsFlipUnderSteadyApply(t *testing.T) {
	// C97, C98, C95: while goroutines apply changes without a pause
	// (inserts, and moves between buckets) before, during and after a
	// Generations run, the run flips in at most 3 attempts: with the keys
	// in the locks' slot (standalone, or a family with a hash tag) the flip
	// replays the tail of the log onto the new generation itself; across
	// slots the run cuts over, Apply waits on its mark, and the flip
	// deletes the mark. The new generation then holds the source plus
	// every change that returned nil, and nothing is left: no lock, log,
	// mark, counter or old generation.
	forEachShape(t, func(t *testing.T, d deployment, prefix string) {
		ctx := redistest.Ctx(t)
		rec := &recorder{}
		const buckets = 10
		r := genRebuilder(t, d, prefix, rebuild.Options{Observer: rec})
		us := genUsers(300, buckets)
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("first Run: %v", err)
		}
		rec.mu.Lock()
		rec.published = 0
		rec.mu.Unlock()

		s := startSteady(ctx, t, r, 2, buckets)
		before := s.applied.Load()
		stats, err := r.Run(ctx, s.source(us))
		during := s.applied.Load() - before
		// Changes after the flip: to the new generation.
		for s.applied.Load() < before+during+10 && s.failed() == nil {
			pollPause()
		}
		applied := s.stop()
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if err := s.failed(); err != nil {
			t.Fatalf("Apply: %v", err)
		}
		rec.mu.Lock()
		attempts := rec.published
		rec.mu.Unlock()
		t.Logf("%d changes applied during the run, %d replayed by it; %d attempts to flip", during, stats.Changes, attempts)
		if attempts < 1 || attempts > 3 {
			t.Errorf("the run flipped in %d attempts, want 1 to 3", attempts)
		}
		if during == 0 || stats.Changes == 0 {
			t.Errorf("%d changes applied during the run, %d replayed: the test did not test", during, stats.Changes)
		}
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, append(slices.Clone(us), applied...))
		wantNoGeneration(t, d, prefix, 1)
		wantGenClean(t, d, prefix, 2)
	})
}

// pollPause is the pause between two reads of a counter that a test polls
// until a deadline.
func pollPause() { time.Sleep(time.Millisecond) }

// genSetIndex is genRebuilder's builder.
func genSetIndex(prefix string) index.Builder[user] {
	return builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true })
}

// scriptReply is a hook that calls on with the reply of every run of the
// script named name that the client sends.
func scriptReply(c rueidis.Client, name string, on func(res rueidis.RedisResult)) rueidis.Client {
	script := redistest.ScriptNamed(name)
	return rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			is := script.Is(cmd.Commands())
			res := c.Do(ctx, cmd)
			if is {
				on(res)
			}
			return res
		},
	})
}

// isWait reports whether res is a script's WAIT reply.
func isWait(res rueidis.RedisResult) bool {
	a, err := res.ToArray()
	if err != nil || len(a) == 0 {
		return false
	}
	code, err := a[0].AsInt64()
	return err == nil && code == protocol.Code("WAIT")
}

func TestGenerationsCutOverMarkOutlivesRun(t *testing.T) {
	// C98: a run across slots that dies right after it set its cut-over
	// mark (its connection gone: its flip, its cleanup and its release
	// never reach Redis) holds Apply back only until the mark's PX ends:
	// an Apply that meets the mark waits, then applies the change (logged
	// for the dead run, whose lock is still held, and written to the
	// current generation); an Apply whose ctx ends while it waits returns
	// the cause, having written and logged nothing. Once the lock expires,
	// a sweep removes the dead run's generation and nothing is left. On the
	// standalone server the run's keys share the locks' slot: it sets no
	// mark, and its flip replays the change itself (C97).
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d = ownPrefix(t, d)
		d.Clear(t)
		prefix := genPrefix(d)
		ctx := redistest.Ctx(t)
		const buckets = 3
		us := genUsers(60, buckets)
		r := genRebuilder(t, d, prefix, rebuild.Options{})
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("first Run: %v", err)
		}
		lock := keys.LockKey(prefix, d.Cluster)
		mark := keys.CutOverKey(lock)
		first := user{ID: "first", Country: "b00"}
		second := user{ID: "second", Country: "b01"}
		third := user{ID: "third", Country: "b02"}

		// Applies that meet the mark: one waits it out, one is cancelled
		// as it waits.
		var waitedOut, cancelledWaits atomic.Int64
		waiting := redistest.Rebuilder(t, scriptReply(d.Client, "genlog", func(res rueidis.RedisResult) {
			if isWait(res) {
				waitedOut.Add(1)
			}
		}), rebuild.Options{Publish: rebuild.Generations},
			genSetIndex(prefix))
		tctx := ctx // the test's: the hook's ctx is the run's
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cancelled := redistest.Rebuilder(t, scriptReply(d.Client, "genlog", func(res rueidis.RedisResult) {
			if isWait(res) {
				cancelledWaits.Add(1)
				cancel()
			}
		}), rebuild.Options{Publish: rebuild.Generations}, genSetIndex(prefix))
		var applies sync.WaitGroup
		var secondErr, thirdErr error
		var px string

		// The dying run: every command after the SET of its mark fails.
		dead := errors.New("injected: the process died")
		var died atomic.Bool
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if died.Load() {
					return rueidis.NewErrorResult(dead)
				}
				args := slices.Clone(cmd.Commands())
				res := c.Do(ctx, cmd)
				if len(args) > 1 && args[0] == "SET" && args[1] == mark && res.Error() == nil {
					died.Store(true)
					px = args[len(args)-1]
					applies.Go(func() { secondErr = waiting.Apply(tctx, index.Change[user]{New: &second}) })
					applies.Go(func() { thirdErr = cancelled.Apply(cctx, index.Change[user]{New: &third}) })
				}
				return res
			},
			OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				if died.Load() {
					out := make([]rueidis.RedisResult, len(multi))
					for i := range out {
						out[i] = rueidis.NewErrorResult(dead)
					}
					return out
				}
				return c.DoMulti(ctx, multi...)
			},
		})
		var once sync.Once
		var firstErr error
		dying := redistest.Rebuilder(t, hooked, rebuild.Options{
			Publish: rebuild.Generations, BatchSize: 50, Grace: 50 * time.Millisecond, TTL: 3 * time.Second,
			Progress: func(p rebuild.Progress) {
				if p.Phase == rebuild.PhasePublishing {
					// Between the last catch-up and the first flip.
					once.Do(func() { firstErr = r.Apply(ctx, index.Change[user]{New: &first}) })
				}
			},
		}, genSetIndex(prefix))
		_, err := dying.Run(ctx, sources.Slice(us))
		applies.Wait()
		if firstErr != nil {
			t.Fatalf("Apply before the flip: %v", firstErr)
		}
		if !d.Cluster {
			if err != nil || died.Load() {
				t.Fatalf("Run: %v (mark set: %v), want a flip that replays the change, without a mark", err, died.Load())
			}
			wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, append(slices.Clone(us), first))
			wantGenClean(t, d, prefix, 2)
			return
		}
		if !died.Load() {
			t.Fatalf("Run: %v; the run set no cut-over mark", err)
		}
		redistest.WantErr(t, err, dead)
		t.Logf("Run: %v; the mark's PX %s ms", err, px)
		if ms, perr := time.ParseDuration(px + "ms"); perr != nil || ms < 250*time.Millisecond || ms > 5*time.Second {
			t.Errorf("the mark's PX is %q ms, want 250 to 5000", px)
		}
		if secondErr != nil {
			t.Errorf("Apply that met the mark: %v, want nil once the mark is gone", secondErr)
		}
		if waitedOut.Load() == 0 {
			t.Errorf("the Apply met no mark: the test did not test")
		}
		redistest.WantErr(t, thirdErr, context.Canceled)
		if cancelledWaits.Load() != 1 {
			t.Errorf("the cancelled Apply met the mark %d times, want 1", cancelledWaits.Load())
		}
		t.Logf("cancelled Apply: %v", thirdErr)
		if ttl := redistest.PTTL(t, d.Other, mark); ttl != -2 {
			t.Errorf("%s has a PTTL of %v after the Apply that waited for it, want gone", mark, ttl)
		}
		// The change is in the current generation (and logged for the dead
		// run); the cancelled one nowhere.
		redistest.WantString(t, d.Other, keys.PointerKey(prefix, d.Cluster), "1")
		if reg := redistest.HGetAll(t, d.Other, keys.RegistryKey(prefix, d.Cluster)); len(reg) != 3 || reg["1"] != keys.RegCurrent || !strings.HasPrefix(reg["2"], "building:") {
			t.Errorf("registry %v, want 1 current and 2 building", reg)
		}
		wantBuckets(t, d, prefix, 1, append(slices.Clone(us), first, second))
		log, lerr := redistest.Cmd(t, d.Other, "LRANGE", keys.LogKey(lock), "0", "-1").AsStrSlice()
		if lerr != nil || len(log) != 2 || !strings.Contains(log[0], "first") || !strings.Contains(log[1], "second") {
			t.Errorf("%s holds %q (%v), want the first and second changes", keys.LogKey(lock), log, lerr)
		}

		// The lock expires, the counters after it; a sweep removes the
		// dead run's generation.
		deadline := time.Now().Add(20 * time.Second)
		for len(redistest.Keys(t, d.Other, lock)) > 0 || len(counters(t, d.Other, keys.Base(prefix, d.Cluster))) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("the dead run's keys outlived their TTL: %v", redistest.Keys(t, d.Other, lock))
			}
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := r.Sweep(ctx); err != nil {
			t.Fatalf("Sweep: %v", err)
		}
		wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent}, append(slices.Clone(us), first, second))
		wantGenClean(t, d, prefix, 1)
	})
}

// scriptsReply is scriptReply for the change scripts of Generations mode:
// genapply (one script) and genlog (the first step across slots, C96).
func scriptsReply(c rueidis.Client, on func(res rueidis.RedisResult)) rueidis.Client {
	return scriptReply(scriptReply(c, "genapply", on), "genlog", on)
}

func TestGenerationsApplyWaitsForCutOver(t *testing.T) {
	// C98: Apply answers a lock's cut-over mark that holds the lock's
	// token with a wait (with a hash tag and across slots): an Apply whose
	// ctx ends as it waits returns the cause, having written and logged
	// nothing; one that outlasts the mark applies the change. A mark of a
	// token the lock does not hold is ignored. The flip deletes the mark
	// that holds its token.
	forEachShape(t, func(t *testing.T, d deployment, prefix string) {
		ctx := redistest.Ctx(t)
		var waits atomic.Int64
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var cancelOnWait atomic.Bool
		client := scriptsReply(d.Client, func(res rueidis.RedisResult) {
			if isWait(res) {
				waits.Add(1)
				if cancelOnWait.Load() {
					cancel()
				}
			}
		})
		r := redistest.Rebuilder(t, client, rebuild.Options{Publish: rebuild.Generations, BatchSize: 50, Grace: time.Millisecond},
			genSetIndex(prefix))
		us := genUsers(60, 3)
		h := runThenBuild(ctx, t, r, us)
		lock := keys.LockKey(prefix, d.Cluster)
		mark := keys.CutOverKey(lock)
		token, _ := redistest.Get(t, d.Other, lock)
		extra := genUsers(63, 3)[60:]

		redistest.Cmd(t, d.Other, "SET", mark, "another run's", "PX", "60000")
		if err := r.Apply(ctx, index.Change[user]{New: &extra[0]}); err != nil || waits.Load() != 0 {
			t.Fatalf("Apply with a mark of another token: %v after %d waits, want nil and none", err, waits.Load())
		}

		redistest.Cmd(t, d.Other, "SET", mark, token, "PX", "60000")
		cancelOnWait.Store(true)
		err := r.Apply(cctx, index.Change[user]{New: &extra[1]})
		redistest.WantErr(t, err, context.Canceled)
		t.Logf("Apply cancelled as it waits: %v", err)
		cancelOnWait.Store(false)
		if n, err := redistest.Cmd(t, d.Other, "LLEN", keys.LogKey(lock)).AsInt64(); err != nil || n != 1 {
			t.Errorf("LLEN %s = %d, %v; want 1 (the first change only)", keys.LogKey(lock), n, err)
		}
		wantBuckets(t, d, prefix, 1, append(slices.Clone(us), extra[0]))

		waits.Store(0)
		redistest.Cmd(t, d.Other, "SET", mark, token, "PX", "300")
		if err := r.Apply(ctx, index.Change[user]{New: &extra[2]}); err != nil {
			t.Fatalf("Apply that outlasts the mark: %v", err)
		}
		t.Logf("the Apply that outlasted the mark met it %d times", waits.Load())
		if waits.Load() == 0 {
			t.Errorf("the Apply met no mark: the test did not test")
		}

		redistest.Cmd(t, d.Other, "SET", mark, token, "PX", "60000")
		stats, err := h.Publish(ctx)
		if err != nil {
			t.Fatalf("Publish: %v", err)
		}
		if stats.Changes != 2 {
			t.Errorf("Stats.Changes = %d, want 2", stats.Changes)
		}
		want := append(slices.Clone(us), extra[0], extra[2])
		wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent}, want)
		wantGenClean(t, d, prefix, 2) // the mark too
	})
}

func TestGenerationsFlipTailRefusals(t *testing.T) {
	// C97: the flip checks the tail it replays before any write, as the
	// rename publish does: an entry that is not a change (counted in the
	// record, so that the counts hold) or one that writes a key of
	// another builder fails the run with ErrTampered, naming the log and
	// the entry; the pointer is untouched and the run's generation
	// removed. With the keys in the locks' slot only: across slots the
	// catch-up reads every entry first, and fails the same way. C99: a
	// valid change whose bucket the flip would list in a manifest that is
	// not a set fails it the same way. The error says what the flip left:
	// every index at its generation (no live key is written in this mode).
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, tc := range []struct {
			name, entry, want string
			manifest          bool // the new generation's manifest is a string
		}{
			{"not a change", "4:SADD", "is not a change", false},
			{"another builder's key", "4:SADD9:elsewhere1:11:x", "not one of the keys of its builder", false},
			{"manifest not a set", "", "is a string", true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				d := ownPrefix(t, d)
				d.Clear(t)
				prefix := d.Prefix + "users:by-bucket"
				ctx := redistest.Ctx(t)
				lock := keys.LockKey(prefix, d.Cluster)
				entry := tc.entry
				if entry == "" {
					entry = protocol.EncodeEntry([]protocol.Op{{Cmd: "SADD", Key: prefix + ":b09", Args: []string{"late"}}})
				}
				var forge atomic.Bool
				r := genRebuilder(t, d, prefix, rebuild.Options{Progress: func(p rebuild.Progress) {
					if p.Phase == rebuild.PhasePublishing && forge.Load() {
						// Logged and counted as Apply logs, after the last
						// catch-up: the flip reads it.
						redistest.Cmd(t, d.Other, "RPUSH", keys.LogKey(lock), entry)
						redistest.Cmd(t, d.Other, "HINCRBY", keys.RecordKey(lock), "logged", "1")
						if tc.manifest {
							redistest.Cmd(t, d.Other, "SET", keys.ManifestKey(prefix, d.Cluster, 2), "x")
						}
					}
				}})
				us := genUsers(60, 3)
				h := runThenBuild(ctx, t, r, us)
				forge.Store(true)
				_, err := h.Publish(ctx)
				redistest.WantErr(t, err, rebuild.ErrTampered)
				if err != nil && !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Publish: %v, want it to say %q", err, tc.want)
				}
				if err != nil && !strings.HasSuffix(err.Error(), "; every index left at its generation") {
					t.Errorf("Publish: %v, want it to end with %q", err, "; every index left at its generation")
				}
				t.Logf("Publish: %v", err)
				wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent}, us)
				wantNoGeneration(t, d, prefix, 2)
				wantGenClean(t, d, prefix, 1)
			})
		}
	})
}

// runThenBuild publishes us with r, then builds them again and holds the
// run before its flip: its locks held, its log of changes open.
func runThenBuild(ctx context.Context, t *testing.T, r *rebuild.Rebuilder[user], us []user) *rebuild.Held[user] {
	t.Helper()
	if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	h, _, err := r.Build(ctx, sources.Slice(us))
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return h
}

func TestGenerationsFlipManifestNoRight(t *testing.T) {
	// C99, C93: the flip checks its SADD to a family's manifest before any
	// write, as it checks every op of its tail: a user who lost the right
	// (the acquire checked it) after the last catch-up fails the flip with
	// ErrNoPermission naming SADD and the manifest; the pointer is
	// untouched, the tail's bucket unwritten and the run's generation
	// removed.
	d := deployment{Name: "standalone", Client: env.Standalone.Client(t), Other: env.Standalone.Client(t)}
	ctx, d, prefix, us := published(t, d)
	c := clientAs(t, d, "~*", "+@all")
	name := "ks-" + strings.ReplaceAll(t.Name(), "/", "-")
	lock := keys.LockKey(prefix, d.Cluster)
	var forge atomic.Bool
	r := spreadRebuilder(t, c, prefix, rebuild.Options{Grace: 50 * time.Millisecond, Progress: func(p rebuild.Progress) {
		if p.Phase == rebuild.PhasePublishing && forge.CompareAndSwap(true, false) {
			// A change logged and counted as Apply logs it, after the
			// last catch-up; SADD left on the generations' keys alone.
			entry := protocol.EncodeEntry([]protocol.Op{{Cmd: "SADD", Key: prefix + ":b09", Args: []string{"late"}}})
			redistest.Cmd(t, d.Other, "RPUSH", keys.LogKey(lock), entry)
			redistest.Cmd(t, d.Other, "HINCRBY", keys.RecordKey(lock), "logged", "1")
			redistest.Cmd(t, d.Other, "ACL", "SETUSER", name, "-sadd", "(~*"+keys.GenInfix+"* +sadd)")
		}
	}})
	h, _, err := r.Build(ctx, sources.Slice(us))
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	forge.Store(true)
	_, err = h.Publish(ctx)
	redistest.WantErr(t, err, rebuild.ErrNoPermission)
	m := keys.ManifestKey(prefix, d.Cluster, 2)
	if err != nil && (!strings.Contains(err.Error(), "SADD") || !strings.Contains(err.Error(), m)) {
		t.Errorf("Publish: %v, want it to name SADD and %s", err, m)
	}
	t.Logf("Publish: %v", err)
	wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent}, us)
	wantNoGeneration(t, d, prefix, 2)
	wantGenClean(t, d, prefix, 1)
	redistest.WantAbsent(t, d.Other, m)
}

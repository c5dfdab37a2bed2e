package rebuild_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"golang.org/x/time/rate"
)

// The online tests rebuild three indexes of a source of truth while a
// writer changes it, and applies every change through a Rebuilder of the
// same indexes (Apply), as an application would. The source of truth is a
// hash in Redis, "<prefix>db": field the user's id, value
// "email|score|country". A run reads it whole (HGETALL) when its source
// starts, after the run took its locks: a snapshot as of the run's start.
// After the run, every index must equal what the source of truth holds
// then, exactly.

// onlineKeys are the keys of an online test.
type onlineKeys struct{ db, hash, zset, family string }

func onlineNames(prefix string) onlineKeys {
	return onlineKeys{db: prefix + "db", hash: prefix + "idx:by-email", zset: prefix + "idx:by-score", family: prefix + "idx:by-country"}
}

// onlineRebuilder returns the Rebuilder of the three indexes of k.
func onlineRebuilder(tb testing.TB, c rueidis.Client, k onlineKeys, opts rebuild.Options) *rebuild.Rebuilder[user] {
	tb.Helper()
	return redistest.Rebuilder(tb, c, opts,
		builders.Hash(k.hash, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SortedSet(k.zset, func(u user) (string, float64, bool) { return u.ID, u.Score, true }),
		builders.SetIndex(k.family, func(u user) (string, string, bool) { return u.Country, u.ID, true }),
	)
}

func encodeUser(u user) string {
	return u.Email + "|" + strconv.FormatFloat(u.Score, 'g', -1, 64) + "|" + u.Country
}

func decodeUser(id, v string) (user, error) {
	f := strings.Split(v, "|")
	if len(f) != 3 {
		return user{}, fmt.Errorf("user %s: %q is not email|score|country", id, v)
	}
	score, err := strconv.ParseFloat(f[1], 64)
	if err != nil {
		return user{}, fmt.Errorf("user %s: %w", id, err)
	}
	return user{ID: id, Email: f[0], Score: score, Country: f[2]}, nil
}

// readDB returns the source of truth.
func readDB(ctx context.Context, c rueidis.Client, db string) (map[string]user, error) {
	m, err := c.Do(ctx, c.B().Hgetall().Key(db).Build()).AsStrMap()
	if err != nil {
		return nil, err
	}
	out := make(map[string]user, len(m))
	for id, v := range m {
		if out[id], err = decodeUser(id, v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// onlineSource reads the source of truth when the run starts it, then
// yields it in id order, storing each id in last as it goes. fail, if
// positive, makes it fail after that many items.
func onlineSource(c rueidis.Client, db string, last *atomic.Value, fail int) sources.Source[user] {
	return func(ctx context.Context) iter.Seq2[user, error] {
		return func(yield func(user, error) bool) {
			m, err := readDB(ctx, c, db)
			if err != nil {
				yield(user{}, err)
				return
			}
			for i, id := range slices.Sorted(maps.Keys(m)) {
				if fail > 0 && i == fail {
					yield(user{}, errors.New("the source failed halfway"))
					return
				}
				if last != nil {
					last.Store(id)
				}
				if !yield(m[id], nil) {
					return
				}
			}
		}
	}
}

// onlineCountries are the buckets of the SetIndex: few enough that moves
// between them are frequent.
const onlineCountries = 40

func onlineUser(i int, rng *rand.Rand) user {
	return user{
		ID:      fmt.Sprintf("u%07d", i),
		Email:   fmt.Sprintf("user%07d.%d@example.com", i, rng.IntN(1000)),
		Score:   float64(rng.IntN(1_000_000)),
		Country: fmt.Sprintf("c%02d", rng.IntN(onlineCountries)),
	}
}

// seedDB writes n users to the source of truth.
func seedDB(tb testing.TB, c rueidis.Client, db string, n int, seed uint64) {
	tb.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	var cmds rueidis.Commands
	for start := 0; start < n; start += 1000 {
		fv := c.B().Hset().Key(db).FieldValue()
		for i := start; i < min(n, start+1000); i++ {
			u := onlineUser(i, rng)
			fv = fv.FieldValue(u.ID, encodeUser(u))
		}
		cmds = append(cmds, fv.Build())
	}
	for _, res := range c.DoMulti(redistest.Ctx(tb), cmds...) {
		if err := res.Error(); err != nil {
			tb.Fatal(err)
		}
	}
}

// onlineWriter is the application: it changes users in the source of
// truth, then applies each change through its Rebuilder. It is the only
// writer of the source of truth, so it keeps a copy.
type onlineWriter struct {
	c     rueidis.Client
	r     *rebuild.Rebuilder[user]
	db    string
	rng   *rand.Rand
	users map[string]user
	ids   []string
	next  int
	last  *atomic.Value // the source's last id, if known

	applied        atomic.Int64
	yielded, ahead atomic.Int64 // changes to items the source had yielded, or not yet
}

func newOnlineWriter(ctx context.Context, c rueidis.Client, r *rebuild.Rebuilder[user], db string, seed uint64) (*onlineWriter, error) {
	users, err := readDB(ctx, c, db)
	if err != nil {
		return nil, err
	}
	w := &onlineWriter{c: c, r: r, db: db, rng: rand.New(rand.NewPCG(seed, 2)), users: users}
	w.ids = slices.Sorted(maps.Keys(users))
	// Past every id in the source of truth, which also holds the users an
	// earlier run of the test inserted (-count): an insert of an id that
	// exists would leave its old entries behind.
	for _, id := range w.ids {
		if n, err := strconv.Atoi(strings.TrimPrefix(id, "u")); err == nil && n >= w.next {
			w.next = n + 1
		}
	}
	return w, nil
}

// step makes one change: an insert, a delete, or an update of the email,
// the score, the country, or several of them.
func (w *onlineWriter) step(ctx context.Context) error {
	var change index.Change[user]
	var commit rueidis.Completed
	roll := w.rng.IntN(100)
	switch {
	case roll < 10 || len(w.ids) == 0:
		u := onlineUser(w.next, w.rng)
		w.next++
		w.users[u.ID] = u
		w.ids = append(w.ids, u.ID)
		change, commit = index.Insert(u), w.c.B().Hset().Key(w.db).FieldValue().FieldValue(u.ID, encodeUser(u)).Build()
	case roll < 20:
		i := w.rng.IntN(len(w.ids))
		u := w.users[w.ids[i]]
		delete(w.users, u.ID)
		w.ids[i] = w.ids[len(w.ids)-1]
		w.ids = w.ids[:len(w.ids)-1]
		change, commit = index.Delete(u), w.c.B().Hdel().Key(w.db).Field(u.ID).Build()
	default:
		old := w.users[w.ids[w.rng.IntN(len(w.ids))]]
		u := old
		what := w.rng.IntN(7) + 1 // a non-empty subset of email, score, country
		if what&1 != 0 {
			u.Email = fmt.Sprintf("user%s.%d@example.com", u.ID[1:], 1000+w.rng.IntN(1_000_000))
		}
		if what&2 != 0 {
			u.Score = float64(w.rng.IntN(1_000_000))
		}
		if what&4 != 0 {
			u.Country = fmt.Sprintf("c%02d", w.rng.IntN(onlineCountries))
		}
		w.users[u.ID] = u
		change, commit = index.Update(old, u), w.c.B().Hset().Key(w.db).FieldValue().FieldValue(u.ID, encodeUser(u)).Build()
	}
	// Commit to the source of truth first, then apply: the order the
	// package documentation asks for.
	if err := w.c.Do(ctx, commit).Error(); err != nil {
		return err
	}
	if w.last != nil {
		id := ""
		if change.New != nil {
			id = change.New.ID
		} else {
			id = change.Old.ID
		}
		if last, _ := w.last.Load().(string); last != "" {
			if id <= last {
				w.yielded.Add(1)
			} else {
				w.ahead.Add(1)
			}
		}
	}
	if err := w.r.Apply(ctx, change); err != nil {
		return err
	}
	w.applied.Add(1)
	return nil
}

// run makes changes at most perSecond a second until stop is closed.
func (w *onlineWriter) run(ctx context.Context, perSecond float64, stop <-chan struct{}) error {
	lim := rate.NewLimiter(rate.Limit(perSecond), 1)
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		if err := lim.Wait(ctx); err != nil {
			return err
		}
		if err := w.step(ctx); err != nil {
			return err
		}
	}
}

// wantOnline fails t unless the three indexes of k hold exactly what the
// source of truth holds, each key without a TTL, and reports how many
// entries differ.
func wantOnline(t *testing.T, c rueidis.Client, k onlineKeys) {
	t.Helper()
	ctx := redistest.Ctx(t)
	users, err := readDB(ctx, c, k.db)
	if err != nil {
		t.Fatal(err)
	}
	wantHash := map[string]string{}
	wantZset := map[string]float64{}
	wantSets := map[string]map[string]bool{}
	for _, u := range users {
		wantHash[u.Email] = u.ID
		wantZset[u.ID] = u.Score
		b := k.family + ":" + u.Country
		if wantSets[b] == nil {
			wantSets[b] = map[string]bool{}
		}
		wantSets[b][u.ID] = true
	}
	var lost, stale []string // entries missing or wrong; entries that should be gone
	diff := func(what string, want, got map[string]string) {
		for e, v := range want {
			if g, ok := got[e]; !ok || g != v {
				lost = append(lost, fmt.Sprintf("%s %s: got %q, want %q", what, e, g, v))
			}
		}
		for e, g := range got {
			if _, ok := want[e]; !ok {
				stale = append(stale, fmt.Sprintf("%s %s = %q", what, e, g))
			}
		}
	}
	diff("hash field", wantHash, redistest.HGetAll(t, c, k.hash))
	asStrings := func(m map[string]float64) map[string]string {
		out := map[string]string{}
		for e, s := range m {
			out[e] = strconv.FormatFloat(s, 'g', -1, 64)
		}
		return out
	}
	diff("sorted-set member", asStrings(wantZset), asStrings(redistest.ZScores(t, c, k.zset)))
	gotSets := map[string]string{}
	for _, b := range redistest.LiveKeys(t, c, k.family+":") {
		for _, m := range redistest.SMembers(t, c, b) {
			gotSets[b+" "+m] = "member"
		}
	}
	wantMembers := map[string]string{}
	for b, ms := range wantSets {
		for m := range ms {
			wantMembers[b+" "+m] = "member"
		}
	}
	diff("bucket", wantMembers, gotSets)
	t.Logf("%d users: %d lost changes, %d stale entries", len(users), len(lost), len(stale))
	for i, d := range append(lost, stale...) {
		if i == 10 {
			t.Errorf("... and %d more", len(lost)+len(stale)-10)
			break
		}
		t.Error(d)
	}
	for _, key := range append(redistest.LiveKeys(t, c, k.family+":"), k.hash, k.zset) {
		redistest.WantPTTL(t, c, key, -1, -1)
	}
}

// waitFor polls cond until it holds, failing t after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// onlineSize is the number of users of the online tests: the issue's
// 200,000, in a run that still takes seconds under -race.
const onlineSize = 200_000

// TestOnlineRebuildKeepsChanges: a rebuild of 200k users, from a snapshot
// of the source of truth taken when its source starts, while a writer
// (another client, another Rebuilder of the same indexes) inserts, deletes
// and updates users at a steady rate, before, during and after the run:
// moving hash fields, changing scores, moving members between buckets.
// Some changes touch users the source had already yielded, others users it
// had not reached. After the publish every index equals the source of
// truth: 0 lost changes, 0 stale entries, and nothing of the run is left.
func TestOnlineRebuildKeepsChanges(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		k := onlineNames(d.Prefix)
		seedDB(t, d.Other, k.db, onlineSize, 1)
		r := onlineRebuilder(t, d.Client, k, rebuild.Options{})
		if _, err := r.Run(ctx, onlineSource(d.Client, k.db, nil, 0)); err != nil {
			t.Fatalf("first run: %v", err)
		}
		var last atomic.Value
		w, err := newOnlineWriter(ctx, d.Other, onlineRebuilder(t, d.Other, k, rebuild.Options{}), k.db, 7)
		if err != nil {
			t.Fatal(err)
		}
		w.last = &last
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var werr error
		wg.Go(func() { werr = w.run(ctx, 5000, stop) })
		waitFor(t, "changes before the run", func() bool { return w.applied.Load() >= 200 })

		before := w.applied.Load()
		stats, err := r.Run(ctx, onlineSource(d.Client, k.db, &last, 0))
		during := w.applied.Load() - before
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("Run: %v", err)
		}
		waitFor(t, "changes after the run", func() bool { return w.applied.Load() >= before+during+200 })
		close(stop)
		wg.Wait()
		if werr != nil {
			t.Fatalf("writer: %v", werr)
		}
		t.Logf("%d changes in all, %d while the run ran (%d to users already yielded, %d to users not yet yielded); the run replayed %d; catch-up %v",
			w.applied.Load(), during, w.yielded.Load(), w.ahead.Load(), stats.Changes, stats.CatchUp)
		if w.yielded.Load() == 0 || w.ahead.Load() == 0 {
			t.Errorf("changes to users already yielded: %d, not yet: %d; want some of each", w.yielded.Load(), w.ahead.Load())
		}
		// Counted per builder: a change writes up to three.
		if stats.Changes == 0 || stats.Changes > 3*(during+1) {
			t.Errorf("Stats.Changes = %d, want between 1 and 3 × the %d (+1 in flight) applied during the run", stats.Changes, during)
		}
		wantOnline(t, d.Other, k)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// TestOnlineRebuildKeepsChangesFromAnotherProcess is
// TestOnlineRebuildKeepsChanges with the writer in another OS process: a
// copy of the test binary (see TestMain), which finds the run through its
// lock.
func TestOnlineRebuildKeepsChangesFromAnotherProcess(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		k := onlineNames(d.Prefix)
		seedDB(t, d.Other, k.db, onlineSize, 2)
		r := onlineRebuilder(t, d.Client, k, rebuild.Options{})
		if _, err := r.Run(ctx, onlineSource(d.Client, k.db, nil, 0)); err != nil {
			t.Fatalf("first run: %v", err)
		}
		w := startOnlineProcess(t, "writer", d)
		waitFor(t, "changes before the run", func() bool { return w.applied.Load() >= 200 })
		before := w.applied.Load()
		stats, err := r.Run(ctx, onlineSource(d.Client, k.db, nil, 0))
		during := w.applied.Load() - before
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		waitFor(t, "changes after the run", func() bool { return w.applied.Load() >= before+during+200 })
		w.stop(t)
		t.Logf("%d changes in all, about %d while the run ran; the run replayed %d; catch-up %v", w.applied.Load(), during, stats.Changes, stats.CatchUp)
		if stats.Changes == 0 {
			t.Errorf("Stats.Changes = 0, want the changes applied during the run")
		}
		wantOnline(t, d.Other, k)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// TestOnlineFailedRunKeepsChanges: a run whose source fails halfway, while
// the writer applies changes, publishes nothing and leaves nothing; the
// live indexes hold every change.
func TestOnlineFailedRunKeepsChanges(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		k := onlineNames(d.Prefix)
		const n = 20_000
		seedDB(t, d.Other, k.db, n, 3)
		r := onlineRebuilder(t, d.Client, k, rebuild.Options{BatchSize: 500})
		if _, err := r.Run(ctx, onlineSource(d.Client, k.db, nil, 0)); err != nil {
			t.Fatalf("first run: %v", err)
		}
		w, err := newOnlineWriter(ctx, d.Other, onlineRebuilder(t, d.Other, k, rebuild.Options{}), k.db, 8)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var werr error
		wg.Go(func() { werr = w.run(ctx, 5000, stop) })
		waitFor(t, "changes before the run", func() bool { return w.applied.Load() >= 100 })
		// A source that yields slowly enough for changes to arrive during
		// the run, then fails.
		slow := func(ctx context.Context) iter.Seq2[user, error] {
			return func(yield func(user, error) bool) {
				for u, err := range onlineSource(d.Client, k.db, nil, n/2)(ctx) {
					if err == nil && u.ID[len(u.ID)-3:] == "000" {
						before := w.applied.Load()
						waitFor(t, "changes during the run", func() bool { return w.applied.Load() > before+10 })
					}
					if !yield(u, err) {
						return
					}
				}
			}
		}
		_, err = r.Run(ctx, slow)
		close(stop)
		wg.Wait()
		if werr != nil {
			t.Fatalf("writer: %v", werr)
		}
		var e *rebuild.Error
		if !errors.As(err, &e) || e.Op != "source" || !strings.Contains(err.Error(), "halfway") {
			t.Fatalf("Run: got %v, want the source's error", err)
		}
		wantOnline(t, d.Other, k)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// TestOnlineKilledRunLeavesNoLog: a run in another process, killed with
// SIGKILL while a writer applies changes that are logged for it, leaves its
// lock, record, log and temp keys to expire: after twice its 2 s lease none
// is left, and the live indexes hold every change.
func TestOnlineKilledRunLeavesNoLog(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		k := onlineNames(d.Prefix)
		seedDB(t, d.Other, k.db, 5000, 4)
		r := onlineRebuilder(t, d.Client, k, rebuild.Options{})
		if _, err := r.Run(ctx, onlineSource(d.Client, k.db, nil, 0)); err != nil {
			t.Fatalf("first run: %v", err)
		}
		runner := startOnlineProcess(t, "runner", d)
		lock := keys.LockKey(k.hash, d.Cluster)
		log := keys.LogKey(lock)
		waitFor(t, "the other process's run", func() bool { return redistest.Exists(t, d.Other, keys.RecordKey(lock)) })
		w, err := newOnlineWriter(ctx, d.Other, onlineRebuilder(t, d.Other, k, rebuild.Options{}), k.db, 9)
		if err != nil {
			t.Fatal(err)
		}
		for range 50 {
			if err := w.step(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := d.Other.Do(ctx, d.Other.B().Llen().Key(log).Build()).AsInt64(); err != nil || n == 0 {
			t.Fatalf("LLEN %s = %d, %v; want the changes logged for the run", log, n, err)
		}
		redistest.WantTTL(t, d.Other, log, 2*time.Second) // the lock's
		runner.kill(t)
		waitFor(t, "the killed run's keys to expire", func() bool { return len(redistest.Leftovers(t, d.Other, d.Prefix)) == 0 })
		wantOnline(t, d.Other, k)
	})
}

// The other processes of the online tests are copies of the test binary,
// which TestMain turns into a writer or a runner when onlineRoleEnv is set.
const (
	onlineRoleEnv    = "KEYSWAP_TEST_ONLINE_ROLE" // "writer" or "runner"
	onlineAddrsEnv   = "KEYSWAP_TEST_ONLINE_ADDRS"
	onlineClusterEnv = "KEYSWAP_TEST_ONLINE_CLUSTER"
	onlinePrefixEnv  = "KEYSWAP_TEST_ONLINE_PREFIX"
)

// onlineProcess is a copy of the test binary in another role.
type onlineProcess struct {
	cmd     *exec.Cmd
	stdin   *os.File
	applied atomic.Int64 // the writer's changes, as it reports them
	done    chan error
}

func startOnlineProcess(t *testing.T, role string, d deployment) *onlineProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), onlineRoleEnv+"="+role, onlineAddrsEnv+"="+strings.Join(d.Addrs, ","),
		onlineClusterEnv+"="+strconv.FormatBool(d.Cluster), onlinePrefixEnv+"="+d.Prefix)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = r
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	p := &onlineProcess{cmd: cmd, stdin: w, done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if n, ok := strings.CutPrefix(sc.Text(), "applied "); ok {
				v, _ := strconv.ParseInt(n, 10, 64)
				p.applied.Store(v)
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stop asks the process to end (by closing its stdin) and waits.
func (p *onlineProcess) stop(t *testing.T) {
	t.Helper()
	p.stdin.Close()
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("the other process: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the other process did not stop")
	}
}

// kill kills the process with SIGKILL.
func (p *onlineProcess) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
	p.stdin.Close()
}

// onlineRole runs this process as the role onlineRoleEnv names, and
// returns its exit code.
func onlineRole(role string) int {
	ctx := context.Background()
	addrs := strings.Split(os.Getenv(onlineAddrsEnv), ",")
	opt := rueidis.ClientOption{InitAddress: addrs, DisableCache: true}
	if os.Getenv(onlineClusterEnv) != "true" {
		opt.ForceSingleClient = true
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer c.Close()
	k := onlineNames(os.Getenv(onlinePrefixEnv))
	stopped := make(chan struct{})
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // EOF when the test closes it
		close(stopped)
	}()
	r, err := rebuild.New(c, rebuild.Options{TTL: 2 * time.Second},
		builders.Hash(k.hash, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SortedSet(k.zset, func(u user) (string, float64, bool) { return u.ID, u.Score, true }),
		builders.SetIndex(k.family, func(u user) (string, string, bool) { return u.Country, u.ID, true }),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	switch role {
	case "writer":
		w, err := newOnlineWriter(ctx, c, r, k.db, 11)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		lim := rate.NewLimiter(5000, 1)
		for {
			select {
			case <-stopped:
				fmt.Printf("applied %d\n", w.applied.Load())
				return 0
			default:
			}
			if err := lim.Wait(ctx); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
			if err := w.step(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "writer:", err)
				return 2
			}
			if n := w.applied.Load(); n%50 == 0 {
				fmt.Printf("applied %d\n", n)
			}
		}
	case "runner":
		// A run that yields its first items, then waits to be killed.
		src := func(ctx context.Context) iter.Seq2[user, error] {
			return func(yield func(user, error) bool) {
				for u, err := range onlineSource(c, k.db, nil, 0)(ctx) {
					if !yield(u, err) {
						return
					}
					if u.ID == "u0000100" {
						<-stopped
						return
					}
				}
			}
		}
		_, err := r.Run(ctx, src)
		fmt.Fprintln(os.Stderr, "runner:", err)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

package rebuild_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
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

// onlineKeys are the keys of an online test, in the online model of
// redistest (the source of truth, its users and the application, App).
type onlineKeys = redistest.OnlineIndexes

func onlineNames(prefix string) onlineKeys {
	return onlineKeys{DB: prefix + "db", Hash: prefix + "idx:by-email", Zset: prefix + "idx:by-score", Family: prefix + "idx:by-country"}
}

// onlineRebuilder returns the Rebuilder of the three indexes of k.
func onlineRebuilder(tb testing.TB, c rueidis.Client, k onlineKeys, opts rebuild.Options) *rebuild.Rebuilder[user] {
	tb.Helper()
	return redistest.Rebuilder(tb, c, opts, k.Builders()...)
}

// onlineSource reads the source of truth when the run starts it, then
// yields it in id order, storing each id in last as it goes. fail, if
// positive, makes it fail after that many items.
func onlineSource(c rueidis.Client, db string, last *atomic.Value, fail int) rebuild.Source[user] {
	return redistest.TruthSource(c, db, nil, func(i int, id string) error {
		if fail > 0 && i == fail {
			return errors.New("the source failed halfway")
		}
		if last != nil {
			last.Store(id)
		}
		return nil
	})
}

// onlineCountries are the buckets of the SetIndex: few enough that moves
// between them are frequent.
const onlineCountries = 40

// seedDB writes n users to the source of truth.
func seedDB(tb testing.TB, c rueidis.Client, db string, n int, seed uint64) {
	tb.Helper()
	redistest.SeedTruth(tb, c, db, n, onlineCountries, 1000, seed, "u")
}

// onlineWriter is the application (redistest.App, of the users "u..."),
// which also counts the changes to users the source had yielded when they
// were applied, or not yet, when last, the source's last id, is set.
type onlineWriter struct {
	*redistest.App
	last           *atomic.Value
	yielded, ahead atomic.Int64
}

func newOnlineWriter(ctx context.Context, c rueidis.Client, r *rebuild.Rebuilder[user], db string, seed uint64) (*onlineWriter, error) {
	a, err := redistest.NewApp(ctx, c, r, db, "u", onlineCountries, seed)
	if err != nil {
		return nil, err
	}
	w := &onlineWriter{App: a}
	a.Before = w.count
	return w, nil
}

// count counts change as yielded or ahead of the source.
func (w *onlineWriter) count(change rebuild.Change[user]) {
	if w.last == nil {
		return
	}
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

// run makes changes at most perSecond a second until stop is closed.
func (w *onlineWriter) run(ctx context.Context, perSecond float64, stop <-chan struct{}) error {
	return w.RunUntil(ctx, stop, rate.NewLimiter(rate.Limit(perSecond), 1).Wait)
}

// wantOnline fails t unless the three indexes of k hold exactly what the
// source of truth holds, each key without a TTL.
func wantOnline(t *testing.T, c rueidis.Client, k onlineKeys) {
	t.Helper()
	redistest.WantOnline(t, c, k)
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

// TestOnlineRebuildKeepsChanges (C64, C65, C66): a rebuild of 200k users, from a snapshot
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
		seedDB(t, d.Other, k.DB, onlineSize, 1)
		r := onlineRebuilder(t, d.Client, k, rebuild.Options{})
		if _, err := r.Run(ctx, onlineSource(d.Client, k.DB, nil, 0)); err != nil {
			t.Fatalf("first run: %v", err)
		}
		var last atomic.Value
		w, err := newOnlineWriter(ctx, d.Other, onlineRebuilder(t, d.Other, k, rebuild.Options{}), k.DB, 7)
		if err != nil {
			t.Fatal(err)
		}
		w.last = &last
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var werr error
		wg.Go(func() { werr = w.run(ctx, 5000, stop) })
		waitFor(t, "changes before the run", func() bool { return w.Applied.Load() >= 200 })

		before := w.Applied.Load()
		stats, err := r.Run(ctx, onlineSource(d.Client, k.DB, &last, 0))
		during := w.Applied.Load() - before
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("Run: %v", err)
		}
		waitFor(t, "changes after the run", func() bool { return w.Applied.Load() >= before+during+200 })
		close(stop)
		wg.Wait()
		if werr != nil {
			t.Fatalf("writer: %v", werr)
		}
		t.Logf("%d changes in all, %d while the run ran (%d to users already yielded, %d to users not yet yielded); the run replayed %d; catch-up %v",
			w.Applied.Load(), during, w.yielded.Load(), w.ahead.Load(), stats.Changes, stats.CatchUp)
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
		seedDB(t, d.Other, k.DB, onlineSize, 2)
		r := onlineRebuilder(t, d.Client, k, rebuild.Options{})
		if _, err := r.Run(ctx, onlineSource(d.Client, k.DB, nil, 0)); err != nil {
			t.Fatalf("first run: %v", err)
		}
		w := startOnlineProcess(t, "writer", d)
		waitFor(t, "changes before the run", func() bool { return w.applied.Load() >= 200 })
		before := w.applied.Load()
		stats, err := r.Run(ctx, onlineSource(d.Client, k.DB, nil, 0))
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
		seedDB(t, d.Other, k.DB, n, 3)
		r := onlineRebuilder(t, d.Client, k, rebuild.Options{BatchSize: 500})
		if _, err := r.Run(ctx, onlineSource(d.Client, k.DB, nil, 0)); err != nil {
			t.Fatalf("first run: %v", err)
		}
		w, err := newOnlineWriter(ctx, d.Other, onlineRebuilder(t, d.Other, k, rebuild.Options{}), k.DB, 8)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var werr error
		wg.Go(func() { werr = w.run(ctx, 5000, stop) })
		waitFor(t, "changes before the run", func() bool { return w.Applied.Load() >= 100 })
		// A source that yields slowly enough for changes to arrive during
		// the run, then fails.
		slow := func(ctx context.Context) iter.Seq2[user, error] {
			return func(yield func(user, error) bool) {
				for u, err := range onlineSource(d.Client, k.DB, nil, n/2)(ctx) {
					if err == nil && u.ID[len(u.ID)-3:] == "000" {
						before := w.Applied.Load()
						waitFor(t, "changes during the run", func() bool { return w.Applied.Load() > before+10 })
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

// TestOnlineKilledRunLeavesNoLog (C65): a run in another process, killed with
// SIGKILL while a writer applies changes that are logged for it, leaves its
// lock, record, log and temp keys to expire: after twice its 2 s lease none
// is left, and the live indexes hold every change.
func TestOnlineKilledRunLeavesNoLog(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		k := onlineNames(d.Prefix)
		seedDB(t, d.Other, k.DB, 5000, 4)
		r := onlineRebuilder(t, d.Client, k, rebuild.Options{})
		if _, err := r.Run(ctx, onlineSource(d.Client, k.DB, nil, 0)); err != nil {
			t.Fatalf("first run: %v", err)
		}
		runner := startOnlineProcess(t, "runner", d)
		lock := keys.LockKey(k.Hash, d.Cluster)
		log := keys.LogKey(lock)
		waitFor(t, "the other process's run", func() bool { return redistest.Exists(t, d.Other, keys.RecordKey(lock)) })
		w, err := newOnlineWriter(ctx, d.Other, onlineRebuilder(t, d.Other, k, rebuild.Options{}), k.DB, 9)
		if err != nil {
			t.Fatal(err)
		}
		for range 50 {
			if err := w.Step(ctx); err != nil {
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
	r, err := rebuild.New(c, rebuild.Options{TTL: 2 * time.Second}, k.Builders()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	switch role {
	case "writer":
		w, err := newOnlineWriter(ctx, c, r, k.DB, 11)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		lim := rate.NewLimiter(5000, 1)
		for {
			select {
			case <-stopped:
				fmt.Printf("applied %d\n", w.Applied.Load())
				return 0
			default:
			}
			if err := lim.Wait(ctx); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
			if err := w.Step(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "writer:", err)
				return 2
			}
			if n := w.Applied.Load(); n%50 == 0 {
				fmt.Printf("applied %d\n", n)
			}
		}
	case "runner":
		// A run that yields its first items, then waits to be killed.
		src := func(ctx context.Context) iter.Seq2[user, error] {
			return func(yield func(user, error) bool) {
				for u, err := range onlineSource(c, k.DB, nil, 0)(ctx) {
					if !yield(u, err) {
						return
					}
					if u.ID == "u000100" {
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

package reliability

// The fault suite (RELIABILITY.md, "Faults"). Every fault is injected at
// three points of a rebuild of a non-empty index (a Hash, a SortedSet and a
// SetIndex family of 2000 entries each): before the first batch reaches
// Redis, mid-stream (at the 3rd write DoMulti, after 2 to 4 of 10 batches),
// and during the publish (at the publish script's EVALSHA). The run's client
// goes through a faultproxy; the test's own clients go straight to the
// server. A reader watches the live keys all along. Afterwards each case
// asserts:
//
//   - the live keys are exactly the old value or exactly the new one, never
//     partial or empty, and the reader saw no gap (C23, C45, C52, C53+);
//   - the generation record of each builder's key went with them: exactly
//     the seeding run's where the old value is live, generation 2 of the
//     run that published where a new one is;
//   - a nil error means published; an error means not published, except a
//     transport or context error from the publish script itself, after which
//     the outcome is unknown to the caller and either value may be live
//     (C29);
//   - no temp key is left without a TTL, nor with one over PreserveFor
//     (C34);
//   - no lock of ours has a TTL over the lease, and none is left a TTL after
//     the run returned (C36, C16+); nor a lock's run record or log, a TTL
//     after the server ran the run's last command; a receipt only with its
//     own short TTL;
//   - the error names the cause: errors.Is/As finds the sentinel, the
//     context error, the server's OOM error or the network error (C42).
//
// SCRIPT FLUSH must not fail the run at any point (NOSCRIPT
// in a DoMulti; rueidis's EVALSHA → EVAL fallback elsewhere), and a panic
// in the source propagates after the same cleanup as an error (C18).
//
// go test ./reliability -run TestFaults -v -faults.report=/tmp/faults.md
// writes the table that RELIABILITY.md quotes.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
)

var faultsReport = flag.String("faults.report", "", "write the fault suite's Markdown table to this file")

// point is where a fault is injected.
type point int

const (
	atBefore  point = iota // at the first write DoMulti, before it is sent
	atMid                  // at the faultMidDoMulti-th write DoMulti
	atPublish              // at the publish script's EVALSHA (or EVAL)
)

func (p point) String() string {
	return [...]string{"before the first batch", "mid-stream", "during the publish"}[p]
}

func (p point) short() string { return [...]string{"before", "mid", "publish"}[p] }

var points = []point{atBefore, atMid, atPublish}

// Outcomes of a case, as the report names them.
const (
	published        = "published"
	notPublished     = "not published"
	unknownPublished = "unknown to the caller: published"
	unknownNot       = "unknown to the caller: not published"
	successorLive    = "not published; the successor's value is live"
)

// want is what a case may end with: its error classes (errClass) and
// outcomes.
type want struct {
	classes  []string
	outcomes []string
}

// faultSpec is one fault of the matrix.
type faultSpec struct {
	name string
	// serverArgs are extra arguments of a private standalone server.
	serverArgs []string
	// hook: the fault is injected by the interceptor; without it the source
	// injects it (a panic) before and mid-stream.
	hook bool
	// successor: while the run is stalled past its TTL, a successor
	// rebuilds the keys with data set v3 (a stale-publish check).
	successor bool
	// holds: the fault holds the run past its TTL, so the case mostly
	// waits (see caseT).
	holds bool
	// noDeadline: the run's ctx has no deadline, only a cancel. With a
	// deadline, rueidis sends a command alone on an idle connection
	// synchronously, under the deadline only, so a cancel cannot end it.
	noDeadline bool
	inject     func(c *caseRun, req request) action
	want       func(p point) want
}

var (
	notPub       = []string{notPublished}
	lockOrTime   = []string{"ErrLockLost", "context.DeadlineExceeded"}
	networkClass = []string{"network"}
)

// faultNames orders the report.
var faultNames = []string{"connection cut", "connection cut + partition", "stall past the TTL", "SIGSTOP past the TTL", "kill -9 and restart",
	"OOM", "SCRIPT FLUSH", "context cancelled", "panic in the source"}

var faults = []faultSpec{
	{
		// The proxy cuts every connection after half of the intercepted
		// batch DoMulti's bytes (so some complete commands run and the
		// rest never arrive), or, at the publish, lets the script run and
		// loses its reply.
		name: "connection cut", hook: true,
		inject: func(c *caseRun, req request) action {
			if c.at == atPublish {
				c.d.proxy.CutAfter(faultproxy.ToServer, -1)
				c.d.proxy.CutAfter(faultproxy.ToClient, 0)
				return action{}
			}
			c.d.proxy.CutAfter(faultproxy.ToServer, respSize(req.cmds)/2)
			return action{}
		},
		want: func(p point) want {
			if p == atPublish {
				// The cut loses the next reply: usually the script's, and
				// Run settles the outcome (store.Settle) and reports the
				// publish it made; sometimes another command's first, and
				// the script never leaves: not published, and said so.
				return want{[]string{"nil", "network"}, []string{published, notPublished}}
			}
			return want{networkClass, notPub}
		},
	},
	{
		// A network partition: the network fails right after the first
		// command of the intercepted batch DoMulti has run (its MULTI: the
		// server holds an open transaction, which it discards when the
		// connection ends), or before the publish script is sent:
		// the proxy cuts every connection and refuses new ones until Run
		// returns, so the run's cleanup cannot reach the server either.
		// (The hook sends the first command alone, then the rest, which
		// fail for real; byte counting with CutAfter would depend on which
		// connection rueidis picks and on what else it sends.)
		name: "connection cut + partition", hook: true,
		inject: func(c *caseRun, req request) action {
			partition := func() error {
				c.d.proxy.Refuse(true)
				c.d.proxy.CutAll()
				// The partition lasts until the run's first cleanup step
				// has failed (the UNLINK of its temp keys, or the EXPIRE
				// that preserves them after a failed publish): then the
				// release works again, instead of being retried until its
				// 10 s timeout.
				c.in.healAfterFailure(func() { c.d.proxy.Refuse(false) })
				return nil
			}
			if c.at == atPublish {
				_ = partition()
				return action{}
			}
			return action{splitFirst: partition}
		},
		want: func(p point) want {
			if p == atPublish {
				// The script never left: settled as not published once the
				// partition heals, or ErrOutcomeUnknown while it lasts.
				return want{networkClass, []string{notPublished, unknownNot}}
			}
			return want{networkClass, notPub}
		},
	},
	{
		// The proxy holds all traffic, both ways, for TTL+0.5s. The run's
		// watchdog or the write's TTL-long deadline ends it, and a publish
		// script delivered late finds the lock expired.
		name: "stall past the TTL", hook: true, holds: true,
		inject: func(c *caseRun, req request) action {
			c.d.proxy.Stall(faultHold)
			c.holdUntil = time.Now().Add(faultHold)
			return action{}
		},
		want: stallWant,
	},
	{
		// As above, and a successor rebuilds the keys (v3) through its own
		// client as soon as the stalled run's locks have expired, while the
		// stalled run's commands are still held: when they arrive, none of
		// them may touch the successor's keys or lock.
		name: "stall past the TTL + successor", hook: true, successor: true, holds: true,
		inject: func(c *caseRun, req request) action {
			c.d.proxy.Stall(faultHold)
			c.holdUntil = time.Now().Add(faultHold)
			return action{then: c.runSuccessor}
		},
		want: func(p point) want {
			w := stallWant(p)
			w.outcomes = []string{successorLive}
			return w
		},
	},
	{
		// The server is stopped with SIGSTOP for TTL+0.5s, then continued:
		// its clock ran, so the lock has expired when it reads the run's
		// next command.
		name: "SIGSTOP past the TTL", hook: true, holds: true,
		inject: func(c *caseRun, req request) action {
			if err := c.d.srv.Pause(); err != nil {
				c.t.Errorf("SIGSTOP: %v", err)
				return action{}
			}
			resumed := make(chan error, 1)
			time.AfterFunc(faultHold, func() { resumed <- c.d.srv.Resume() })
			c.resumed = resumed
			return action{}
		},
		want: stallWant,
	},
	{
		// The server is killed with SIGKILL before the intercepted command
		// is sent, which then fails, and restarted at once. It runs with
		// appendonly yes and appendfsync always, so every write it
		// acknowledged (the old value, the locks, the temp keys so far)
		// survives, and the live keys must still be old or new.
		name: "kill -9 and restart", hook: true,
		serverArgs: []string{"--appendonly", "yes", "--appendfsync", "always"},
		inject: func(c *caseRun, req request) action {
			if err := c.d.srv.Kill(); err != nil {
				c.t.Errorf("kill: %v", err)
				return action{}
			}
			c.restarted = true
			return action{after: c.d.srv.Restart}
		},
		want: func(p point) want {
			if p == atPublish {
				// The script never reached the server. Run settles that
				// once the server is back (its receipt is absent), or
				// reports ErrOutcomeUnknown if it cannot ask.
				return want{networkClass, []string{notPublished, unknownNot}}
			}
			return want{networkClass, notPub}
		},
	},
	{
		// maxmemory is set just under (before the first batch, and during
		// the publish) or 16 KiB over (mid-stream: the batch fails
		// partway) the server's use, with noeviction. Writes fail with
		// OOM; the publish script only deletes and renames, which Redis
		// allows under OOM, so a publish under OOM succeeds.
		name: "OOM", hook: true,
		inject: func(c *caseRun, req request) action {
			headroom := int64(-1)
			if c.at == atMid {
				headroom = 16 << 10
			}
			c.d.srv.LimitMemory(c.t, headroom)
			return action{}
		},
		want: func(p point) want {
			if p == atPublish {
				return want{[]string{"nil"}, []string{published}}
			}
			return want{[]string{"OOM"}, notPub}
		},
	},
	{
		// SCRIPT FLUSH on the server: the next EVALSHA of every script
		// hits NOSCRIPT. The run must recover and succeed.
		name: "SCRIPT FLUSH", hook: true,
		inject: func(c *caseRun, req request) action {
			ctx, cancel := context.WithTimeout(context.Background(), faultWait)
			defer cancel()
			if err := c.admin.Do(ctx, c.admin.B().ScriptFlush().Build()).Error(); err != nil {
				c.t.Errorf("SCRIPT FLUSH: %v", err)
			}
			return action{}
		},
		want: func(p point) want { return want{[]string{"nil"}, []string{published}} },
	},
	{
		// The run's ctx is cancelled before the intercepted batch is sent
		// (the batch, once sent, is not cancelled with the run: it runs,
		// then is discarded), or, during the publish, while the script is
		// in flight: held by the proxy, then delivered after the cancel.
		name: "context cancelled", hook: true, noDeadline: true,
		inject: func(c *caseRun, req request) action {
			if c.at != atPublish {
				c.cancel()
				return action{}
			}
			c.d.proxy.Pause()
			return action{then: func() {
				defer c.d.proxy.Resume()
				if err := poll(func() error {
					if held := c.d.proxy.Stats().Held; held == 0 {
						return fmt.Errorf("the publish script is not held by the proxy yet")
					}
					return nil
				}); err != nil {
					c.t.Error(err)
				}
				c.cancel()
			}}
		},
		want: func(p point) want {
			if p == atPublish {
				// Settled: a publish that ran is a success, one that did
				// not is the cancellation.
				return want{[]string{"context.Canceled", "nil"}, []string{published, notPublished}}
			}
			return want{[]string{"context.Canceled"}, notPub}
		},
	},
	{
		// The source panics before its first item, or at item 1000 (after
		// 5 batches). During the publish the source has returned, so a
		// hook on the publish script's EVALSHA panics in its place, on
		// Run's goroutine, before the script is sent.
		name: "panic in the source",
		inject: func(c *caseRun, req request) action {
			if c.at == atPublish {
				return action{panicWith: c.panicValue}
			}
			return action{}
		},
		want: func(p point) want { return want{[]string{"panic"}, notPub} },
	},
}

// stallWant accepts, before the publish, the held write's
// context.DeadlineExceeded beside ErrLockLost: when the write's deadline
// fires before the lease's watchdog, Run reports the deadline alone (the
// open bug of TestRacePausedRebuilder's comment).
func stallWant(p point) want {
	if p == atPublish {
		return want{[]string{"ErrLockLost"}, notPub}
	}
	return want{lockOrTime, notPub}
}

// panicValue is what a panicking source panics with, so that identity
// shows the original value came through.
type panicValue struct{ where string }

// caseRun is the state of one case.
type caseRun struct {
	t          testing.TB
	at         point
	d          *deployment
	s          shape
	obs        rueidis.Client // the test's client, straight to the server(s)
	admin      rueidis.Client // straight to d.srv only, for SCRIPT FLUSH
	in         *interceptor
	cancel     context.CancelFunc
	panicValue *panicValue

	holdUntil    time.Time    // a proxy stall ends then
	resumed      <-chan error // a SIGSTOP ends when this receives
	restarted    bool         // the server was killed and restarted
	successorErr error        // the successor's Run error
	successorRan bool         // the successor ran
	successorAt  genWindow    // when the successor ran
	seeded       map[string]redistest.KeyState
	seededGens   map[string]map[string]string // each builder's generation record after the seeding run
}

// runSuccessor waits until the stalled run's locks have expired, then
// rebuilds the keys with v3 through the test's own client.
func (c *caseRun) runSuccessor() {
	st := store.New(c.obs, store.Options{})
	locks := []string{st.LockKey(c.s.email), st.LockKey(c.s.score), st.LockKey(c.s.country)}
	if err := poll(func() error {
		n, err := c.obs.Do(context.Background(), c.obs.B().Exists().Key(locks...).Build()).AsInt64()
		if err == nil && n > 0 {
			err = fmt.Errorf("%d locks of the stalled run still held", n)
		}
		return err
	}); err != nil {
		c.t.Errorf("successor: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), faultRunTimeout)
	defer cancel()
	c.successorAt.from = time.Now()
	_, c.successorErr = redistest.Rebuilder(c.t, c.obs, rebuild.Options{}, c.s.builders()...).Run(ctx, sources.Slice(v3.items()))
	c.successorAt.to = time.Now()
	c.successorRan = true
}

// respSize is the size of cmds in RESP, as sent.
func respSize(cmds []rueidis.Completed) int64 {
	var n int64
	for _, cmd := range cmds {
		args := cmd.Commands()
		n += int64(len(fmt.Sprintf("*%d\r\n", len(args))))
		for _, a := range args {
			n += int64(len(fmt.Sprintf("$%d\r\n", len(a))) + len(a) + 2)
		}
	}
	return n
}

// TestFaults runs every fault at every injection point on a private
// standalone server each, and every fault that makes sense on a cluster
// (at one point each with -short); see clusterRows.
func TestFaults(t *testing.T) {
	report.mu.Lock()
	report.rows = nil
	report.mu.Unlock()
	start := time.Now()
	t.Cleanup(func() {
		report.mu.Lock()
		md := markdown(report.rows)
		report.mu.Unlock()
		t.Logf("fault suite, %v:\n%s", time.Since(start).Round(time.Second), md)
		if *faultsReport != "" {
			if err := os.WriteFile(*faultsReport, []byte(md), 0o644); err != nil {
				t.Error(err)
			}
		}
	})

	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		for _, f := range faults {
			if f.holds {
				continue
			}
			for _, p := range points {
				t.Run(f.name+"/"+p.short(), func(t *testing.T) {
					t.Parallel()
					runCase(t, f, p, standalone(t, f.serverArgs...))
				})
			}
		}
	})
	// Mid-stream, with Options.Unordered: a second round trip is in flight
	// when the fault hits, and must be over before the cleanup. On the
	// package's cluster, the faults that stay on the case's connections.
	t.Run("unordered", func(t *testing.T) {
		t.Parallel()
		for _, f := range faults {
			if f.holds {
				continue
			}
			row, onShared := clusterRows[f.name]
			onShared = onShared && !row.private
			for _, name := range []string{"standalone", "cluster"} {
				if name == "cluster" && !onShared {
					continue
				}
				t.Run(name+"/"+f.name+"/"+atMid.short(), func(t *testing.T) {
					t.Parallel()
					var d *deployment
					if name == "cluster" {
						d = onCluster(t, env.Cluster, true)
					} else {
						d = standalone(t, f.serverArgs...)
					}
					d.name += ", unordered"
					d.unordered = true
					runCase(t, f, atMid, d)
				})
			}
		}
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		for _, f := range faults {
			if f.holds {
				continue
			}
			for _, p := range clusterPoints(f, false) {
				t.Run(f.name+"/"+p.short(), func(t *testing.T) {
					t.Parallel()
					runCase(t, f, p, onCluster(t, env.Cluster, true))
				})
			}
		}
	})
	// The faults that hold a run past its TTL, standalone and on the
	// package's cluster, all at once: see caseT.
	t.Run("holding", func(t *testing.T) {
		t.Parallel()
		// At most holdingBusy cases at a time set up, seed and run up to
		// their fault; the waiting that follows overlaps freely.
		gate := make(chan struct{}, holdingBusy)
		var wg sync.WaitGroup
		start := func(name string, run func(ct *caseT)) {
			ct := &caseT{TB: t, name: t.Name() + "/" + name, gate: gate}
			wg.Go(func() {
				ct.busy()
				defer ct.idle()
				run(ct)
			})
		}
		for _, f := range faults {
			if !f.holds {
				continue
			}
			for _, p := range points {
				start("standalone/"+f.name+"/"+p.short(), func(ct *caseT) { runCase(ct, f, p, standalone(ct, f.serverArgs...)) })
			}
			for _, p := range clusterPoints(f, false) {
				start("cluster/"+f.name+"/"+p.short(), func(ct *caseT) { runCase(ct, f, p, onCluster(ct, env.Cluster, true)) })
			}
			for _, p := range clusterPoints(f, true) {
				// A private cluster for each case: the fault stops a
				// whole node.
				start("cluster-private/"+f.name+"/"+p.short(), func(ct *caseT) {
					runCase(ct, f, p, onCluster(ct, startCluster(ct), false))
				})
			}
		}
		wg.Wait()
	})
	t.Run("cluster-private", func(t *testing.T) {
		t.Parallel()
		cl := startCluster(t)
		for _, f := range faults {
			if f.holds {
				continue
			}
			for _, p := range clusterPoints(f, true) {
				// One at a time: each of these faults hits a whole node.
				t.Run(f.name+"/"+p.short(), func(t *testing.T) { runCase(t, f, p, onCluster(t, cl, false)) })
			}
		}
	})
}

// startCluster starts a private 3-master cluster, stopped when t ends.
func startCluster(t testing.TB) *redistest.Cluster { return redistest.OwnCluster(t, 3) }

// clusterRows is where each fault runs on a cluster, and at which point
// with -short (otherwise at every point). Faults that stay on the case's own connections run on the
// package's cluster; those that hit a whole node (private) on a private
// cluster, one case at a time. Killing a master is left out: the test
// clusters have no persistence and no replicas, so a killed master loses
// its slots' data. The plain stall is covered by the stall with successor.
var clusterRows = map[string]struct {
	private bool
	at      point
}{
	"connection cut":                 {false, atPublish},
	"connection cut + partition":     {false, atBefore},
	"stall past the TTL + successor": {false, atPublish},
	"context cancelled":              {false, atPublish},
	"panic in the source":            {false, atMid},
	"SIGSTOP past the TTL":           {true, atPublish},
	"OOM":                            {true, atMid},
	"SCRIPT FLUSH":                   {true, atMid},
}

// clusterPoints returns the points at which f runs on a (private) cluster.
func clusterPoints(f faultSpec, private bool) []point {
	row, ok := clusterRows[f.name]
	switch {
	case !ok || row.private != private:
		return nil
	case !testing.Short():
		return points
	}
	return []point{row.at}
}

// runCase seeds the old value, runs the rebuild of the new one with the
// fault injected at p, and checks the state it leaves.
func runCase(t testing.TB, f faultSpec, p point, d *deployment) {
	c := &caseRun{t: t, at: p, d: d, s: newShape(d.prefix), obs: d.observe(t), admin: d.srv.Client(t),
		panicValue: &panicValue{f.name + " " + p.short()}}
	r := row{deployment: d.name, fault: f.name, point: p.String()}

	// The old value: a first, successful run, which leaves generation 1.
	ctx, cancel := context.WithTimeout(context.Background(), faultRunTimeout)
	defer cancel()
	seedAt := genWindow{from: time.Now()}
	if _, err := redistest.Rebuilder(t, c.obs, rebuild.Options{}, c.s.builders()...).Run(ctx, sources.Slice(v1.items())); err != nil {
		t.Fatalf("seeding run: %v", err)
	}
	seedAt.to = time.Now()
	if ok, why := sameLive(readLive(t, c.obs, d.prefix), c.s.expected(v1)); !ok {
		t.Fatalf("seeding run: live keys: %s", why)
	}
	c.seeded = liveOnly(redistest.Snapshot(t, c.obs, d.prefix))
	c.seededGens = map[string]map[string]string{}
	for _, k := range c.s.keys() {
		if err := checkGeneration(ctx, c.obs, k, d.cluster, 1, seedAt); err != nil {
			t.Fatalf("seeding run: %v", err)
		}
		m, err := genRecord(ctx, c.obs, metaKey(k, d.cluster))
		if err != nil {
			t.Fatalf("seeding run: %v", err)
		}
		c.seededGens[k] = m
	}

	// The faulted run.
	in := newInterceptor(t, p)
	in.hooked = f.hook || p == atPublish
	c.in = in
	var runCtx context.Context
	var runCancel context.CancelFunc
	if f.noDeadline {
		runCtx, runCancel = context.WithCancel(context.Background())
	} else {
		runCtx, runCancel = context.WithTimeout(context.Background(), faultRunTimeout)
	}
	defer runCancel()
	c.cancel = runCancel
	items := v2.items()
	src := func(yield func(fuser, error) bool) {
		for i, u := range items {
			if !f.hook && ((p == atBefore && i == 0) || (p == atMid && i == 5*faultBatch)) {
				panic(c.panicValue)
			}
			if !yield(u, nil) {
				return
			}
		}
	}
	rd := startReader(d.observe(t), c.s)
	type result struct {
		stats    rebuild.Stats
		err      error
		panicked any
	}
	done := make(chan result, 1)
	started := time.Now()
	var logged lockedBuffer // what the run logs: the cleanup steps that failed
	rb := redistest.Rebuilder(t, in.wrap(d.client), rebuild.Options{
		BatchSize: faultBatch, Writers: faultWriters, TTL: faultTTL, PreserveFor: faultPreserveFor,
		Unordered: d.unordered, MaxMerged: faultMaxMerged,
		Logger: slog.New(slog.NewTextHandler(&logged, nil)),
	}, c.s.builders()...)
	go func() {
		var res result
		defer func() {
			res.panicked = recover()
			done <- res
		}()
		res.stats, res.err = rb.Run(runCtx, sources.Seq2(src))
	}()
	var res result
	injected := false
	guard := time.NewTimer(faultRunTimeout + 30*time.Second)
	defer guard.Stop()
wait:
	for {
		select {
		case req := <-in.reqs:
			injected = true
			if ct, ok := t.(*caseT); ok {
				ct.idle() // from now on the case mostly waits
			}
			a := f.inject(c, req)
			req.reply <- a
			if a.then != nil {
				a.then()
			}
		case res = <-done:
			break wait
		case <-guard.C:
			t.Fatalf("Run still running %v after it started", time.Since(started))
		}
	}
	runEnd := time.Now()
	r.elapsed = runEnd.Sub(started)
	if n := in.runReturned(); n != 0 {
		r.bad = append(r.bad, fmt.Sprintf("leak: %d commands of the run still in flight when Run returned", n))
	}
	d.proxy.Refuse(false)
	if f.hook && !injected {
		t.Fatalf("the run never reached the injection point (%d write DoMultis): Run returned %v, panic %v, after %v",
			in.writes.Load(), res.err, res.panicked, r.elapsed)
	}

	// Let the fault end: the stall or the SIGSTOP is over, every held byte
	// delivered; then close the run's client and wait until the server has
	// closed every connection, so that it has run every command it got.
	if !c.holdUntil.IsZero() {
		if err := poll(func() error {
			if s := d.proxy.Stats(); time.Now().Before(c.holdUntil) || s.Held > 0 {
				return fmt.Errorf("stall not over: %d bytes held", s.Held)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	if c.resumed != nil {
		select {
		case err := <-c.resumed:
			if err != nil {
				t.Errorf("SIGCONT: %v", err)
			}
		case <-time.After(faultWait):
			t.Error("the server was never continued")
		}
	}
	select {
	case err := <-in.afterErr:
		t.Errorf("after the fault: %v", err)
	default:
	}
	d.client.Close()
	if err := pollFor(closeGrace, d.allClosed); err != nil {
		// rueidis v1.0.79 leaks a connection it was dialing when Close
		// ran: mux._pipe stores the new wire over the dead one Close put
		// in its place, and the connection stays open, idle, until the
		// process ends. A cluster refresh that a fault scheduled can be
		// dialing just then. None of the run's commands is on it: the
		// interceptor saw none in flight when Run returned and none sent
		// later (both checked above). Cut what is left: the server still
		// runs every command it received, then closes.
		t.Logf("%v after the client closed: connections rueidis dialed while closing; cutting them", err)
		d.cutAll()
		if err := poll(d.allClosed); err != nil {
			t.Error(err)
		}
	}
	quiet := time.Now() // the server has run every command of the run
	reads, gaps, firstGap := rd.finish()
	r.reads, r.gaps = reads, gaps
	r.noScript = in.noScript.Load()
	obs := d.observe(t) // a new client: the server may have been restarted

	// The outcome and the error.
	r.class, r.op = errClass(res.err, res.panicked), errOp(res.err)
	t.Logf("Run: class %s, op %q, err %v, panic %v, %v", r.class, r.op, res.err, res.panicked, r.elapsed)
	if l := logged.String(); l != "" {
		t.Logf("the run logged:\n%s", l)
	}
	live := readLive(t, obs, d.prefix)
	isOld, whyOld := sameLive(live, c.s.expected(v1))
	isNew, whyNew := sameLive(live, c.s.expected(v2))
	isNext, _ := sameLive(live, c.s.expected(v3))
	switch {
	case isOld:
		r.live = "old"
	case isNew:
		r.live = "new"
	case isNext:
		r.live = "successor's"
	default:
		r.live = "partial"
		r.bad = append(r.bad, fmt.Sprintf("lost data: the live keys are neither old (%s) nor new (%s)", whyOld, whyNew))
	}
	if isOld && !c.restarted {
		// Not only the same contents: byte for byte the same keys.
		if diff := cmp.Diff(c.seeded, liveOnly(redistest.Snapshot(t, obs, d.prefix))); diff != "" {
			r.bad = append(r.bad, "lost data: old contents, but not byte-identical: "+diff)
		}
	}
	// The generation records went with the live keys, in the same atomic
	// step: untouched where the old value is live, generation 2 where a
	// run published over it (the faulted run's or the successor's).
	gctx, gcancel := context.WithTimeout(context.Background(), faultWait)
	defer gcancel()
	for _, k := range c.s.keys() {
		var err error
		switch {
		case isOld:
			err = sameGeneration(gctx, obs, k, d.cluster, c.seededGens[k])
		case isNew:
			err = checkGeneration(gctx, obs, k, d.cluster, 2, genWindow{from: started, to: runEnd})
		case isNext:
			err = checkGeneration(gctx, obs, k, d.cluster, 2, c.successorAt)
		}
		if err != nil {
			r.bad = append(r.bad, "generation: "+err.Error())
		}
	}
	fail := res.err != nil || res.panicked != nil
	// Only ErrOutcomeUnknown leaves the outcome open: every other failure
	// says that nothing was published.
	unknown := res.err != nil && errors.Is(res.err, rebuild.ErrOutcomeUnknown)
	switch {
	case f.successor && isNew:
		r.outcome = "stale publish"
		r.bad = append(r.bad, "stale publish: the stalled run's value replaced the successor's")
	case f.successor && isNext:
		r.outcome = successorLive
	case f.successor:
		r.outcome = "successor's publish lost"
		r.bad = append(r.bad, "lost data: the successor's value is not live")
	case !fail && isNew:
		r.outcome = published
	case !fail && isOld:
		r.outcome = "success reported, not published"
		r.bad = append(r.bad, "lost data: Run returned nil but the old value is live")
	case fail && unknown && isOld:
		r.outcome = unknownNot
	case fail && unknown && isNew:
		r.outcome = unknownPublished
	case fail && isOld:
		r.outcome = notPublished
	case fail && isNew:
		r.outcome = "failure reported, published"
		r.bad = append(r.bad, fmt.Sprintf("lost data: Run failed with %v (%s), which says nothing was published, but the new value is live", res.err, r.class))
	default:
		r.outcome = "partial"
	}
	// Stats.Generations names the generation the publish made, unless the
	// run failed or its publish reply was lost (then it is empty).
	if g := res.stats.Generations; len(g) > 0 {
		want := map[string]int64{}
		for _, k := range c.s.keys() {
			want[k] = 2
		}
		if fail || !isNew || !maps.Equal(g, want) {
			r.bad = append(r.bad, fmt.Sprintf("generation: Stats.Generations %v after Run returned %v, want %v or empty", g, res.err, want))
		}
	}
	if f.successor {
		if !c.successorRan || c.successorErr != nil {
			t.Errorf("successor: ran %v, err %v; want a successful run", c.successorRan, c.successorErr)
		}
	}
	if gaps > 0 {
		r.bad = append(r.bad, fmt.Sprintf("gap: %d of %d reads saw the live keys missing, partial or mixed (first: %s)", gaps, reads, firstGap))
	}
	if reads == 0 {
		t.Error("the reader never read the live keys")
	}
	if res.panicked != nil && res.panicked != any(c.panicValue) {
		t.Errorf("panic value: got %T %v, want the source's own %v, unwrapped", res.panicked, res.panicked, c.panicValue)
	}

	// Leftovers: temp keys bounded by PreserveFor, locks and their records
	// by the lease, receipts by their own short TTL.
	for _, l := range leftovers(t, obs, d.prefix) {
		switch l.kind {
		case leftLock, leftRecord:
			if l.kind == leftLock {
				r.locks++
			} else {
				r.records++
			}
			if l.pttl < 0 || l.pttl > faultTTL {
				r.bad = append(r.bad, fmt.Sprintf("leak: %s %s has PTTL %v, want (0, %v]", l.kind, l.key, l.pttl, faultTTL))
			}
		case leftReceipt:
			r.receipts++
			r.receiptMaxTTL = max(r.receiptMaxTTL, l.pttl)
			if l.pttl < 0 || l.pttl > faultReceiptTTL {
				r.bad = append(r.bad, fmt.Sprintf("leak: receipt %s has PTTL %v, want (0, %v]", l.key, l.pttl, faultReceiptTTL))
			}
		default:
			r.temps++
			r.tempMaxTTL = max(r.tempMaxTTL, l.pttl)
			if l.pttl < 0 {
				r.tempsNoTTL++
			}
			if l.pttl < 0 || l.pttl > faultPreserveFor {
				r.bad = append(r.bad, fmt.Sprintf("leak: temp key %s has PTTL %v, want (0, %v]", l.key, l.pttl, faultPreserveFor))
			}
		}
	}
	// No lock outlives its lease: a TTL after the run returned (the last
	// renewal can be no later), none is left. Nor does a lock's record or
	// log: a TTL after the server ran the run's last command, which may
	// be a batch held past the lease that re-created the record (with an
	// EXPIRE NX of a TTL).
	lockDeadline := runEnd.Add(faultTTL + 250*time.Millisecond)
	recordDeadline := quiet.Add(faultTTL + 250*time.Millisecond)
	var lastLocks, lastRecords []string
	for locksDone, recordsDone := false, false; !locksDone || !recordsDone; {
		var locks, records []string
		for _, l := range leftovers(t, obs, d.prefix) {
			switch l.kind {
			case leftLock:
				locks = append(locks, l.key)
			case leftRecord:
				records = append(records, l.key)
			}
		}
		now := time.Now()
		if !locksDone {
			lastLocks, locksDone = locks, len(locks) == 0 || now.After(lockDeadline)
		}
		if !recordsDone {
			lastRecords, recordsDone = records, len(records) == 0 || now.After(recordDeadline)
		}
		if !locksDone || !recordsDone {
			time.Sleep(50 * time.Millisecond) // poll interval
		}
	}
	if r.locksPastTTL = len(lastLocks); r.locksPastTTL > 0 {
		r.bad = append(r.bad, fmt.Sprintf("leak: locks %q outlived the lease (%v after the run returned)", lastLocks, faultTTL))
	}
	if r.recordsPastTTL = len(lastRecords); r.recordsPastTTL > 0 {
		r.bad = append(r.bad, fmt.Sprintf("leak: records %q outlived the lease (%v after the server ran the run's last command)", lastRecords, faultTTL))
	}
	// Checked last, so that the run's leftovers, if any, had the whole
	// observation to show up.
	if n, first := in.lateCommands(); n != 0 {
		r.bad = append(r.bad, fmt.Sprintf("leak: %d commands sent after Run returned (first: %s)", n, first))
	}

	addRow(r)
	w := f.want(p)
	if !slices.Contains(w.classes, r.class) {
		t.Errorf("Run: got error class %s (%v), want one of %q", r.class, res.err, w.classes)
	}
	if r.class == "other" {
		t.Errorf("Run: the error does not name its cause (no sentinel, context, OOM or network error): %v", res.err)
	}
	if !slices.Contains(w.outcomes, r.outcome) {
		t.Errorf("outcome: got %q (live keys %s), want one of %q", r.outcome, r.live, w.outcomes)
	}
	for _, b := range r.bad {
		t.Errorf("broken invariant: %s", b)
	}
	if f.name == "SCRIPT FLUSH" && r.noScript == 0 {
		t.Errorf("no NOSCRIPT reply seen after SCRIPT FLUSH: the fault did not bite")
	}
	t.Logf("%s / %s / %s: outcome %q, live %s, temps %d (max %v), locks %d/%d, gaps %d/%d, NOSCRIPT %d",
		r.fault, r.point, r.deployment, r.outcome, r.live, r.temps, r.tempMaxTTL, r.locks, r.locksPastTTL, gaps, reads, r.noScript)
	if strings.Contains(r.outcome, "unknown") {
		t.Logf("the publish outcome is unknown to the caller: Run returned %v", res.err)
	}
}

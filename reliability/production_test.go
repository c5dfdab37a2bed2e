package reliability

// Production conditions (RELIABILITY.md, "Production conditions"): a
// failover to a replica that was behind, a restart from an older snapshot,
// a restart from an AOF, Options.Durability, and publish replies lost on
// the way back. Each test runs one Hash rebuild of 1000 fields over a
// complete live hash of 1000 older fields, on redis-server processes of its
// own, in batches of 100 sent one by one (Writers 1), and asserts the run's
// error, the live key's whole contents and TTL, and what is left beside it.
//
// Each says what the code before the run record (d86fdeb) did in its
// place: there, Run returned nil after a failover or a restart that lost
// batches 4 to 6, and published a hash of 700 of the 1000 fields. The
// assertions that the live hash still holds its 1000 old fields, and that
// Run's error matches the sentinel, fail on that behaviour.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/redistest/replication"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

const (
	prodFields  = 1000 // fields of the live hash, old and new
	prodBatch   = 100  // BatchSize: 10 batches
	prodBatches = prodFields / prodBatch
)

var (
	prodOld = redistest.Fields("old", prodFields) // the live hash before the run
	prodNew = redistest.Fields("new", prodFields) // what the run builds
)

// prodItems is the run's source: item i is field f<i> = new-<i>.
func prodItems() sources.Source[int] {
	items := make([]int, prodFields)
	for i := range items {
		items[i] = i
	}
	return sources.Slice(items)
}

// prodHash is the run's one builder, for live.
func prodHash(live string) index.Builder[int] {
	return builders.Hash(live, func(i int) (string, string, bool) {
		return "f" + strconv.Itoa(i), "new-" + strconv.Itoa(i), true
	})
}

// prodOptions are the run's options: batches of 100, one at a time, so
// that the hook acts between two batches.
func prodOptions() rebuild.Options {
	return rebuild.Options{BatchSize: prodBatch, Writers: 1}
}

// batchTemp returns the temp key that multi, a DoMulti, HSETs, if any: a
// batch round trip of a Hash rebuild.
func batchTemp(multi []rueidis.Completed) (string, bool) {
	for _, cmd := range multi {
		if args := cmd.Commands(); len(args) > 1 && args[0] == "HSET" {
			if _, _, temp := store.ParseTempKey(args[1]); temp {
				return args[1], true
			}
		}
	}
	return "", false
}

// onBatch returns c with a hook that calls after(n, temp), on the run's
// sending goroutine, once its nth batch round trip has returned and before
// the run sees the replies: with Writers 1 the next batch is not sent until
// after returns. temp is the temp key the batch wrote.
func onBatch(c rueidis.Client, after func(n int, temp string)) rueidis.Client {
	var n atomic.Int64
	return rueidishook.WithHook(c, redistest.Hook{
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			temp, batch := batchTemp(multi) // before sending: rueidis recycles commands
			res := c.DoMulti(ctx, multi...)
			if batch {
				after(int(n.Add(1)), temp)
			}
			return res
		},
	})
}

// reach polls c until the server listening on port answers through it,
// and then until every connection of c does, so that none of the run's
// next commands fails on a connection that a failover or a kill broke.
// (rueidis sends a command with a key on any of its connections to a
// server, at random, and a command without one, such as the MULTI that
// opens every batch, on the first: the run's batches alone would leave the
// others broken, and the publish, which is never retried, would fail on
// one with EOF.)
func reach(c rueidis.Client, port int) error {
	return poll(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		m, err := c.Do(ctx, c.B().ConfigGet().Parameter("port").Build()).AsStrMap()
		if err != nil {
			return err
		}
		if m["port"] != strconv.Itoa(port) {
			return fmt.Errorf("reached port %s, want %d", m["port"], port)
		}
		// A broken connection fails one command and is replaced: 32 in a
		// row on connections picked at random have met every one.
		for range 32 {
			if err := c.Do(ctx, c.B().Exists().Key("reach").Build()).Error(); err != nil {
				return err
			}
		}
		return nil
	})
}

// wantKeys fails t unless the keys under prefix on c's server are exactly
// want: no temp key, lock, record or receipt beside them, and no
// generation where no publish happened, but for the owner stamps runs
// leave (redistest.IsOwnerStamp). Unlike redistest.Keys it scans a
// replica too.
func wantKeys(t testing.TB, c rueidis.Client, prefix string, want ...string) {
	t.Helper()
	slices.Sort(want)
	// The owner stamps the runs left (SPEC C104) stay, whatever their end.
	got := slices.DeleteFunc(scanKeys(t, c, prefix), func(k string) bool {
		return !slices.Contains(want, k) && redistest.IsOwnerStamp(t, c, k)
	})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("keys under %q (-want +got):\n%s", prefix, diff)
	}
}

// scanKeys returns the keys under prefix on the one server c reaches,
// sorted.
func scanKeys(t testing.TB, c rueidis.Client, prefix string) []string {
	t.Helper()
	var out []string
	var cursor uint64
	for {
		e, err := c.Do(context.Background(), c.B().Scan().Cursor(cursor).Match(prefix+"*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Fatalf("SCAN %s*: %v", prefix, err)
		}
		out = append(out, e.Elements...)
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	slices.Sort(out)
	return out
}

// dump returns the DUMP of key on c's server: its exact value, to compare
// on one server process (another process's hash seed orders a hash
// differently).
func dump(t testing.TB, c rueidis.Client, key string) string {
	t.Helper()
	d, err := c.Do(context.Background(), c.B().Dump().Key(key).Build()).ToString()
	if err != nil {
		t.Fatalf("DUMP %s: %v", key, err)
	}
	return d
}

// wantDump fails t unless key's DUMP on c's server is want.
func wantDump(t testing.TB, c rueidis.Client, key, want string) {
	t.Helper()
	if got := dump(t, c, key); got != want {
		t.Errorf("%s changed: DUMP %q, want %q", key, got, want)
	}
}

// wantHashLen fails t unless the hash key holds n fields.
func wantHashLen(t testing.TB, c rueidis.Client, key string, n int64) {
	t.Helper()
	got, err := c.Do(context.Background(), c.B().Hlen().Key(key).Build()).AsInt64()
	if err != nil || got != n {
		t.Errorf("HLEN %s: got %d, %v, want %d", key, got, err, n)
	}
}

// wantRecordBatches fails t unless the run record of live holds n batches.
func wantRecordBatches(t testing.TB, c rueidis.Client, live string, n int) {
	t.Helper()
	record := keys.RecordKey(keys.LockKey(live, false))
	got, err := c.Do(context.Background(), c.B().Hget().Key(record).Field("batches").Build()).ToString()
	if err != nil || got != strconv.Itoa(n) {
		t.Errorf("HGET %s batches: got %q, %v, want %d", record, got, err, n)
	}
}

// TestProductionFailover fails the master over to its replica mid-run,
// while the replica is three batches behind: batches 1-3 replicated, the
// link stalled, batches 4-6 acknowledged by the master alone, then the
// master killed and the replica promoted; batches 7-10 go to the promoted
// replica. Its temp key then holds 700 of the 1000 fields, and its run
// record 3 of the 6 batches acknowledged before the failover.
//
// The old code (d86fdeb) kept no record: it wrote batches 7-10 into the
// promoted replica's temp key, published those 700 fields over the live
// hash and returned nil. Here the record's count gives the loss away, at
// the next heartbeat or at the latest in the publish: Run must fail with
// ErrWritesLost, and the promoted replica's live hash must be the complete
// old one, byte for byte.
func TestProductionFailover(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t)
	pair := replication.Start(t)
	c := pair.Client(t)
	replica := pair.Replica.Client(t)
	prefix := redistest.Prefix(t)
	live := prefix + "by-email"
	redistest.SeedHash(t, c, live, prodOld)
	if err := pair.WaitSync(ctx); err != nil {
		t.Fatal(err)
	}
	before := dump(t, replica, live) // DUMP differs across processes: compare on one

	var failedOver atomic.Bool
	hooked := onBatch(c, func(n int, temp string) {
		switch n {
		case 3:
			// Every write so far is on the replica, and no later one.
			if err := pair.WaitSync(ctx); err != nil {
				t.Error(err)
			}
			pair.Link.Pause()
		case 6:
			if _, err := pair.Failover(ctx); err != nil {
				t.Error(err)
				return
			}
			failedOver.Store(true)
			// What the old code would have built on: 3 batches of 6.
			wantHashLen(t, replica, temp, 3*prodBatch)
			wantRecordBatches(t, replica, live, 3)
			if err := reach(c, pair.Replica.Port); err != nil {
				t.Errorf("the run's client never reached the promoted replica: %v", err)
			}
		}
	})
	r := redistest.Rebuilder(t, hooked, prodOptions(), prodHash(live))
	stats, err := r.Run(ctx, prodItems())
	t.Logf("Run after %d batches: %v", stats.Batches, err)
	if !failedOver.Load() {
		t.Fatalf("the run never reached its 6th batch: %v", err)
	}
	redistest.WantErr(t, err, rebuild.ErrWritesLost)
	redistest.WantErr(t, err, rebuild.ErrTempKeyLost)
	redistest.WantHash(t, replica, live, prodOld)
	wantDump(t, replica, live, before)
	wantKeys(t, replica, prefix, live)
}

// restartCase runs the rebuild on srv, a server of the test's own, with a
// SAVE after batch 3 and a SIGKILL and restart after batch 6, and returns
// Run's error once it has checked what the restarted server held after the
// restart: check(temp) runs then, with the run's temp key.
func restartCase(t *testing.T, srv *redistest.Server, live string, check func(temp string)) error {
	t.Helper()
	ctx := redistest.Ctx(t)
	c := srv.Client(t)
	admin := srv.Client(t)
	redistest.SeedHash(t, admin, live, prodOld)
	var restarted atomic.Bool
	hooked := onBatch(c, func(n int, temp string) {
		switch n {
		case 3:
			if err := admin.Do(ctx, admin.B().Save().Build()).Error(); err != nil {
				t.Errorf("SAVE: %v", err)
			}
		case 6:
			if err := srv.Kill(); err != nil {
				t.Error(err)
				return
			}
			if err := srv.Restart(); err != nil {
				t.Error(err)
				return
			}
			restarted.Store(true)
			if err := reach(c, srv.Port); err != nil {
				t.Errorf("the run's client never reached the restarted server: %v", err)
			}
			if err := reach(admin, srv.Port); err != nil {
				t.Errorf("the admin client never reached the restarted server: %v", err)
			}
			check(temp)
		}
	})
	r := redistest.Rebuilder(t, hooked, prodOptions(), prodHash(live))
	stats, err := r.Run(ctx, prodItems())
	t.Logf("Run after %d batches: %v", stats.Batches, err)
	if !restarted.Load() {
		t.Fatalf("the run never reached its 6th batch: %v", err)
	}
	return err
}

// TestProductionRestartFromSnapshot restarts the server from a snapshot
// taken after batch 3, once batch 6 was acknowledged: the restarted server
// has the lock, the run record at 3 batches and a temp key of 300 fields,
// and batches 7-10 then add 400.
//
// The old code (d86fdeb) published those 700 fields and returned nil. The
// lock survives in the snapshot (it was taken before batch 1), so the run
// does not fail with ErrLockLost but with ErrWritesLost, and the live hash
// is the complete old one. (A restarted server rebuilds its hashes with a
// fresh hash seed, so their DUMP differs: they are compared by HGETALL.)
func TestProductionRestartFromSnapshot(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	admin := srv.Client(t)
	prefix := redistest.Prefix(t)
	live := prefix + "by-email"
	err := restartCase(t, srv, live, func(temp string) {
		wantHashLen(t, admin, temp, 3*prodBatch)
		wantRecordBatches(t, admin, live, 3)
	})
	redistest.WantErr(t, err, rebuild.ErrWritesLost)
	redistest.WantErr(t, err, rebuild.ErrTempKeyLost)
	if errors.Is(err, rebuild.ErrLockLost) {
		t.Errorf("err = %v: matches ErrLockLost, but the lock was in the snapshot", err)
	}
	redistest.WantHash(t, admin, live, prodOld)
	wantKeys(t, admin, prefix, live)
}

// TestProductionRestartFromAOF is the same restart on a server with
// appendonly yes and appendfsync always: every write the server
// acknowledged survives the kill (the snapshot is ignored), so the
// restarted server has all 6 batches, the run goes on and publishes all
// 1000 new fields.
func TestProductionRestartFromAOF(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t, "--appendonly", "yes", "--appendfsync", "always")
	admin := srv.Client(t)
	prefix := redistest.Prefix(t)
	live := prefix + "by-email"
	err := restartCase(t, srv, live, func(temp string) {
		wantHashLen(t, admin, temp, 6*prodBatch)
		wantRecordBatches(t, admin, live, 6)
	})
	if err != nil {
		t.Fatalf("Run: %v, want nil: the AOF kept every acknowledged write", err)
	}
	redistest.WantHash(t, admin, live, prodNew)
	wantKeys(t, admin, prefix, live, keys.MetaKey(live, false))
}

// TestProductionDurability (C58) runs with Options.Durability: a WAIT for one
// replica that the stalled link keeps from acknowledging refuses the
// publish; one it acknowledges lets it through, and the replica then has
// the new index; WAITAOF, which redis-server 7.0 lacks, is refused before
// anything is written. The old code (d86fdeb) had no Durability: it
// published what the master alone held.
func TestProductionDurability(t *testing.T) {
	t.Parallel()
	durable := func() rebuild.Options {
		o := prodOptions()
		o.Durability = rebuild.Durability{Replicas: 1, Timeout: 500 * time.Millisecond}
		return o
	}

	t.Run("link stalled before the publish", func(t *testing.T) {
		t.Parallel()
		ctx := redistest.Ctx(t)
		pair := replication.Start(t)
		c := pair.Client(t)
		master, replica := pair.Master.Client(t), pair.Replica.Client(t)
		prefix := redistest.Prefix(t)
		live := prefix + "by-email"
		redistest.SeedHash(t, c, live, prodOld)
		if err := pair.WaitSync(ctx); err != nil {
			t.Fatal(err)
		}
		before := redistest.Snapshot(t, master, prefix)
		beforeReplica := dump(t, replica, live)
		hooked := onBatch(c, func(n int, _ string) {
			if n == prodBatches {
				pair.Link.Pause()
			}
		})
		r := redistest.Rebuilder(t, hooked, durable(), prodHash(live))
		_, err := r.Run(ctx, prodItems())
		t.Logf("Run: %v", err)
		redistest.WantErr(t, err, rebuild.ErrNotDurable)
		if !strings.Contains(err.Error(), "0 of 1 replicas") {
			t.Errorf("err = %q, want it to say 0 of 1 replicas acknowledged", err)
		}
		redistest.WantHash(t, master, live, prodOld)
		redistest.WantUnchanged(t, master, prefix, before)

		// Once the link flows again the replica is as the master.
		pair.Link.Resume()
		if err := pair.WaitSync(ctx); err != nil {
			t.Fatal(err)
		}
		redistest.WantHash(t, replica, live, prodOld)
		wantDump(t, replica, live, beforeReplica)
		wantKeys(t, replica, prefix, live)
	})

	t.Run("link flowing", func(t *testing.T) {
		t.Parallel()
		ctx := redistest.Ctx(t)
		pair := replication.Start(t)
		c := pair.Client(t)
		replica := pair.Replica.Client(t)
		prefix := redistest.Prefix(t)
		live := prefix + "by-email"
		redistest.SeedHash(t, c, live, prodOld)
		// Until the replica's first acknowledgement after its initial
		// sync, which can come a second after replication.Start returned,
		// the master streams it nothing and WAIT counts it out: wait for
		// the seed to reach it.
		if err := pair.WaitSync(ctx); err != nil {
			t.Fatal(err)
		}
		// A timeout a loaded machine's replica meets: this run must
		// succeed, and 500 ms is a bound only a refused run may hit.
		o := durable()
		o.Durability.Timeout = 30 * time.Second
		r := redistest.Rebuilder(t, c, o, prodHash(live))
		if _, err := r.Run(ctx, prodItems()); err != nil {
			t.Fatalf("Run: %v, want nil", err)
		}
		redistest.WantHash(t, c, live, prodNew)
		if err := pair.WaitSync(ctx); err != nil {
			t.Fatal(err)
		}
		redistest.WantHash(t, replica, live, prodNew)
		wantKeys(t, replica, prefix, live, keys.MetaKey(live, false))
	})

	t.Run("LocalAOF on Redis 7.0", func(t *testing.T) {
		t.Parallel()
		ctx := redistest.Ctx(t)
		srv := redistest.OwnServer(t, "--appendonly", "yes")
		admin := srv.Client(t)
		prefix := redistest.Prefix(t)
		live := prefix + "by-email"
		redistest.SeedHash(t, admin, live, prodOld)
		before := redistest.Snapshot(t, admin, prefix)
		var mu sync.Mutex
		var sent []string
		record := func(cmds ...rueidis.Completed) {
			mu.Lock()
			defer mu.Unlock()
			for _, cmd := range cmds {
				sent = append(sent, strings.Join(cmd.Commands(), " "))
			}
		}
		hooked := redistest.Watch(srv.Client(t), record)
		o := prodOptions()
		o.Durability = rebuild.Durability{LocalAOF: true}
		r := redistest.Rebuilder(t, hooked, o, prodHash(live))
		_, err := r.Run(ctx, prodItems())
		t.Logf("Run: %v", err)
		redistest.WantErr(t, err, rebuild.ErrNotDurable)
		for _, want := range []string{"WAITAOF", "7.2"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("err = %q, want it to name %s", err, want)
			}
		}
		// The probe is all that was sent, on a connection bound to the
		// lock's master by a read: no lock, record or temp key was ever
		// written.
		if want := []string{"EXISTS " + keys.RecordKey(keys.LockKey(live, false)), "WAITAOF 0 0 1"}; !slices.Equal(sent, want) {
			t.Errorf("commands sent: got %q, want %q", sent, want)
		}
		redistest.WantUnchanged(t, admin, prefix, before)
	})
}

// TestProductionDurabilityNoConnection (C58): the application holds every free
// connection of the client's blocking pool (BlockingPoolSize 2) to the
// server of the run's lock, as blocking commands would, from before the
// run (both: its check that WAIT may run needs the pool too) or from its
// first batch (the one its writes do not hold, C81: the wait before the
// publish then has no connection to wait on),
// on a standalone server and on a cluster (whose client takes the
// connection in the wait's first command). Either way the run fails closed
// after Durability.Timeout, with an error matching ErrNotDurable that names
// the pool, the live key untouched and nothing left; and the pool still
// counts every connection the application holds: no one gets another.
// Before, rueidis's Dedicated waited for the pool without a deadline, and
// the check and a cluster's wait only under the run's context: the run
// hung, its lease unrenewed, until the pool came free. Then the check's
// WAIT, sent on the client, and a cluster's wait for a connection were cut
// short by the timeout while they waited for the pool, which rueidis counts
// as a connection given back: the pool had room for one more.
func TestProductionDurabilityNoConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		cluster, beforeRun bool
	}{
		{"standalone, held before the run", false, true},
		{"standalone, held from the first batch", false, false},
		{"cluster, held before the run", true, true},
		{"cluster, held from the first batch", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testDurabilityNoConnection(t, tc.cluster, tc.beforeRun)
		})
	}
}

func testDurabilityNoConnection(t *testing.T, cluster, beforeRun bool) {
	ctx := redistest.Ctx(t)
	opt := rueidis.ClientOption{DisableCache: true, BlockingPoolSize: 2}
	var admin rueidis.Client
	if cluster {
		cl := redistest.OwnCluster(t, 3)
		opt.InitAddress, admin = cl.Addrs, cl.Client(t)
	} else {
		srv := redistest.OwnServer(t)
		opt.InitAddress, opt.ForceSingleClient, admin = []string{srv.Addr}, true, srv.Client(t)
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(c.Close)
	prefix := redistest.Prefix(t)
	live := prefix + "by-email"
	var once, freed sync.Once
	var releases []func()
	take := func() {
		// A cluster client takes the connection on the first command,
		// from the pool of its key's server: the lock's.
		held, release := c.Dedicate()
		releases = append(releases, release)
		if err := held.Do(ctx, held.B().Get().Key(keys.LockKey(live, cluster)).Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
			t.Errorf("GET on a held connection: %v", err)
		}
	}
	hold := func(n int) {
		once.Do(func() {
			for range n {
				take()
			}
		})
	}
	free := func() {
		freed.Do(func() {
			for _, release := range releases {
				release()
			}
		})
	}
	t.Cleanup(free)
	if beforeRun {
		hold(opt.BlockingPoolSize)
	}
	redistest.SeedHash(t, admin, live, prodOld)
	before := redistest.Snapshot(t, admin, prefix)
	o := prodOptions()
	o.Durability = rebuild.Durability{Replicas: 1, Timeout: 500 * time.Millisecond}
	r := redistest.Rebuilder(t, onBatch(c, func(int, string) { hold(opt.BlockingPoolSize - 1) }), o, prodHash(live))
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, prodItems())
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute: the durability wait waits for the pool")
	}
	t.Logf("Run: %v", err)
	redistest.WantErr(t, err, rebuild.ErrNotDurable)
	if !strings.Contains(err.Error(), "BlockingPoolSize") {
		t.Errorf("err = %q, want it to name the blocking pool", err)
	}
	redistest.WantUnchanged(t, admin, prefix, before)
	redistest.WantClean(t, admin, prefix)
	// The waits the run gave up on are no connections the pool lost count
	// of: once the application holds the one the run's writes gave back,
	// none is free.
	for len(releases) < opt.BlockingPoolSize {
		take()
	}
	redistest.WantPoolFull(t, c, keys.LockKey(live, cluster), free)
}

// TestProductionLostPublishReply (C59) loses the publish script's reply after the
// script ran, so that the run settles it from the receipt the script left.
//
//   - The reply is replaced by a network error, and the release that
//     settles it runs twice, as rueidis runs a retryable script again after
//     a lost reply. The second run must still find the receipt (the first
//     marks it read rather than deleting it), so Run reports the publish
//     that happened: nil. The old code (d86fdeb) deleted the receipt in the
//     first release, so the second found none, and Run returned the
//     network error, "nothing was published", over the new index.
//   - The client is closed right after the script ran, and the publish
//     returns rueidis.ErrClosing: Redis cannot be asked any more, so Run's
//     error must match ErrOutcomeUnknown, with the new index live. The old
//     code did not count ErrClosing as a lost reply: it returned it
//     unchanged, and every error but ErrOutcomeUnknown means that nothing
//     was published.
func TestProductionLostPublishReply(t *testing.T) {
	t.Parallel()
	publish, release := redistest.ScriptNamed("publish"), redistest.ScriptNamed("release")

	t.Run("network error, release retried", func(t *testing.T) {
		t.Parallel()
		ctx := redistest.Ctx(t)
		srv := redistest.OwnServer(t)
		admin := srv.Client(t)
		prefix := redistest.Prefix(t)
		live := prefix + "by-email"
		redistest.SeedHash(t, admin, live, prodOld)
		var ran, settled atomic.Bool
		var releases atomic.Int64
		hooked := rueidishook.WithHook(srv.Client(t), redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				args := slices.Clone(cmd.Commands())
				switch {
				case publish.Is(args):
					res := c.Do(ctx, cmd)
					if res.Error() != nil {
						return res // NOSCRIPT: rueidis sends EVAL next
					}
					ran.Store(true)
					return rueidis.NewErrorResult(&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET})
				case release.Is(args) && ran.Load() && !settled.Load():
					res := c.Do(ctx, cmd)
					if res.Error() != nil {
						return res
					}
					settled.Store(true)
					releases.Add(2)
					// Its reply is lost: run it again.
					return c.Do(ctx, c.B().Arbitrary(args...).Build())
				}
				return c.Do(ctx, cmd)
			},
		})
		r := redistest.Rebuilder(t, hooked, prodOptions(), prodHash(live))
		stats, err := r.Run(ctx, prodItems())
		if err != nil {
			t.Fatalf("Run: %v, want nil: the publish ran", err)
		}
		if !ran.Load() || releases.Load() != 2 {
			t.Fatalf("publish ran %v, settling releases %d: want true, 2", ran.Load(), releases.Load())
		}
		if got := stats.Outcomes[live]; got != rebuild.Swapped {
			t.Errorf("Stats.Outcomes[%s] = %v, want %v", live, got, rebuild.Swapped)
		}
		redistest.WantHash(t, admin, live, prodNew)
		wantKeys(t, admin, prefix, live, keys.MetaKey(live, false))
	})

	t.Run("client closed", func(t *testing.T) {
		t.Parallel()
		ctx := redistest.Ctx(t)
		srv := redistest.OwnServer(t) // the lock it leaves would fail the test run again (-count) on a shared one
		admin := srv.Client(t)
		prefix := redistest.Prefix(t)
		live := prefix + "by-email"
		redistest.SeedHash(t, admin, live, prodOld)
		const ttl = 10 * time.Second
		c := srv.Client(t)
		var ran atomic.Bool
		hooked := rueidishook.WithHook(c, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if !publish.Is(cmd.Commands()) {
					return c.Do(ctx, cmd)
				}
				res := c.Do(ctx, cmd)
				if res.Error() != nil {
					return res // NOSCRIPT: rueidis sends EVAL next
				}
				ran.Store(true)
				c.Close()
				return rueidis.NewErrorResult(rueidis.ErrClosing)
			},
		})
		o := prodOptions()
		o.TTL = ttl
		r := redistest.Rebuilder(t, hooked, o, prodHash(live))
		_, err := r.Run(ctx, prodItems())
		t.Logf("Run: %v", err)
		if !ran.Load() {
			t.Fatalf("the publish never ran: %v", err)
		}
		redistest.WantErr(t, err, rebuild.ErrOutcomeUnknown)
		redistest.WantHash(t, admin, live, prodNew)
		// Nothing could be released: the lock and the run record expire
		// within the lease, the receipt within its 30 s. The temp key was
		// renamed over the live key.
		lock := keys.LockKey(live, false)
		bounds := map[string]time.Duration{
			lock:                  ttl,
			keys.RecordKey(lock):  ttl,
			keys.ReceiptKey(lock): 30 * time.Second,
		}
		left := map[string]time.Duration{}
		for _, l := range leftovers(t, admin, prefix) {
			left[l.key] = l.pttl
		}
		if got, want := slices.Sorted(maps.Keys(left)), slices.Sorted(maps.Keys(bounds)); !slices.Equal(got, want) {
			t.Errorf("left behind: got %q, want %q", got, want)
		}
		for k, pttl := range left {
			if bound, ok := bounds[k]; ok && (pttl <= 0 || pttl > bound) {
				t.Errorf("%s: PTTL %v, want in (0, %v]", k, pttl, bound)
			}
		}
		wantKeys(t, admin, prefix, append(slices.Collect(maps.Keys(bounds)), live, keys.MetaKey(live, false))...)
	})
}

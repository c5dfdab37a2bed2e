package rebuild_test

// The claim's durability (C58, C102): a run in a group with
// Options.Durability waits, before its flip, on the master of each
// index's own base too, where it claimed the index and reserved its
// generation, not only on the masters of its lock and its data.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/redistest/replication"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// waitLog records the keys the durability waits of a run bind their
// connections to (EXISTS of the lock's record or of a per-slot counter),
// and the counters a wait wrote (SET).
type waitLog struct {
	mu         sync.Mutex
	binds, set []string
}

// hook returns c with w recording the waits of a run whose lock is lock.
func (w *waitLog) hook(c rueidis.Client, lock string) rueidis.Client {
	return rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(cl rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			c := cmd.Commands()
			switch {
			case len(c) == 2 && c[0] == "EXISTS" && (keys.IsCounterKey(c[1]) || c[1] == keys.RecordKey(lock)):
				w.mu.Lock()
				w.binds = append(w.binds, c[1])
				w.mu.Unlock()
			case len(c) > 2 && c[0] == "SET" && keys.IsCounterKey(c[1]):
				w.mu.Lock()
				w.set = append(w.set, c[1])
				w.mu.Unlock()
			}
			return cl.Do(ctx, cmd)
		},
	})
}

// TestGroupClaimDurable (C58, C102): on a cluster, a run in a group
// claims its index (the pointer L:rebuild-ptr set to group:<name>) and
// reserves its generation (the field next of L:rebuild-gens) on the
// master of the index's own base. The test picks an index whose own
// base's master is neither the lock's nor the data's: the run's waits run
// on all three masters, one bound to a counter in the claim's slot and
// counting from a write of it there. The cluster has no replicas: each of
// the three WAITs finds 0 of 1 replicas, and the run fails before its
// flip, the group's pointer unset. Without the wait on the claim's master
// two waits failed, and a failover of that master could lose the claim
// and the reservation whatever Durability asked. The counter written for
// the wait is gone with the run.
func TestGroupClaimDurable(t *testing.T) {
	ctx := redistest.Ctx(t)
	d := env.Deployments(t)[1]
	c := env.Cluster
	group := redistest.Prefix(t) + "g"
	in := keys.Names{Cluster: true, Group: group}
	var live string
	for i := 0; ; i++ {
		live = fmt.Sprintf("%sdur%d:email", redistest.Prefix(t), i)
		own, lock, data := c.NodeFor(t, keys.PointerKey(live, true)), c.NodeFor(t, keys.LockKey(live, in)), c.NodeFor(t, keys.GenKey(live, 1))
		if own != lock && own != data && lock != data {
			break
		}
	}
	own := c.NodeFor(t, keys.PointerKey(live, true))
	var w waitLog
	r := redistest.Rebuilder(t, w.hook(d.Client, keys.LockKey(live, in)), rebuild.Options{Publish: rebuild.Generations, Group: group, Grace: -1,
		Durability: rebuild.Durability{Replicas: 1, Timeout: 200 * time.Millisecond}},
		builders.Hash(live, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
	_, err := r.Run(ctx, sources.Slice(users(20)))
	redistest.WantErr(t, err, rebuild.ErrNotDurable)
	if err != nil {
		if n := strings.Count(err.Error(), "0 of 1 replicas"); n != 3 {
			t.Errorf("%d waits failed, want 3 (the lock's, the data's and the claim's masters): %v", n, err)
		}
	}
	redistest.WantString(t, d.Other, keys.PointerKey(live, true), keys.GroupMarker(group))
	if v, ok := redistest.Get(t, d.Other, keys.PointerKey(live, in)); ok {
		t.Errorf("the group's pointer holds %q, want none (no flip)", v)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var onOwn []string
	for _, k := range w.binds {
		if c.NodeFor(t, k) == own {
			onOwn = append(onOwn, k)
		}
	}
	if len(onOwn) != 1 || keys.Slot(onOwn[0]) != keys.Slot(keys.PointerKey(live, true)) {
		t.Fatalf("the waits bound to %v: on %s, the master of the claim %s and the reservation %s, %v, want one counter in their slot",
			w.binds, own.Addr, keys.PointerKey(live, true), keys.RegistryKey(live, true), onOwn)
	}
	if !slices.Equal(w.set, onOwn) {
		t.Errorf("the waits wrote the counters %v, want %v (the claim's)", w.set, onOwn)
	}
	if v, ok := redistest.Get(t, d.Other, onOwn[0]); ok {
		t.Errorf("the claim's counter %s holds %q after the run, want it deleted", onOwn[0], v)
	}
}

// TestGroupClaimDurableReplicas (C58, C102): a cluster whose masters each
// have a replica, and an index whose own base (its claim and reservation)
// is on a master that holds neither its group's lock nor its data. With
// every replica acknowledging, a run in the group with Durability
// publishes generation 1. With the replica of the claim's master stopped
// (SIGSTOP), the next run fails with ErrNotDurable, one wait of three
// short, before its flip: the group's pointer still names generation 1,
// current in its registry, and generation 2 is gone. Without the wait on
// the claim's master it published generation 2, its claim and
// reservation on one master only.
func TestGroupClaimDurableReplicas(t *testing.T) {
	ctx := redistest.Ctx(t)
	cl := redistest.OwnClusterWithReplicas(t, 3)
	client, other := cl.Client(t), cl.Client(t)
	group := redistest.Prefix(t) + "g"
	in := keys.Names{Cluster: true, Group: group}
	var live string
	for i := 0; ; i++ {
		live = fmt.Sprintf("%sdur%d:email", redistest.Prefix(t), i)
		own, lock := cl.NodeFor(t, keys.PointerKey(live, true)), cl.NodeFor(t, keys.LockKey(live, in))
		if own != lock && own != cl.NodeFor(t, keys.GenKey(live, 1)) && own != cl.NodeFor(t, keys.GenKey(live, 2)) {
			break
		}
	}
	replica := cl.Replicas[slices.Index(cl.Nodes, cl.NodeFor(t, keys.PointerKey(live, true)))]
	run := func(timeout time.Duration) error {
		r := redistest.Rebuilder(t, client, rebuild.Options{Publish: rebuild.Generations, Group: group, Grace: -1,
			Durability: rebuild.Durability{Replicas: 1, Timeout: timeout}},
			builders.Hash(live, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
		_, err := r.Run(ctx, sources.Slice(users(20)))
		return err
	}
	// Long enough for a loaded machine's replicas: only the run whose
	// replica stopped must fail.
	if err := run(30 * time.Second); err != nil {
		t.Fatalf("Run with every replica: %v", err)
	}
	redistest.WantString(t, other, keys.PointerKey(live, in), "1")
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := replica.Resume(); err != nil {
			t.Error(err)
		}
	})
	err := run(500 * time.Millisecond)
	redistest.WantErr(t, err, rebuild.ErrNotDurable)
	if err != nil {
		if n := strings.Count(err.Error(), "0 of 1 replicas"); n != 1 {
			t.Errorf("%d waits failed, want 1 (the claim's master's): %v", n, err)
		}
	}
	redistest.WantString(t, other, keys.PointerKey(live, true), keys.GroupMarker(group))
	redistest.WantString(t, other, keys.PointerKey(live, in), "1")
	redistest.WantHash(t, other, keys.RegistryKey(live, in), map[string]string{keys.RegNext: "2", "1": keys.RegCurrent})
	if n, _ := redistest.Do(t, other, other.B().Exists().Key(keys.GenKey(live, 2)).Build()).AsInt64(); n != 0 {
		t.Errorf("%s exists, want it removed with the failed run", keys.GenKey(live, 2))
	}
}

// TestGroupClaimDurableStandalone (C58, C102): on a standalone server
// with a replica, every write of a run in a group, its claim too, is on
// one master: the run checks what the server can give at its start, and
// waits once, each bound to its lock's record, writes no counter, and
// publishes.
func TestGroupClaimDurableStandalone(t *testing.T) {
	ctx := redistest.Ctx(t)
	pair := replication.Start(t)
	client := pair.Client(t)
	group := redistest.Prefix(t) + "g"
	live := redistest.Prefix(t) + "email"
	in := keys.Names{Group: group}
	var w waitLog
	r := redistest.Rebuilder(t, w.hook(client, keys.LockKey(live, in)), rebuild.Options{Publish: rebuild.Generations, Group: group, Grace: -1,
		Durability: rebuild.Durability{Replicas: 1, Timeout: 30 * time.Second}},
		builders.Hash(live, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
	if _, err := r.Run(ctx, sources.Slice(users(20))); err != nil {
		t.Fatalf("Run: %v", err)
	}
	redistest.WantString(t, client, keys.PointerKey(live, false), keys.GroupMarker(group))
	redistest.WantString(t, client, keys.PointerKey(live, in), "1")
	w.mu.Lock()
	defer w.mu.Unlock()
	record := keys.RecordKey(keys.LockKey(live, in))
	if want := []string{record, record}; !slices.Equal(w.binds, want) || len(w.set) != 0 {
		t.Errorf("the check and the wait bound to %v and wrote %v, want %v and none", w.binds, w.set, want)
	}
}

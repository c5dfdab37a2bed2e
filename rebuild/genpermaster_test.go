package rebuild_test

// The writes of a Generations run of a family spread over a cluster's
// slots go by master: each master's slot transactions in one DoMulti of
// its node client, and a transaction its master did not run because its
// slot moved is sent again on the cluster client.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// slotTxns returns the slots of the transactions of multi that count in a
// run's per-slot counter: one per MULTI ... EXEC, by its INCR of the
// counter.
func slotTxns(multi []rueidis.Completed) []uint16 {
	var out []uint16
	for _, c := range multi {
		if args := c.Commands(); args[0] == "INCR" && keys.IsCounterKey(args[1]) {
			out = append(out, c.Slot())
		}
	}
	return out
}

func TestGenerationsSpreadWritesByMaster(t *testing.T) {
	// One write round trip of a family over 400 buckets, on 3 masters:
	// its slot transactions go in one DoMulti per master, on the master's
	// node client, none on the cluster client.
	cl := redistest.OwnCluster(t, 3)
	var mu sync.Mutex
	nodeCalls, clusterTxns := 0, 0
	slots := map[uint16]int{}
	c := rueidishook.WithHook(cl.Client(t), redistest.Hook{OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
		if txns := slotTxns(multi); len(txns) > 0 {
			mu.Lock()
			if c.Mode() == rueidis.ClientModeCluster {
				clusterTxns += len(txns)
			} else {
				nodeCalls++
			}
			for _, s := range txns {
				slots[s]++
			}
			mu.Unlock()
		}
		return c.DoMulti(ctx, multi...)
	}})
	d := deployment{Name: "cluster", Cluster: true, Client: c, Other: cl.Client(t), Prefix: "{" + redistest.Prefix(t) + "}", Addrs: cl.Addrs}
	prefix := genPrefix(d)
	us := genUsers(400, 400)
	if _, err := genRebuilder(t, d, prefix, rebuild.Options{BatchSize: 1000}).Run(redistest.Ctx(t), sources.Slice(us)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if clusterTxns != 0 {
		t.Errorf("%d slot transactions went on the cluster client, want none", clusterTxns)
	}
	for s, n := range slots {
		if n != 1 {
			t.Errorf("slot %d had %d transactions, want 1 (one round trip)", s, n)
		}
	}
	if len(slots) < 300 || nodeCalls != 3 {
		t.Errorf("%d slot transactions in %d DoMultis of the masters' node clients, want over 300 in 3", len(slots), nodeCalls)
	}
	wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
	wantGenClean(t, d, prefix, 1)
}

func TestGenerationsSpreadSlotMoves(t *testing.T) {
	// A slot of the family's buckets moves to another master at the first
	// write to it (MOVED: the node client's transaction ran nothing), or
	// starts moving (ASK: its keys are not on the source; the move ends
	// before the transaction is sent again); every other write of the
	// cluster waits meanwhile. The transaction is sent again
	// on the cluster client, which follows the redirection; the run
	// publishes every bucket, its counters agree, and nothing else is
	// left.
	for _, half := range []bool{false, true} {
		t.Run(map[bool]string{false: "moved", true: "ask"}[half], func(t *testing.T) {
			t.Parallel()
			cl := redistest.OwnCluster(t, 3)
			ctx := redistest.Ctx(t)
			prefix := strings.Trim(redistest.Prefix(t), "{}") + "users:by-bucket"
			us := genUsers(600, 60)
			// The slot of a bucket of generation 1, not that of a key of
			// the index's own.
			own := []uint16{keys.Slot(keys.LockKey(prefix, true)), keys.Slot(keys.PointerKey(prefix, true)), keys.Slot(keys.RegistryKey(prefix, true)), keys.Slot(keys.MetaKey(prefix, true))}
			var slot uint16
			var bucket string
			for b := range 60 {
				bucket = keys.GenBucketKey(prefix, 1, fmt.Sprintf("b%02d", b))
				if slot = keys.Slot(bucket); !slices.Contains(own, slot) {
					break
				}
			}
			// The master of slot, and another.
			var to *redistest.Server
			from := cl.NodeFor(t, bucket)
			for _, n := range cl.Nodes {
				if n != from {
					to = n
					break
				}
			}
			var gate sync.RWMutex
			var once, finishing sync.Once
			var finish func()
			var moved atomic.Bool
			var resent atomic.Int64
			c := rueidishook.WithHook(cl.Client(t), redistest.Hook{OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				txns := slotTxns(multi)
				node := c.Mode() != rueidis.ClientModeCluster
				if node && slices.Contains(txns, slot) {
					trigger := false
					once.Do(func() { trigger = true })
					if trigger {
						gate.Lock() // the writes in flight end, the next wait
						if half {
							finish = cl.StartMove(t, int64(slot), to)
						} else {
							cl.MoveSlot(t, int64(slot), to)
						}
						moved.Store(true)
						gate.Unlock()
						return c.DoMulti(ctx, multi...)
					}
				}
				gate.RLock()
				defer gate.RUnlock()
				if !node && moved.Load() && slices.Contains(txns, slot) {
					resent.Add(1)
					if half {
						// The node answered ASK, and ran nothing: no key
						// of the slot is on the source. The move ends
						// before the transaction is sent again (the
						// target refuses a transaction of several keys
						// it does not hold yet with TRYAGAIN).
						finishing.Do(func() { finish() })
					}
				}
				return c.DoMulti(ctx, multi...)
			}})
			d := deployment{Name: "cluster", Cluster: true, Client: c, Other: cl.Client(t), Prefix: "{" + redistest.Prefix(t) + "}", Addrs: cl.Addrs}
			if _, err := genRebuilder(t, d, prefix, rebuild.Options{}).Run(ctx, sources.Slice(us)); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if !moved.Load() || resent.Load() == 0 {
				t.Fatalf("slot %d moved: %v; its transactions sent again on the cluster client: %d, want some", slot, moved.Load(), resent.Load())
			}
			wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
			wantGenClean(t, d, prefix, 1)
		})
	}
}

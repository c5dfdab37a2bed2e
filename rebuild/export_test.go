package rebuild

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/hook"
	"github.com/redis/rueidis"
)

// MergePath runs a SetIndex's client side without Redis, for
// BenchmarkMergeBucketPath: each item's MergeBucket in batches of batch
// items, built by two goroutines at once (one per core of the machines the
// project is measured on), then the sender's coalescer with the default
// MaxMerged, and the transactions packed from what it emits, of at most
// batch entries each, as the sender packs them. Item i is in bucket
// buckets[bucketOf[i]]; its member, "user:1" and i in 7 digits, is made in
// its batch, as a source makes its items: nothing of the items outlives
// the run but what keyswap keeps. It returns the commands built and the
// entries they carry.
func MergePath(cb rueidis.Builder, buckets []string, bucketOf []int32, batch int) (cmds, entries int, err error) {
	n := len(bucketOf)
	ts := newTargets([]owner{{key: "idx", family: true, commutative: true}}, false, func(live string) string { return live + ":tmp" })
	co := &coalescer{bound: defaultMaxMerged}
	next := make(chan int, n/batch+1)
	for i := 0; i < n; i += batch {
		next <- i
	}
	close(next)
	batches := make(chan *commands, 4)
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for from := range next {
				to := min(from+batch, n)
				members := make([]string, to-from)
				var buf []byte
				for i := range members {
					buf = strconv.AppendInt(append(buf[:0], "user:"...), int64(10_000_000+from+i), 10)
					members[i] = string(buf)
				}
				c := newCommands(cb, ts, 1)
				c.hint = batch
				ic := hook.NewCommands(c).(*index.Commands) // what a builder calls, as build passes it
				for i := from; i < to; i++ {
					if err := ic.MergeBucket(buckets[bucketOf[i]], "SADD", members[i-from]); err != nil {
						errs <- fmt.Errorf("item %d: %w", i, err)
						return
					}
				}
				batches <- c
			}
		})
	}
	go func() { wg.Wait(); close(batches) }()
	count := func(txns []*txn) {
		for _, t := range txns {
			cmds += len(t.cmds)
			entries += t.entries
		}
	}
	for c := range batches {
		count(pack(cb, co.add(c.merged), batch))
	}
	count(pack(cb, co.drain(), batch))
	select {
	case err = <-errs:
	default:
	}
	return cmds, entries, err
}

// CatchUpChunk is the most entries a catch-up reads from one log per round
// trip.
const CatchUpChunk = catchUpChunk

package rebuild

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/rueidis"
)

// MergePath runs a SetIndex's client side without Redis, for
// BenchmarkMergeBucketPath: each item's MergeBucket in batches of batch
// items, built by two goroutines at once (Options.Writers' default), then
// the sender's coalescer with the default MaxMerged, and the commands
// built from what it emits. Item i is in bucket buckets[bucketOf[i]]; its
// member, "user:1" and i in 7 digits, is made in its batch, as a source makes its
// items: nothing of the items outlives the run but what keyswap keeps. It
// returns the commands built.
func MergePath(cb rueidis.Builder, buckets []string, bucketOf []int32, batch int) (int, error) {
	n := len(bucketOf)
	ts := newTargets([]owner{{key: "idx", family: true, commutative: true}}, false, func(live string) string { return live + ":tmp" })
	co := &coalescer{bound: DefaultMaxMerged}
	next := make(chan int, n/batch+1)
	for i := 0; i < n; i += batch {
		next <- i
	}
	close(next)
	batches := make(chan *Commands, 4)
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
				for i := from; i < to; i++ {
					if err := c.MergeBucket(buckets[bucketOf[i]], "SADD", members[i-from]); err != nil {
						errs <- fmt.Errorf("item %d: %w", i, err)
						return
					}
				}
				batches <- c
			}
		})
	}
	go func() { wg.Wait(); close(batches) }()
	sent := 0
	for c := range batches {
		for _, t := range pack(cb, co.add(c.merged), 1<<20) {
			sent += len(t.cmds)
		}
	}
	for _, t := range pack(cb, co.drain(), 1<<20) {
		sent += len(t.cmds)
	}
	select {
	case err := <-errs:
		return sent, err
	default:
		return sent, nil
	}
}

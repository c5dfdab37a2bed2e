package rebuild

import (
	"fmt"
	"sync"

	"github.com/redis/rueidis"
)

// MergePath runs a SetIndex's client side without Redis, for
// BenchmarkMergeBucketPath: each item's MergeBucket in batches of batch
// items, built by two goroutines at once (Options.Writers' default), then
// the sender's coalescer with the default MaxMerged, and the commands
// built from what it emits. Item i is members[i] in bucket bucketOf[i]. It
// returns the commands built.
func MergePath(cb rueidis.Builder, bucketOf, members []string, batch int) (int, error) {
	ts := newTargets([]owner{{key: "idx", family: true, commutative: true}}, false, func(live string) string { return live + ":tmp" })
	co := &coalescer{bound: DefaultMaxMerged}
	next := make(chan int, len(members)/batch+1)
	for i := 0; i < len(members); i += batch {
		next <- i
	}
	close(next)
	batches := make(chan *Commands, 4)
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for from := range next {
				c := newCommands(cb, ts, 1)
				c.hint = batch
				for i := from; i < min(from+batch, len(members)); i++ {
					if err := c.MergeBucket(bucketOf[i], "SADD", members[i]); err != nil {
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

package rebuild_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
)

// BenchmarkMergeBucketPath measures the client's path of a SetIndex's
// writes, without the server: 1M items in random buckets, batches of 1000
// (see rebuild.MergePath, in export_test.go). ns/item is wall time with
// two build goroutines and the sender on the machine's cores, making each
// item's member included.
func BenchmarkMergeBucketPath(b *testing.B) {
	const items, batch = 1_000_000, 1000
	cb := env.Standalone.Client(b).B()
	for _, buckets := range []int{1000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("buckets=%d", buckets), func(b *testing.B) {
			names := make([]string, buckets)
			for i := range names {
				names[i] = fmt.Sprintf("b%06d", i)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			bucketOf := make([]int32, items)
			for i := range bucketOf {
				bucketOf[i] = int32(rng.IntN(buckets))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				cmds, entries, err := rebuild.MergePath(cb, names, bucketOf, batch)
				if err != nil {
					b.Fatal(err)
				}
				if entries != items || cmds < items/index.MaxArgs {
					b.Fatalf("%d commands of %d entries in all, want %d entries in at least %d commands", cmds, entries, items, items/index.MaxArgs)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*items), "ns/item")
		})
	}
}

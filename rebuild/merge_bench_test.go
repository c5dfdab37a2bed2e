package rebuild_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/keyswap/keyswap/rebuild"
)

// BenchmarkMergeBucketPath measures the client's cost per item of a
// SetIndex's writes, without the server's: 1M items in random buckets,
// batches of 1000 (see rebuild.MergePath, in export_test.go).
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
			bucketOf := make([]string, items)
			members := make([]string, items)
			for i := range items {
				bucketOf[i] = names[rng.IntN(buckets)]
				members[i] = fmt.Sprintf("user:%07d", i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				sent, err := rebuild.MergePath(cb, bucketOf, members, batch)
				if err != nil {
					b.Fatal(err)
				}
				if want := items / rebuild.MaxMergeArgs; sent < want {
					b.Fatalf("%d commands, want at least %d", sent, want)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*items), "ns/item")
		})
	}
}

package rebuild_test

import (
	"testing"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// BenchmarkGenerationsFamilyCluster measures one run in Generations mode
// of a SetIndex of 200,000 members in 20,000 buckets on the package's
// 3-master cluster: "one-slot" (a hash tag: the family on one master)
// against "spread" (no hash tag: the buckets over every master). Run:
//
//	go test -run '^$' -bench BenchmarkGenerationsFamilyCluster -benchtime 3x ./rebuild/
func BenchmarkGenerationsFamilyCluster(b *testing.B) {
	const n = 200000
	us := genUsers(n, 20000)
	for _, shape := range []string{"one-slot", "spread"} {
		b.Run(shape, func(b *testing.B) {
			ctx := b.Context()
			c := env.Cluster.Client(b)
			p := redistest.Prefix(b) + "users:by-bucket"
			if shape == "one-slot" {
				p = "{" + p + "}"
			}
			r, err := rebuild.New(c, rebuild.Options{Publish: rebuild.Generations, Grace: -1},
				builders.SetIndex(p, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "items/s")
			if _, err := r.Sweep(ctx); err != nil {
				b.Fatal(err)
			}
		})
	}
}

package rebuild_test

import (
	"testing"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// BenchmarkGenerationsApplyCluster measures Apply in Generations mode on
// the package's 3-master cluster, outside a run, of a change that moves a
// user between two buckets of a family: "tagged" (every key in the locks'
// slot: one script) against "spread" (no hash tag: the first step, one
// write per slot, the last step; C96). Run:
//
//	go test -run '^$' -bench BenchmarkGenerationsApplyCluster -benchtime 2000x ./rebuild/
func BenchmarkGenerationsApplyCluster(b *testing.B) {
	for _, shape := range []string{"tagged", "spread"} {
		b.Run(shape, func(b *testing.B) {
			ctx := b.Context()
			c := env.Cluster.Client(b)
			prefix := redistest.Prefix(b) + "users:by-bucket"
			if shape == "tagged" {
				prefix = "{" + prefix + "}"
			}
			r, err := rebuild.New(c, rebuild.Options{Publish: rebuild.Generations},
				builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
			if err != nil {
				b.Fatal(err)
			}
			us := genUsers(100, 10)
			if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
				b.Fatal(err)
			}
			there, back := us[0], us[0]
			there.Country = "b01"
			changes := []index.Change[user]{{Old: &back, New: &there}, {Old: &there, New: &back}}
			i := 0
			for b.Loop() {
				if err := r.Apply(ctx, changes[i%2]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

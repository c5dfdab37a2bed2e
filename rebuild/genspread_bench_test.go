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

// BenchmarkGenerationsGroupCluster measures one run of two indexes of one
// Rebuilder in Generations mode on the package's 3-master cluster (a hash
// of 50,000 fields and a SetIndex of 50,000 members in 1,000 buckets):
// "one-slot" (a common hash tag, so every key of both indexes is on one
// master) against "group" (Options.Group: the control keys share the
// group's slot, and the data keys spread over the 3 masters; C100). Run:
//
//	go test -run '^$' -bench BenchmarkGenerationsGroupCluster -benchtime 3x ./rebuild/
func BenchmarkGenerationsGroupCluster(b *testing.B) {
	const n = 50000
	us := genUsers(n, 1000)
	for _, shape := range []string{"one-slot", "group"} {
		b.Run(shape, func(b *testing.B) {
			c := env.Cluster.Client(b)
			p := redistest.Prefix(b)
			opts := rebuild.Options{Publish: rebuild.Generations, Grace: -1}
			if shape == "group" {
				opts.Group = p
			} else {
				p = "{" + p + "}"
			}
			r, err := rebuild.New(c, opts,
				builders.Hash(p+"users:by-email", func(u user) (string, string, bool) { return u.Email, u.ID, true }),
				builders.SetIndex(p+"users:by-bucket", func(u user) (string, string, bool) { return u.Country, u.ID, true }))
			if err != nil {
				b.Fatal(err)
			}
			benchRuns(b, r, us)
		})
	}
}

// BenchmarkGenerationsFamilyCluster measures one run in Generations mode
// of a SetIndex of 200,000 members in 20,000 buckets on the package's
// 3-master cluster: "one-slot" (a hash tag: the family on one master)
// against "spread" (no hash tag: the buckets over every master). Run:
//
//	go test -run '^$' -bench BenchmarkGenerationsFamilyCluster -benchtime 3x ./rebuild/
func BenchmarkGenerationsFamilyCluster(b *testing.B) {
	us := genUsers(200000, 20000)
	for _, shape := range []string{"one-slot", "spread"} {
		b.Run(shape, func(b *testing.B) {
			p := redistest.Prefix(b) + "users:by-bucket"
			if shape == "one-slot" {
				p = "{" + p + "}"
			}
			r, err := rebuild.New(env.Cluster.Client(b), rebuild.Options{Publish: rebuild.Generations, Grace: -1},
				builders.SetIndex(p, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
			if err != nil {
				b.Fatal(err)
			}
			benchRuns(b, r, us)
		})
	}
}

// benchRuns runs r over us once per iteration of b, reports the items per
// second, and then removes the generations the runs retired.
func benchRuns(b *testing.B, r *rebuild.Rebuilder[user], us []user) {
	ctx := b.Context()
	for b.Loop() {
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(us)*b.N)/b.Elapsed().Seconds(), "items/s")
	if _, err := r.Sweep(ctx); err != nil {
		b.Fatal(err)
	}
}

package rebuild_test

import (
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// BenchmarkGenerationsFlipUnderApply measures a run in Generations mode of
// a family of 10 buckets (300 users) while 2 goroutines apply changes
// without a pause (inserts, and moves between buckets): per run, the
// attempts to flip (attempts/op) and the time from the source's end to the
// flip (catchup-ms/op, Stats.CatchUp), on the standalone server and on the
// package's 3-master cluster, with a hash tag ("tagged": the flip replays
// the tail, C97) and without ("spread": the run cuts over, C98). Run:
//
//	go test -run '^$' -bench BenchmarkGenerationsFlipUnderApply -benchtime 20x ./rebuild/
func BenchmarkGenerationsFlipUnderApply(b *testing.B) {
	for _, dep := range []struct {
		name    string
		client  func(testing.TB) rueidis.Client
		cluster bool
	}{{"standalone", env.Standalone.Client, false}, {"cluster", env.Cluster.Client, true}} {
		for _, shape := range []string{"tagged", "spread"} {
			if shape == "spread" && !dep.cluster {
				continue // one slot: the same as tagged
			}
			b.Run(dep.name+"/"+shape, func(b *testing.B) {
				ctx := b.Context()
				prefix := redistest.Prefix(b) + "users:by-bucket"
				if shape == "tagged" && dep.cluster {
					prefix = "{" + prefix + "}"
				}
				rec := &recorder{}
				r := redistest.Rebuilder(b, dep.client(b), rebuild.Options{
					Publish: rebuild.Generations, BatchSize: 50, Grace: time.Millisecond, Observer: rec,
				}, genSetIndex(prefix))
				us := genUsers(300, 10)
				s := startSteady(ctx, b, r, 2, 10)
				defer s.stop()
				var catchUp time.Duration
				for b.Loop() {
					stats, err := r.Run(ctx, s.source(us))
					if err != nil {
						b.Fatal(err)
					}
					catchUp += stats.CatchUp
				}
				if err := s.failed(); err != nil {
					b.Fatal(err)
				}
				rec.mu.Lock()
				attempts := rec.published
				rec.mu.Unlock()
				b.ReportMetric(float64(attempts)/float64(b.N), "attempts/op")
				b.ReportMetric(float64(catchUp)/float64(time.Millisecond)/float64(b.N), "catchup-ms/op")
				b.ReportMetric(float64(s.slowest.Load())/float64(time.Millisecond), "apply-max-ms")
			})
		}
	}
}

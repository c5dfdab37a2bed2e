package rebuild

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

// The pacer of Options.LatencyBudget keeps the latency that other clients
// see under a budget while the run builds.
//
// It measures that latency as another client does: every probeEvery it
// times a GET of the run's lock on a connection of its own (not the
// pipelined one the run writes on) to the server of each lock. The round
// trip is what any command sent at that moment waits, behind the run's
// transactions on the server and on the way to it. Every window of 200 ms
// (probeWindow probes while they are quick, fewer while they are slow, so
// that a slow server is answered as soon as a quick one) it compares the
// 90th percentile of each server's probes, the slowest server's, with the
// budget and sets the gate's adaptive limit, in the manner of TCP's
// congestion control:
//   - the run starts at paceStart batches per second, not at full speed,
//     and doubles its limit every window in which the probes stay under
//     paceHeadroom of the budget and the limit holds the run back, until a
//     window is over the budget (slow start);
//   - over the budget, the limit drops to paceDecrease of what the run
//     achieved in the window (or of the limit, if lower);
//   - under paceHeadroom of the budget, while the limit is what holds the run
//     back, it rises by paceIncrease;
//   - in between it stays.
//
// It never goes below a floor of a quarter of a batch per second, so the
// run always progresses: latency that the run does not cause (another
// client's load, a budget below the network's round trip) only slows it to
// the floor.
const (
	probeEvery   = 10 * time.Millisecond
	probeWindow  = 20 // probes per decision while they are quick: 200 ms
	probeTimeout = time.Second
	paceStart    = 10 // batches per second
	paceDecrease = 0.6
	paceIncrease = 1.25
	paceHeadroom = 0.7
)

// pacer is the control loop's state; only the pacing goroutine uses it.
type pacer struct {
	budget time.Duration
	floor  float64 // items/s
	limit  float64 // items/s; 0 is none
	slow   bool    // in slow start: no window has been over the budget yet
}

// newPacer returns a pacer in slow start, for batches of batchSize items.
func newPacer(budget time.Duration, batchSize int) *pacer {
	floor := max(1, float64(batchSize)/4)
	return &pacer{budget: budget, floor: floor, limit: max(floor, float64(paceStart*batchSize)), slow: true}
}

// next returns the limit for the next window, given the window's 90th
// percentile round trip q and the items per second the run achieved in it.
func (p *pacer) next(q time.Duration, achieved float64) float64 {
	switch {
	case q > p.budget:
		p.slow = false
		base := achieved
		if p.limit > 0 && (base <= 0 || p.limit < base) {
			base = p.limit
		}
		p.limit = max(p.floor, base*paceDecrease)
	case p.limit > 0 && float64(q) < float64(p.budget)*paceHeadroom && achieved >= p.limit*paceHeadroom:
		// The limit holds the run back (it achieves most of it) and the
		// latency has room: allow more.
		if p.slow {
			p.limit *= 2
		} else {
			p.limit *= paceIncrease
		}
	}
	return p.limit
}

// percentile90 returns the 90th percentile of rtts, which it sorts.
func percentile90(rtts []time.Duration) time.Duration {
	slices.Sort(rtts)
	return rtts[(len(rtts)*9+9)/10-1]
}

// pacing is the pacer of a run (Options.LatencyBudget): run paces the
// run's gate by the probes of the servers it writes to, and keeps the last
// probe's percentile for the heartbeats (latency).
type pacing struct {
	redis     *protocol.Redis
	key       string   // the builders' keys, for the log
	lockKeys  []string // the run's lock keys
	budget    time.Duration
	batchSize int
	logger    *slog.Logger
	gate      *gate
	items     func() int64 // the items pulled from the source so far
	probed    atomic.Int64 // the last 90th-percentile probe, in ns
}

// latency returns the last 90th-percentile probe, in ns; 0 before the
// first.
func (pc *pacing) latency() int64 { return pc.probed.Load() }

// probeKeys returns the lock keys to probe: one per server the run writes
// to, as far as the keys tell (one per slot in a cluster; one in all
// otherwise).
func (pc *pacing) probeKeys() []string {
	if !pc.redis.Cluster() {
		return pc.lockKeys[:1]
	}
	var out []string
	seen := map[uint16]bool{}
	for _, k := range pc.lockKeys {
		if s := keys.Slot(k); !seen[s] {
			seen[s] = true
			out = append(out, k)
		}
	}
	return out
}

// probe is the latency probe of one lock's server: a connection of its
// own, and the round trips of the window, so that each server is judged
// apart.
type probe struct {
	lock    string
	conn    rueidis.DedicatedClient
	release func()
	pending <-chan protocol.Dedicated // the connection asked for, until it comes
	since   time.Time                 // when it was asked for
	rtts    []time.Duration
}

// connect reports whether pr has a connection, asking c for one when it has
// none, without waiting: the client's blocking pool may be in use by the
// application. A new connection's first GET, untimed, is where a cluster
// client takes it from the pool; err is that GET's failure.
func (pr *probe) connect(ctx context.Context, c rueidis.Client) (ready bool, err error) {
	if pr.conn != nil {
		return true, nil
	}
	if pr.pending == nil {
		lock := pr.lock
		// Not under ctx: see protocol.TakeConnection. A connection that comes after
		// the run is given back by close.
		pr.pending = protocol.TakeConnection(ctx, c, func(actx context.Context, dc rueidis.DedicatedClient) error {
			return dc.Do(actx, dc.B().Get().Key(lock).Build()).Error()
		})
		pr.since = time.Now()
	}
	select {
	case d := <-pr.pending:
		pr.pending = nil
		if d.Err != nil && !rueidis.IsRedisNil(d.Err) {
			d.Release()
			return false, d.Err
		}
		pr.conn, pr.release = d.Client, d.Release
		return true, nil
	default:
		return false, nil
	}
}

// drop gives pr's connection back, so that the next probe asks anew.
func (pr *probe) drop() {
	if pr.release != nil {
		pr.release()
	}
	pr.conn, pr.release = nil, nil
}

// close gives back pr's connection, and the one it asked for once it comes.
func (pr *probe) close() {
	pr.drop()
	if pr.pending != nil {
		protocol.Abandon(pr.pending)
	}
}

// run runs the pacer until ctx ends, then lifts its limit.
func (pc *pacing) run(ctx context.Context) {
	defer pc.gate.setAdaptive(0)
	p := newPacer(pc.budget, pc.batchSize)
	pc.gate.setAdaptive(p.limit)
	var probes []*probe
	for _, lock := range pc.probeKeys() {
		probes = append(probes, &probe{lock: lock})
	}
	defer func() {
		for _, pr := range probes {
			pr.close()
		}
	}()
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	from, items := time.Now(), pc.items()
	warned, starved := false, false
	failed := func(lock string, err error) {
		if !warned {
			warned = true
			pc.logger.Warn("keyswap: a latency probe failed; the run paces by the probes that succeed, and keeps its limit while none does",
				"key", pc.key, "lock", lock, "error", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, pr := range probes {
			if !pc.measure(ctx, pr, failed, &starved) {
				return
			}
		}
		if time.Since(from) < probeWindow*probeEvery {
			continue
		}
		q, measured := slowest(probes)
		if !measured {
			from, items = time.Now(), pc.items()
			continue
		}
		now, pulled := time.Now(), pc.items()
		achieved := float64(pulled-items) / max(now.Sub(from).Seconds(), 1e-3)
		pc.probed.Store(int64(q))
		limit := p.next(q, achieved)
		pc.gate.setAdaptive(limit)
		pc.logger.Debug("keyswap: paced", "key", pc.key, "p90", q, "items_per_s", achieved, "limit", limit)
		from, items = now, pulled
	}
}

// measure times one probe on pr, once its connection is ready, and adds
// its round trip to pr's; failed is told of a failure, starved is set once
// no connection came for a whole probeTimeout. It reports false once ctx
// is done.
func (pc *pacing) measure(ctx context.Context, pr *probe, failed func(string, error), starved *bool) bool {
	ready, err := pr.connect(ctx, pc.redis.Client())
	switch {
	case ctx.Err() != nil:
		return false
	case err != nil:
		failed(pr.lock, err)
		return true
	case !ready:
		if !*starved && time.Since(pr.since) >= probeTimeout {
			*starved = true
			pc.logger.Warn("keyswap: no connection is free for the latency probes (the client's BlockingPoolSize is in use, or the server does not answer); the run keeps its limit until one is",
				"key", pc.key, "lock", pr.lock, "waited", time.Since(pr.since))
		}
		return true
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	start := time.Now()
	err = pr.conn.Do(pctx, pr.conn.B().Get().Key(pr.lock).Build()).Error()
	rtt := time.Since(start)
	cancel()
	switch {
	case ctx.Err() != nil:
		return false
	case err == nil || rueidis.IsRedisNil(err):
		pr.rtts = append(pr.rtts, rtt)
	case errors.Is(err, context.DeadlineExceeded):
		// It waited at least that long, behind a slow server, on a
		// connection that still works (rueidis drops the late
		// reply): the next probe goes on it, and is timed too.
		pr.rtts = append(pr.rtts, rtt)
	default:
		// Any other failure measures nothing. The connection goes
		// back (rueidis closes it if it broke), and the next probe
		// takes one anew.
		failed(pr.lock, err)
		pr.drop()
	}
	return true
}

// slowest returns the 90th percentile of the round trips of the slowest
// server that measured any, and empties every probe's; measured is false
// when none did.
func slowest(probes []*probe) (q time.Duration, measured bool) {
	// The slowest server decides: its own 90th percentile, not one
	// pooled with the others'.
	for _, pr := range probes {
		if len(pr.rtts) > 0 {
			q, measured = max(q, percentile90(pr.rtts)), true
			pr.rtts = pr.rtts[:0]
		}
	}
	return q, measured
}

package rebuild

import (
	"strconv"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
)

// leaseOwner returns what the lease of p's run sees of it: the heartbeats
// carry its status, and bring back an operator's requests (control).
func (p *pipeline) leaseOwner() leaseOwner {
	x, r := p.x, p.x.r
	owner := leaseOwner{
		redis: r.redis, locks: x.locks, ttl: r.opts.TTL, key: r.key, cancel: p.cancel, log: r.opts.Logger,
		stall:    p.throttle.stall,
		fence:    beatFence{acked: x.acked.Load, status: p.status, control: p.control, seen: x.catchUp.logs.Seen},
		tempKeys: tempRenewal{targets: x.targets, secs: &p.writer.tempSecs},
	}
	if x.gen != nil {
		// No temp key to refresh: the data keys have no TTL, and the
		// counters of a cluster's slots are renewed instead.
		owner.tempKeys.renew = x.gen.counters.renew
		if r.redis.Cluster() {
			// The writes are counted per slot, not in the record.
			owner.fence.acked = func() int64 { return 0 }
		}
	}
	return owner
}

// status returns the run's status, for its record: written by every
// heartbeat.
func (p *pipeline) status() []string {
	x, th := p.x, p.throttle
	now := time.Now()
	items := x.pulled.Load()
	rate := float64(items) / max(now.Sub(x.start).Seconds(), 1e-3)
	// The ETA is at the current rate, so that it follows a throttle; a
	// paused or stalled run has none.
	current := x.rates.observe(now, items)
	eta := ""
	if e := x.r.opts.Expected; e > 0 && current > 0 && !th.gate.isPaused() && x.phase.Load() == PhaseBuilding {
		eta = strconv.FormatInt(int64(float64(max(0, e-items))/current), 10)
	}
	logged, replayed := x.catchUp.counts()
	return []string{
		"eta", eta, "progress_at", protocol.Now(th.stall.lastProgress()),
		"phase", string(x.phase.Load().(Phase)), "items", strconv.FormatInt(items, 10),
		"entries", strconv.FormatInt(x.written.Load(), 10), "acked", strconv.FormatInt(x.acked.Load(), 10),
		"rate", strconv.FormatFloat(rate, 'f', 1, 64), protocol.FieldRateNow, strconv.FormatFloat(current, 'f', 1, 64),
		"beat_at", protocol.Now(now), "limit", strconv.FormatFloat(th.gate.rate(), 'f', -1, 64),
		"latency_us", strconv.FormatInt(th.pacing.latency()/1e3, 10),
		"changes", strconv.FormatInt(logged, 10), "replayed", strconv.FormatInt(replayed, 10),
	}
}

// control applies what a heartbeat read of an operator's requests: a
// cancel ends the run, a throttle or a pause goes to the throttle, a
// decision to a held run, and the counts of the logs of changes to the
// catch-up.
func (p *pipeline) control(c protocol.Control) {
	x := p.x
	if c.Cancel {
		p.cancel(&Error{Op: "run", Key: x.r.key, Err: ErrAborted})
	}
	p.throttle.control(c, x.r.opts.MaxRate)
	if x.held != nil && x.phase.Load() == PhaseHeld {
		switch c.Action {
		case "publish":
			x.held.decideBy(true)
		case "discard":
			x.held.decideBy(false)
		}
	}
	x.catchUp.heard(c.Logs, func(err error) {
		p.cancel(&Error{Op: "lease", Key: x.r.key, Err: err})
	})
}

package rebuild

import (
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
)

// Durability is how durable a run's writes must be before they are
// published, for replicated or persisted deployments. The zero value waits
// for nothing. See the README, "Durability", for what each deployment gets
// with and without it.
type Durability struct {
	// Replicas is how many replicas must acknowledge every write of the run
	// before it is published (WAIT). Zero waits for none.
	Replicas int
	// LocalAOF makes the master fsync every write of the run to its AOF
	// before it is published (WAITAOF). It needs Redis 7.2 or later, with
	// appendonly yes: on an older server, or one without an AOF, Run fails
	// at once, before writing anything.
	LocalAOF bool
	// ReplicasAOF is how many replicas must fsync every write of the run to
	// their AOF before it is published (WAITAOF, Redis 7.2 or later).
	ReplicasAOF int
	// Timeout bounds the wait. Zero means DefaultDurabilityTimeout, or half
	// the lease (Options.TTL) if that is shorter. The run keeps its lease
	// while it waits (its phase is PhaseWaiting), and an operator's cancel
	// ends the wait.
	//
	// WAIT and WAITAOF are blocking commands: rueidis sends them on a
	// connection of the client's blocking pool (ClientOption.BlockingPoolSize).
	// If the application keeps every one of them busy, with BLPOP say, for
	// longer than Timeout, the run fails closed with an error matching
	// ErrNotDurable that says so.
	Timeout time.Duration
}

// DefaultDurabilityTimeout bounds the wait of Options.Durability.
const DefaultDurabilityTimeout = 10 * time.Second

// durability returns the run's Durability for package protocol.
func (r *Rebuilder[T]) durability() protocol.Durability {
	d := r.opts.Durability
	return protocol.Durability{Replicas: d.Replicas, LocalAOF: d.LocalAOF, ReplicasAOF: d.ReplicasAOF, Timeout: d.Timeout}
}

// checkDurability fills in and checks Options.Durability.
func (r *Rebuilder[T]) checkDurability(bad func(string, ...any) error) error {
	d := &r.opts.Durability
	switch {
	case d.Replicas < 0:
		return bad("Durability.Replicas %d: must not be negative", d.Replicas)
	case d.ReplicasAOF < 0:
		return bad("Durability.ReplicasAOF %d: must not be negative", d.ReplicasAOF)
	case d.Timeout < 0:
		return bad("Durability.Timeout %v: must not be negative (zero means %v)", d.Timeout, DefaultDurabilityTimeout)
	}
	if d.Replicas == 0 && !d.LocalAOF && d.ReplicasAOF == 0 {
		return nil // nothing to wait for
	}
	d.Timeout = protocol.OrDefault(d.Timeout, min(DefaultDurabilityTimeout, r.opts.TTL/2))
	return nil
}

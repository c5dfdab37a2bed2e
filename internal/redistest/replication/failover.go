package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/keyswap/keyswap/internal/redistest"
)

// Failover fails the master over to the replica, as an operator or Sentinel
// would after a crash: it kills the master (SIGKILL), promotes the replica
// with REPLICAOF NO ONE, cuts Link, re-points Front to the promoted replica
// and cuts Front's connections, and returns the promoted replica
// (p.Replica). A client from Client keeps its address: its next connection
// reaches the promoted replica, which holds exactly what it had applied when
// it was promoted. Writes still held by a stalled Link are lost, as writes
// not yet replicated are in a real failover. The first command a client
// sends after Failover may fail with a connection error (its connection was
// cut); a retry reaches the promoted replica.
//
// Failover returns an error when it is called a second time, and when the
// kill or the promotion fails, naming the step.
func (p *Pair) Failover(ctx context.Context) (*redistest.Server, error) {
	if !p.beginFailover() {
		return nil, errors.New("replication: failover: already failed over")
	}
	if err := p.Master.Kill(); err != nil {
		return nil, fmt.Errorf("replication: failover: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	c := p.replica
	if err := c.Do(ctx, c.B().Replicaof().No().One().Build()).Error(); err != nil {
		return nil, fmt.Errorf("replication: failover: REPLICAOF NO ONE on %s: %w", p.Replica.Addr, err)
	}
	// The promoted replica has closed its link; the cut drops what a stall
	// still holds, so that a later Link.Resume has nothing to deliver.
	p.Link.CutAll()
	p.Front.SetTarget(p.Replica.Addr)
	p.Front.CutAll()
	return p.Replica, nil
}

// beginFailover marks the Pair failed over, and reports whether it was not
// already.
func (p *Pair) beginFailover() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failedOver {
		return false
	}
	p.failedOver = true
	return true
}

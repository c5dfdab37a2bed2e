package rebuild

import (
	"context"
	"fmt"
	"strings"
)

// sender is a run's send stage, between build and write: it owns the
// run's slots in flight (one per batch built, queued or being sent) and the
// queue of built batches, in source order, which the pump fills (take,
// hand, done); it checks each built batch's keys, feeds the coalescer, and
// hands round trips to the writer (run). It is the only way from build to
// the writer. It accounts for each batch written, in source order, in the
// run's progress, then gives the batch's slot back.
type sender struct {
	r        *core
	writer   *writer
	progress *progress     // the run's: what the written batches add up to
	queue    chan *batch   // built batches, in source order
	slots    chan struct{} // one per batch in flight: built, queued or being sent
	perTrip  int
	co       *coalescer
	pending  *trip  // the round trip in flight, unless inOrder
	checked  string // the last command name checkMerge accepted
}

// newSender returns the sender of a run of r that writes with w and counts
// in p.
func newSender(r *core, w *writer, p *progress) *sender {
	return &sender{
		r: r, writer: w, progress: p,
		queue: make(chan *batch, r.opts.Writers), slots: make(chan struct{}, r.opts.Writers),
		perTrip: max(1, r.opts.Writers/2), co: &coalescer{bound: r.opts.MaxMerged},
	}
}

// take takes a slot for a batch about to be built, waiting while Writers
// batches are in flight: that is the backpressure that bounds the run's
// memory. It reports false when ctx ended first.
func (s *sender) take(ctx context.Context) bool {
	select {
	case s.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// hand queues b, which holds a slot, for run. It reports false when ctx
// ended first.
func (s *sender) hand(ctx context.Context, b *batch) bool {
	select {
	case s.queue <- b:
		return true
	case <-ctx.Done():
		return false
	}
}

// done tells run that no batch comes after those handed on.
func (s *sender) done() { close(s.queue) }

// run takes built batches from the queue in source order and writes them,
// every batch already waiting, up to half of Writers, in one round trip
// (see the package documentation, "Pipeline"). The other half of the slots
// are being built meanwhile, so that the next round trip is ready when this
// one's replies come back. The entries builders merge (Commands.Merge) go
// through the coalescer, which adds them to round trips as commands fill,
// and sends the rest once the source is exhausted.
//
// Unless the run is inOrder, the next round trip is sent as soon as it is
// built, while the previous one is still in flight (byEntry: unless the two
// write a common entry). At most two are in flight, and each is accounted
// for in source order. Either way, run returns only once every round trip
// it sent has returned: once sent, writes run to their end, and the cleanup
// must come after them.
func (s *sender) run(ctx context.Context) (err error) {
	defer func() {
		if s.pending != nil {
			if perr := s.pending.wait(s); err == nil {
				err = perr
			}
		}
	}()
	for {
		group, open, err := s.next(ctx)
		switch {
		case err != nil:
			return err
		case ctx.Err() != nil:
			return nil // run reports the cause
		case !open:
			return s.drain(ctx)
		}
		if err := s.trip(ctx, group); err != nil {
			return err
		}
	}
}

// next waits for the next batch, accounting meanwhile for the round trip in
// flight when it returns, and gathers the batches already waiting behind
// it. open is false once queue is closed and empty.
func (s *sender) next(ctx context.Context) (group []*batch, open bool, err error) {
	for group == nil {
		var done <-chan error // nil, which blocks, when no trip is pending
		if s.pending != nil {
			done = s.pending.done
		}
		select {
		case b, ok := <-s.queue:
			if !ok {
				return nil, false, nil
			}
			group = append(group, b)
		case werr := <-done:
			// Account for it now: its slots let the source fill the
			// batches this loop waits for.
			t := s.pending
			s.pending = nil
			if err := t.finish(s, werr); err != nil {
				return nil, true, err
			}
		case <-ctx.Done():
			return nil, true, nil
		}
	}
	return gather(group, s.queue, s.perTrip), true, nil
}

// trip writes group, with the merged commands it fills, in one round trip.
func (s *sender) trip(ctx context.Context, group []*batch) error {
	if err := s.awaitBuilt(ctx, group); err != nil || ctx.Err() != nil {
		return err
	}
	t := &trip{group: group, done: make(chan error, 1)}
	if s.r.order == byEntry && s.pending != nil && s.pending.conflicts(t) {
		// t rewrites an entry that the trip in flight writes: it goes out
		// after that one has returned, so the later write wins. The
		// batches queued meanwhile go with it.
		if err := s.settle(); err != nil {
			return err
		}
		if more := gather(group, s.queue, s.perTrip); len(more) > len(group) {
			if err := s.awaitBuilt(ctx, more[len(group):]); err != nil || ctx.Err() != nil {
				return err
			}
			t.group = more
		}
	}
	for _, b := range t.group {
		t.txns = append(t.txns, batchTxn(b))
		ready, err := s.merge(ctx, b)
		if err != nil {
			return err
		}
		t.txns = append(t.txns, pack(s.r.redis.Client().B(), s.writer.sortBySlot(ready), s.r.opts.BatchSize)...)
	}
	return s.launch(ctx, t)
}

// merge feeds b's merged entries to the coalescer, and returns the commands
// it fills.
func (s *sender) merge(ctx context.Context, b *batch) ([]mergedCmd, error) {
	for _, m := range b.c.merged {
		if m.name == s.checked {
			continue
		}
		if err := s.checkMerge(ctx, m); err != nil {
			return nil, err
		}
		s.checked = m.name
	}
	return s.co.add(b.c.merged), nil
}

// drain sends what the coalescer holds, once the source is exhausted.
func (s *sender) drain(ctx context.Context) error {
	txns := pack(s.r.redis.Client().B(), s.writer.sortBySlot(s.co.drain()), s.r.opts.BatchSize)
	for len(txns) > 0 && ctx.Err() == nil {
		n := min(len(txns), s.perTrip)
		if err := s.launch(ctx, &trip{txns: txns[:n], done: make(chan error, 1)}); err != nil {
			return err
		}
		txns = txns[n:]
	}
	return nil
}

// launch sends t: at once, with the trip in flight still pending, unless the
// run is inOrder, in which case t is written before launch returns.
func (s *sender) launch(ctx context.Context, t *trip) error {
	for _, tx := range t.txns {
		expiring(tx)
	}
	if s.r.order == inOrder {
		return t.finish(s, s.writer.write(ctx, t.txns))
	}
	go func() { t.done <- s.writer.write(ctx, t.txns) }()
	prev := s.pending
	s.pending = t
	if prev != nil {
		return prev.wait(s)
	}
	return nil
}

// settle waits for the trip in flight, if any, and accounts for it.
func (s *sender) settle() error {
	if s.pending == nil {
		return nil
	}
	prev := s.pending
	s.pending = nil
	return prev.wait(s)
}

// gather adds to group the batches already waiting in queue, up to n in
// all, without waiting for more.
func gather(group []*batch, queue <-chan *batch, n int) []*batch {
	for len(group) < n {
		select {
		case b, ok := <-queue:
			if !ok {
				return group
			}
			group = append(group, b)
		default:
			return group
		}
	}
	return group
}

// awaitBuilt waits until every batch of group is built, and returns the
// first one's error, or the first command that writes outside its temp
// keys; it returns nil early when ctx is done (the run reports the cause).
func (s *sender) awaitBuilt(ctx context.Context, group []*batch) error {
	for _, b := range group {
		select {
		case <-b.built:
		case <-ctx.Done():
			return nil
		}
		if b.err != nil {
			return b.err
		}
		if err := s.checkKeys(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

// checkMerge refuses a Merge of a command that could write keys other than
// its first argument.
func (s *sender) checkMerge(ctx context.Context, m merged) error {
	spec, err := s.r.specs.spec(ctx, s.r.redis.Client(), strings.ToLower(m.name))
	if err == nil && (spec.movable || spec.subs != nil || spec.first != 1 || spec.last != 1) {
		err = fmt.Errorf("a Merge of %s, whose keys are not just its first argument", m.name)
	}
	if err != nil {
		return &Error{Op: "build", Key: s.r.owners[m.t.builder].key, Err: err}
	}
	return nil
}

// trip is one round trip: the transactions of batches, and of merged
// writes, sent by write in one DoMulti.
type trip struct {
	group []*batch
	txns  []*txn
	done  chan error // write's result
}

// conflicts reports whether a batch of t and a batch of o write a common
// entry of a ByEntry builder.
func (t *trip) conflicts(o *trip) bool {
	for _, a := range t.group {
		for _, b := range o.group {
			if a.c.conflicts(b.c) {
				return true
			}
		}
	}
	return false
}

// wait waits for t's write, and finishes t.
func (t *trip) wait(s *sender) error { return t.finish(s, <-t.done) }

// finish accounts for t's batches if its write, which returned err,
// succeeded, and returns err.
func (t *trip) finish(s *sender, err error) error {
	if err != nil {
		return err
	}
	for _, b := range t.group {
		s.account(b)
	}
	return nil
}

// account records a written batch, recycles its buffer and reports
// progress; then gives its slot back.
func (s *sender) account(b *batch) {
	s.progress.account(b)
	<-s.slots // the batch is done: the source may fill another
}

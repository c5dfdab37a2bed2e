package rebuild

import (
	"context"
	"iter"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// batch is one batch on its way from the source to Redis: built by its own
// goroutine, then sent in source order by the sender. Its items stay with
// the pump and the build: after build, nothing depends on their type.
type batch struct {
	seq     int64         // 1 for the source's first batch
	items   int           // how many items it holds
	built   chan struct{} // closed when c and err are set
	c       *commands
	err     error
	release func() // gives the items' buffer back for reuse, once written
}

// pump pulls src into batches, at the pace th allows, starts building each
// in g, and hands it on to s in source order. A batch takes one of Writers slots of s before it
// is built and gives it back once written: that is the backpressure that
// bounds memory to the batch being filled plus Writers in flight. A batch
// that has waited for FlushInterval since its first item is handed on
// unfilled, so that a slow source still makes progress. pump tells s when
// done, and returns the source's error, if any. It stops early when ctx is
// done.
func (x *execution[T]) pump(ctx context.Context, g *errgroup.Group, s *sender, th *throttle, src iter.Seq2[T, error]) error {
	defer s.done()
	c := &cutter[T]{x: x, ctx: ctx, g: g, send: s, items: x.buffer()}
	stop := c.flushEvery(x.r.opts.FlushInterval)
	defer stop() // before the last hand, and on every other way out
	for item, err := range src {
		if err != nil {
			return err
		}
		if ctx.Err() != nil || !th.wait(ctx) {
			return nil
		}
		x.pulled.Add(1)
		if !c.add(item) {
			return nil
		}
	}
	stop()
	c.rest()
	return nil
}

// cutter cuts the source's items into batches, and hands them on in order:
// from the pump when a batch is full, from its flusher when a partial batch
// has waited too long.
type cutter[T any] struct {
	x    *execution[T]
	ctx  context.Context
	g    *errgroup.Group
	send *sender

	handing sync.Mutex // held while a batch is handed on, so that batches go in order

	mu      sync.Mutex // guards the fields below
	items   []T        // the batch being filled
	since   time.Time  // when its first item came
	seq     int64      // the last batch's number
	pending int        // batches cut by add and not yet handed on
}

// add adds item to the batch being filled, and hands the batch on when it
// is full. It reports whether the run goes on.
func (c *cutter[T]) add(item T) bool {
	c.mu.Lock()
	if len(c.items) == 0 {
		c.since = time.Now()
	}
	c.items = append(c.items, item)
	var b *batch
	var items []T
	if len(c.items) == c.x.r.opts.BatchSize {
		b, items = c.cut()
		c.pending++
	}
	c.mu.Unlock()
	if b == nil {
		return true
	}
	c.handing.Lock()
	ok := c.hand(b, items)
	c.handing.Unlock()
	c.mu.Lock()
	c.pending--
	c.mu.Unlock()
	return ok
}

// cut takes the batch being filled and numbers it, and returns it with its
// items. c.mu is held.
func (c *cutter[T]) cut() (*batch, []T) {
	c.seq++
	items, free := c.items, c.x.free
	b := &batch{seq: c.seq, items: len(items), built: make(chan struct{}), release: func() {
		clear(items)
		select {
		case free <- items[:0]:
		default:
		}
	}}
	c.items = c.x.buffer()
	return b, items
}

// flushOld hands on the batch being filled if its first item came
// interval ago or more, and no full batch is waiting to go before it.
func (c *cutter[T]) flushOld(now time.Time, interval time.Duration) {
	c.handing.Lock()
	defer c.handing.Unlock()
	c.mu.Lock()
	if len(c.items) == 0 || c.pending > 0 || now.Sub(c.since) < interval {
		c.mu.Unlock()
		return
	}
	b, items := c.cut()
	c.mu.Unlock()
	c.hand(b, items)
}

// flushEvery starts the flusher, which checks for an old partial batch
// every interval/4. The returned func stops it and waits for it; calling it
// again does nothing.
func (c *cutter[T]) flushEvery(interval time.Duration) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(max(interval/4, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case now := <-t.C:
				c.flushOld(now, interval)
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-ended }) }
}

// rest hands on the last, partial batch, once the source is exhausted and
// the flusher stopped.
func (c *cutter[T]) rest() {
	if len(c.items) > 0 && c.ctx.Err() == nil {
		c.hand(c.cut())
	}
}

// hand takes a slot for b, starts building it from items, and hands it
// on to the sender. It reports whether the run goes on.
func (c *cutter[T]) hand(b *batch, items []T) bool {
	if !c.send.take(c.ctx) {
		return false
	}
	c.g.Go(func() error { c.x.build(b, items); return nil }) // its error goes to the sender, in order
	return c.send.hand(c.ctx, b)
}

// buffer returns an empty batch buffer, reusing a sent one if possible.
func (x *execution[T]) buffer() []T {
	select {
	case b := <-x.free:
		return b
	default:
		return make([]T, 0, x.r.opts.BatchSize)
	}
}

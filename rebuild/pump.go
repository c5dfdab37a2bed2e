package rebuild

import (
	"context"
	"iter"

	"golang.org/x/sync/errgroup"
)

// batch is one batch on its way from the source to Redis: built by its own
// goroutine, then sent in source order by the sender.
type batch[T any] struct {
	seq   int64 // 1 for the source's first batch
	items []T
	built chan struct{} // closed when c and err are set
	c     *Commands
	err   error
}

// pump pulls src into batches, starts building each, and queues it for the
// sender in source order. A batch takes one of Writers slots before it is
// handed on and gives it back once written: that is the backpressure that
// bounds memory to the batch being filled plus Writers in flight. It closes
// queue when done, and returns the source's error, if any. It stops early
// when ctx is done.
func (x *execution[T]) pump(ctx context.Context, g *errgroup.Group, queue chan<- *batch[T], src iter.Seq2[T, error]) error {
	defer close(queue)
	size := x.r.opts.BatchSize
	items := x.buffer(size)
	var seq int64
	hand := func() bool {
		select {
		case x.slots <- struct{}{}:
		case <-ctx.Done():
			return false
		}
		seq++
		b := &batch[T]{seq: seq, items: items, built: make(chan struct{})}
		g.Go(func() error { x.build(b); return nil }) // its error goes to the sender, in order
		items = x.buffer(size)
		select {
		case queue <- b:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for item, err := range src {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		x.stats.Items++
		if items = append(items, item); len(items) == size && !hand() {
			return nil
		}
	}
	if len(items) > 0 && ctx.Err() == nil {
		hand()
	}
	return nil
}

// buffer returns an empty batch buffer, reusing a sent one if possible.
func (x *execution[T]) buffer(size int) []T {
	select {
	case b := <-x.free:
		return b
	default:
		return make([]T, 0, size)
	}
}

package rebuild

import "context"

// send takes built batches from queue in source order and writes them,
// every batch already waiting, up to half of Writers, in one DoMulti. The
// other half of the slots are being built meanwhile, so that the next
// DoMulti is ready when this one's replies come back: the server is not
// left waiting for the client to build.
//
// Unless the run is inOrder, the next DoMulti is sent as soon as it is
// built, while the previous one is still in flight (byEntry: unless the two
// write a common entry), so that the server is not left waiting either while
// rueidis writes it out. At most two are in flight, and each is accounted
// for in source order. Either way, send returns only once every DoMulti it
// sent has returned: once sent, writes run to their end, and the cleanup
// must come after them.
func (x *execution[T]) send(ctx context.Context, queue <-chan *batch[T]) (err error) {
	perTrip := max(1, x.r.opts.Writers/2)
	var pending *trip[T] // the DoMulti in flight, unless inOrder
	defer func() {
		if pending != nil {
			if perr := pending.wait(x); err == nil {
				err = perr
			}
		}
	}()
	for {
		var group []*batch[T]
		for group == nil {
			var done <-chan error // nil, which blocks, when no trip is pending
			if pending != nil {
				done = pending.done
			}
			select {
			case b, ok := <-queue:
				if !ok {
					return nil
				}
				group = append(group, b)
			case werr := <-done:
				// Account for it now: its slots let the source fill the
				// batches this loop waits for.
				t := pending
				pending = nil
				if err := t.finish(x, werr); err != nil {
					return err
				}
			case <-ctx.Done():
				return nil // run reports the cause
			}
		}
		group = gather(group, queue, perTrip)
		if err := x.awaitBuilt(ctx, group); err != nil || ctx.Err() != nil {
			return err
		}
		t := &trip[T]{group: group, done: make(chan error, 1)}
		if x.r.order == inOrder {
			if err := t.finish(x, x.write(ctx, group)); err != nil {
				return err
			}
			continue
		}
		if pending != nil && x.r.order == byEntry && pending.conflicts(t) {
			// t rewrites an entry that the trip in flight writes: it
			// goes out after that one has returned, so the later write
			// wins. The batches queued meanwhile go with it.
			prev := pending
			pending = nil
			if err := prev.wait(x); err != nil {
				return err
			}
			if more := gather(group, queue, perTrip); len(more) > len(group) {
				if err := x.awaitBuilt(ctx, more[len(group):]); err != nil || ctx.Err() != nil {
					return err
				}
				group, t.group = more, more
			}
		}
		go func() { t.done <- x.write(ctx, group) }()
		prev := pending
		pending = t
		if prev != nil {
			if err := prev.wait(x); err != nil {
				return err
			}
		}
	}
}

// gather adds to group the batches already waiting in queue, up to n in
// all, without waiting for more.
func gather[T any](group []*batch[T], queue <-chan *batch[T], n int) []*batch[T] {
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
func (x *execution[T]) awaitBuilt(ctx context.Context, group []*batch[T]) error {
	for _, b := range group {
		select {
		case <-b.built:
		case <-ctx.Done():
			return nil
		}
		if b.err != nil {
			return b.err
		}
		if err := x.checkKeys(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

// trip is one DoMulti of batches, sent by write.
type trip[T any] struct {
	group []*batch[T]
	done  chan error // write's result
}

// conflicts reports whether a batch of t and a batch of o write a common
// entry of a Keyed builder.
func (t *trip[T]) conflicts(o *trip[T]) bool {
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
func (t *trip[T]) wait(x *execution[T]) error { return t.finish(x, <-t.done) }

// finish accounts for t's batches if its write, which returned err,
// succeeded, and returns err.
func (t *trip[T]) finish(x *execution[T], err error) error {
	if err != nil {
		return err
	}
	for _, b := range t.group {
		x.account(b)
	}
	return nil
}

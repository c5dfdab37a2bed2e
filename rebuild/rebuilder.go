package rebuild

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"golang.org/x/sync/errgroup"
)

// Rebuilder rebuilds the keys of its builders from one pass over a source,
// and publishes them all at once. It is safe for concurrent use; runs of
// the same keys exclude each other through their locks.
type Rebuilder[T any] struct {
	client   rueidis.Client
	store    *store.Store
	opts     Options
	builders []Builder[T]
	owners   []owner
	key      string // the builders' keys, for errors
	err      error  // a configuration error, returned by Run
	ttlSecs  int64
	overlap  bool // two round trips may be in flight: Unordered, or every builder commutative
	keyed    bool // not overlap, but every builder commutative or keyed: overlap unless entries conflict
}

// New returns a Rebuilder that writes through client with builders. Run
// reports invalid options or builders (a negative BatchSize, an empty or
// duplicated key, keys in different hash slots on a cluster, ...) before
// touching Redis.
//
// New panics if client or a builder is nil: those are programming errors.
func New[T any](client rueidis.Client, opts Options, builders ...Builder[T]) *Rebuilder[T] {
	if client == nil {
		panic("keyswap: rebuild.New: nil rueidis.Client")
	}
	for i, b := range builders {
		if b == nil {
			panic(fmt.Sprintf("keyswap: rebuild.New: builder %d is nil", i))
		}
	}
	r := &Rebuilder[T]{
		client:   client,
		store:    store.New(client, store.Options{Logger: opts.Logger}),
		builders: builders,
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	r.opts = opts
	r.err = r.configure()
	return r
}

// configure fills in defaults and validates the options and builders.
func (r *Rebuilder[T]) configure() error {
	o := &r.opts
	var ks []string
	r.overlap, r.keyed = true, true
	for _, b := range r.builders {
		if c, ok := b.(Commutative); !ok || !c.Commutative() {
			r.overlap = o.Unordered
			if k, ok := b.(Keyed); !ok || !k.Keyed() {
				r.keyed = false
			}
		}
		_, family := b.(Family)
		r.owners = append(r.owners, owner{key: b.Key(), family: family})
		ks = append(ks, b.Key())
	}
	r.key = strings.Join(ks, ", ")
	bad := func(format string, args ...any) error {
		return &Error{Op: "config", Key: r.key, Err: fmt.Errorf(format, args...)}
	}
	switch {
	case o.BatchSize < 0:
		return bad("BatchSize %d: must not be negative (zero means %d)", o.BatchSize, DefaultBatchSize)
	case o.Writers < 0:
		return bad("Writers %d: must not be negative (zero means %d)", o.Writers, DefaultWriters)
	case o.TTL < 0:
		return bad("TTL %v: must not be negative (zero means %v)", o.TTL, DefaultTTL)
	case o.PreserveFor < 0:
		return bad("PreserveFor %v: must not be negative (zero means %v)", o.PreserveFor, DefaultPreserveFor)
	case len(r.builders) == 0:
		return bad("no builders")
	}
	o.BatchSize = orDefault(o.BatchSize, DefaultBatchSize)
	o.Writers = orDefault(o.Writers, DefaultWriters)
	o.TTL = orDefault(o.TTL, DefaultTTL)
	o.PreserveFor = orDefault(o.PreserveFor, DefaultPreserveFor)
	for what, d := range map[string]time.Duration{"TTL": o.TTL, "PreserveFor": o.PreserveFor} {
		if d < time.Second || d%time.Second != 0 {
			return bad("%s %v: must be a whole number of seconds, at least 1s (Redis expiries here are in seconds)", what, d)
		}
	}
	r.ttlSecs = int64(o.TTL / time.Second)

	for i, a := range r.owners {
		if a.key == "" {
			return bad("builder %d (%T) has an empty key", i, r.builders[i])
		}
		if reserved(a.key) {
			return bad("key %q of builder %d has the shape of a rebuild lock or temp key, so it cannot be rebuilt", a.key, i)
		}
		for j, b := range r.owners[:i] {
			switch {
			case a.key == b.key:
				return bad("builders %d and %d both target key %q", j, i, a.key)
			case b.family && strings.HasPrefix(a.key, b.key+":"):
				return bad("key %q of builder %d is inside the family %q of builder %d, whose publish would delete it", a.key, i, b.key+":*", j)
			case a.family && strings.HasPrefix(b.key, a.key+":"):
				return bad("key %q of builder %d is inside the family %q of builder %d, whose publish would delete it", b.key, j, a.key+":*", i)
			}
		}
	}
	if r.store.Cluster() {
		return r.checkSlots(bad)
	}
	return nil
}

// checkSlots refuses, on a cluster, builders whose keys cannot be published
// in one single-slot script.
func (r *Rebuilder[T]) checkSlots(bad func(string, ...any) error) error {
	for _, o := range r.owners {
		if _, tagged := keys.HashTag(o.key); o.family && !tagged {
			return bad("family prefix %q has no hash tag, so on Redis Cluster its buckets would spread over many hash slots and could not be published atomically; put the part that must stay together in braces, e.g. %q",
				o.key, "{"+o.key+"}")
		}
	}
	first := r.owners[0].key
	for _, o := range r.owners[1:] {
		if keys.Slot(o.key) != keys.Slot(first) {
			return bad("keys %q (slot %d) and %q (slot %d) are in different hash slots, and one publish must stay in one slot on Redis Cluster; give them a common hash tag, e.g. %q and %q",
				first, keys.Slot(first), o.key, keys.Slot(o.key), "{idx}:"+first, "{idx}:"+o.key)
		}
	}
	return nil
}

// orDefault returns v, or def when v is zero.
func orDefault[N int | time.Duration](v, def N) N {
	if v == 0 {
		return def
	}
	return v
}

// Run rebuilds every builder's keys from src and publishes them in one
// fenced atomic step. Readers see the old keys or the new ones, never a
// missing, empty or half-built key, and never a mixture of the two runs.
//
// # Lifecycle
//
//  1. Lock every builder's key (a family's prefix) under one token. If any
//     lock is held, release the others and return an error matching
//     ErrInProgress that names the key. Nothing is written.
//  2. Pull src and cut batches of BatchSize items. Builders turn up to
//     Writers batches into commands concurrently; one sender sends them in
//     source order, each batch a MULTI/EXEC transaction that also gives
//     every temp key it creates its TTL, up to Writers/2 batches per
//     pipelined round trip, with the renewal of the lease when one is due.
//     One round trip is in flight at a time; two with Options.Unordered,
//     when every builder is Commutative, or when every builder is
//     Commutative or Keyed and the two round trips write no field or
//     member of a Keyed builder in common.
//  3. Renew once more, check that every populated temp key still exists,
//     and publish: one script checks the locks and replaces every live key,
//     deletes the keys of builders that produced nothing, and deletes the
//     family buckets the run no longer produced.
//  4. Release the locks.
//
// # Errors
//
// A run is all or nothing. A source error, a builder error, a write error, a
// lost lease or a cancelled ctx discards every temp key, leaves every live
// key untouched, releases the locks, and returns the cause wrapped in an
// *Error, so that errors.Is and errors.As see it. A panic in the source or
// a builder gets the same cleanup, then propagates (see [PanicError]).
// Publish failures are those of store.Store.Publish: ErrLockLost,
// ErrTempKeyLost, or the script's own error, after which the temp keys are
// kept for PreserveFor. When the publish script's reply is lost (a dropped
// connection, a timeout, a cancelled ctx), Run finds out whether it ran
// (store.Store.Settle): if it did, Run succeeds; if Redis cannot be asked,
// the error matches ErrOutcomeUnknown. Every other error means that nothing
// was published.
//
// Stats are returned on failure too, with what was done before it.
func (r *Rebuilder[T]) Run(ctx context.Context, src iter.Seq2[T, error]) (Stats, error) {
	start := time.Now()
	stats := Stats{Targets: map[string]int64{}, Outcomes: map[string]store.Outcome{}}
	if r.err != nil {
		return stats, r.err
	}
	if src == nil {
		return stats, &Error{Op: "config", Key: r.key, Err: errors.New("nil source")}
	}
	lockKeys := make([]string, len(r.owners))
	for i, o := range r.owners {
		lockKeys[i] = o.key
	}
	locks, err := r.store.AcquireAll(ctx, lockKeys, r.opts.TTL)
	if err != nil {
		return stats, err
	}
	x := &execution[T]{r: r, start: start, locks: locks, stats: &stats}
	err = x.run(ctx, src)
	stats.Elapsed = time.Since(start)
	return stats, err
}

// execution is the state of one Run.
type execution[T any] struct {
	r       *Rebuilder[T]
	start   time.Time
	locks   []*store.Lock
	stats   *Stats
	targets *targets
	lease   *lease

	items, batches atomic.Int64  // items in sent batches, sent batches
	entries        []int64       // entries written per builder; only the sender writes
	free           chan []T      // batch buffers to reuse
	slots          chan struct{} // one per batch in flight: built, queued or being sent
}

// batch is one batch on its way from the source to Redis: built by its own
// goroutine, then sent in source order by the sender.
type batch[T any] struct {
	seq   int64 // 1 for the source's first batch
	items []T
	built chan struct{} // closed when c and err are set
	c     *Commands
	err   error
}

// run is Run after the locks are taken. Every way out of it, a panic
// included, ends every goroutine it started, then either publishes or
// discards every temp key, and releases the locks.
//
// The pipeline has three stages. The caller's goroutine pulls the source and
// cuts batches. Each batch is built (turned into commands by the builders)
// in a goroutine of its own, up to Writers batches ahead. One sender takes
// the built batches in source order and sends those already waiting (up to
// Writers/2) in one DoMulti, which rueidis writes to one connection in
// order, while the next ones are built. So the server is kept busy, and the
// last write of a field or member in source order wins (C50, C54):
// concurrent DoMulti calls would go out on different connections, in no set
// order. Only when order cannot matter does the sender send the next
// DoMulti while one is in flight: r.overlap (Unordered, or every builder
// Commutative), or r.keyed and the two write no entry in common.
func (x *execution[T]) run(ctx context.Context, src iter.Seq2[T, error]) (err error) {
	r := x.r
	x.entries = make([]int64, len(r.builders))
	x.free = make(chan []T, r.opts.Writers+1)
	x.slots = make(chan struct{}, r.opts.Writers)
	x.targets = newTargets(r.owners, r.store.Cluster(), r.store.NewTempKey)

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	x.lease = newLease(r.store, x.locks, x.targets, r.opts.TTL, r.key, cancel, x.batches.Load, x.start)
	var leaseDone sync.WaitGroup
	leaseDone.Go(func() { x.lease.run(runCtx) })

	// The family scans run concurrently with the source.
	scans, scanCtx := errgroup.WithContext(runCtx)
	live := x.scanFamilies(scanCtx, scans)
	g, gctx := errgroup.WithContext(runCtx)
	queue := make(chan *batch[T], r.opts.Writers)
	g.Go(func() error { return x.send(gctx, queue) })

	published := false
	defer func() {
		// On every path, a panic in the source included: stop, wait, clean up.
		cancel(errors.New("keyswap: run ended"))
		_ = g.Wait()
		_ = scans.Wait()
		x.lease.stop()
		leaseDone.Wait()
		if !published {
			x.discard(ctx)
		}
		err = x.release(ctx, err)
	}()

	srcErr := x.pump(gctx, g, queue, src)
	werr := g.Wait()
	// The first failure: a write or build error (a panic included) or the
	// source's error, which happen before anything cancels the run; or else
	// the caller's cancellation or a lost lease, which stop the pipeline
	// without an error of its own.
	var failure error
	switch cause := context.Cause(runCtx); {
	case isPanic(werr):
		failure = werr
	case werr != nil && errors.Is(cause, ErrLockLost):
		// A stall that outlived the lease also timed out the batch in
		// flight: the lost lease is the cause, the write error its symptom.
		failure = errors.Join(x.wrap("lease", cause), werr)
	case werr != nil:
		failure = werr
	case srcErr != nil:
		failure = &Error{Op: "source", Key: r.key, Err: srcErr}
	case cause != nil:
		failure = x.wrap("run", cause)
	}
	if failure != nil {
		cancel(failure) // stops the family scans: nothing will be published
		_ = scans.Wait()
		if isPanic(failure) {
			panic(failure) // after the deferred cleanup, in the caller's goroutine
		}
		return failure
	}
	if err := scans.Wait(); err != nil {
		return &Error{Op: "scan", Key: r.key, Err: err}
	}

	x.lease.stop()
	leaseDone.Wait()
	published, err = x.publish(runCtx, live)
	return err
}

// isPanic reports whether err is a builder's panic, which Run re-panics.
func isPanic(err error) bool {
	_, ok := err.(*PanicError)
	return ok
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

// build turns b's items into commands through every builder. A panic in a
// builder becomes a *PanicError, which Run re-panics after cleaning up.
func (x *execution[T]) build(b *batch[T]) {
	defer close(b.built)
	defer func() {
		if p := recover(); p != nil {
			b.err = &PanicError{Value: p, Stack: debug.Stack()}
		}
	}()
	r := x.r
	c := &Commands{
		cb: r.client.B(), targets: x.targets, entries: make([]int64, len(r.builders)),
		seen: map[*target]bool{}, temps: map[string]*target{},
	}
	for i, bl := range r.builders {
		c.builder = i
		err := bl.Build(c, b.items)
		if err == nil {
			err = c.err
		}
		if err != nil {
			b.err = &Error{Op: "build", Key: bl.Key(), Err: err}
			return
		}
	}
	if x.targets.cluster {
		for _, cmd := range c.cmds {
			if cmd.Slot() != x.targets.slot {
				b.err = &Error{Op: "build", Key: r.key, Err: fmt.Errorf("a builder's command %q is outside the rebuild's hash slot %d; builders must write only to keys from Commands.Temp", cmd.Commands()[0], x.targets.slot)}
				return
			}
		}
	}
	c.sortWrites()
	b.c = c
}

// send takes built batches from queue in source order and writes them,
// every batch already waiting, up to half of Writers, in one DoMulti. The
// other half of the slots are being built meanwhile, so that the next
// DoMulti is ready when this one's replies come back: the server is not
// left waiting for the client to build.
//
// With overlap, the next DoMulti is sent as soon as it is built, while the
// previous one is still in flight, so that the server is not left waiting
// either while rueidis writes it out. At most two are in flight, and each
// is accounted for in source order. Either way, send returns only once
// every DoMulti it sent has returned: once sent, writes run to their end,
// and the cleanup must come after them.
func (x *execution[T]) send(ctx context.Context, queue <-chan *batch[T]) (err error) {
	perTrip := max(1, x.r.opts.Writers/2)
	var pending *trip[T] // the DoMulti in flight, with overlap or keyed
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
	more:
		for len(group) < perTrip {
			select {
			case b, ok := <-queue:
				if !ok {
					break more
				}
				group = append(group, b)
			default:
				break more
			}
		}
		for _, b := range group {
			select {
			case <-b.built:
			case <-ctx.Done():
				return nil
			}
			if b.err != nil {
				return b.err
			}
		}
		t := &trip[T]{group: group, done: make(chan error, 1)}
		if !x.r.overlap && !x.r.keyed {
			if err := t.finish(x, x.write(ctx, group)); err != nil {
				return err
			}
			continue
		}
		if pending != nil && !x.r.overlap && pending.conflicts(t) {
			// t rewrites an entry that the trip in flight writes: it
			// goes out after that one has returned, so the later write
			// wins.
			prev := pending
			pending = nil
			if err := prev.wait(x); err != nil {
				return err
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

// write sends a group of built batches in one DoMulti. Each batch is one
// MULTI ... EXEC transaction of its writes followed by an EXPIRE NX of every
// temp key it wrote, so that no temp key ever exists without a TTL (C34):
// if the connection breaks before EXEC arrives, the server drops the
// transaction; if EXEC runs late, the TTL comes with the writes. At the end
// of the DoMulti rides the lease renewal, when one is due. write checks
// every reply; the sender accounts for the batches.
func (x *execution[T]) write(ctx context.Context, group []*batch[T]) error {
	r := x.r
	var cmds rueidis.Commands
	for _, b := range group {
		cmds = append(cmds, b.c.cb.Multi().Build())
		cmds = append(cmds, b.c.cmds...)
		for _, t := range b.c.touched {
			// NX: only a key this batch created has no TTL yet, so a reply
			// of 1 is the creation of the temp key, and a second one for the
			// same key is a loss (see target.created).
			cmds = append(cmds, b.c.cb.Expire().Key(t.temp).Seconds(r.ttlSecs).Nx().Build())
		}
		cmds = append(cmds, b.c.cb.Exec().Build())
	}
	sent := time.Now()
	rn, renew := x.lease.claim(sent, false)
	if renew {
		cmd, err := x.lease.command(rn.temps)
		if err != nil {
			x.lease.settle(ctx, sent, rn, nil) // reports the same error
			renew = false
		} else {
			cmds = append(cmds, cmd)
		}
	}

	// The writes are not cancelled with the run: once sent they will run,
	// and the cleanup must come after them. A write that outlives the lease
	// is bounded by it.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.TTL)
	defer cancel()
	res := r.client.DoMulti(wctx, cmds...)
	if renew {
		x.lease.settle(wctx, sent, rn, &res[len(res)-1])
	}
	for _, b := range group {
		n := len(b.c.cmds) + len(b.c.touched)
		replies, err := execReplies(res[:n+2], n)
		if err != nil {
			return &Error{Op: "write", Key: r.key, Err: fmt.Errorf("batch %d (%d items): %w", b.seq, len(b.items), err)}
		}
		writes := len(b.c.cmds)
		for i, m := range replies[:writes] {
			if err := m.Error(); err != nil {
				return &Error{Op: "write", Key: r.key, Err: fmt.Errorf("batch %d (%d items), command %d of %d: %w",
					b.seq, len(b.items), i+1, writes, err)}
			}
		}
		for i, t := range b.c.touched {
			n, err := replies[writes+i].AsInt64()
			if err != nil {
				return &Error{Op: "write", Key: r.key, Err: fmt.Errorf("EXPIRE %s: %w", t.temp, err)}
			}
			if n == 1 && !t.created() {
				return &Error{Op: "write", Key: r.key, Err: lostTemp(t, "vanished and was re-created by a later write (or a write removed its TTL, as a plain SET does: use SET KEEPTTL), so it holds only part of the rebuild")}
			}
		}
		res = res[n+2:]
	}
	return nil
}

// execReplies returns the replies to the n commands of a MULTI ... EXEC
// transaction, given the replies to all of its n+2 commands. A command the
// server refused to queue (OOM, a syntax error) aborts the transaction: its
// error is returned.
func execReplies(res []rueidis.RedisResult, n int) ([]rueidis.RedisMessage, error) {
	for i, r := range res[:n+1] { // MULTI, then each QUEUED
		if err := r.Error(); err != nil {
			if i == 0 {
				return nil, fmt.Errorf("MULTI: %w", err)
			}
			return nil, fmt.Errorf("command %d of %d: %w", i, n, err)
		}
	}
	replies, err := res[n+1].ToArray()
	if err != nil {
		return nil, fmt.Errorf("EXEC: %w", err)
	}
	if len(replies) != n {
		return nil, fmt.Errorf("EXEC returned %d replies for %d commands", len(replies), n)
	}
	return replies, nil
}

// account records a written batch, recycles its buffer and reports progress.
func (x *execution[T]) account(b *batch[T]) {
	for i, n := range b.c.entries {
		x.entries[i] += n
	}
	items := x.items.Add(int64(len(b.items)))
	batches := x.batches.Add(1)
	clear(b.items)
	select {
	case x.free <- b.items[:0]:
	default:
	}
	if p := x.r.opts.Progress; p != nil {
		elapsed := time.Since(x.start)
		p(Progress{Items: items, Batches: batches, Elapsed: elapsed, Rate: float64(items) / elapsed.Seconds()})
	}
	<-x.slots // the batch is done: the source may fill another
}

// scanFamilies starts a SCAN per family builder for its live keys, whose
// leftovers become orphans at publish. It returns the sets the scans fill.
func (x *execution[T]) scanFamilies(ctx context.Context, g *errgroup.Group) []map[string]bool {
	live := make([]map[string]bool, len(x.r.builders))
	for i, b := range x.r.builders {
		f, ok := b.(Family)
		if !ok {
			continue
		}
		live[i] = map[string]bool{}
		prefix := b.Key() + ":"
		// On a cluster every bucket is in the prefix's slot (its hash tag is
		// required): only that slot's master is scanned.
		opts := scan.Options{Match: scan.EscapeGlob(prefix) + "*", Type: f.KeyType(), InSlot: true, Slot: keys.Slot(b.Key())}
		g.Go(func() error {
			for page, err := range scan.Pages(ctx, x.r.client, opts) {
				if err != nil {
					return fmt.Errorf("SCAN %s: %w", opts.Match, err)
				}
				for _, k := range page {
					if _, _, temp := keys.ParseTempKey(k); !temp && !strings.HasSuffix(k, keys.LockSuffix) {
						live[i][k] = true
					}
				}
			}
			return nil
		})
	}
	return live
}

// publish renews the lease a last time, checks the temp keys, and publishes
// every target in one script. It reports whether the temp keys were handed
// over to the publish (and so must not be discarded).
func (x *execution[T]) publish(ctx context.Context, live []map[string]bool) (bool, error) {
	r := x.r
	x.stats.Batches = x.batches.Load()
	for i, b := range r.builders {
		x.stats.Targets[b.Key()] = x.entries[i]
	}
	all := x.targets.all()
	rn := snapshot(all) // every write has returned: populated is final
	states, err := r.store.TouchAll(ctx, x.locks, tempKeys(all))
	if err != nil {
		return false, x.wrap("lease", err)
	}
	// A populated temp key that is gone would read as an empty result and
	// delete its live key; one re-created holds part of the rebuild.
	if err := checkTemps(rn, states, "before the swap"); err != nil {
		return false, &Error{Op: "publish", Key: r.key, Err: err}
	}
	targets := make([]store.Target, len(all))
	for i, t := range all {
		targets[i] = store.Target{Temp: t.temp, Final: t.final, Populated: t.populated.Load()}
	}
	var orphans []string
	for _, set := range live {
		for _, k := range slices.Sorted(maps.Keys(set)) {
			if !x.targets.has(k) {
				orphans = append(orphans, k)
			}
		}
	}
	outcomes, err := r.store.Publish(ctx, store.PublishOptions{
		Locks: x.locks, Targets: targets, Orphans: orphans, PreserveFor: r.opts.PreserveFor,
	})
	if err != nil {
		// A lost reply leaves it open whether the publish ran: settle it.
		published, err := r.store.Settle(ctx, err, x.locks)
		if !published {
			return true, err
		}
		outcomes = make([]store.Outcome, len(targets))
		for i, t := range targets {
			outcomes[i] = store.Emptied
			if t.Populated {
				outcomes[i] = store.Swapped
			}
		}
	}
	for i, t := range all {
		x.stats.Outcomes[t.final] = outcomes[i]
	}
	for _, o := range orphans {
		x.stats.Outcomes[o] = store.Emptied
	}
	return true, nil
}

// cleanupTimeout bounds each cleanup step after a failed run (discarding the
// temp keys, releasing the locks), which must run even after ctx is
// cancelled. Its commands are retried on a fresh connection within it.
const cleanupTimeout = 5 * time.Second

// discard deletes every temp key of the run, best effort: they have TTLs.
func (x *execution[T]) discard(ctx context.Context) {
	all := x.targets.all()
	if len(all) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := x.r.store.Discard(ctx, tempKeys(all)...); err != nil {
		x.r.opts.Logger.Warn("keyswap: could not delete temp keys after a failed rebuild; they expire within the TTL",
			"key", x.r.key, "ttl", x.r.opts.TTL, "err", err)
	}
}

// release releases the locks after the run ended with err (C8): a release
// failure is joined onto err, or logged after a success.
func (x *execution[T]) release(ctx context.Context, err error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	rerr := x.r.store.ReleaseAll(ctx, x.locks)
	switch {
	case rerr == nil, errors.Is(rerr, ErrLockLost):
	case err != nil:
		err = errors.Join(err, rerr)
	default:
		x.r.opts.Logger.Warn("keyswap: could not release rebuild locks; they expire by themselves",
			"key", x.r.key, "ttl", x.r.opts.TTL, "err", rerr)
	}
	x.stats.Batches = x.batches.Load()
	return err
}

// wrap returns err as an *Error of op, unless it already is one.
func (x *execution[T]) wrap(op string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return &Error{Op: op, Key: x.r.key, Err: err}
}

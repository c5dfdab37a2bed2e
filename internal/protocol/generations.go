package protocol

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// The scripts of Generations mode (see the keys package for the shapes).
// genalloc and flip are not retried: a rerun of genalloc would allocate
// another generation, and a rerun of flip would find its generation
// current, not building, and report a loss that did not happen. genback is
// not retried: a rerun would flip back again. The removal of generations
// is the gens package's.
var (
	genallocScript = newScript("genalloc", false)
	flipScript     = newScript("flip", false)
	genbackScript  = newScript("genback", false)
	// genapply is not retried, as apply is not: the caller must learn that
	// the outcome is unknown.
	genapplyScript = newScript("genapply", false)
)

// RegistryNames are the names the scripts of Generations mode write in a
// registry as literal strings: its field RegNext, and the states of a
// generation that are no prefix (keys.RegCurrent, keys.RegPrevious).
var RegistryNames = []string{keys.RegNext, keys.RegCurrent, keys.RegPrevious}

// ErrGenerationLost reports a run in Generations mode whose generation is
// no longer marked as its own in its index's registry when it publishes:
// the registry was overwritten or lost (evicted, or a failover to a
// replica that was behind). Nothing was published.
var ErrGenerationLost = errors.New("the run's generation is no longer in its index's registry")

// UnlinkChunk is the most keys one UNLINK of a generation's removal
// carries, so that no single command holds the server for long.
const UnlinkChunk = 256

// AllocateGenerations allocates a new generation for each index of lives
// (live keys, or families' prefixes) in its registry, marked as built by
// the run that holds locks, in one script fenced by them. It returns the
// generations, in the order of lives, and the generation current for each
// (0 for an index without a pointer, in the rename-in-place shape): it
// stays current while the locks are held, as only a flip or a rollback,
// fenced by them, moves a pointer. Each generation is above floors[i], if
// given: with a group, the floors ClaimGroup returns (SPEC C102), and then
// each generation is exactly floors[i]+1, the one the claim reserved (a
// registry that moved past it is refused, an error matching ErrTampered
// that says to run again, nothing written); nil allocates above the registry's own next and
// pointer only.
func (r Generations) AllocateGenerations(ctx context.Context, op, key string, locks []*Lock, lives []string, floors []int64) (gens, current []int64, err error) {
	mode := ""
	if r.cluster.Group != "" && floors != nil {
		mode = "exact"
	}
	return r.genalloc(ctx, op, key, locks, lives, floors, mode)
}

// genalloc runs genalloc.lua for the indexes of lives above floors in mode
// (see the script), and returns the generations it allocated (in mode
// peek, would allocate) and the current ones.
func (r Generations) genalloc(ctx context.Context, op, key string, locks []*Lock, lives []string, floors []int64, mode string) (gens, current []int64, err error) {
	lockKeys, token, err := CheckLocks(op, locks)
	if err != nil {
		return nil, nil, err
	}
	ks := slices.Clone(lockKeys)
	for _, l := range lives {
		ks = append(ks, keys.RegistryKey(l, r.cluster))
	}
	for _, l := range lives {
		ks = append(ks, keys.PointerKey(l, r.cluster))
	}
	if err := r.SameSlot(op, key, ks...); err != nil {
		return nil, nil, err
	}
	args := []string{token, strconv.Itoa(len(lockKeys))}
	for i := range lives {
		f := int64(0)
		if i < len(floors) {
			f = floors[i]
		}
		args = append(args, strconv.FormatInt(f, 10))
	}
	args = append(args, mode)
	res, err := parseReply(genallocScript.Exec(ctx, r.client, ks, args))
	if err != nil {
		return nil, nil, Fail(ctx, op, key, err)
	}
	code, err := res.code()
	i, _ := res.int(1)
	switch {
	case err != nil:
		return nil, nil, &Error{Op: op, Key: key, Err: fmt.Errorf("unexpected genalloc script reply: %w", err)}
	case code == codeLockLost && i >= 1 && int(i) <= len(locks):
		return nil, nil, &Error{Op: op, Key: locks[i-1].Live, Err: ErrLockLost}
	case code == codeInGroup && i >= 1 && int(i) <= len(lives):
		return nil, nil, r.inGroup(op, lives[i-1], res.str(2))
	case code == codeBadRegistry && i >= 1 && int(i) <= len(lives):
		reg, ptr := keys.RegistryKey(lives[i-1], r.cluster), keys.PointerKey(lives[i-1], r.cluster)
		return nil, nil, &Error{Op: op, Key: lives[i-1], Err: fmt.Errorf("%w: %s: %s, a state no run leaves (evicted, deleted or written by hand); nothing written. Readers follow %s: if it names the generation they should read, restore the registry with HSET %s next <G> <G> current, where <G> is that generation", ErrTampered, reg, res.str(2), ptr, reg)}
	case code == codeMovedPast && i >= 1 && int(i) <= len(lives):
		// Not the advice of a lost registry above: this one is whole, and
		// ahead of the reservation.
		reg := keys.RegistryKey(lives[i-1], r.cluster)
		return nil, nil, &Error{Op: op, Key: lives[i-1], Err: fmt.Errorf("%w: %s: %s: a generation was allocated there meanwhile, which no run does while this one holds its locks: the registry was written by hand, or this run lost its lock; nothing written. Run again: the next run reserves a generation past it", ErrTampered, reg, res.str(2))}
	case code != codeOK || len(res) != 1+2*len(lives):
		return nil, nil, &Error{Op: op, Key: key, Err: fmt.Errorf("unexpected genalloc script reply %v", res)}
	}
	all, err := res.ints(1)
	if err != nil {
		return nil, nil, &Error{Op: op, Key: key, Err: fmt.Errorf("unexpected genalloc script reply: %w", err)}
	}
	return all[:len(lives)], all[len(lives):], nil
}

// FlipOptions configures [Generations.Flip].
type FlipOptions struct {
	// Op and Key name the operation and the run in errors.
	Op, Key string
	// Locks are the run's locks, each with its record, log and the
	// operator's requests next to the first.
	Locks []*Lock
	// Lives are the indexes, one per lock, and Gens the generation the run
	// built for each.
	Lives []string
	Gens  []int64
	// CountBatches checks Batches against the first record's count (on a
	// standalone server; on a cluster the caller counts the writes per
	// slot).
	CountBatches bool
	Batches      int64
	// KeepPrevious keeps each index's old generation as its previous one,
	// for a rollback, instead of retiring it.
	KeepPrevious bool
	// Logs are the logs of changes, one per lock (log i of index i), with
	// what the run replayed of each. The flip replays the rest, the tail,
	// onto each index's new generation, when it holds at most MaxTail
	// entries of at most MaxWork ops and arguments over every log; a
	// longer one is refused with a *BehindError. MaxTail 0 (the run's keys
	// are not all in the locks' slot, which the flip cannot write) refuses
	// any tail.
	Logs    []LogOffset
	MaxTail int
	MaxWork int64
	// Now is the time of the flip, recorded in the metas and the
	// retirements.
	Now time.Time
}

// Flipped is what a successful flip did.
type Flipped struct {
	// Metas has the new meta generation of each index; none when the flip
	// was settled after its reply was lost.
	Metas []int64
	// Retired has, per index, the generations the flip retired, to remove
	// once readers no longer use them.
	Retired [][]int64
	// Replayed is the number of changes (log entries) of the tail the
	// flip replayed.
	Replayed int64
}

// Flip publishes a run in Generations mode (flip.lua): it checks, in one
// script and before any write, the locks, the records, the batches, the
// operator's cancel, that every log of changes was replayed to its end and
// that each index's new generation is still the run's; then replays the
// tail of the logs onto the new generations (see FlipOptions.Logs),
// deletes the run's cut-over marks and points each index's pointer at its
// new generation. The keys the tail writes in a family's new generation are
// listed in its manifest (keys.ManifestKey), in the same step. The
// refusals are those of [Publisher.Publish], and a tail
// over the bounds is refused with a *BehindError, so that the run catches
// up again. A flip whose reply was lost is settled from its receipt, as a
// publish is.
func (r Generations) Flip(ctx context.Context, opts FlipOptions) (Flipped, error) {
	op, key := opts.Op, opts.Key
	lockKeys, token, err := CheckLocks(op, opts.Locks)
	if err != nil {
		return Flipped{}, err
	}
	if len(opts.Lives) != len(opts.Gens) || len(opts.Logs) != len(lockKeys) || len(opts.Lives) != len(lockKeys) {
		return Flipped{}, &Error{Op: op, Key: key, Err: fmt.Errorf("%d generations and %d logs for %d indexes and %d locks", len(opts.Gens), len(opts.Logs), len(opts.Lives), len(lockKeys))}
	}
	ks := slices.Clone(lockKeys)
	for _, l := range lockKeys {
		ks = append(ks, keys.RecordKey(l))
	}
	ks = append(ks, keys.CtlKey(lockKeys[0]))
	for _, l := range opts.Logs {
		ks = append(ks, l.Key)
	}
	for _, l := range opts.Lives {
		ks = append(ks, keys.PointerKey(l, r.cluster), keys.RegistryKey(l, r.cluster), keys.MetaKey(l, r.cluster))
	}
	ks = append(ks, keys.ReceiptKey(lockKeys[0]))
	for _, l := range lockKeys {
		ks = append(ks, keys.CutOverKey(l))
	}
	for i, l := range opts.Lives {
		ks = append(ks, keys.ManifestKey(l, r.cluster, opts.Gens[i]))
	}
	if err := r.SameSlot(op, key, ks...); err != nil {
		return Flipped{}, err
	}
	batches, keep := "", "0"
	if opts.CountBatches {
		batches = strconv.FormatInt(opts.Batches, 10)
	}
	if opts.KeepPrevious {
		keep = "1"
	}
	args := []string{token, strconv.Itoa(len(lockKeys)), strconv.Itoa(len(opts.Lives)), batches, keep, Now(opts.Now),
		strconv.Itoa(int(receiptTTL / time.Second))}
	for _, g := range opts.Gens {
		args = append(args, strconv.FormatInt(g, 10))
	}
	args, err = tailArgs(args, opts.Logs, opts.MaxTail, opts.MaxWork)
	if err != nil {
		return Flipped{}, &Error{Op: op, Key: key, Err: err}
	}
	res, err := parseReply(flipScript.Exec(ctx, r.client, ks, args))
	if err != nil {
		perr := Fail(ctx, op, key, err)
		if IsServerReply(err) {
			return Flipped{}, perr
		}
		// The reply was lost: the flip may or may not have run.
		if ran, err := r.publisher.settle(ctx, perr, opts.Locks); !ran {
			return Flipped{}, err
		}
		return Flipped{}, nil
	}
	return r.flipped(opts, res)
}

// flipped reads the flip script's reply.
func (r Generations) flipped(opts FlipOptions, res reply) (Flipped, error) {
	op, key := opts.Op, opts.Key
	unexpected := func() (Flipped, error) {
		return Flipped{}, &Error{Op: op, Key: key, Err: fmt.Errorf("unexpected flip script reply %v", res)}
	}
	code, err := res.code()
	if err != nil {
		return Flipped{}, &Error{Op: op, Key: key, Err: fmt.Errorf("unexpected flip script reply: %w", err)}
	}
	if i, _ := res.int(1); code == codeLockLost && names(i, len(opts.Locks)) {
		l := opts.Locks[i-1]
		r.log.Warn("keyswap: rebuild lock lost before the flip; nothing published", "key", l.Live, "lock_key", l.Key)
		return Flipped{}, &Error{Op: op, Key: l.Live, Err: ErrLockLost}
	}
	if err := res.refusal(); err != nil {
		return Flipped{}, &Error{Op: op, Key: key, Err: refusal{err}}
	}
	if code != codeOK {
		if err := flipRefusals.decode(flipCall{opts, r.cluster}, code, res); err != nil {
			return Flipped{}, &Error{Op: op, Key: key, Err: refusal{err}}
		}
		return unexpected()
	}
	n := len(opts.Lives)
	all, err := res.ints(1)
	if err != nil || len(all) < n {
		return unexpected()
	}
	out := Flipped{Metas: all[:n]}
	rest := all[n:]
	for range n {
		if len(rest) == 0 || rest[0] < 0 || int(rest[0]) > len(rest)-1 {
			return unexpected()
		}
		out.Retired = append(out.Retired, rest[1:1+rest[0]])
		rest = rest[1+rest[0]:]
	}
	if len(rest) != 1 || rest[0] < 0 {
		return unexpected()
	}
	out.Replayed = rest[0]
	return out, nil
}

// flipCall is what a refusal of flip.lua is decoded against: the flip's
// options, and the key shapes that name its indexes' keys.
type flipCall struct {
	FlipOptions
	cluster keys.Names
}

// flipRefusals decodes the codes flip.lua refuses a flip with, before any
// write: all but LOCK_LOST. Those it shares with publish.lua (see
// withFence) are said of indexes left at their generation.
var flipRefusals = newFlipRefusals()

// newFlipRefusals returns flipRefusals.
func newFlipRefusals() refusals[flipCall] {
	return withTail(withFence(refusals[flipCall]{
		codeGenLost: {flipLives, func(f flipCall, _ reply, i int64) error {
			return fmt.Errorf("%w: %s no longer marks generation %d as this run's (overwritten, or lost in a failover); every index left at its generation", ErrGenerationLost, keys.RegistryKey(f.Lives[i-1], f.cluster), f.Gens[i-1])
		}},
		codeNotMeta: {flipLives, func(f flipCall, _ reply, i int64) error {
			return fmt.Errorf("%w: %s is not a hash of keyswap's; every index left at its generation", ErrTampered, keys.MetaKey(f.Lives[i-1], f.cluster))
		}},
		codeInGroup: {flipLives, func(f flipCall, res reply, i int64) error {
			return fmt.Errorf("%w; every index left at its generation", keys.GroupConflict(f.Lives[i-1], keys.PointerKey(f.Lives[i-1], f.cluster), res.str(2), f.cluster.Group))
		}},
		codeBadRegistry: {flipLives, func(f flipCall, res reply, i int64) error {
			return fmt.Errorf("%w: index %q: %s, a state no run leaves (written by hand?); every index left at its generation", ErrTampered, f.Lives[i-1], res.str(2))
		}},
	}, func(f flipCall) fence { return fence{f.Locks, f.Batches, f.Logs} }, "flip; every index left at its generation"),
		func(f flipCall) []LogOffset { return f.Logs }, "every index left at its generation")
}

// What the index of a refusal of flip.lua names.
func flipLives(f flipCall) int { return len(f.Lives) }

// GenRollback flips every index of opts back to its previous generation
// (genback.lua), fenced by the indexes' locks, which it takes first: while
// a run of them is in progress it fails with ErrInProgress. The generation
// rolled back becomes the previous one, so a second GenRollback rolls
// forward again. An index without a previous generation fails it with
// ErrNothingToRollBack, changing nothing, unless, in a group, it has no
// pointer of the group and another group claimed it: then it fails with
// keys.ErrGroupConflict naming that group (SPEC C102). It returns the
// generation now current of each index.
func (r Generations) GenRollback(ctx context.Context, opts RollbackOptions) ([]int64, error) {
	locks, err := r.publisher.rollbackLocks(ctx, opts)
	if err != nil {
		return nil, err
	}
	gens, err := r.genRollback(ctx, opts, locks)
	return gens, r.locks.ReleaseAfter(ctx, locks, err)
}

func (r Generations) genRollback(ctx context.Context, opts RollbackOptions, locks []*Lock) ([]int64, error) {
	op, key := opts.Op, opts.Key
	lockKeys, token, err := CheckLocks(op, locks)
	if err != nil {
		return nil, err
	}
	ks := slices.Clone(lockKeys)
	for _, l := range opts.Lives {
		ks = append(ks, keys.PointerKey(l, r.cluster), keys.RegistryKey(l, r.cluster), keys.MetaKey(l, r.cluster))
	}
	if err := r.SameSlot(op, key, ks...); err != nil {
		return nil, err
	}
	args := []string{token, strconv.Itoa(len(lockKeys)), strconv.Itoa(len(opts.Lives)), Now(opts.Now)}
	res, err := parseReply(genbackScript.Exec(ctx, r.client, ks, args))
	if err != nil {
		return nil, Fail(ctx, op, key, err)
	}
	code, err := res.code()
	i, _ := res.int(1)
	switch {
	case err != nil:
		return nil, &Error{Op: op, Key: key, Err: fmt.Errorf("unexpected genback script reply: %w", err)}
	case code == codeLockLost && i >= 1 && int(i) <= len(locks):
		return nil, &Error{Op: op, Key: locks[i-1].Live, Err: ErrLockLost}
	case code == codeNoPrevious && i >= 1 && int(i) <= len(opts.Lives):
		// In a group, an index without the group's pointer may be another
		// group's (SPEC C102): say so, rather than that it has nothing to
		// roll back.
		if err := r.otherClaims(ctx, op, opts.Lives[i-1:i], []string{"0"}); err != nil {
			return nil, err
		}
		return nil, &Error{Op: op, Key: opts.Lives[i-1], Err: fmt.Errorf("%w: the index has no previous generation (publish in Generations mode with KeepPrevious to keep one); nothing changed", ErrNothingToRollBack)}
	case code == codeNotMeta && i >= 1 && int(i) <= len(opts.Lives):
		return nil, &Error{Op: op, Key: opts.Lives[i-1], Err: fmt.Errorf("%w: %s is not a hash of keyswap's; nothing changed", ErrTampered, keys.MetaKey(opts.Lives[i-1], r.cluster))}
	case code == codeInGroup && i >= 1 && int(i) <= len(opts.Lives):
		return nil, r.inGroup(op, opts.Lives[i-1], res.str(2))
	case code == codeBadRegistry && i >= 1 && int(i) <= len(opts.Lives):
		return nil, &Error{Op: op, Key: opts.Lives[i-1], Err: fmt.Errorf("%w: %s: %s, a state no run leaves; nothing changed", ErrTampered, keys.RegistryKey(opts.Lives[i-1], r.cluster), res.str(2))}
	case code != codeOK || len(res) != 1+len(opts.Lives):
		return nil, &Error{Op: op, Key: key, Err: fmt.Errorf("unexpected genback script reply %v", res)}
	}
	return res.ints(1)
}

// Unlink deletes ks with UNLINK, at most [UnlinkChunk] keys per command,
// grouped by hash slot on a cluster, and returns the first error.
func (r *Core) Unlink(ctx context.Context, ks []string) error {
	groups := map[uint16][]string{}
	var order []uint16
	for _, k := range ks {
		s := uint16(0)
		if r.cluster.Cluster {
			s = keys.Slot(k)
		}
		if _, ok := groups[s]; !ok {
			order = append(order, s)
		}
		groups[s] = append(groups[s], k)
	}
	var cmds rueidis.Commands
	for _, s := range order {
		for chunk := range slices.Chunk(groups[s], UnlinkChunk) {
			// Idempotent, so rueidis may resend it on a fresh connection.
			cmds = append(cmds, r.client.B().Unlink().Key(chunk...).Build().ToRetryable())
		}
	}
	if len(cmds) == 0 {
		return nil
	}
	for _, res := range r.client.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			return err
		}
	}
	return nil
}

// GenApplyOptions configures [Changes.GenApply].
type GenApplyOptions struct {
	// Op and Key name the operation in errors.
	Op, Key string
	// Locks are the lock keys of the indexes the change writes, Lives
	// their live keys or families' prefixes, as Families says, and Ops the
	// ops on each one's keys, on their plain names.
	Locks    []string
	Lives    []string
	Families []bool
	Ops      [][]Op
	// MaxLog bounds each log of changes, as ApplyOptions.MaxLog does.
	MaxLog int
}

// genApplyTries is how many times GenApply resolves the pointers again
// when a flip moved one between its resolution and the change.
const genApplyTries = 3

// GenApply applies ops to the current generation of indexes published in
// Generations mode (genapply.lua): it resolves each index's pointer (a
// generation its registry marks current, else ErrTampered), writes
// the ops on that generation's keys (the plain keys for an index without a
// pointer), and checks in the same atomic step that the pointers did not
// move (else it resolves them again). While a run holds a lock, the same
// step logs the ops, on their plain names, for that run, as [Changes.Apply]
// does, or refuses the change as Apply does (an error matching
// [ErrInProgress], nothing written). On a cluster, without a group, the
// same step first checks the owner stamp of each index's base another
// live key can have (keys.Aliasable, SPEC C104): one naming another live
// key fails it with an error matching keys.ErrGroupConflict, one of
// another type with [ErrTampered], nothing written or logged. On a
// cluster, when an index has no hash tag (its generation's keys may leave
// the locks' slot), the change goes in three steps across slots instead:
// see genApplySpread.
func (r Changes) GenApply(ctx context.Context, opts GenApplyOptions) (Applied, error) {
	op, key := opts.Op, opts.Key
	fail := func(err error) (Applied, error) { return Applied{}, &Error{Op: op, Key: key, Err: err} }
	if opts.MaxLog < 1 {
		return fail(fmt.Errorf("log bound %d", opts.MaxLog))
	}
	c := pickChange(opts.Locks, opts.Lives, opts.Families, opts.Ops)
	n := len(c.locks)
	if n == 0 {
		return c.none(), nil
	}
	if err := c.check(); err != nil {
		return fail(err)
	}
	c.owners = r.aliasable(c.lives)
	if r.spreads(c.lives) {
		return r.genApplySpread(ctx, opts, c)
	}
	var waiter cutOverWaiter
	for try := 0; try < genApplyTries; {
		gens, err := r.resolvePointers(ctx, op, key, c.lives)
		if err != nil {
			return Applied{}, err
		}
		ks, args := r.genApplyCall(c, gens, opts.MaxLog)
		if dup := FirstDuplicate(ks); dup != "" {
			return fail(fmt.Errorf("key %q is both a live key and one of keyswap's own", dup))
		}
		if err := r.SameSlot(op, key, ks...); err != nil {
			return Applied{}, err
		}
		res, err := parseReply(genapplyScript.Exec(ctx, r.client, ks, args))
		if err != nil {
			return Applied{}, applyLost(ctx, op, key, err)
		}
		out, _, err := c.decode("genapply", res, 0)
		var co *cutOverError
		switch {
		case errors.Is(err, errMoved):
			try++ // a flip came in between: resolve again
			continue
		case errors.As(err, &co):
			// A run drains its log to flip: apply the change once it
			// is done (it does not count as a try).
			if err := waiter.wait(ctx, op, key, co); err != nil {
				return Applied{}, err
			}
			continue
		case err != nil:
			return fail(err)
		}
		return out, nil
	}
	return fail(fmt.Errorf("%w: the indexes' pointers moved %d times while the change was applied (flips in quick succession); nothing applied: apply it again", ErrInProgress, genApplyTries))
}

// resolvePointers reads the pointer of each index whose live key (or
// family prefix) is in lives: its generation, or "0" for an index without
// a pointer. A pointer that is not a generation is ErrTampered: readers
// refuse it too, and writing where it seems to point would write where
// nobody reads; one that holds a group's claim is keys.ErrGroupConflict
// (SPEC C102), naming the group to pass. In a group, an index without the
// group's pointer whose pointer without a group holds another group's
// claim is keys.ErrGroupConflict too (a second round trip, only then).
func (r Changes) resolvePointers(ctx context.Context, op, key string, lives []string) ([]string, error) {
	pointers := make(rueidis.Commands, len(lives))
	for i, l := range lives {
		pointers[i] = r.client.B().Get().Key(keys.PointerKey(l, r.cluster)).Build()
	}
	gens := make([]string, len(lives))
	for i, res := range r.client.DoMulti(ctx, pointers...) {
		g, err := res.ToString()
		if rueidis.IsRedisNil(err) {
			g, err = "0", nil
		}
		if err != nil {
			return nil, Fail(ctx, op, key, fmt.Errorf("GET %s: %w", keys.PointerKey(lives[i], r.cluster), err))
		}
		if group, ok := keys.ParseGroupMarker(g); ok {
			return nil, r.inGroup(op, lives[i], group)
		}
		if g != "0" && !isGeneration(g) {
			return nil, &Error{Op: op, Key: lives[i], Err: fmt.Errorf("%w: %s holds %.40q, not a generation; nothing written", ErrTampered, keys.PointerKey(lives[i], r.cluster), g)}
		}
		gens[i] = g
	}
	if err := r.otherClaims(ctx, op, lives, gens); err != nil {
		return nil, err
	}
	return gens, nil
}

// genApplyCall returns genapply.lua's keys and arguments for change c on
// the generations gens (as resolvePointers returns them): for each index
// its lock, record, log, pointer, registry, cut-over mark and manifest,
// the owner stamps of c.owners, then every key the ops write, once, in
// the generation's shape.
func (r Changes) genApplyCall(c change, gens []string, maxLog int) (ks, args []string) {
	n := len(c.locks)
	ks = make([]string, 7*n, 7*n+len(c.owners))
	listed := make([]string, n)
	for i, l := range c.locks {
		ks[i], ks[n+i], ks[2*n+i] = l, keys.RecordKey(l), keys.LogKey(l)
		ks[3*n+i], ks[4*n+i] = keys.PointerKey(c.lives[i], r.cluster), keys.RegistryKey(c.lives[i], r.cluster)
		ks[5*n+i] = keys.CutOverKey(l)
		g, _ := strconv.ParseInt(gens[i], 10, 64)
		ks[6*n+i], listed[i] = keys.ManifestKey(c.lives[i], r.cluster, g), "0"
		if c.families[i] && keys.SameSlot(c.lives[i], r.cluster) {
			// A family whose keys share its registry's slot has a
			// manifest (not one in a group on a cluster).
			listed[i] = "1"
		}
	}
	for _, l := range c.owners {
		ks = append(ks, keys.OwnerKey(l, r.cluster))
	}
	head := len(ks)
	index := map[string]int{}
	args = append([]string{strconv.Itoa(n), strconv.Itoa(maxLog), strconv.Itoa(c.count())}, gens...)
	args = append(args, listed...)
	args = append(args, strconv.Itoa(len(c.owners)))
	args = append(args, c.owners...)
	for i, ops := range c.lists {
		for _, o := range ops {
			k := o.Key
			if gens[i] != "0" {
				head, tail := genShape(c.lives[i], c.families[i], o.Key)
				k = head + gens[i] + tail
			}
			j, ok := index[k]
			if !ok {
				ks = append(ks, k)
				j = len(ks) - head
				index[k] = j
			}
			args = append(args, strconv.Itoa(i+1), strconv.Itoa(j), o.Key, o.Cmd, strconv.Itoa(len(o.Args)))
			args = append(args, o.Args...)
		}
	}
	return ks, args
}

// isGeneration reports whether s is a generation as the scripts write it:
// a positive decimal number with no leading zero, of at most 15 digits.
func isGeneration(s string) bool {
	if s == "" || len(s) > 15 || s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

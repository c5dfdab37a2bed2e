package protocol

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// Outcome is what a successful publish did to a live key.
type Outcome int8

const (
	// Swapped: the live key now holds exactly the temp key's contents.
	Swapped Outcome = iota + 1
	// Emptied: the rebuild produced nothing for the key, or it was a family
	// bucket the rebuild no longer produced, so the live key was deleted.
	Emptied
)

func (o Outcome) String() string {
	switch o {
	case Swapped:
		return "swapped"
	case Emptied:
		return "emptied"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Target is one live key of a publish and the temp key that replaces it.
type Target struct {
	// Temp is the rebuilt temp key.
	Temp string
	// Live is the live key Temp replaces.
	Live string
	// Populated records that the caller saw Temp hold data, so a missing
	// Temp at publish time is a loss and fails closed with ErrTempKeyLost.
	// False means a missing Temp is an empty result: Live is deleted.
	Populated bool
	// HasTTL records that every write gave Temp its TTL, as a Rebuilder's
	// batches do: a populated Temp without one was lost and re-created by a
	// later write, and fails closed with ErrTempKeyLost.
	HasTTL bool
}

// PublishOptions configures [Publisher.Publish].
type PublishOptions struct {
	// Op names the operation in errors ("publish", "swap").
	Op string
	// Key names the rebuild in errors and logs.
	Key string
	// Locks fences the publish: it happens only while every lock still holds
	// its token. The locks must share one token. Nil is an unfenced publish.
	Locks []*Lock
	// Records, with Locks, says that the locks are a Rebuilder's run's,
	// each with its record: every record must carry the run's token (else
	// the publish fails with ErrTampered, or ErrWritesLost for one gone),
	// the first must hold Batches batches (else ErrWritesLost), and an
	// operator's cancel in the requests next to the first lock fails it
	// with ErrAborted.
	Records bool
	// Batches is the number of batches the run wrote, with Records.
	Batches int64
	// Targets are the keys to publish.
	Targets []Target
	// Orphans are live keys to delete in the same atomic step, such as the
	// buckets of a rebuilt family that the rebuild no longer produces.
	Orphans []string
	// Drops are other keys to delete in the same step, such as the kept
	// previous values of an earlier publish.
	Drops []string
	// Metas are the keys of the builders' generations; each is advanced.
	// FamilyTypes, if not nil, gives for each a family's key type ("set"),
	// or "" for a plain key: the meta records it, for a rollback.
	Metas       []string
	FamilyTypes []string
	// KeepPrevious, when positive, keeps the old value of every target and
	// orphan in its prev key (keys.PrevKey) for this long, for a rollback,
	// instead of deleting it. A whole number of seconds.
	KeepPrevious time.Duration
	// PreserveFor is how long populated temp keys are kept after the
	// publish script itself fails. It must be a whole number of seconds.
	PreserveFor time.Duration
	// Settle, with Locks, finds out whether a publish whose reply was lost
	// ran (see [Publisher.Publish]). Finding out releases the locks.
	Settle bool
	// Now is the time recorded in the metas.
	Now time.Time
	// Logs are the logs of changes of the run's locks, one per lock, with
	// Records, each with the entries the run replayed onto its temp keys:
	// the publish replays the rest onto the live keys, right after the
	// renames, after checking each log against its count (ErrWritesLost,
	// ErrTampered) and each entry of the rest (ErrTampered for an entry
	// that is not a change of its builder's keys). MaxTail bounds the rest
	// in entries and MaxWork in work (ops and arguments), over every log:
	// a longer one fails with a *BehindError before any write.
	Logs    []LogOffset
	MaxTail int
	MaxWork int64
	// Indexes are the live keys (or families' prefixes) of the indexes
	// published, for the switch from Generations mode back: in the same
	// step, after the renames, each one's pointer (keys.PointerKey) is
	// deleted, so that readers read the plain keys just published, and
	// the current and previous generations in its registry
	// (keys.RegistryKey) become retired:<ms>, stamped with the server's
	// clock, for a sweep to remove once readers no longer read them. An
	// index without a pointer or a registry is left as it is.
	Indexes []string
	// Owners are live keys whose base's owner stamp (keys.OwnerKey, SPEC
	// C104) the publish checks before any write, as [StampCheck] does:
	// one naming another live key refuses it with an error matching
	// keys.ErrGroupConflict, one of another type with [ErrTampered]. Only
	// those whose base another live key can have (keys.Aliasable, on a
	// cluster, without a group) are checked: elsewhere the base is the
	// key's own.
	Owners []string
}

// Published is what a successful publish did.
type Published struct {
	// Outcomes has one Outcome per target, in order.
	Outcomes []Outcome
	// Generations has the new generation of each meta, in order; none when
	// the publish was settled after its reply was lost.
	Generations []int64
	// Replayed is the number of changes the publish replayed from the logs'
	// tails (unknown, zero, when it was settled after its reply was lost).
	Replayed int64
}

// Publish checks, in one script and before any write, that this user may
// run every command the publish needs on every key, that every lock is
// ours, that the run's record holds every batch, and that every populated
// temp key exists with its TTL; and only then, for each target, retires the
// live key (UNLINK, or RENAME to its prev key with KeepPrevious) and RENAMEs
// and PERSISTs the temp key over it (or leaves the live key deleted for an
// empty temp key), retires the orphans, deletes the drops, and advances the
// metas. Readers see every target old or every target new, never a mixture
// and never a missing key.
//
// It fails closed; on every failure the live keys are untouched.
//   - A lock that is not ours: every temp key is deleted (it is stale:
//     nothing to diagnose) and the error matches [ErrLockLost], naming that
//     lock's live key.
//   - A populated temp key that is gone or was re-created, or a record that
//     lost batches: nothing changes, and the error matches
//     [ErrTempKeyLost] or [ErrWritesLost].
//   - A right or command Redis would refuse: nothing changes, and the error
//     matches [ErrNoPermission] and names the command.
//   - The script itself fails (an error reply, a lost reply): the populated
//     temp keys are kept for PreserveFor, and the error is returned
//     wrapped. When its reply was lost (a dropped connection, a timeout, a
//     cancelled or closed client) and Settle is set, Publish finds out from
//     the receipt whether it ran (see [Publisher.settle]): if it did, it
//     returns success with no generations.
//
// On a cluster every key must share one hash slot, or Publish returns an
// error before sending anything. Publish is never retried: a retried RENAME
// would find its own temp key gone and report a loss that did not happen.
func (r Publisher) Publish(ctx context.Context, opts PublishOptions) (Published, error) {
	p, err := r.plan(opts)
	if err != nil {
		return Published{}, err
	}
	res, err := parseReply(publishScript.Exec(ctx, r.client, p.keys, p.args))
	if err == nil {
		return r.published(ctx, opts, res)
	}
	// OOM, a dropped connection, a timeout: the caller must see the error,
	// not a success. Keep what was built for a bounded diagnostic window
	// instead of leaking index-sized keys indefinitely.
	r.preserve(ctx, opts)
	perr := Fail(ctx, opts.Op, opts.Key, err)
	if IsServerReply(err) || !opts.Settle || len(opts.Locks) == 0 {
		return Published{}, perr
	}
	// The reply was lost: the script may or may not have run.
	if ran, err := r.settle(ctx, perr, opts.Locks); !ran {
		return Published{}, err
	}
	out := make([]Outcome, len(opts.Targets))
	for i, t := range opts.Targets {
		out[i] = Emptied
		if t.Populated {
			out[i] = Swapped
		}
	}
	return Published{Outcomes: out}, nil
}

// publishPlan is one call of the publish script.
type publishPlan struct {
	keys, args []string
}

// publishKeys are the publish script's KEYS, section by section, in the
// order the script reads them.
type publishKeys struct {
	locks, records, receipts, temps, lives, orphans, prevs, drops, metas, logs, ctls, pointers, stamps []string
}

// all returns every key, section after section.
func (k publishKeys) all() []string {
	var ks []string
	for _, section := range [][]string{k.locks, k.records, k.receipts, k.temps, k.lives, k.orphans, k.prevs, k.drops, k.metas, k.logs, k.ctls, k.pointers, k.stamps} {
		ks = append(ks, section...)
	}
	return ks
}

// counts returns the length of each section the script is told about: all
// but lives, which has as many keys as temps, and pointers and stamps,
// which the script counts by index.
func (k publishKeys) counts() []int {
	return []int{len(k.locks), len(k.records), len(k.receipts), len(k.temps), len(k.orphans), len(k.prevs), len(k.drops), len(k.metas), len(k.logs), len(k.ctls)}
}

// plan validates opts and lays out the publish script's keys and args.
func (r Publisher) plan(opts PublishOptions) (publishPlan, error) {
	op, key := opts.Op, opts.Key
	keep, err := keepSeconds(opts)
	if err != nil {
		return publishPlan{}, err
	}
	var k publishKeys
	var token, flags string
	if len(opts.Locks) > 0 {
		if k.locks, token, err = CheckLocks(op, opts.Locks); err != nil {
			return publishPlan{}, err
		}
	}
	if k.temps, k.lives, flags, err = targets(op, key, opts.Targets); err != nil {
		return publishPlan{}, err
	}
	k.orphans, k.drops, k.metas = opts.Orphans, opts.Drops, opts.Metas
	if err := noEmptyKey(op, key, k.orphans, k.drops, k.metas); err != nil {
		return publishPlan{}, err
	}
	if err := r.derivedKeys(&k, opts, keep); err != nil {
		return publishPlan{}, err
	}
	ks := k.all()
	if dup := FirstDuplicate(ks); dup != "" {
		return publishPlan{}, &Error{Op: op, Key: key, Err: fmt.Errorf("key %q appears twice in the publish", dup)}
	}
	if err := r.SameSlot(op, key, ks...); err != nil {
		return publishPlan{}, err
	}
	args := []string{token}
	for _, n := range k.counts() {
		args = append(args, strconv.Itoa(n))
	}
	args = append(args, flags, strconv.FormatInt(opts.Batches, 10), strconv.FormatInt(keep, 10),
		strconv.Itoa(int(receiptTTL/time.Second)), Now(opts.Now))
	if args, err = tailArgs(args, opts.Logs, opts.MaxTail, opts.MaxWork); err != nil {
		return publishPlan{}, &Error{Op: op, Key: key, Err: err}
	}
	for i := range opts.Metas {
		kind := ""
		if i < len(opts.FamilyTypes) {
			kind = opts.FamilyTypes[i]
		}
		args = append(args, kind)
	}
	args = append(args, strconv.Itoa(len(opts.Indexes)), strconv.Itoa(len(k.stamps)))
	args = append(args, r.owners(opts)...)
	return publishPlan{keys: ks, args: args}, nil
}

// keepSeconds validates opts' durations and returns KeepPrevious in
// seconds, 0 for none.
func keepSeconds(opts PublishOptions) (int64, error) {
	if _, err := Seconds(opts.Op, opts.Key, "PreserveFor", opts.PreserveFor); err != nil {
		return 0, err
	}
	if opts.KeepPrevious <= 0 {
		return 0, nil
	}
	return Seconds(opts.Op, opts.Key, "KeepPrevious", opts.KeepPrevious)
}

// noEmptyKey returns an error if any key of sections is "".
func noEmptyKey(op, key string, sections ...[]string) error {
	for _, section := range sections {
		for _, k := range section {
			if k == "" {
				return &Error{Op: op, Key: key, Err: errors.New("empty key")}
			}
		}
	}
	return nil
}

// derivedKeys fills in the keys k derives from the run and the options: the
// locks' records, receipt, control and logs, the prev keys that
// KeepPrevious (keep seconds) fills, and the indexes' pointers and
// registries. k.locks, k.lives and k.orphans must be set.
func (r Publisher) derivedKeys(k *publishKeys, opts PublishOptions, keep int64) error {
	op, key := opts.Op, opts.Key
	if len(k.locks) > 0 {
		k.receipts = []string{keys.ReceiptKey(k.locks[0])}
		if opts.Records {
			for _, l := range k.locks {
				k.records = append(k.records, keys.RecordKey(l))
			}
			k.ctls = []string{keys.CtlKey(k.locks[0])}
		}
	}
	if len(opts.Logs) > 0 && len(opts.Logs) != len(k.records) {
		return &Error{Op: op, Key: key, Err: fmt.Errorf("%d logs for %d locks with records", len(opts.Logs), len(k.records))}
	}
	if keep > 0 {
		for _, l := range append(slicesOf(k.lives), k.orphans...) {
			k.prevs = append(k.prevs, keys.PrevKey(l, r.cluster))
		}
	}
	k.logs = make([]string, len(opts.Logs))
	for i, l := range opts.Logs {
		k.logs[i] = l.Key
	}
	if err := noEmptyKey(op, key, opts.Indexes); err != nil {
		return err
	}
	for _, l := range opts.Indexes {
		k.pointers = append(k.pointers, keys.PointerKey(l, r.cluster), keys.RegistryKey(l, r.cluster))
	}
	for _, l := range r.owners(opts) {
		k.stamps = append(k.stamps, keys.OwnerKey(l, r.cluster))
	}
	return nil
}

// owners returns the live keys of opts.Owners whose base's owner stamp
// the publish checks: those another live key can share it with.
func (r Publisher) owners(opts PublishOptions) []string { return r.aliasable(opts.Owners) }

// slicesOf returns a copy of ss, so that appending to it cannot write into
// the caller's array.
func slicesOf(ss []string) []string { return append([]string(nil), ss...) }

// targets validates ts and returns their temp keys, live keys and populated
// flags.
func targets(op, key string, ts []Target) (temps, lives []string, flags string, err error) {
	var b strings.Builder
	for _, t := range ts {
		switch {
		case t.Live == "":
			return nil, nil, "", &Error{Op: op, Key: key, Err: errors.New("empty key")}
		case t.Temp == "":
			return nil, nil, "", &Error{Op: op, Key: t.Live, Err: errors.New("empty temp key")}
		case t.Temp == t.Live:
			return nil, nil, "", &Error{Op: op, Key: t.Live, Err: errors.New("temp key is the live key")}
		}
		temps, lives = append(temps, t.Temp), append(lives, t.Live)
		switch {
		case t.Populated && t.HasTTL:
			b.WriteByte('2')
		case t.Populated:
			b.WriteByte('1')
		default:
			b.WriteByte('0')
		}
	}
	return temps, lives, b.String(), nil
}

// refusal marks the error of a publish that its script refused before any
// write: every reply but {1, ...}.
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }
func (r refusal) Unwrap() error { return r.err }

// PublishRefused reports whether err is the error of a publish whose
// script ran and refused it before any write, so that the caller may
// delete the temp keys at once: not a script that failed, nor one whose
// reply was lost or not understood, whose temp keys [Publisher.Publish] keeps
// for PreserveFor.
func PublishRefused(err error) bool {
	var r refusal
	return errors.As(err, &r)
}

// published reads the publish script's reply.
func (r Publisher) published(ctx context.Context, opts PublishOptions, res reply) (Published, error) {
	op, key := opts.Op, opts.Key
	fail := func(err error) (Published, error) { return Published{}, &Error{Op: op, Key: key, Err: err} }
	refuse := func(err error) (Published, error) { return fail(refusal{err}) }
	if err := res.refusal(); err != nil {
		return refuse(err)
	}
	code, err := res.code()
	if err != nil {
		return fail(fmt.Errorf("unexpected publish script reply: %w", err))
	}
	if i, _ := res.int(1); code == codeLockLost && names(i, len(opts.Locks)) {
		// A successor owns the lock, so our snapshot is the stale one.
		// Drop it rather than preserve it: there is nothing to diagnose.
		l := opts.Locks[i-1]
		r.log.Warn("keyswap: rebuild lock lost before the publish; nothing published", "key", l.Live, "lock_key", l.Key)
		temps, _, _, _ := targets(op, key, opts.Targets)
		r.Discard(ctx, key, temps...)
		return Published{}, &Error{Op: op, Key: l.Live, Err: ErrLockLost}
	}
	if owners := r.owners(opts); code == codeOwned {
		if i, _ := res.int(1); names(i, len(owners)) {
			l := owners[i-1]
			return Published{}, &Error{Op: op, Key: l, Err: refusal{ownerError(l, keys.OwnerKey(l, r.cluster), res)}}
		}
	}
	if err := publishRefusals.decode(opts, code, res); err != nil {
		return refuse(err)
	}
	if code != codeOK || len(res) != 2+len(opts.Targets)+len(opts.Metas) {
		return fail(fmt.Errorf("unexpected publish script reply %v", res))
	}
	nums, err := res.ints(1)
	if err != nil {
		return fail(err)
	}
	nt := len(opts.Targets)
	p := Published{Outcomes: make([]Outcome, nt), Generations: nums[nt : len(nums)-1], Replayed: nums[len(nums)-1]}
	for i, c := range nums[:nt] {
		switch c {
		case codeRenamed:
			p.Outcomes[i] = Swapped
		case codeEmptied:
			p.Outcomes[i] = Emptied
		default:
			return fail(fmt.Errorf("unexpected publish outcome %d for %s", c, opts.Targets[i].Temp))
		}
	}
	return p, nil
}

// publishRefusals decodes the codes publish.lua refuses a publish with,
// before any write: all but LOCK_LOST, whose temp keys [Publisher.Publish]
// discards, and the rights [reply.refusal] decodes.
var publishRefusals = newPublishRefusals()

// newPublishRefusals returns publishRefusals.
func newPublishRefusals() refusals[PublishOptions] {
	return withTail(withFence(refusals[PublishOptions]{
		codeTempLost: {publishTargets, func(o PublishOptions, _ reply, i int64) error {
			// Populated at a renewal, gone inside the script: evicted, expired
			// or swept mid-publish. The live keys are stale but intact;
			// reporting success would be the fail-open bug.
			t := o.Targets[i-1]
			return fmt.Errorf("%w: %s vanished during the %s; %s and every other live key left unchanged", ErrTempKeyLost, t.Temp, o.Op, t.Live)
		}},
		codeRecreated: {publishTargets, func(o PublishOptions, _ reply, i int64) error {
			t := o.Targets[i-1]
			return fmt.Errorf("%w: %s has no TTL: it was lost and re-created by a later write, so it holds only part of the rebuild (or a write removed its TTL, as a plain SET does: use SET KEEPTTL); %s and every other live key left unchanged", ErrTempKeyLost, t.Temp, t.Live)
		}},
		codeInGroup: {func(o PublishOptions) int { return len(o.Indexes) }, func(o PublishOptions, res reply, i int64) error {
			g := res.str(2)
			return fmt.Errorf("%w: index %s is in group %q (its pointer without a group holds %q): a run without the group may not publish it in the rename-in-place shape, as deleting the claim would let a later run without the group allocate generations named like the group's, and remove them; publish it in Generations mode with Group %q, or remove the group's generations and the claim first; %s",
				keys.ErrGroupConflict, o.Indexes[i-1], g, keys.GroupMarker(g), g, liveUnchanged)
		}},
		codeNotMeta: {func(o PublishOptions) int { return len(o.Metas) }, func(o PublishOptions, _ reply, i int64) error {
			return fmt.Errorf("%q, where keyswap keeps the generation of an index, is a key of another kind or content; rename it (keyswap keeps \"<key>:rebuild-gen\" next to every index it publishes)", o.Metas[i-1])
		}},
	}, func(o PublishOptions) fence { return fence{o.Locks, o.Batches, o.Logs} }, "publish; "+liveUnchanged),
		func(o PublishOptions) []LogOffset { return o.Logs }, liveUnchanged)
}

// tailArgs appends to args what lib/tail.lua reads of logs, five per log
// (the entries the run replayed, the highest count it saw, their work, the
// builder's key, '1' for a family), then the bounds of the tail.
func tailArgs(args []string, logs []LogOffset, maxTail int, maxWork int64) ([]string, error) {
	for _, l := range logs {
		if l.Offset < 0 || l.Logged < l.Offset || l.Work < 0 || l.Owner == "" {
			return nil, fmt.Errorf("log %q: offset %d, %d logged, work %d, builder %q", l.Key, l.Offset, l.Logged, l.Work, l.Owner)
		}
		family := "0"
		if l.Family {
			family = "1"
		}
		args = append(args, strconv.FormatInt(l.Offset, 10), strconv.FormatInt(l.Logged, 10), strconv.FormatInt(l.Work, 10), l.Owner, family)
	}
	return append(args, strconv.Itoa(max(maxTail, 0)), strconv.FormatInt(max(maxWork, 0), 10)), nil
}

// withTail adds to t the codes of lib/tail.lua, the tail of the logs of
// changes that publish.lua and flip.lua replay: BEHIND (a *BehindError),
// OVERRUN, BAD_LOG, NOT_THE_RUNS and WRONG_TYPE, decoded against the logs
// of(o). left says what a refusal left unchanged.
func withTail[O any](t refusals[O], of func(o O) []LogOffset, left string) refusals[O] {
	logs := func(o O) int { return len(of(o)) }
	t[codeBehind] = refused[O]{logs, func(o O, res reply, i int64) error {
		n, _ := res.int(2)
		w, _ := res.int(3)
		return &BehindError{Log: of(o)[i-1].Key, Tail: n, Work: w}
	}}
	t[codeOverrun] = refused[O]{logs, func(o O, _ reply, i int64) error {
		return fmt.Errorf("%w: %s reached its bound, so changes applied during the run were not logged; %s (and holds every change)", ErrFallingBehind, of(o)[i-1].Key, left)
	}}
	t[codeBadLog] = refused[O]{logs, func(o O, res reply, i int64) error {
		e, _ := res.int(2)
		return badEntry(of(o)[i-1].Key, e, errors.New(res.str(3)), left)
	}}
	t[codeNotTheRuns] = refused[O]{logs, func(o O, res reply, i int64) error {
		e, _ := res.int(2)
		return foreignEntry(of(o)[i-1], e, res.str(3), left)
	}}
	t[codeWrongType] = refused[O]{nil, func(_ O, res reply, _ int64) error {
		return fmt.Errorf("a change applied during the run cannot be replayed: %q holds a %s; %s", res.str(1), res.str(2), left)
	}}
	return t
}

// What the index of a refusal of publish.lua names.
func publishTargets(o PublishOptions) int { return len(o.Targets) }

// logFailure is the error of a {LOG_LOST, i, len, logged} or {UNCOUNTED,
// i, len, logged} reply about log l.
func logFailure(l LogOffset, res reply) error {
	n, _ := res.int(2)
	logged, _ := res.int(3)
	return NewLogs([]string{l.Key}).Check(0, LogCount{Len: n, Logged: logged, Seen: l.Logged})
}

// receiptTTL is how long the receipt of a fenced publish lives: long
// enough for settle, which runs right after the publish failed.
const receiptTTL = 30 * time.Second

// settle settles the outcome of a publish fenced on locks whose reply was
// lost (perr): the script may or may not have run. A fenced publish script
// leaves a receipt, in the same atomic step as the publish: our token under
// "<lock key>:done". settle releases the locks and reads the receipt in one
// script, so that a publish script still on its way on a broken connection
// fails its fence if it runs at all: what the receipt says is final. Our
// receipt means the publish happened, and settle returns (true, nil); no
// receipt means it did not, and settle returns (false, perr). A receipt
// that was lost (evicted) errs on the safe side: a publish that happened is
// reported as failed, never the reverse.
//
// The release marks the receipt as read rather than deleting it, so that
// rueidis retrying the release after its own reply was lost still finds
// it. When Redis cannot be reached to settle it (the client is closed, the
// server is gone), the error matches both [ErrOutcomeUnknown] and perr.
// settle runs on a [CleanupContext].
func (r Publisher) settle(ctx context.Context, perr error, locks []*Lock) (published bool, err error) {
	ctx, cancel := CleanupContext(ctx)
	defer cancel()
	// One script releases the locks and reads the receipt: from then on no
	// publish fenced on them can happen, and the receipt says whether one
	// did. (Another rebuild's lock found instead of ours: ours expired, and
	// its publish, if any, is over too.)
	receipt, err := r.locks.release(ctx, locks, true)
	if err != nil && !errors.Is(err, ErrLockLost) {
		return false, &Error{Op: "publish", Key: locks[0].Live, Err: fmt.Errorf("%w: releasing the locks: %w; publish failed: %w", ErrOutcomeUnknown, err, perr)}
	}
	if !receipt {
		return false, perr
	}
	r.log.Warn("keyswap: the publish reply was lost, but the publish happened", "key", locks[0].Live, "err", perr)
	return true, nil
}

// preserve bounds the populated temp keys of a failed publish (Familia's
// preserve_temp_key), best effort.
func (r Publisher) preserve(ctx context.Context, opts PublishOptions) {
	ctx, cancel := CleanupContext(ctx)
	defer cancel()
	secs := int64(opts.PreserveFor / time.Second)
	var cmds rueidis.Commands
	var temps []string
	for _, t := range opts.Targets {
		if t.Populated {
			// Idempotent, so rueidis may retry it on a fresh connection.
			cmds = append(cmds, r.client.B().Expire().Key(t.Temp).Seconds(secs).Build().ToRetryable())
			temps = append(temps, t.Temp)
		}
	}
	if len(cmds) == 0 {
		return
	}
	for i, res := range r.client.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			r.log.Warn("keyswap: could not bound temp key after a failed publish", "key", opts.Key, "temp_key", temps[i], "err", err)
			return
		}
	}
	r.log.Warn("keyswap: temp keys preserved after a failed publish", "key", opts.Key, "temp_keys", len(temps), "preserve_for", opts.PreserveFor)
}

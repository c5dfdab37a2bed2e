package gens

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/redis/rueidis"
)

const (
	// DefaultGrace is the grace period of [Options]: how long a retired
	// generation stays readable. It must exceed the TTL of the readers'
	// cache of the pointer.
	DefaultGrace = 10 * time.Second
	// DefaultScanCount is the SCAN COUNT hint of [Options]: small enough
	// that one SCAN holds the server well under 5 ms on a database of a
	// million keys (COUNT 1000 took 3 to 31 ms there; the work is linear in
	// COUNT), large enough that a sweep needs few round trips.
	DefaultScanCount = 100
	// MaxUnlink is the most keys one command of the sweep deletes. UNLINK
	// frees in the foreground a value of at most 64 elements (lazyfree's
	// threshold), so a chunk costs up to 64 frees a key: 1,000 sets of 64
	// members of 75 bytes took one UNLINK 13.6 ms on Redis 7.0, 256 keys
	// stay near 3.5 ms. Larger chunks save little: removing 100,000 sets
	// of 10 members cost the server 0.140 µs of CPU per member in chunks
	// of 256, 0.122 in chunks of 1,024 and 0.117 in chunks of 4,096,
	// against 0.093 for pipelined UNLINKs of 1,000 keys without checks
	// (medians of 5 rounds on Redis 7.0): a chunk's round trip and the
	// commands around it (WATCH, its checks, MULTI, EXEC) cost about
	// 60 µs, and each key UNLINK deletes under WATCH about 0.1 µs more.
	MaxUnlink = 256
	// maxPasses bounds the SCAN passes over a generation: a pass that
	// deleted keys is followed by one that checks that none remains.
	maxPasses = 3
)

// Options configures [Sweep] and [DropPlain]. The zero value is usable.
type Options struct {
	// Grace is how long a retired generation is kept after its retirement.
	// Zero means DefaultGrace; negative is an error.
	Grace time.Duration
	// Now is the time the grace is measured from. Zero means the server's
	// clock (TIME, read with the registry): runs stamp retirements with
	// it, so a client's clock running ahead cannot cut the grace short.
	Now time.Time
	// ScanCount is the SCAN COUNT hint; zero means DefaultScanCount.
	ScanCount int64
	// Unlink is the most keys per deleting command, from 1 to MaxUnlink;
	// zero means MaxUnlink.
	Unlink int
	// Pace, if not nil, is called before each deleting command with the
	// number of keys it is about to delete, and may wait: a
	// rate.Limiter's WaitN paces deletions to a rate of keys per second
	// (its burst must be at least Unlink). An error stops the sweep.
	Pace func(ctx context.Context, keys int) error
	// Progress, if not nil, is called after each deleting command.
	Progress func(Progress)
	// Logger receives a line per generation removed or skipped (Info) and
	// per SCAN pass or manifest read (Debug). Nil discards them.
	Logger *slog.Logger
	// Buckets, for a family, names buckets (the part of a bucket's key
	// after "<prefix>:") that the generations removed probably hold, in
	// the order to delete them: a run passes those it wrote, in the order
	// it wrote them, when it removes the generation it flipped away from,
	// which mostly holds the same buckets. Each generation removed loses
	// those buckets first, by name, in chunks of at most Unlink keys
	// (grouped by hash slot on a cluster), each checked against the
	// generation's state as a SCAN's chunk is; then the SCAN passes
	// delete the rest. A name costs a lookup whether or not the
	// generation holds it. It deletes only the generation's keys of those
	// names, so it never widens what the sweep deletes; it saves the SCAN
	// the work of returning most keys, and deletes them in the order they
	// were written, which frees memory faster than the SCAN's order.
	// Ignored for a plain index, and for a generation whose manifest the
	// sweep reads (see the package documentation, "The manifest"), which
	// names exactly its keys in the order its run wrote them.
	Buckets []string
}

// Progress is a sweep's progress, after a deleting command.
type Progress struct {
	// Gen is the generation being removed (0 for DropPlain).
	Gen int64
	// Keys is the keys of Gen deleted so far, Total those of the whole
	// call.
	Keys, Total int64
}

// Reason says why the sweep kept a generation.
type Reason string

// The reasons the sweep keeps a generation.
const (
	SkipCurrent  Reason = "current: readers read it"
	SkipPrevious Reason = "previous: kept for a rollback"
	SkipGrace    Reason = "retired less than the grace period ago"
	SkipRunning  Reason = "building: the run that holds the lock builds it"
	SkipChanged  Reason = "its state changed during the sweep"
	SkipGone     Reason = "its registry field was removed during the sweep, by another sweep or its run"
	SkipWritten  Reason = "keys of it kept appearing"
	SkipPointer  Reason = "the pointer names it: readers read it"
	// SkipClaimed keeps the keys of RemoveOwn's generation whose field is
	// gone while the pointer holds a group's claim (SPEC C102): the group
	// allocates above the registry's next, but if the registry was lost
	// too it may have allocated the same number, and the keys may be its
	// own.
	SkipClaimed Reason = "its field is gone and the pointer holds a group's claim: the keys may be the group's"
)

// Removed is a generation the sweep removed: its keys and its field.
type Removed struct {
	Gen   int64
	State State
	// Keys is the number of its keys deleted.
	Keys int64
}

// Skipped is a generation the sweep kept, and why.
type Skipped struct {
	Gen    int64
	State  State
	Reason Reason
	// Keys is the number of its keys deleted before the sweep stopped
	// (for SkipChanged, SkipGone and SkipWritten).
	Keys int64
}

// Result is what [Sweep] did.
type Result struct {
	Removed []Removed
	Skipped []Skipped
	// Keys is the number of keys deleted, over every generation.
	Keys int64
	// Now is the time the grace was measured at: the server's clock when
	// the sweep read the registry, unless Options.Now was given.
	Now time.Time
}

// withDefaults returns opts with its defaults, or an error naming the option.
func (opts Options) withDefaults() (Options, error) {
	switch {
	case opts.Grace < 0:
		return opts, fmt.Errorf("option Grace %v: must not be negative", opts.Grace)
	case opts.ScanCount < 0:
		return opts, fmt.Errorf("option ScanCount %d: must not be negative", opts.ScanCount)
	case opts.Unlink < 0 || opts.Unlink > MaxUnlink:
		return opts, fmt.Errorf("option Unlink %d: must be from 1 to %d (0: %d)", opts.Unlink, MaxUnlink, MaxUnlink)
	}
	if opts.Grace == 0 {
		opts.Grace = DefaultGrace
	}
	if opts.ScanCount == 0 {
		opts.ScanCount = DefaultScanCount
	}
	if opts.Unlink == 0 {
		opts.Unlink = MaxUnlink
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return opts, nil
}

// unlinkScript deletes keys of a generation, and then its registry field
// and its manifest when asked, only while the generation is in the state
// the sweep read, while the index's pointer does not name it and, for a
// building generation, while the lock does not hold its run's token. Every
// key must be in the registry's slot.
//
// KEYS[1] registry, KEYS[2] lock, KEYS[3] pointer, KEYS[4] and KEYS[5]
// the generation's manifest (keys.ManifestKey) and its list
// (keys.ManifestListKey), KEYS[6..] keys of the generation (maybe none)
// ARGV[1] generation, ARGV[2] its state as read, ARGV[3] its run's token
// (empty unless building), ARGV[4] '1' to remove the field and the
// manifest after the keys, ARGV[5] '1' when the caller built the
// generation (RemoveOwn): an absent field then means that a sweep removed
// it, and the keys are still the caller's to delete, unless the pointer
// holds a group's claim (SPEC C102); ARGV[6], with ARGV[4] '1' after a
// removal by the manifest, the length of its list when the removal began
// (empty otherwise)
// Returns the number of keys deleted; -1 the state changed, -2 the field is
// gone, -3 the lock holds the token, -4 the pointer names the generation (a
// flip ran whose reply its run lost, or a registry that lost its state),
// -5 the manifest changed while the removal read it (its list's length, or
// its set lost the mark: evicted, deleted, popped), -6 the caller's field
// is gone and the pointer holds a group's claim (a group may have
// allocated the generation's number since): then nothing changed.
var unlinkScript = newScript(`
local state = redis.call('HGET', KEYS[1], ARGV[1])
if not state then
  if ARGV[5] ~= '1' then return -2 end
  local p = redis.pcall('GET', KEYS[3])
  if type(p) == 'string' and string.sub(p, 1, 6) == 'group:' then return -6 end
elseif state ~= ARGV[2] then
  return -1
end
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then return -3 end
-- pcall: a pointer of another type names no generation.
if redis.pcall('GET', KEYS[3]) == ARGV[1] then return -4 end
local n = 0
if ARGV[4] == '1' and ARGV[6] and ARGV[6] ~= '' then
  local ok, len = pcall(redis.call, 'LLEN', KEYS[5])
  local ok2, mark = pcall(redis.call, 'SISMEMBER', KEYS[4], 'rebuild-listed')
  if not ok or not ok2 or len ~= tonumber(ARGV[6]) or mark ~= 1 then return -5 end
end
if #KEYS > 5 then n = redis.call('UNLINK', unpack(KEYS, 6)) end
if ARGV[4] == '1' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('UNLINK', KEYS[4], KEYS[5])
end
return n
`, false)

// disowned is the state RemoveOwn gives a failed run's generation before it
// removes its keys: retired at the epoch, past any grace, so that a sweep
// finishes what RemoveOwn could not.
const disowned = keys.RegRetired + "0"

// disownScript turns a run's own generation from building into retired,
// in one step that checks the field and the pointer. KEYS[1] the registry,
// KEYS[2] the pointer; ARGV[1] the generation, ARGV[2] its building state,
// ARGV[3] the retired state. Returns 1 done; 0 the field holds another
// state or is gone (nothing changed); -4 the pointer names the generation
// (nothing changed).
var disownScript = newScript(`
if redis.pcall('GET', KEYS[2]) == ARGV[1] then return -4 end
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
`, false)

// The unlink script's refusals, as reasons.
var refusals = map[int64]Reason{-1: SkipChanged, -2: SkipGone, -3: SkipRunning, -4: SkipPointer, -6: SkipClaimed}

// Sweep removes idx's generations that no reader reads and no run builds:
// those retired more than opts.Grace before opts.Now, and those building
// whose lock does not hold their run's token. It never removes the current
// or the previous generation, nor a key that is not a data key of a
// generation it removes. See the package documentation for the rules.
//
// A corrupt registry or pointer fails the sweep with a [*CorruptError]
// before anything is deleted. On any other error (a cancelled ctx, a lost
// connection) the sweep stops with what it did so far: a generation whose
// keys were partly deleted keeps its registry field, and the next sweep
// finishes it.
func Sweep(ctx context.Context, client rueidis.Client, idx Index, opts Options) (Result, error) {
	const op = "sweep"
	var res Result
	o, snap, err := begin(ctx, client, idx, opts, op)
	if err != nil {
		return res, err
	}
	res.Now = o.Now
	s := &sweeper{client: client, idx: idx, opts: o, snap: snap, res: &res, cluster: isCluster(client), listLen: -1}
	for _, g := range snap.Registry.Sorted() {
		st := snap.Registry.Gens[g]
		if reason := s.keep(st); reason != "" {
			s.skip(g, st, reason, 0)
			continue
		}
		n, reason, err := s.remove(ctx, g, st)
		if err != nil {
			return res, protocol.Fail(ctx, op, idx.Live, fmt.Errorf("generation %d (%s): %w", g, st, err))
		}
		if reason != "" {
			s.skip(g, st, reason, n)
			continue
		}
		s.removed(g, st, n)
	}
	return res, nil
}

// begin checks opts and idx, fills in opts' defaults, reads idx's
// registry, pointer and lock, and sets opts.Now to the server's clock
// unless given: the start of a Sweep or a DryRun, whose errors name op.
func begin(ctx context.Context, client rueidis.Client, idx Index, opts Options, op string) (Options, Snapshot, error) {
	o, err := opts.withDefaults()
	if err == nil {
		err = idx.check()
	}
	if err != nil {
		return o, Snapshot{}, &protocol.Error{Op: op, Key: idx.Live, Err: err}
	}
	// On a cluster the registry of a base another index owns (SPEC C104)
	// is that index's: its generations' keys hang off that index's key,
	// and removing them as idx's would find none and drop their fields.
	if err := owned(ctx, client, idx); err != nil {
		return o, Snapshot{}, protocol.Fail(ctx, op, idx.Live, err)
	}
	snap, err := Read(ctx, client, idx)
	if err != nil {
		return o, Snapshot{}, protocol.Fail(ctx, op, idx.Live, err)
	}
	if o.Now.IsZero() {
		o.Now = snap.Time
	}
	return o, snap, nil
}

// RemoveOwn removes generation gen of idx, which the run holding idx's lock
// with token built and did not publish (its run failed). First, in one step
// that checks the field still holds "building:<token>" and the pointer does
// not name gen, it marks gen retired at the epoch, so that a flip of the
// run still on its way finds the generation no longer the run's and
// refuses, and a sweep finishes what RemoveOwn cannot; then it removes its
// keys in chunks, as [Sweep] does, and its registry field. Unlike Sweep it does not wait for the lock to
// be released: the caller is that run. A field in any other state is left
// alone and named in the result's Skipped (SkipChanged). An absent field
// does not stop it: the generation was allocated to the caller, so its
// keys are the caller's, and a sweep that removed the field while the run
// had lost its lock and still wrote may have left some; unless the pointer
// holds a group's claim (SPEC C102), set since the field went: a group's
// generation with the same number may then be there (the group allocates
// above the registry's next, which its runs raise, but not if the
// registry was lost in between), and the keys stay (SkipClaimed). An error leaves the field, for a later sweep once the lock
// is gone.
//
// It never removes a generation the index's pointer names, checked in the
// same step as each deletion (SkipPointer): a run whose flip reply was lost
// does not know whether the flip ran, and may call RemoveOwn either way.
func RemoveOwn(ctx context.Context, client rueidis.Client, idx Index, gen int64, token string, opts Options) (Result, error) {
	const op = "remove generation"
	var res Result
	o, err := opts.withDefaults()
	if err == nil {
		err = idx.check()
	}
	if err == nil && (gen < 1 || token == "") {
		err = fmt.Errorf("generation %d, token %q: want a generation from 1 and a token", gen, token)
	}
	if err != nil {
		return res, &protocol.Error{Op: op, Key: idx.Live, Err: err}
	}
	cluster := idx.names(client)
	st := State{Kind: Building, Token: token, Raw: keys.RegBuilding + token}
	s := &sweeper{client: client, idx: idx, opts: o, res: &res, cluster: cluster.Cluster, own: true, listLen: -1, snap: Snapshot{
		Registry:   Registry{Key: keys.RegistryKey(idx.Live, cluster)},
		LockKey:    keys.LockKey(idx.Live, cluster),
		PointerKey: keys.PointerKey(idx.Live, cluster),
	}}
	// First the generation stops being the run's: a flip of the run still
	// on its way to the server (its reply lost, the locks not released)
	// then finds it no longer building and refuses, rather than publishing
	// a generation half removed.
	g := strconv.FormatInt(gen, 10)
	switch d, err := disownScript.Exec(ctx, client, []string{s.snap.Registry.Key, s.snap.PointerKey}, []string{g, st.Raw, disowned}).AsInt64(); {
	case err != nil:
		return res, protocol.Fail(ctx, op, idx.Live, fmt.Errorf("generation %d (%s): %w", gen, st, err))
	case d == 1:
		st = State{Kind: Retired, RetiredAt: time.UnixMilli(0), Raw: disowned}
	case d == -4:
		s.skip(gen, st, SkipPointer, 0)
		return res, nil
	}
	n, reason, err := s.remove(ctx, gen, st)
	if err != nil {
		return res, protocol.Fail(ctx, op, idx.Live, fmt.Errorf("generation %d (%s): %w", gen, st, err))
	}
	if reason != "" {
		s.skip(gen, st, reason, n)
		return res, nil
	}
	s.removed(gen, st, n)
	return res, nil
}

// sweeper is one call of Sweep or RemoveOwn.
type sweeper struct {
	client  rueidis.Client
	idx     Index
	opts    Options
	snap    Snapshot
	res     *Result
	cluster bool
	// own is set for RemoveOwn: the lock holds the generation's token.
	own bool
	// dc is the connection of the removal of a family's generation whose
	// keys share the registry's slot (see watchedUnlink), nil otherwise.
	dc rueidis.DedicatedClient
	// armed is the WATCH watchedUnlink sent for its next chunk on dc, nil
	// when none is.
	armed *armedWatch
	// watched is set once watchedUnlink sent a WATCH on dc: disarm then
	// ends it, whatever came of its replies.
	watched bool
	// listLen is the length of the manifest's list byManifest read, which
	// the last step checks; -1 when not reading a manifest.
	listLen int64
}

// manifestMoved is what script reports when the manifest the removal read
// changed before its last step (-5): the removal then SCANs the
// generation, so that no key the manifest no longer names outlives the
// registry field that finds it.
const manifestMoved Reason = "manifest changed while read"

// names returns how the index's control keys are named.
func (s *sweeper) names() keys.Names { return keys.Names{Cluster: s.cluster, Group: s.idx.Group} }

// keep returns why the generation in state st is kept, or "" when it is
// to be removed.
func (s *sweeper) keep(st State) Reason { return keep(s.opts, s.snap, st) }

// keep returns why a sweep with opts (its defaults filled in, Now set)
// keeps the generation in state st of snap, or "" when it removes it: the
// rule of [Sweep], which [DryRun] applies too.
func keep(opts Options, snap Snapshot, st State) Reason {
	switch st.Kind {
	case Current:
		return SkipCurrent
	case Previous:
		return SkipPrevious
	case Retired:
		if opts.Now.Sub(st.RetiredAt) <= opts.Grace {
			return SkipGrace
		}
	case Building:
		if snap.Lock == st.Token {
			return SkipRunning
		}
	}
	return ""
}

// removed records a generation removed, with its n keys.
func (s *sweeper) removed(g int64, st State, n int64) {
	s.res.Removed = append(s.res.Removed, Removed{Gen: g, State: st, Keys: n})
	s.opts.Logger.Info("keyswap: generation removed", "index", s.idx.Live, "generation", g, "state", st.Raw, "keys", n)
}

// skip records a generation kept.
func (s *sweeper) skip(g int64, st State, reason Reason, n int64) {
	s.res.Skipped = append(s.res.Skipped, Skipped{Gen: g, State: st, Reason: reason, Keys: n})
	s.opts.Logger.Info("keyswap: generation kept", "index", s.idx.Live, "generation", g, "state", st.Raw, "reason", string(reason), "keys", n)
}

// script runs the unlink script on data (keys of generation g, all in the
// registry's slot), removing g's field and manifest after them when last.
// It returns the keys deleted, or why nothing was.
func (s *sweeper) script(ctx context.Context, g int64, st State, data []string, last bool) (int64, Reason, error) {
	ks := append([]string{s.snap.Registry.Key, s.snap.LockKey, s.snap.PointerKey,
		keys.ManifestKey(s.idx.Live, s.names(), g), keys.ManifestListKey(s.idx.Live, s.names(), g)}, data...)
	flag := "0"
	if last {
		flag = "1"
	}
	fence, own := s.fence(st)
	read := ""
	if last && s.listLen >= 0 {
		read = strconv.FormatInt(s.listLen, 10)
	}
	n, err := unlinkScript.Exec(ctx, s.client, ks, []string{strconv.FormatInt(g, 10), st.Raw, fence, flag, own, read}).AsInt64()
	if err != nil {
		return 0, "", err
	}
	if n == -5 {
		return 0, manifestMoved, nil
	}
	if n < 0 {
		if reason, ok := refusals[n]; ok {
			return 0, reason, nil
		}
		return 0, "", fmt.Errorf("unexpected unlink script reply %d", n)
	}
	return n, "", nil
}

// fence returns the token of st's run that the lock must not hold for its
// keys to go ("" for none), and "1" when the sweeper removes its own
// generation (RemoveOwn), else "0".
func (s *sweeper) fence(st State) (token, own string) {
	if s.own {
		return "", "1" // the run removes its own generation, under its lock
	}
	return st.Token, "0"
}

// sameSlot reports whether the index's data keys share the registry's
// slot. They hang off the live key or prefix, the registry off its base:
// they share a slot on a standalone server, or when the live key carries a
// hash tag (its own base). Each chunk is then deleted in a step that
// checks the state. Otherwise they are in other slots (a family's over
// every slot), and the state is checked just before each chunk. In a
// group the registry hangs off the group's tag, and the data keys may be
// anywhere.
func (s *sweeper) sameSlot() bool { return keys.SameSlot(s.idx.Live, s.names()) }

// remove deletes generation g's keys in chunks, then its registry field
// and its manifest. It returns the keys deleted and, when it stopped
// before the field, why.
func (s *sweeper) remove(ctx context.Context, g int64, st State) (total int64, reason Reason, err error) {
	if !s.idx.Family {
		return s.removePlain(ctx, g, st)
	}
	if !s.sameSlot() {
		return s.removeFamily(ctx, g, st, false)
	}
	// The chunks go on one connection, in WATCH ... EXEC (see
	// watchedUnlink).
	dc, release := s.client.Dedicate()
	defer release()
	s.dc = dc
	// Deferred, so that it runs before the release also when the removal
	// panics (a Progress callback, after a chunk armed the next one's
	// WATCH): dc would go back to the pool with keys watched.
	defer func() {
		if derr := s.disarm(ctx); err == nil {
			err = derr
		}
		s.dc = nil
	}()
	return s.removeFamily(ctx, g, st, true)
}

// removeFamily is remove for a family, whose keys share the registry's
// slot when sameSlot.
func (s *sweeper) removeFamily(ctx context.Context, g int64, st State, sameSlot bool) (int64, Reason, error) {
	listed, err := s.listed(ctx, g, st, sameSlot)
	if err != nil {
		return 0, "", err
	}
	if listed {
		// The manifest names exactly the generation's keys, in the order
		// its run wrote them: opts.Buckets would only add names the
		// generation may not hold, and the memory to remember them.
		total, reason, err := s.byManifest(ctx, g, st)
		if err != nil || reason != "" {
			s.listLen = -1
			return total, reason, err
		}
		_, reason, err = s.script(ctx, g, st, nil, true)
		s.listLen = -1
		if reason != manifestMoved {
			return total, reason, err
		}
		n, reason, err := s.byScan(ctx, g, st, sameSlot, total)
		return total + n, reason, err
	}
	total, reason, err := s.byName(ctx, g, st, sameSlot)
	if err != nil || reason != "" {
		return total, reason, err
	}
	n, reason, err := s.byScan(ctx, g, st, sameSlot, total)
	return total + n, reason, err
}

// removePlain removes generation g of a plain index: its one key, then its
// field.
func (s *sweeper) removePlain(ctx context.Context, g int64, st State) (int64, Reason, error) {
	key := keys.GenKey(s.idx.Live, g)
	if s.sameSlot() {
		// One step deletes the key and the field.
		if err := s.pace(ctx, 1); err != nil {
			return 0, "", err
		}
		n, reason, err := s.script(ctx, g, st, []string{key}, true)
		if err == nil && reason == "" {
			s.progress(g, n, n)
		}
		return n, reason, err
	}
	n, reason, err := s.chunk(ctx, g, st, []string{key}, false)
	if err != nil || reason != "" {
		return n, reason, err
	}
	s.progress(g, n, n)
	_, reason, err = s.script(ctx, g, st, nil, true)
	return n, reason, err
}

// byName deletes the keys of generation g named by opts.Buckets, in
// chunks, each checked against the state st as a SCAN's chunk is. On a
// cluster, where one command deletes keys of one slot, the keys are first
// grouped by slot (in the order given within a slot), so that a chunk
// needs few commands. It returns the keys deleted and why it stopped.
func (s *sweeper) byName(ctx context.Context, g int64, st State, sameSlot bool) (int64, Reason, error) {
	if len(s.opts.Buckets) == 0 {
		return 0, "", nil
	}
	named := make([]string, len(s.opts.Buckets))
	for i, b := range s.opts.Buckets {
		named[i] = keys.GenBucketKey(s.idx.Live, g, b)
	}
	if !sameSlot {
		slices.SortStableFunc(named, func(a, b string) int { return int(keys.Slot(a)) - int(keys.Slot(b)) })
	}
	var total int64
	for chunk := range slices.Chunk(named, s.opts.Unlink) {
		n, reason, err := s.chunk(ctx, g, st, chunk, sameSlot)
		total += n
		if err != nil || reason != "" {
			return total, reason, err
		}
		s.progress(g, total, n)
	}
	s.opts.Logger.Debug("keyswap: generation's buckets deleted by name", "index", s.idx.Live, "generation", g, "named", len(named), "deleted", total)
	return total, "", nil
}

// byScan deletes the keys of generation g that SCAN MATCH finds, in
// chunks: a pass that deleted keys is followed by one that checks that
// none remains, at most maxPasses; then g's field goes. deleted is what
// went before it (for the progress).
func (s *sweeper) byScan(ctx context.Context, g int64, st State, sameSlot bool, deleted int64) (int64, Reason, error) {
	prefix := keys.GenPrefix(s.idx.Live, g)
	opts := scan.Options{Match: keys.GenPattern(s.idx.Live, g), Count: s.opts.ScanCount, InSlot: sameSlot, Slot: keys.Slot(s.snap.Registry.Key)}
	var total int64
	// del deletes the keys found so far, in chunks of Unlink: the matches
	// of several SCAN pages make one chunk, so that a generation whose
	// keys are sparse among the keyspace's costs few commands.
	var pending []string
	del := func(all bool) (Reason, error) {
		for len(pending) >= s.opts.Unlink || (all && len(pending) > 0) {
			chunk := pending[:min(len(pending), s.opts.Unlink)]
			n, reason, err := s.chunk(ctx, g, st, chunk, sameSlot)
			total += n
			if err != nil || reason != "" {
				return reason, err
			}
			s.progress(g, deleted+total, n)
			pending = pending[len(chunk):]
		}
		return "", nil
	}
	for pass := 1; pass <= maxPasses; pass++ {
		found := 0
		for page, err := range scan.Pages(ctx, s.client, opts) {
			if err != nil {
				return total, "", fmt.Errorf("SCAN %s: %w", opts.Match, err)
			}
			// MATCH already did this; a key SCAN returns that is not of the
			// shape is never deleted.
			page = slices.DeleteFunc(page, func(k string) bool { return !strings.HasPrefix(k, prefix) })
			found += len(page)
			pending = append(pending, page...)
			if reason, err := del(false); err != nil || reason != "" {
				return total, reason, err
			}
		}
		if reason, err := del(true); err != nil || reason != "" {
			return total, reason, err
		}
		s.opts.Logger.Debug("keyswap: generation scanned", "index", s.idx.Live, "generation", g, "pass", pass, "found", found)
		if found == 0 {
			_, reason, err := s.script(ctx, g, st, nil, true)
			return total, reason, err
		}
	}
	return total, SkipWritten, nil
}

// chunk deletes ks, keys of generation g, after the pacer: when they share
// the registry's slot, in a step that checks the state (watchedUnlink, or
// the script); else by UNLINK after the script checked the state.
func (s *sweeper) chunk(ctx context.Context, g int64, st State, ks []string, sameSlot bool) (int64, Reason, error) {
	if err := s.pace(ctx, len(ks)); err != nil {
		return 0, "", err
	}
	if sameSlot {
		if s.dc != nil {
			return s.watchedUnlink(ctx, g, st, ks)
		}
		return s.script(ctx, g, st, ks, false)
	}
	if _, reason, err := s.script(ctx, g, st, nil, false); err != nil || reason != "" {
		return 0, reason, err
	}
	n, err := unlinkBySlot(ctx, s.client, ks)
	return n, "", err
}

// watchedUnlink deletes ks, keys of generation g in the registry's slot,
// on the sweeper's own connection: WATCH of the registry, the lock and the
// pointer, the checks of the unlink script read by the client, then
// MULTI, UNLINK, EXEC. EXEC runs the UNLINK only if none of the watched
// keys changed since the WATCH, so the checks hold when the keys go, as
// they do in the script; and the server does none of the script's work of
// turning every key into a Lua string and back. A write to the registry
// between the WATCH and the EXEC (another index's run allocating, a flip
// of another generation) makes the EXEC run nothing: the chunk then goes
// by the script, which a registry that keeps changing cannot delay.
//
// The WATCH and the checks of the next chunk go behind the EXEC, in the
// same round trip (EXEC ends every WATCH, so the next one starts after
// it): a chunk costs one round trip, not two. Their replies wait in
// s.armed for the next call, which checks them as it would its own;
// disarm sends UNWATCH for a WATCH no chunk used.
func (s *sweeper) watchedUnlink(ctx context.Context, g int64, st State, ks []string) (int64, Reason, error) {
	cb := s.dc.B()
	res := s.takeArmed(g, st)
	if res == nil {
		s.watched = true
		res = s.dc.DoMulti(ctx, s.watch(g)...)
	}
	if err := res[0].Error(); err != nil {
		return 0, "", fmt.Errorf("WATCH: %w", err)
	}
	reason, err := s.refusal(g, st, res[1], res[2], res[3])
	if err != nil || reason != "" {
		if uerr := s.dc.Do(ctx, cb.Unwatch().Build()).Error(); err == nil && uerr != nil {
			err = fmt.Errorf("UNWATCH: %w", uerr)
		}
		return 0, reason, err
	}
	res = s.dc.DoMulti(ctx, append(rueidis.Commands{cb.Multi().Build(), cb.Unlink().Key(ks...).Build(), cb.Exec().Build()}, s.watch(g)...)...)
	s.armed = &armedWatch{g: g, st: st.Raw, res: res[3:]}
	for _, r := range res[:2] {
		if err := r.Error(); err != nil {
			return 0, "", fmt.Errorf("MULTI UNLINK: %w", err)
		}
	}
	replies, err := res[2].ToArray()
	if rueidis.IsRedisNil(err) {
		return s.script(ctx, g, st, ks, false) // a watched key changed
	}
	if err != nil || len(replies) != 1 {
		return 0, "", fmt.Errorf("EXEC of UNLINK: %v, %w", replies, err)
	}
	n, err := replies[0].AsInt64()
	if err != nil {
		return 0, "", fmt.Errorf("UNLINK: %w", err)
	}
	return n, "", nil
}

// watch returns the commands that start a chunk of generation g in
// watchedUnlink: WATCH of the registry, the lock and the pointer, and
// their reads for the checks.
func (s *sweeper) watch(g int64) rueidis.Commands {
	cb := s.dc.B()
	return rueidis.Commands{
		cb.Watch().Key(s.snap.Registry.Key, s.snap.LockKey, s.snap.PointerKey).Build(),
		cb.Hget().Key(s.snap.Registry.Key).Field(strconv.FormatInt(g, 10)).Build(),
		cb.Get().Key(s.snap.LockKey).Build(),
		cb.Get().Key(s.snap.PointerKey).Build()}
}

// armedWatch is the WATCH and the reads of the checks that watchedUnlink
// sent behind a chunk of generation g in state st, for the next chunk.
type armedWatch struct {
	g   int64
	st  string
	res []rueidis.RedisResult
}

// takeArmed returns the replies of the WATCH and the reads sent for a
// chunk of generation g in state st, nil when none wait (the caller then
// sends its own: WATCH adds to the keys watched, so one sent for another
// chunk only makes an EXEC fail more often, and the chunk go by the
// script).
func (s *sweeper) takeArmed(g int64, st State) []rueidis.RedisResult {
	a := s.armed
	if a == nil || a.g != g || a.st != st.Raw {
		return nil
	}
	s.armed = nil
	return a.res
}

// disarm ends a WATCH that watchedUnlink sent for a chunk that never came,
// or whose EXEC never came (its replies lost to a cancelled ctx, or a
// refusal whose UNWATCH was not sent), before the connection goes back to
// the client's pool, where another caller's EXEC would otherwise fail for
// a key this sweeper watched. It runs whatever ctx's state: a WATCH must
// not outlive the sweep.
func (s *sweeper) disarm(ctx context.Context) error {
	if s.armed == nil && !s.watched {
		return nil
	}
	s.armed, s.watched = nil, false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if err := s.dc.Do(ctx, s.dc.B().Unwatch().Build()).Error(); err != nil {
		s.dc.Close() // not back to the pool with keys watched
		return fmt.Errorf("UNWATCH: %w", err)
	}
	return nil
}

// refusal applies the unlink script's checks to the replies of HGET of
// generation g's field, GET of the lock and GET of the pointer: why g's
// keys in state st may not go now, or "".
func (s *sweeper) refusal(g int64, st State, field, lock, ptr rueidis.RedisResult) (Reason, error) {
	state, err := field.ToString()
	switch {
	case rueidis.IsRedisNil(err):
		if !s.own {
			return SkipGone, nil
		}
	case err != nil:
		return "", fmt.Errorf("HGET %s: %w", s.snap.Registry.Key, err)
	case state != st.Raw:
		return SkipChanged, nil
	}
	if token, _ := s.fence(st); token != "" {
		holder, err := lock.ToString()
		if err != nil && !rueidis.IsRedisNil(err) {
			return "", fmt.Errorf("GET %s: %w", s.snap.LockKey, err)
		}
		if holder == token {
			return SkipRunning, nil
		}
	}
	// A pointer of another type names no generation.
	p, err := ptr.ToString()
	if err != nil && !isRedisErr(err) {
		return "", fmt.Errorf("GET %s: %w", s.snap.PointerKey, err)
	}
	if err == nil && p == strconv.FormatInt(g, 10) {
		return SkipPointer, nil
	}
	if _, claimed := keys.ParseGroupMarker(p); err == nil && claimed && s.own && rueidis.IsRedisNil(field.Error()) {
		return SkipClaimed, nil
	}
	return "", nil
}

// pace waits for the pacer, if any.
func (s *sweeper) pace(ctx context.Context, n int) error { return pace(ctx, s.opts, n) }

// progress counts n more keys deleted and reports them.
func (s *sweeper) progress(g, keys, n int64) {
	s.res.Keys += n
	if s.opts.Progress != nil {
		s.opts.Progress(Progress{Gen: g, Keys: keys, Total: s.res.Keys})
	}
}

// isRedisErr reports whether err is a reply of Redis (an error reply, or a
// nil), not a failure to get one.
func isRedisErr(err error) bool {
	var rerr *rueidis.RedisError
	return errors.As(err, &rerr)
}

// unlinkBySlot deletes ks, one UNLINK per hash slot (a command may not
// cross slots on a cluster), all sent at once, and returns how many
// existed.
func unlinkBySlot(ctx context.Context, client rueidis.Client, ks []string) (int64, error) {
	groups := map[uint16][]string{}
	for _, k := range ks {
		groups[keys.Slot(k)] = append(groups[keys.Slot(k)], k)
	}
	cmds := make(rueidis.Commands, 0, len(groups))
	for _, slot := range slices.Sorted(maps.Keys(groups)) {
		cmds = append(cmds, client.B().Unlink().Key(groups[slot]...).Build())
	}
	var n int64
	var errs []error
	for _, r := range client.DoMulti(ctx, cmds...) {
		d, err := r.AsInt64()
		n += d
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}

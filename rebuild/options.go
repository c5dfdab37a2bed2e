package rebuild

import (
	"log/slog"
	"time"

	"github.com/keyswap/keyswap/guards"
	"github.com/keyswap/keyswap/internal/protocol"
)

// The defaults of [Options]: what a zero field means (see [Defaults]).
const (
	// defaultBatchSize is the number of items per batch.
	defaultBatchSize = 2000
	// defaultWriters is the number of batches in flight at once.
	defaultWriters = 8
	// defaultTTL is the lease: the lifetime of the locks and the temp keys
	// without renewal.
	defaultTTL = 300 * time.Second
	// defaultPreserveFor is how long temp keys are kept after the publish
	// script itself fails.
	defaultPreserveFor = 3600 * time.Second
	// defaultStallTimeout is how long the source may yield nothing before
	// the run fails with ErrStalled.
	defaultStallTimeout = 10 * time.Minute
	// defaultFlushInterval is how long a partial batch waits for more items
	// before it is written anyway.
	defaultFlushInterval = time.Second
	// defaultMaxMerged is the most entries a run holds to merge them into
	// fuller commands (see Options.MaxMerged).
	defaultMaxMerged = 1 << 20
	// defaultMaxKeys is the most keys one publish touches (see
	// Options.MaxKeys).
	defaultMaxKeys = protocol.DefaultMaxKeys
	// defaultMaxChanges is the most changes Apply logs for one run in
	// progress (see Options.MaxChanges).
	defaultMaxChanges = 1_000_000
	// defaultCatchUpTimeout is how long a run may take to catch up with the
	// changes applied while it ran (see Options.CatchUpTimeout).
	defaultCatchUpTimeout = time.Minute
	// defaultMaxHold is how long a held run waits for a decision (see
	// Options.MaxHold).
	defaultMaxHold = time.Hour
	// defaultGrace is how long an old generation stays readable after a
	// flip (see Options.Grace).
	defaultGrace = 10 * time.Second
	// defaultDurabilityTimeout bounds the wait of Options.Durability (see
	// Durability.Timeout).
	defaultDurabilityTimeout = 10 * time.Second
)

// Defaults returns the options a zero [Options] stands for: each field
// that has a default holds it, as New fills it in. Durability.Timeout holds
// the longest default wait: a run waits for half its lease (TTL) if that is
// shorter. The fields without a default (MaxRate, LatencyBudget, Expected,
// KeepPrevious, Durability's counts, ...) are zero, as in Options{}.
//
// Each call returns a new value: changing it changes no default.
func Defaults() Options {
	return Options{
		BatchSize: defaultBatchSize, Writers: defaultWriters, TTL: defaultTTL, PreserveFor: defaultPreserveFor,
		StallTimeout: defaultStallTimeout, FlushInterval: defaultFlushInterval, MaxMerged: defaultMaxMerged,
		MaxKeys: defaultMaxKeys, MaxChanges: defaultMaxChanges, CatchUpTimeout: defaultCatchUpTimeout,
		MaxHold: defaultMaxHold, Grace: defaultGrace, Durability: Durability{Timeout: defaultDurabilityTimeout},
	}
}

// PublishTail is the most changes the publish itself replays: those logged
// after the run's last catch-up (see the package documentation, "Writes
// during a rebuild"). With more, the run catches up again first.
const PublishTail = 1000

// PublishTailWork bounds the work of the changes the publish replays, over
// every log: their ops and arguments, each counting one (an Apply of one
// change to a Hash, an HDELIF and an HSET, is 6). The publish is one
// atomic script, which other clients wait behind: 10,000 keep the replay to
// a few milliseconds of the server's time. With more, the run catches up
// again first.
const PublishTailWork = 10_000

// Options configures a [Rebuilder]. The zero value uses every default.
type Options struct {
	// BatchSize is the number of source items per batch. Builders turn a
	// batch into variadic commands of at most about 1000 entries each.
	// Zero means the default, 2000; negative is an error.
	BatchSize int
	// Writers is the number of batches in flight at once: being built, or
	// waiting for or on a round trip (see the package documentation,
	// "Pipeline"). Together with BatchSize it bounds memory: a run holds at
	// most (Writers+1) × BatchSize items, whatever the size of the source.
	// Zero means the default, 8; negative is an error.
	//
	// Each batch is one MULTI/EXEC transaction, which other clients of the
	// server wait behind while it runs: lower BatchSize if a batch's
	// execution time (see the README's Performance section) is more than
	// your latency budget.
	Writers int
	// Unordered lets a second round trip be sent while the first is still
	// in flight whatever the two write (see the package documentation,
	// "Pipeline", for when round trips overlap without it).
	//
	// Most Rebuilders need not set it: those whose builders are all
	// [index.AnyOrder] (sets) or [index.ByEntry] (builders.Hash, builders.SortedSet)
	// overlap their round trips anyway whenever the two write no field or
	// member in common. Unordered makes a difference only with other
	// builders (builders.Func, builders.Compat, your own), or to save the
	// ByEntry builders' bookkeeping.
	//
	// The price: batches of two round trips may run in either order, so
	// when the source yields a hash field or sorted-set member more than
	// once, which of its values ends in the index is undefined, instead of
	// the last in source order. Set it only when every entry appears once
	// in the source, such as fields keyed by a primary key. Nothing else
	// changes: a run is still published all at once or not at all, and
	// memory is bounded alike.
	Unordered bool
	// TTL is the lease of a run: its locks expire TTL after the last
	// heartbeat, and its temp keys 2×TTL (or more, for a family whose
	// refresh takes long) after the last refresh (see the
	// package documentation, "Lease"). A run whose heartbeats cannot reach
	// Redis for a whole TTL fails with ErrLockLost, so that a stalled
	// process cannot hold the lock forever, and a crashed one's lock expires
	// within TTL. Zero means the default, 300 s. It must be a whole number of
	// seconds, at least one.
	TTL time.Duration
	// StallTimeout is how long the source may yield no item before the run
	// fails with ErrStalled, while it is not paused: a source that hangs
	// must not hold the locks forever. A slow source that yields now and
	// then is not stalled: its partial batches are written every
	// FlushInterval. Zero means the default, 10 min; negative is an error.
	StallTimeout time.Duration
	// FlushInterval is how long a partial batch waits for more items before
	// it is written anyway, so that a slow source still makes progress.
	// Zero means the default, 1 s; negative is an error.
	FlushInterval time.Duration
	// MaxRate is the most items per second the run pulls from the source;
	// zero is no limit. An operator can change it while the run runs
	// ("keyswap throttle").
	MaxRate float64
	// LatencyBudget, if positive, paces the run so that the commands of
	// other clients wait at most about that long behind it. While the
	// source runs, the run times a GET on a connection of its own to the
	// server of each of its locks, 100 times a second: the round trip any
	// other client's command takes at that moment. It starts at ten
	// batches a second and, every 200 ms, doubles its rate while the 90th
	// percentile of each server's round trips stays under 0.7 of the
	// budget, until one goes over; from then on it cuts its rate when they
	// are over, and raises it by a quarter while they are under 0.7 of
	// the budget (see the README, "Pacing"). The pacer's own rate never
	// goes below a quarter of a batch per second (one item at least); the
	// lower of it and MaxRate (or an operator's throttle) holds. Each
	// decision is logged to Logger at the Debug level.
	//
	// Without a budget, the application's commands on the client the run
	// was given wait as long as another client's do: the run's writes go
	// on a connection of their own (see the package documentation,
	// "Pipeline"), so what a run adds is the server's load alone, which
	// only a budget bounds, at a cost in throughput (the README's Pacing
	// section has both, measured).
	//
	// The probes' connection comes from the client's blocking pool
	// (rueidis ClientOption.BlockingPoolSize), as does the writes': a run
	// takes two of them, one without a budget. While the application keeps
	// every one of them busy, the run keeps its limit, and warns once
	// after a second. A connection that comes only after the run has
	// ended is given back at once (a wait for the pool is never cut
	// short: rueidis would lose count of its connections).
	//
	// The run paces between batches: a batch's transaction runs whole, so
	// BatchSize must be small enough that one batch runs well within the
	// budget (a few hundred items for 1 ms). The catch-up and the publish
	// are not paced. A budget below the latency clients see without the
	// run only slows it to that floor. Zero is no budget; negative is an
	// error.
	LatencyBudget time.Duration
	// Expected is the number of items the source will yield, when known: it
	// gives the run's status an ETA ("keyswap status"). Zero is unknown.
	Expected int64
	// Durability is how durable the run's writes must be before they are
	// published. The zero value waits for nothing. With Group, the claim
	// and the reservation of each index are among the writes waited for.
	Durability Durability
	// MaxMerged is the most entries of AnyOrder builders (a SetIndex's
	// members, a Set's) the run holds back to merge them across batches
	// into fuller commands (see Commands.Merge): a batch spreads over every
	// bucket of a family, and without merging each bucket would get a
	// command of a few members. A command goes as soon as it is full; past
	// MaxMerged entries the fullest ones go; the rest go when the source
	// ends. It bounds memory next to Writers and BatchSize (see the README,
	// "Memory"). Zero means the default, 1<<20 entries; negative is an error.
	MaxMerged int
	// MaxKeys bounds the keys one publish touches: the keys rebuilt, a
	// family's buckets included, plus the stale buckets it deletes. The
	// publish is one atomic script, so Redis serves no other client while
	// it runs: 7 to 10 µs per key as measured on 2 shared cores (the
	// README's Performance section), so 100,000 keys block it for 0.7 to
	// 1 s, and past the server's busy-reply-threshold (5 s by default)
	// other clients get BUSY replies until it ends. A run past the
	// bound fails with ErrTooManyKeys, before it publishes, and as soon as
	// it writes one key too many. Zero means the default, 100,000; negative means
	// no bound.
	MaxKeys int
	// MaxChanges bounds the log of changes that [Rebuilder.Apply] keeps,
	// in Redis, for a run in progress on its keys: once a run's log holds
	// MaxChanges entries (one per Apply call and lock), later changes are
	// still applied to the live keys but no longer logged, and the run
	// fails with ErrFallingBehind instead of publishing without them. It is
	// the bound of the Rebuilder that applies, whichever process runs. Zero
	// means the default, 1,000,000; negative is an error.
	MaxChanges int
	// CatchUpTimeout bounds the catch-up: the time from the end of the
	// source to a publish whose tail of changes is short enough (see
	// PublishTail). A run whose changes arrive faster than it replays them
	// fails with ErrFallingBehind. Zero means the default, 1 min;
	// negative is an error.
	CatchUpTimeout time.Duration
	// MaxHold bounds how long a held run (Rebuilder.Build) waits for a
	// decision: past it, the run is discarded (its temp keys deleted, its
	// locks released), and it ends with an error matching ErrDiscarded
	// that says so, so that a forgotten Held does not keep its locks, and
	// block every other run of its keys, for ever. Zero means
	// the default, 1 h; negative is an error.
	MaxHold time.Duration
	// Guards decide, before the publish, whether the result may replace
	// the live keys (see package guards): the first that refuses fails the
	// run with guards.ErrRefused, and nothing is published.
	Guards []guards.Guard
	// KeepPrevious, when positive, keeps the previous value of every key a
	// publish replaces or deletes for that long, instead of freeing it, so
	// that Rebuilder.Rollback (or "keyswap rollback") can swap it back.
	// Memory: the previous values stay in Redis for that long, so the
	// index takes up to twice its size meanwhile. A whole number of
	// seconds; zero keeps nothing.
	KeepPrevious time.Duration
	// PreserveFor is how long the temp keys are kept, for diagnosis, after
	// the publish script itself fails (OOM, a timeout, a dropped
	// connection). Zero means the default, 1 h.
	PreserveFor time.Duration
	// Publish is how a run publishes: RenameInPlace (the zero value), or
	// Generations (see the package documentation, "Generations"). In
	// Generations mode MaxKeys does not bind, and KeepPrevious, when
	// positive, keeps the previous generation until the next flip,
	// whatever its length.
	Publish PublishMode
	// Group, in Generations mode, puts the Rebuilder's indexes in a group
	// of that name: the control keys of every index (its lock, run record,
	// log of changes, requests, meta, pointer and registry) hang off
	// "{" + Group + "}:rebuild-group:" + its key, so that they share the group's hash
	// slot whatever the keys' names, while the data keys of its
	// generations keep the key's own name and, on a cluster, spread over
	// every master. Several indexes of one run then need no common hash
	// tag. Readers must name the same group (reader.Options.Group), and so
	// must the CLI (--group). Empty means no group: each index's control
	// keys hang off its own key, and on a cluster the keys of a run must
	// share a hash slot. A group with a '{' or '}', or a Group in
	// RenameInPlace mode (a rename needs the lock and the data in one
	// slot), is an error of New that names the problem and matches
	// reader.ErrBadGroup. The data keys of a generation do not name the
	// group, so one index is written in one group only: a run in a group
	// first claims each index, leaving "group:" + Group in the index's
	// pointer outside the group, and from then on a run of it without a
	// group or in another group, and a reader without a group, fail with
	// an error matching ErrGroupConflict that names the group, writing
	// nothing; a run in a group fails the same way, writing nothing, while
	// the index has generations of runs without a group (a pointer, or
	// one in its registry: building, kept or retired).
	Group string
	// SkipSizeCheck, in Generations mode, skips the size check before the
	// flip. The check catches a key of the run's generation lost during
	// the run (deleted, or evicted under an allkeys-* maxmemory-policy:
	// the keys of a generation carry no TTL), which fails the run with
	// ErrTempKeyLost, and one another client wrote into, which fails it
	// with ErrTampered, naming the key; the run counts, per key, the
	// entries Redis reported new in its writes' replies, and sends one
	// SCARD, HLEN or ZCARD per key before the flip.
	//
	// What it costs: Redis 7.0, 100,000 sets of 10 members (go run ./bench
	// -sections generations -rounds 3, bench/results
	// 2026-12-02-generations-6.json), the build's server CPU is 1.35× that
	// of a redis-cli --pipe write of the same data, of which the 100,000
	// SCARD take 48 to 54 ms in commandstats, beside 254 to 290 ms of SADD,
	// plus the server's work per command outside commandstats: 100,000
	// SCARD through redis-cli --pipe alone took 0.077 s of server CPU
	// against 0.37 s for the whole write, about 20% of the write at 10
	// entries per key, less with more. Without it the build is about 1.12×
	// the pipe's. The client saves its counting too.
	//
	// What is lost: a key of the generation deleted by another client
	// (a DEL, a pattern delete of the index's prefix) is published
	// missing, or with only the entries written after the delete, and one
	// another client wrote into is published with what it wrote. What
	// still holds: writes Redis acknowledged and then lost (a failover to
	// a replica that was behind, a restart) fail the run with
	// ErrWritesLost (the run's batch count, the per-slot counters on a
	// cluster); Durability waits for replicas as before. Evictions are
	// still caught, coarsely: the run reads evicted_keys (INFO stats) and
	// run_id (INFO server) of every master before it allocates its
	// generations and again before the flip, and fails with
	// ErrTempKeyLost, every index left at its generation, if any master
	// evicted keys meanwhile, whosever they were, if a count went down
	// (CONFIG RESETSTAT), or if a master is not the same (a restart, a
	// failover). So the run needs INFO: a user without it fails at the
	// acquire with ErrNoPermission naming it.
	//
	// It is safe when Redis cannot evict the generation's keys (a
	// maxmemory-policy of noeviction, or volatile-*: keys without a TTL
	// are never evicted; under volatile-*, evictions of other keys still
	// fail the run) and nothing else deletes or writes them: no client
	// deletes by a pattern that matches the index's prefix, or writes
	// under it. In RenameInPlace mode, where there is no size check (a
	// publish RENAMEs each temp key, which fails for a lost one), it is an
	// error of New that names it.
	SkipSizeCheck bool
	// Grace, in Generations mode, is how long a generation a flip retired
	// stays readable before the run removes it: longer than the time a
	// reader caches an index's pointer. Zero means the default, 10 s; negative
	// leaves it, retired, to the next run's sweep or an explicit one. The
	// run waits for it before it returns; a ctx cancelled meanwhile leaves
	// the generation to a sweep too, and the run still succeeds.
	Grace time.Duration
	// Progress, if not nil, is called after each batch completes, and as
	// the run enters each phase after building (Progress.Phase), from one
	// goroutine at a time, with counts that never decrease. It should
	// return quickly: batches wait for it.
	Progress func(Progress)
	// Observer, if not nil, receives the run's events, for metrics and
	// traces (see Observer; the module github.com/keyswap/keyswap/otel
	// turns them into OpenTelemetry metrics and spans).
	Observer Observer
	// Logger receives what returned errors cannot carry, such as a failed
	// cleanup after an error that is returned instead. Nil discards.
	Logger *slog.Logger
}

// Progress is a snapshot of a run in progress.
type Progress struct {
	// Phase is the step the run is in.
	Phase Phase
	// Items is the number of source items in completed batches, skipped
	// items included.
	Items int64
	// Batches is the number of completed batches.
	Batches int64
	// Elapsed is the time since the run started.
	Elapsed time.Duration
	// Rate is Items per second of Elapsed.
	Rate float64
}

// Stats describes a run, successful or not.
type Stats struct {
	// Items is the number of items the source yielded, skipped items
	// included.
	Items int64
	// Batches is the number of batches written.
	Batches int64
	// Entries is the number of entries (fields, members) written per
	// builder, keyed by the builder's Key: its live key, or its prefix for
	// a family builder. The last write of a hash field or sorted-set member
	// wins, so a key can end with fewer entries than were written.
	Entries map[string]int64
	// Outcomes is what the publish did to each live key (in Generations
	// mode, Swapped for each key the run wrote): Swapped (replaced
	// with the rebuilt value) or Emptied (deleted: the builder produced
	// nothing for it, or it was a family bucket the run no longer
	// produced; a change applied during the run and replayed by the
	// publish may have written it again). It is empty when the run failed.
	Outcomes map[string]Outcome
	// Generations is each builder's new generation, keyed by its Key: a
	// number that every publish of the key advances, in the same atomic
	// step; in Generations mode, the generation the run built and its
	// pointer now names. It is empty when the run failed, or when its
	// publish reply was lost and found to have run.
	Generations map[string]int64
	// Skipped is the number of entries skipped per family builder because
	// their key has the shape of a key keyswap keeps next to an index
	// (index.ErrReservedKey), such as a bucket named "rebuild-lock".
	Skipped map[string]int64
	// Changes is the number of changes applied during the run that the
	// run replayed, while it caught up and in the publish, counted per
	// builder: an Apply call that writes the keys of three builders counts
	// three.
	Changes int64
	// CatchUp is the time from the end of the source to the publish: the
	// catch-up with the changes applied meanwhile.
	CatchUp time.Duration
	// Elapsed is the run's duration, from locking to release.
	Elapsed time.Duration
}

// Phase is the step a run is in, as its status and Progress report it.
type Phase string

// The phases of a run.
const (
	// PhaseBuilding: pulling the source and writing the temp keys.
	PhaseBuilding Phase = "building"
	// PhaseCatchingUp: replaying the changes applied during the run.
	PhaseCatchingUp Phase = "catching up"
	// PhaseHeld: built and waiting for a decision to publish or discard
	// (see Rebuilder.Build).
	PhaseHeld Phase = "held"
	// PhaseWaiting: waiting for Options.Durability before the publish. The
	// run keeps its lease, and an operator's cancel still ends it.
	PhaseWaiting Phase = "waiting for durability"
	// PhasePublishing: publishing, in one script; an operator's cancel
	// read by it refuses the publish.
	PhasePublishing Phase = "publishing"
)

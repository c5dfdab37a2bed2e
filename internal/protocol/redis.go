package protocol

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// CleanupTimeout bounds each cleanup step (deleting temp keys, releasing
// locks, settling a publish) that must still run after the caller's context
// is cancelled. Its commands are retried on a fresh connection within it.
const CleanupTimeout = 5 * time.Second

// CleanupContext returns a context for cleanup that must survive the
// cancellation of ctx, bounded by CleanupTimeout. Every cleanup step of a
// run uses it: a cleanup sent on an already cancelled context would send
// nothing.
func CleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
}

// Redis is keyswap's protocol in Redis, one field per concern, each a small
// type over the one shared [Core]: [Locks] takes and releases a run's
// locks, [Lease] renews them and the temp keys, [Publisher] publishes (and
// rolls back) in the rename-in-place shape, [Generations] allocates and
// flips generations, [Changes] applies a change to live keys, [Operator]
// reads and writes an operator's requests to a run, and [Durable] waits
// for writes to be replicated and persisted. The Core's own methods (keys,
// slots, discarding temp keys) are Redis's too. It is safe for concurrent
// use.
type Redis struct {
	*Core
	Locks       Locks
	Lease       Lease
	Publisher   Publisher
	Generations Generations
	Changes     Changes
	Operator    Operator
	Durable     Durable
}

// Core is what every concern of [Redis] shares: the client its commands go
// through, the key shapes (standalone or cluster) and the logger; and the
// helpers they all use: lock and temp key names, the check that a
// command's keys share a slot, the discarding of temp keys and the
// unlinking of a removed generation's keys. Each concern type embeds it.
type Core struct {
	client rueidis.Client
	// cluster names the control keys: the deployment's shapes, and the
	// group of the indexes, if any (keys.Names; the functions of keys take
	// it where they take a bool).
	cluster keys.Names
	log     *slog.Logger
}

// Locks takes and releases a run's locks: the lock of each live key
// ("<live>:rebuild-lock", keys.LockKey), and next to each the run's record
// (":run"), its log of changes (":log"), the operator's requests next to
// the first lock (":ctl") and the receipt a fenced publish leaves
// (":done"), which the release of a settle reads (acquire.lua,
// release.lua).
type Locks struct{ *Core }

// Lease renews a run's lease: its locks, its records' status and the
// operator's requests read back in one heartbeat (heartbeat.lua), and the
// TTL of its temp keys, in bounded chunks (touch.lua, refresh.lua). It
// reads the lock keys and writes no live key.
type Lease struct{ *Core }

// Publisher publishes a run in the rename-in-place shape: in one fenced
// script it checks the locks, records, requests, temp keys and logs of
// changes, then renames the temp keys over the live keys, retires the
// orphans and drops, advances the metas (":rebuild-gen") and leaves the
// receipt (publish.lua); it settles a publish whose reply was lost from
// that receipt, keeps the temp keys of a failed publish for a while, and
// swaps the kept previous values (":rebuild-prev") back in a rollback
// (rollback.lua). It uses Locks for the release that settles and for the
// locks a rollback takes.
type Publisher struct {
	*Core
	locks Locks
}

// Generations publishes a run in Generations mode: it allocates each
// index's new generation in its registry (keys.RegistryKey, genalloc.lua),
// flips its pointer (keys.PointerKey) to it in one fenced script that
// also writes the meta and the receipt (flip.lua), flips it back in a
// rollback (genback.lua).
// It uses Publisher to settle a flip whose reply was lost and to take a
// rollback's locks, and Locks to release them.
type Generations struct {
	*Core
	locks     Locks
	publisher Publisher
}

// Changes applies a change to live keys while a run of them may be in
// progress (apply.lua), or to the current generation of indexes published
// in Generations mode (genapply.lua; on a cluster, for an index without a
// hash tag, in three steps across slots: genlog.lua, genwrite.lua per slot,
// genkept.lua), and logs it for the run: the live keys (or the
// generation's), and the locks, records and logs of changes next to them.
type Changes struct{ *Core }

// Operator is the operator's side of a run: it finds the run holding a
// lock (the lock, its record, its requests) and records a request in the
// run's requests (":ctl"), fenced by its token and its receipt
// (control.lua).
type Operator struct{ *Core }

// Durable makes a run's writes as durable as asked, with WAIT and WAITAOF
// on a dedicated connection to the master that holds a key the run wrote
// (its record, or a key named by the caller), after a write to that key.
type Durable struct{ *Core }

// New returns a Redis that sends every command through client and logs what
// returned errors cannot carry to log (nil discards). Key shapes follow
// client.Mode().
func New(client rueidis.Client, log *slog.Logger) *Redis { return NewInGroup(client, "", log) }

// NewInGroup is New for indexes in group (none when empty): their control
// keys hang off keys.GroupBase (see keys.Names).
func NewInGroup(client rueidis.Client, group string, log *slog.Logger) *Redis {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Core{client: client, cluster: keys.Names{Cluster: client.Mode() == rueidis.ClientModeCluster, Group: group}, log: log}
	locks := Locks{c}
	publisher := Publisher{Core: c, locks: locks}
	return &Redis{
		Core:        c,
		Locks:       locks,
		Lease:       Lease{c},
		Publisher:   publisher,
		Generations: Generations{Core: c, locks: locks, publisher: publisher},
		Changes:     Changes{c},
		Operator:    Operator{c},
		Durable:     Durable{c},
	}
}

// Client returns the client every command goes through.
func (r *Core) Client() rueidis.Client { return r.client }

// Cluster reports whether keys take Redis Cluster shapes.
func (r *Core) Cluster() bool { return r.cluster.Cluster }

// Names returns how the control keys are named.
func (r *Core) Names() keys.Names { return r.cluster }

// Logger returns the logger.
func (r *Core) Logger() *slog.Logger { return r.log }

// aliasable returns the keys of lives whose base another live key can
// have (keys.Aliasable, SPEC C104): on a cluster, without a group (whose
// bases are the group's, one per live key). Only their bases carry an
// owner stamp.
func (r *Core) aliasable(lives []string) []string {
	if r.cluster.Group != "" {
		return nil
	}
	var out []string
	for _, l := range lives {
		if keys.Aliasable(l, r.cluster.Cluster) {
			out = append(out, l)
		}
	}
	return out
}

// LockKey returns the lock key of live.
func (r *Core) LockKey(live string) string { return keys.LockKey(live, r.cluster) }

// OrDefault returns v, or def when v is zero.
func OrDefault[N int | int64 | time.Duration](v, def N) N {
	if v == 0 {
		return def
	}
	return v
}

// Seconds converts d to the whole seconds Redis EX and EXPIRE take. what
// names the setting in the error. d must be positive and whole: rounding
// silently would make a lease shorter or longer than the caller asked for.
func Seconds(op, key, what string, d time.Duration) (int64, error) {
	switch {
	case d <= 0:
		return 0, &Error{Op: op, Key: key, Err: fmt.Errorf("%s %v: must be positive", what, d)}
	case d%time.Second != 0:
		return 0, &Error{Op: op, Key: key, Err: fmt.Errorf("%s %v: must be a whole number of seconds (Redis expiries here are in seconds)", what, d)}
	}
	return int64(d / time.Second), nil
}

// CheckKey refuses an empty key.
func CheckKey(op, key string) error {
	if key == "" {
		return &Error{Op: op, Err: errors.New("empty key")}
	}
	return nil
}

// SameSlot reports an error when, on a cluster, ks span several hash slots.
// rueidis's command builder panics on such a command, so every multi-key
// command is checked here first. live names the rebuild in the error.
func (r *Core) SameSlot(op, live string, ks ...string) error {
	if !r.cluster.Cluster || len(ks) == 0 {
		return nil
	}
	want := keys.Slot(ks[0])
	for _, k := range ks[1:] {
		if keys.Slot(k) != want {
			return &Error{Op: op, Key: live, Err: fmt.Errorf(
				"keys %q (slot %d) and %q (slot %d) are in different hash slots; give them a common hash tag, e.g. {%s}",
				ks[0], want, k, keys.Slot(k), live)}
		}
	}
	return nil
}

// Discard deletes temp keys that must not be published, such as those of a
// failed rebuild, with UNLINK so that freeing a large partial index does not
// block the server. It runs on a [CleanupContext] of its own, and logs a
// failure instead of returning it: the caller returns the error that made
// the temp keys worthless, and their TTL bounds the leak. live names the
// rebuild in the log.
func (r *Core) Discard(ctx context.Context, live string, temps ...string) {
	if len(temps) == 0 {
		return
	}
	ctx, cancel := CleanupContext(ctx)
	defer cancel()
	cmds := make(rueidis.Commands, 0, len(temps))
	for _, t := range temps {
		// Idempotent, so rueidis may retry it on a fresh connection: the
		// cleanup after a dropped connection should not fail for that.
		cmds = append(cmds, r.client.B().Unlink().Key(t).Build().ToRetryable())
	}
	var errs []error
	for i, res := range r.client.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			errs = append(errs, fmt.Errorf("UNLINK %s: %w", temps[i], err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		r.log.Warn("keyswap: could not delete temp keys; they expire within their TTL", "key", live, "err", err)
	}
}

// NewTempKey returns a new temp key for a rebuild of live, stamped with now:
// "<live>:rebuild:<unix seconds>:<16 hex>" on a standalone server, in live's
// slot on a cluster. The 64 random bits make every call unique, even within
// a second and across processes.
func (r *Core) NewTempKey(live string, now time.Time) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return keys.TempKey(live, r.cluster, now.Unix(), binary.BigEndian.Uint64(b[:]))
}

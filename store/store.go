package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// Defaults, from Familia (C33).
const (
	// DefaultTTL is the lifetime of the rebuild lock and of the temp key
	// between touches. A single batch must complete within it.
	DefaultTTL = 300 * time.Second
	// DefaultPreserveFor is how long a temp key is kept, for diagnosis,
	// after the swap script itself failed.
	DefaultPreserveFor = 3600 * time.Second
	// DefaultSweepOlderThan is the minimum age of a temp key the sweep
	// deletes.
	DefaultSweepOlderThan = 3600 * time.Second
	// DefaultSweepPattern is the SCAN MATCH pattern of the sweep.
	DefaultSweepPattern = "*:rebuild:*"
)

// cleanupTimeout bounds best-effort cleanup (deleting a temp key, releasing
// a lock) that must still run after the caller's context is cancelled.
const cleanupTimeout = 5 * time.Second

// Store is the Redis core of keyswap: key naming, the rebuild lock, touch,
// the fenced swap, the WithRebuild lifecycle and the sweep. It is safe for
// concurrent use by multiple goroutines.
type Store struct {
	client  rueidis.Client
	cluster bool
	log     *slog.Logger
	now     func() time.Time
}

// Options configures a [Store]. The zero value is ready to use.
type Options struct {
	// Logger receives what returned errors cannot carry: a failed cleanup
	// after an error that is returned instead, or a failed release after a
	// success. Nil discards.
	Logger *slog.Logger
	// Now is the clock used for temp-key timestamps and sweep ages. Nil
	// means time.Now.
	Now func() time.Time
}

// New returns a Store that sends every command through client (C19). Key
// shapes follow client.Mode(): Familia's exact shapes on a standalone
// server, slot-pinned shapes on Redis Cluster (see [Store.LockKey]).
//
// The client type is rueidis.Client, so a rebuild cannot be started inside
// MULTI or a pipeline, where SET NX would only return a queued-command
// placeholder and exclusion could not be enforced (C10).
//
// New panics if client is nil.
func New(client rueidis.Client, opts Options) *Store {
	if client == nil {
		panic("keyswap: store.New: nil rueidis.Client")
	}
	s := &Store{
		client:  client,
		cluster: client.Mode() == rueidis.ClientModeCluster,
		log:     opts.Logger,
		now:     opts.Now,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// Client returns the client the Store sends every command through.
func (s *Store) Client() rueidis.Client { return s.client }

// Cluster reports whether the Store uses Redis Cluster key shapes.
func (s *Store) Cluster() bool { return s.cluster }

// LockKey returns the key of final's rebuild lock: "<final>:rebuild-lock"
// on a standalone server (C4). On a cluster the lock shares final's hash
// slot: an untagged key is wrapped ("{<final>}:rebuild-lock") and keys that
// cannot be wrapped, such as "a{}b", get a synthetic tag in their slot.
// The lock key never matches the sweep pattern "*:rebuild:*".
func (s *Store) LockKey(final string) string {
	return keys.LockKey(final, s.cluster)
}

// NewTempKey returns a new temp key for a rebuild of final:
// "<final>:rebuild:<unix seconds>:<16 hex>" on a standalone server (C1),
// in final's slot on a cluster. The timestamp keeps orphans sortable by age
// for the sweep; the 64 random bits make every call unique, even within a
// second and across processes (C2), so two rebuilds never write into the
// same temp key.
func (s *Store) NewTempKey(final string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return keys.TempKey(final, s.cluster, s.now().Unix(), binary.BigEndian.Uint64(b[:]))
}

// ParseTempKey recognises a temp key, in the current or the legacy shape
// (C3, C5), and returns the base it derives from and its Unix timestamp.
// The base is the live key on a standalone server; the lock that guards the
// temp key is base + ":rebuild-lock".
func ParseTempKey(key string) (base string, unix int64, ok bool) {
	return keys.ParseTempKey(key)
}

// newToken returns 128 random bits as 32 hex characters (C6).
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// errEmptyTemp describes an empty temp key.
var errEmptyTemp = errors.New("empty temp key")

// checkKey refuses an empty key.
func checkKey(op, key string) error {
	if key == "" {
		return &Error{Op: op, Err: errors.New("empty key")}
	}
	return nil
}

// seconds converts d to the whole seconds Redis EX and EXPIRE take. what
// names the setting in the error. d must be positive and whole: rounding
// silently would make a lease shorter or longer than the caller asked for.
func seconds(op, key, what string, d time.Duration) (int64, error) {
	switch {
	case d <= 0:
		return 0, &Error{Op: op, Key: key, Err: fmt.Errorf("%s %v: must be positive", what, d)}
	case d%time.Second != 0:
		return 0, &Error{Op: op, Key: key, Err: fmt.Errorf("%s %v: must be a whole number of seconds (Redis expiries here are in seconds)", what, d)}
	}
	return int64(d / time.Second), nil
}

// orDefault returns d, or def when d is zero.
func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// sameSlot reports an error when, on a cluster, keys span several hash
// slots. rueidis's command builder panics on such a command, so every
// multi-key command is checked here first.
func (s *Store) sameSlot(op, final string, ks ...string) error {
	if !s.cluster || len(ks) == 0 {
		return nil
	}
	want := keys.Slot(ks[0])
	for _, k := range ks[1:] {
		if keys.Slot(k) != want {
			return &Error{Op: op, Key: final, Err: fmt.Errorf(
				"keys %q (slot %d) and %q (slot %d) are in different hash slots; give them a common hash tag, e.g. {%s}",
				ks[0], want, k, keys.Slot(k), final)}
		}
	}
	return nil
}

// cleanupContext returns a context for cleanup that must survive the
// cancellation of ctx, bounded by cleanupTimeout.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// Discard deletes temp keys that must not be published, such as those of
// a failed rebuild, with UNLINK so that freeing a large partial index does
// not block the server. It returns the errors of the keys it could not
// delete, joined.
func (s *Store) Discard(ctx context.Context, temps ...string) error {
	if len(temps) == 0 {
		return nil
	}
	cmds := make(rueidis.Commands, 0, len(temps))
	for _, t := range temps {
		// Idempotent, so rueidis may retry it on a fresh connection: the
		// cleanup after a dropped connection should not fail for that.
		cmds = append(cmds, s.client.B().Unlink().Key(t).Build().ToRetryable())
	}
	var errs []error
	for i, r := range s.client.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			errs = append(errs, fmt.Errorf("UNLINK %s: %w", temps[i], err))
		}
	}
	return errors.Join(errs...)
}

// discardTemp deletes temp keys that must not be swapped, best effort
// (Familia's discard_temp_key), even after ctx is cancelled. A failure is
// logged: the caller returns the error that made the temp keys worthless,
// and their TTL bounds the leak.
func (s *Store) discardTemp(ctx context.Context, final string, temps ...string) {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := s.Discard(ctx, temps...); err != nil {
		s.log.Warn("keyswap: could not delete temp keys", "key", final, "err", err)
	}
}

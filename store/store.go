package store

import (
	"log/slog"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

// Defaults, from Familia.
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

// Store is the Redis core of keyswap for one key at a time: key naming, the
// rebuild lock, touch, the fenced swap, the WithRebuild lifecycle and the
// sweep. It is safe for concurrent use by multiple goroutines.
type Store struct {
	redis *protocol.Redis
	now   func() time.Time
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

// New returns a Store that sends every command through client. Key shapes
// follow client.Mode(): Familia's exact shapes on a standalone server,
// slot-pinned shapes on Redis Cluster (see [Store.LockKey]).
//
// The client type is rueidis.Client, so a rebuild cannot be started inside
// MULTI or a pipeline, where SET NX would only return a queued-command
// placeholder and exclusion could not be enforced.
//
// New panics if client is nil.
func New(client rueidis.Client, opts Options) *Store {
	if client == nil {
		panic("keyswap: store.New: nil rueidis.Client")
	}
	s := &Store{redis: protocol.New(client, opts.Logger), now: opts.Now}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// LockKey returns the key of live's rebuild lock: "<live>:rebuild-lock" on
// a standalone server. On a cluster the lock shares live's hash slot: an
// untagged key is wrapped ("{<live>}:rebuild-lock") and keys that cannot be
// wrapped, such as "a{}b", get a synthetic tag in their slot. The lock key
// never matches the sweep pattern "*:rebuild:*".
func (s *Store) LockKey(live string) string { return s.redis.LockKey(live) }

// NewTempKey returns a new temp key for a rebuild of live:
// "<live>:rebuild:<unix seconds>:<16 hex>" on a standalone server, in live's
// slot on a cluster. The timestamp keeps orphans sortable by age for the
// sweep; the 64 random bits make every call unique, even within a second and
// across processes, so two rebuilds never write into the same temp key.
func (s *Store) NewTempKey(live string) string { return s.redis.NewTempKey(live, s.now()) }

// ParseTempKey recognises a temp key, in the current or the legacy shape,
// and returns the base it derives from and its Unix timestamp. The base is
// the live key on a standalone server; the lock that guards the temp key is
// base + ":rebuild-lock".
func ParseTempKey(key string) (base string, unix int64, ok bool) {
	return keys.ParseTempKey(key)
}

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

// Redis sends a run's commands through one rueidis.Client. It is safe for
// concurrent use.
type Redis struct {
	client  rueidis.Client
	cluster bool
	log     *slog.Logger
}

// New returns a Redis that sends every command through client and logs what
// returned errors cannot carry to log (nil discards). Key shapes follow
// client.Mode().
func New(client rueidis.Client, log *slog.Logger) *Redis {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Redis{client: client, cluster: client.Mode() == rueidis.ClientModeCluster, log: log}
}

// Client returns the client every command goes through.
func (r *Redis) Client() rueidis.Client { return r.client }

// Cluster reports whether keys take Redis Cluster shapes.
func (r *Redis) Cluster() bool { return r.cluster }

// Logger returns the logger.
func (r *Redis) Logger() *slog.Logger { return r.log }

// LockKey returns the lock key of live.
func (r *Redis) LockKey(live string) string { return keys.LockKey(live, r.cluster) }

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
func (r *Redis) SameSlot(op, live string, ks ...string) error {
	if !r.cluster || len(ks) == 0 {
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
func (r *Redis) Discard(ctx context.Context, live string, temps ...string) {
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
func (r *Redis) NewTempKey(live string, now time.Time) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return keys.TempKey(live, r.cluster, now.Unix(), binary.BigEndian.Uint64(b[:]))
}

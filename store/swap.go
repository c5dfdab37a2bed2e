package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
)

// Populated says what the caller knows about a temp key before a swap.
type Populated int8

const (
	// PopulatedUnknown (the zero value) makes Swap ask Redis with EXISTS
	// just before the swap script.
	PopulatedUnknown Populated = iota
	// PopulatedYes means the caller saw the temp key hold data, so a missing
	// key at swap time is a loss and fails closed with ErrTempKeyLost.
	PopulatedYes
	// PopulatedNo means nothing was written: a missing key is an empty
	// rebuild, and the swap deletes the live key.
	PopulatedNo
)

func (p Populated) String() string {
	switch p {
	case PopulatedUnknown:
		return "unknown"
	case PopulatedYes:
		return "yes"
	case PopulatedNo:
		return "no"
	}
	return "Populated(" + strconv.Itoa(int(p)) + ")"
}

// Outcome is what a successful swap did to the live key.
type Outcome = protocol.Outcome

// The outcomes of a swap.
const (
	// Swapped: the live key now holds exactly the temp key's contents.
	Swapped = protocol.Swapped
	// Emptied: the rebuild produced nothing, so the live key was deleted.
	Emptied = protocol.Emptied
)

// SwapOptions configures [Store.Swap]. The zero value is an unfenced swap
// that asks Redis whether the temp key is populated.
type SwapOptions struct {
	// Lock fences the swap: the script publishes only while Lock still
	// holds its token. Nil is Familia's unfenced direct swap.
	Lock *Lock
	// Populated says whether the temp key is known to hold data. The zero
	// value, PopulatedUnknown, asks Redis with EXISTS.
	Populated Populated
	// PreserveFor is how long the temp key is kept after the swap script
	// itself fails, for diagnosis. Zero means DefaultPreserveFor.
	PreserveFor time.Duration
}

// Swap atomically replaces live with temp in one script: fence
// check, temp-key existence, then publish or empty-delete.
//
//   - Non-empty: the old value is UNLINKed, temp is RENAMEd over live and
//     PERSISTed. live ends with exactly temp's contents, without an expiry,
//     and readers see either the old value or the new one, never a missing
//     key. The old value is freed off the server's main thread.
//   - Empty (temp is absent and was not populated): live is deleted, which
//     is the correct outcome for an index with no members.
//
// Swap fails closed on every path and never reports success unless the
// RENAME or the empty-delete happened:
//
//   - opts.Lock given and no longer ours: temp is deleted (it is stale:
//     nothing to diagnose), live and the successor's lock are untouched,
//     and the error matches [ErrLockLost]. The fence is checked before
//     existence.
//   - temp was populated but is gone: nothing changes and the error matches
//     [ErrTempKeyLost].
//   - the script itself fails (server error, timeout, dropped connection):
//     if temp is populated it is kept for opts.PreserveFor instead of leaking
//     an index-sized key, and the error is returned wrapped. A timeout
//     can outrun a script that did run; the EXPIRE is then a no-op.
//
// On Redis Cluster, a live key whose base another index owns (see
// [Store.Acquire]) is refused inside the script, before any write, with
// an error matching [ErrGroupConflict]: the swap would advance that
// index's meta. temp is left as it is.
//
// A fenced swap with a blank token is refused before anything changes.
// Swap never acquires, extends or releases the lock. It is never
// retried: a retried RENAME would see its own temp key gone.
func (s *Store) Swap(ctx context.Context, temp, live string, opts SwapOptions) (Outcome, error) {
	return s.swap(ctx, temp, live, opts, false)
}

// swap is Swap. With settle, a swap whose reply was lost is settled from
// its receipt, which releases the lock (see protocol.Publisher.Publish).
func (s *Store) swap(ctx context.Context, temp, live string, opts SwapOptions, settle bool) (Outcome, error) {
	const op = "swap"
	if err := protocol.CheckKey(op, live); err != nil {
		return 0, err
	}
	if opts.Populated < PopulatedUnknown || opts.Populated > PopulatedNo {
		// Read as "no", an unknown value would delete the live key.
		return 0, &Error{Op: op, Key: live, Err: fmt.Errorf("invalid %v", opts.Populated)}
	}
	preserve := protocol.OrDefault(opts.PreserveFor, DefaultPreserveFor)
	if _, err := protocol.Seconds(op, live, "PreserveFor", preserve); err != nil {
		return 0, err
	}
	var locks []*protocol.Lock
	if opts.Lock != nil {
		l := opts.Lock.core()
		switch {
		case l.Live == "":
			l.Live = live // a hand-built lock: errors still name the live key
		case l.Live != live:
			return 0, &Error{Op: op, Key: live, Err: fmt.Errorf("lock guards %q, not this key", l.Live)}
		}
		if err := protocol.CheckLock(op, l); err != nil {
			return 0, err
		}
		locks = []*protocol.Lock{l}
	}
	target := protocol.Target{Temp: temp, Live: live}
	switch opts.Populated {
	case PopulatedYes:
		target.Populated = true
	case PopulatedUnknown:
		if temp == "" || temp == live {
			break // refused by the publish, before anything is sent
		}
		ks := []string{temp, live}
		for _, l := range locks {
			ks = append(ks, l.Key)
		}
		if err := s.redis.SameSlot(op, live, ks...); err != nil {
			return 0, err
		}
		n, err := s.redis.Client().Do(ctx, s.redis.Client().B().Exists().Key(temp).Build()).AsInt64()
		if err != nil {
			return 0, protocol.Fail(ctx, op, live, err)
		}
		target.Populated = n > 0
	}
	if !target.Populated {
		s.redis.Logger().Info("keyswap: no temp key to swap (empty result set)", "key", live, "temp_key", temp)
	}
	p, err := s.redis.Publisher.Publish(ctx, protocol.PublishOptions{
		Op: op, Key: live, Locks: locks, Targets: []protocol.Target{target},
		Metas:       []string{keys.MetaKey(live, s.redis.Cluster())},
		Owners:      []string{live},
		PreserveFor: preserve, Settle: settle, Now: s.now(),
	})
	if err != nil {
		return 0, err
	}
	return p.Outcomes[0], nil
}

package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Populated says what the caller knows about a temp key before a swap.
type Populated int8

const (
	// PopulatedUnknown (the zero value) makes Swap ask Redis with EXISTS
	// just before the swap script (C25).
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

// Outcome is what a successful swap did to the live key (C32).
type Outcome int8

const (
	// Swapped: the live key now holds exactly the temp key's contents.
	Swapped Outcome = iota + 1
	// Emptied: the rebuild produced nothing, so the live key was deleted.
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

// Swap atomically replaces final with temp in one script (C22): fence
// check, temp-key existence, then publish or empty-delete.
//
//   - Non-empty: the old value is UNLINKed, temp is RENAMEd over final and
//     PERSISTed. final ends with exactly temp's contents, without an expiry,
//     and readers see either the old value or the new one, never a missing
//     key (C23). The old value is freed off the server's main thread (C23+).
//   - Empty (temp is absent and was not populated): final is deleted, which
//     is the correct outcome for an index with no members (C24).
//
// Swap fails closed on every path and never reports success unless the
// RENAME or the empty-delete happened:
//
//   - opts.Lock given and no longer ours: temp is deleted (it is stale:
//     nothing to diagnose), final and the successor's lock are untouched,
//     and the error matches [ErrLockLost] (C27). The fence is checked before
//     existence (C28).
//   - temp was populated but is gone: nothing changes and the error matches
//     [ErrTempKeyLost] (C26).
//   - the script itself fails (server error, timeout, dropped connection):
//     if temp is populated it is kept for opts.PreserveFor instead of leaking
//     an index-sized key, and the error is returned wrapped (C29). A timeout
//     can outrun a script that did run; the EXPIRE is then a no-op.
//
// A fenced swap with a blank token is refused before anything changes (C30).
// Swap never acquires, extends or releases the lock (C31). It is never
// retried: a retried RENAME would see its own temp key gone.
func (s *Store) Swap(ctx context.Context, temp, final string, opts SwapOptions) (Outcome, error) {
	const op = "swap"
	if err := checkKey(op, final); err != nil {
		return 0, err
	}
	if temp == "" {
		return 0, &Error{Op: op, Key: final, Err: errors.New("empty temp key")}
	}
	if temp == final {
		return 0, &Error{Op: op, Key: final, Err: errors.New("temp key is the live key")}
	}
	preserve, err := seconds(op, final, "PreserveFor", orDefault(opts.PreserveFor, DefaultPreserveFor))
	if err != nil {
		return 0, err
	}
	if opts.Populated < PopulatedUnknown || opts.Populated > PopulatedNo {
		// Read as "no", an unknown value would delete the live key.
		return 0, &Error{Op: op, Key: final, Err: fmt.Errorf("invalid %v", opts.Populated)}
	}
	var locks []*Lock
	if opts.Lock != nil {
		l := *opts.Lock
		switch {
		case l.Final == "":
			l.Final = final // a hand-built lock: errors still name the live key
		case l.Final != final:
			return 0, &Error{Op: op, Key: final, Err: fmt.Errorf("lock guards %q, not this key", l.Final)}
		}
		if err := checkLock(op, &l); err != nil {
			return 0, err
		}
		locks = []*Lock{&l}
	}
	target := Target{Temp: temp, Final: final}
	if err := s.sameSlot(op, final, append([]string{temp, final}, lockKeys(locks)...)...); err != nil {
		return 0, err
	}

	switch opts.Populated {
	case PopulatedYes:
		target.Populated = true
	case PopulatedUnknown:
		n, err := s.client.Do(ctx, s.client.B().Exists().Key(temp).Build()).AsInt64()
		if err != nil {
			return 0, fail(ctx, op, final, err)
		}
		target.Populated = n > 0
	}
	if !target.Populated {
		s.log.Info("keyswap: no temp key to swap (empty result set)", "key", final, "temp_key", temp)
	}
	outcomes, err := s.publishTargets(ctx, op, final, locks, []Target{target}, nil, preserve)
	if err != nil {
		return 0, err
	}
	return outcomes[0], nil
}

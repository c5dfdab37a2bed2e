package protocol

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/scan"
)

// ErrTooManyKeys reports a publish or a rollback that would touch more keys
// than its bound (MaxKeys) in one atomic script. Nothing changed.
var ErrTooManyKeys = errors.New("too many keys for one publish")

// DefaultMaxKeys is the most keys one publish or rollback touches unless
// told otherwise.
const DefaultMaxKeys = 100_000

// ErrNothingToRollBack reports a rollback of an index that keeps no
// previous generation: none was kept (KeepPrevious was not set), or it
// expired. Nothing changed.
var ErrNothingToRollBack = errors.New("no previous generation is kept")

// RollbackOptions configures [Publisher.Rollback].
type RollbackOptions struct {
	// Op and Key name the operation in errors.
	Op, Key string
	// Lives are the indexes: live keys, or families' prefixes where
	// FamilyTypes gives the family's key type ("set"; "" for a plain key).
	// A family's keys of another type under its prefix are not its own,
	// and are left alone.
	Lives       []string
	FamilyTypes []string
	// TTL is the lease of the locks the rollback holds while it runs.
	TTL time.Duration
	// MaxKeys bounds the keys of the rollback, live keys and kept previous
	// values together, as MaxKeys bounds a publish: the rollback is one
	// atomic script, so past it the rollback is refused before any write,
	// with an error matching ErrTooManyKeys. Zero or negative: no bound.
	MaxKeys int
	// Now is the time recorded in the metas.
	Now time.Time
}

// Rollback swaps the previous generation of every index of opts back in,
// in one atomic script (rollback.lua), fenced by the indexes' locks, which
// it takes first: while a run of them is in progress it fails with
// ErrInProgress and changes nothing. A family's keys are found by SCAN
// under its prefix, with the lock held; more keys than opts.MaxKeys fail
// it with ErrTooManyKeys, changing nothing. It returns the generation now
// live of each index.
func (r Publisher) Rollback(ctx context.Context, opts RollbackOptions) ([]int64, error) {
	locks, err := r.rollbackLocks(ctx, opts)
	if err != nil {
		return nil, err
	}
	gens, err := r.rollback(ctx, opts, locks)
	return gens, r.locks.ReleaseAfter(ctx, locks, err)
}

// rollbackLocks takes the locks of a rollback of opts.Lives.
func (r Publisher) rollbackLocks(ctx context.Context, opts RollbackOptions) ([]*Lock, error) {
	families := make([]bool, len(opts.Lives))
	for i := range families {
		families[i] = i < len(opts.FamilyTypes) && opts.FamilyTypes[i] != ""
	}
	return r.locks.Acquire(ctx, AcquireOptions{Op: opts.Op, Key: opts.Key, Lives: opts.Lives, Families: families,
		Mode: ModeRollback, TTL: opts.TTL, Record: []string{FieldPhase, "rolling back"},
		// A rollback of "{X}" would flip the pointer, or swap the kept
		// values, of "X" (SPEC C104); it writes no stamp.
		Stamp: StampCheck})
}

func (r Publisher) rollback(ctx context.Context, opts RollbackOptions, locks []*Lock) ([]int64, error) {
	op, key := opts.Op, opts.Key
	lockKeys, token, err := CheckLocks(op, locks)
	if err != nil {
		return nil, err
	}
	var metas, triples []string
	var owner []string
	for i, l := range opts.Lives {
		metas = append(metas, keys.MetaKey(l, r.cluster))
		lives := []string{l}
		if i < len(opts.FamilyTypes) && opts.FamilyTypes[i] != "" {
			if lives, err = r.familyKeys(ctx, l, opts.FamilyTypes[i]); err != nil {
				return nil, Fail(ctx, op, l, err)
			}
		}
		for _, k := range lives {
			prev := keys.PrevKey(k, r.cluster)
			triples = append(triples, k, prev, prev+":swap")
			owner = append(owner, strconv.Itoa(i+1))
		}
	}
	if n := len(triples) / 3; opts.MaxKeys > 0 && n > opts.MaxKeys {
		return nil, &Error{Op: op, Key: key, Err: fmt.Errorf("%w: a rollback may touch at most %d keys (MaxKeys), and this one would swap %d, in one atomic script that blocks Redis for about 10 µs per key; nothing changed", ErrTooManyKeys, opts.MaxKeys, n)}
	}
	ks := slices.Concat(lockKeys, metas, triples)
	if err := r.SameSlot(op, key, ks...); err != nil {
		return nil, err
	}
	args := []string{token, strconv.Itoa(len(lockKeys)), strconv.Itoa(len(metas)), strconv.Itoa(len(triples) / 3), Now(opts.Now)}
	args = append(args, owner...)
	res, err := parseReply(rollbackScript.Exec(ctx, r.client, ks, args))
	if err != nil {
		return nil, Fail(ctx, op, key, err)
	}
	if err := res.refusal(); err != nil {
		return nil, &Error{Op: op, Key: key, Err: err}
	}
	code, err := res.code()
	i, _ := res.int(1)
	switch {
	case err != nil:
		return nil, &Error{Op: op, Key: key, Err: fmt.Errorf("unexpected rollback script reply: %w", err)}
	case code == codeLockLost && i >= 1 && int(i) <= len(locks):
		return nil, &Error{Op: op, Key: locks[i-1].Live, Err: ErrLockLost}
	case code == codeNoPrevious && i >= 1 && int(i) <= len(opts.Lives):
		return nil, &Error{Op: op, Key: opts.Lives[i-1], Err: fmt.Errorf("%w: publish with KeepPrevious to keep one, for as long as a rollback may be needed; nothing changed", ErrNothingToRollBack)}
	case code != codeOK || len(res) != 1+len(metas):
		return nil, &Error{Op: op, Key: key, Err: fmt.Errorf("unexpected rollback script reply %v", res)}
	}
	return res.ints(1)
}

// familyKeys returns the live buckets of the family prefix, of type kind,
// and those its prev keys would restore.
func (r Publisher) familyKeys(ctx context.Context, prefix, kind string) ([]string, error) {
	set := map[string]bool{}
	opts := scan.Options{Match: scan.EscapeGlob(prefix+":") + "*", Type: kind, InSlot: true, Slot: keys.Slot(prefix)}
	for page, err := range scan.Pages(ctx, r.client, opts) {
		if err != nil {
			return nil, fmt.Errorf("SCAN %s: %w", opts.Match, err)
		}
		for _, k := range page {
			if bucket, ok := strings.CutSuffix(k, keys.PrevSuffix); ok {
				if _, _, temp := keys.ParseTempKey(bucket); !temp && !keys.Reserved(bucket) {
					set[bucket] = true
				}
			} else if !keys.Reserved(k) && !strings.HasSuffix(k, keys.PrevSuffix+":swap") {
				set[k] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set)), nil
}

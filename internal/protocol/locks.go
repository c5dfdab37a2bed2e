package protocol

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// Lock is one held rebuild lock.
type Lock struct {
	// Live is the live key the lock guards.
	Live string
	// Key is the lock's Redis key.
	Key string
	// Token is the random value the lock holds while it is ours.
	Token string
	// TTL is the lock's lifetime; every extension resets it to TTL.
	TTL time.Duration
}

// NewToken returns 128 random bits as 32 hex characters.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Lock takes the rebuild lock of live with one SET NX EX and a fresh token:
// Familia's lock, for the single-key API. It never waits or retries. If
// another rebuild holds the lock, it returns an error matching
// [ErrInProgress] that names live. A SET whose reply was lost may have
// taken the lock: it is released on a [CleanupContext].
//
// On a cluster, without a group, for a live key whose base another live
// key can have (keys.Aliasable, SPEC C104), the SET goes in a script
// (lock.lua) that first checks the base's owner stamp, as [StampCheck]
// does: one naming another live key fails it with an error matching
// keys.ErrGroupConflict, one of another type with one matching
// [ErrTampered], nothing written either way.
func (r Locks) Lock(ctx context.Context, op, live string, ttl time.Duration) (*Lock, error) {
	if err := CheckKey(op, live); err != nil {
		return nil, err
	}
	secs, err := Seconds(op, live, "ttl", ttl)
	if err != nil {
		return nil, err
	}
	l := &Lock{Live: live, Key: r.LockKey(live), Token: NewToken(), TTL: ttl}
	if len(r.aliasable([]string{live})) > 0 {
		return r.lockStamped(ctx, op, l, keys.OwnerKey(live, r.cluster), secs)
	}
	err = r.client.Do(ctx, r.client.B().Set().Key(l.Key).Value(l.Token).Nx().ExSeconds(secs).Build()).Error()
	switch {
	case err == nil:
		return l, nil
	case rueidis.IsRedisNil(err):
		return nil, &Error{Op: op, Key: live, Err: ErrInProgress}
	case !IsServerReply(err):
		// The SET may have run before its reply was lost. The token is
		// ours alone, so compare-and-delete cannot hurt another lock.
		_ = r.ReleaseAfter(ctx, []*Lock{l}, nil)
	}
	return nil, Fail(ctx, op, live, err)
}

// lockStamped is Lock for a live key whose base's owner stamp is stamp:
// lock.lua checks the stamp and takes the lock in one step.
func (r Locks) lockStamped(ctx context.Context, op string, l *Lock, stamp string, secs int64) (*Lock, error) {
	res, err := parseReply(lockScript.Exec(ctx, r.client, []string{l.Key, stamp},
		[]string{l.Token, strconv.FormatInt(secs, 10), l.Live}))
	if err != nil {
		if !IsServerReply(err) {
			// The script may have run before its reply was lost: as in
			// Lock, the token is ours alone.
			_ = r.ReleaseAfter(ctx, []*Lock{l}, nil)
		}
		return nil, Fail(ctx, op, l.Live, err)
	}
	switch code, err := res.code(); {
	case err != nil:
	case code == codeOK:
		return l, nil
	case code == codeHeld:
		return nil, &Error{Op: op, Key: l.Live, Err: ErrInProgress}
	case code == codeOwned:
		return nil, &Error{Op: op, Key: l.Live, Err: ownerError(l.Live, stamp, res)}
	}
	return nil, &Error{Op: op, Key: l.Live, Err: fmt.Errorf("unexpected lock script reply %v", res)}
}

// Check is one right a rebuild needs: to run Command on Key.
type Check struct {
	Command, Key string
}

// AcquireOptions configures [Locks.Acquire].
type AcquireOptions struct {
	// Op and Key name the operation and the rebuild in errors.
	Op, Key string
	// Lives are the live keys to lock, under one token: a family's prefix
	// for a family, as Families says (nil: none is).
	Lives    []string
	Families []bool
	// Mode is the run's mode: ModeRebuild (Apply logs the changes to its
	// keys) or ModeRollback (Apply refuses them while it runs).
	Mode string
	// TTL is the locks' lifetime; a whole number of seconds.
	TTL time.Duration
	// Checks are the rights to check before anything is written, where the
	// server can check them (Redis 7). A Check with an empty Key is a
	// command without keys, such as MULTI.
	Checks []Check
	// Record is more field/value pairs for the record of the first lock:
	// the run's owner, options and status.
	Record []string
	// Stamp is what the acquire does with the owner stamps of the locks'
	// bases (SPEC C104); StampNone, the zero value: nothing.
	Stamp Stamp
}

// Stamp is what an acquire does with the owner stamp (keys.OwnerKey, SPEC
// C104) of each lock's base. It acts only outside a group, on a cluster,
// and for a live key whose base another live key can have
// (keys.Aliasable): elsewhere the base is the key's alone, and no stamp
// is read or written.
type Stamp int

const (
	// StampNone reads and writes no stamp.
	StampNone Stamp = iota
	// StampCheck refuses a base whose stamp names another live key, or
	// is of another type, and writes none: a run in RenameInPlace mode,
	// a rollback.
	StampCheck
	// StampSet checks as StampCheck does, and sets an absent stamp to the
	// lock's live key, without a TTL, in the same step: a run in
	// Generations mode, whose base keeps a pointer and a registry.
	StampSet
)

// stamps returns the owner stamps the acquire of locks reads, as opts.Stamp
// says, and the index in locks of each.
func (r Locks) stamps(opts AcquireOptions, locks []*Lock) (stamps []string, of []int) {
	if opts.Stamp == StampNone || r.cluster.Group != "" {
		// In a group the lock's base is the group's, one per live key;
		// the claim stamps the index's own.
		return nil, nil
	}
	for i, l := range locks {
		if keys.Aliasable(l.Live, r.cluster.Cluster) {
			stamps = append(stamps, keys.OwnerKey(l.Live, r.cluster))
			of = append(of, i)
		}
	}
	return stamps, of
}

// records returns the field/value pairs of each lock's record, for the
// acquire script: the schema version, the token, the mode and the keys;
// the first lock's with opts.Record, the others' naming the first.
func (opts AcquireOptions) records(locks []*Lock) [][]string {
	flags := func(fs []bool) string {
		b := make([]byte, len(fs))
		for i, f := range fs {
			b[i] = '0'
			if f {
				b[i] = '1'
			}
		}
		return string(b)
	}
	families := make([]bool, len(opts.Lives))
	copy(families, opts.Families)
	out := make([][]string, len(locks))
	for i, l := range locks {
		rec := []string{FieldVersion, RecordVersion, FieldToken, l.Token, FieldMode, opts.Mode}
		if i == 0 {
			rec = append(rec, FieldKeys, EncodeKeys(opts.Lives), FieldFamilies, flags(families))
			rec = append(rec, opts.Record...)
		} else {
			rec = append(rec, FieldPrimary, locks[0].Key,
				FieldKeys, EncodeKeys(opts.Lives[i:i+1]), FieldFamilies, flags(families[i:i+1]))
		}
		out[i] = rec
	}
	return out
}

// Acquire takes the rebuild locks of opts.Lives, all under one fresh token,
// and opens the run's record, in one script. It never waits or retries. It
// takes all of the locks or none: if another rebuild holds any of them, it
// returns an error matching [ErrInProgress] that names the first such live
// key. If the user may not run one of opts.Checks, it returns an error
// matching [ErrNoPermission] that names it.
//
// On a cluster, without a group, it reads the owner stamp of the base of
// each live key that another live key can share (keys.Aliasable, SPEC
// C104) before it takes any lock, as opts.Stamp says, and with StampSet
// sets an absent one to the lock's live key in the same step. A base
// stamped with another live key (on a cluster "X" and "{X}" share a base)
// fails it with an error matching keys.ErrGroupConflict that names both
// and the base, a stamp of another type with one matching [ErrTampered]
// that names it. Either way nothing changed.
//
// A script whose reply was lost may have run: its locks are released on a
// [CleanupContext], so that a cancelled ctx does not leave them held for
// their whole TTL. On a cluster every key must share one hash slot. The
// returned locks are in the order of opts.Lives.
func (r Locks) Acquire(ctx context.Context, opts AcquireOptions) ([]*Lock, error) {
	op, lives := opts.Op, opts.Lives
	if len(lives) == 0 {
		return nil, &Error{Op: op, Key: opts.Key, Err: errors.New("no keys to lock")}
	}
	for _, l := range lives {
		if err := CheckKey(op, l); err != nil {
			return nil, err
		}
	}
	secs, err := Seconds(op, opts.Key, "ttl", opts.TTL)
	if err != nil {
		return nil, err
	}
	if opts.Mode != ModeRebuild && opts.Mode != ModeRollback || len(opts.Record)%2 != 0 || len(opts.Families) > len(lives) {
		return nil, &Error{Op: op, Key: opts.Key, Err: fmt.Errorf("mode %q, %d record arguments, %d family flags for %d keys", opts.Mode, len(opts.Record), len(opts.Families), len(lives))}
	}
	token := NewToken()
	locks := make([]*Lock, len(lives))
	for i, l := range lives {
		locks[i] = &Lock{Live: l, Key: r.LockKey(l), Token: token, TTL: opts.TTL}
	}
	ks := runKeys(locks)
	if dup := FirstDuplicate(ks[:len(locks)]); dup != "" {
		return nil, &Error{Op: op, Key: opts.Key, Err: fmt.Errorf("lock key %q requested twice", dup)}
	}
	if err := r.SameSlot(op, opts.Key, ks...); err != nil {
		return nil, err
	}
	args := []string{token, strconv.FormatInt(secs, 10), strconv.Itoa(len(locks)), strconv.Itoa(len(opts.Checks))}
	stamps, of := r.stamps(opts, locks)
	ks = append(ks, stamps...)
	args = append(args, strconv.FormatBool(opts.Stamp == StampSet))
	for _, i := range of {
		args = append(args, lives[i])
	}
	for _, c := range opts.Checks {
		args = append(args, c.Command, c.Key)
	}
	for _, rec := range opts.records(locks) {
		args = append(args, strconv.Itoa(len(rec)/2))
		args = append(args, rec...)
	}
	res, err := parseReply(acquireScript.Exec(ctx, r.client, ks, args))
	if err != nil {
		// It may have run (a lost reply), or run in part (an error reply
		// from one of its commands): release what it may have taken.
		// Compare-and-delete on a token of ours alone harms no one.
		_ = r.ReleaseAfter(ctx, locks, nil)
		return nil, Fail(ctx, op, opts.Key, err)
	}
	if err := res.refusal(); err != nil {
		return nil, &Error{Op: op, Key: opts.Key, Err: err}
	}
	switch code, err := res.code(); {
	case err != nil:
		return nil, &Error{Op: op, Key: opts.Key, Err: fmt.Errorf("unexpected acquire script reply: %w", err)}
	case code == codeOK:
		return locks, nil
	case code == codeHeld:
		i, _ := res.int(1)
		if i >= 1 && int(i) <= len(locks) {
			return nil, &Error{Op: op, Key: locks[i-1].Live, Err: ErrInProgress}
		}
	case code == codeOwned:
		i, _ := res.int(1)
		if names(i, len(stamps)) {
			l := locks[of[i-1]].Live
			return nil, &Error{Op: op, Key: l, Err: ownerError(l, stamps[i-1], res)}
		}
	}
	return nil, &Error{Op: op, Key: opts.Key, Err: fmt.Errorf("unexpected acquire script reply %v", res)}
}

// ownerError returns the error of an OWNED reply res (acquire.lua,
// claim.lua) for live, whose base's owner stamp is stamp: one matching
// keys.ErrGroupConflict when the other live key of the base owns it, or
// ErrTampered when the stamp is of another type or names neither key.
func ownerError(live, stamp string, res reply) error {
	if kind := res.str(2); kind != "string" {
		return fmt.Errorf("%w: %s", ErrTampered, keys.OwnerTampered(stamp, kind, live))
	}
	owner := res.str(3)
	if alias := keys.Alias(live, keys.Base(live, true)); owner != alias {
		return fmt.Errorf("%w: %s", ErrTampered, keys.OwnerStray(stamp, owner, live, alias))
	}
	return keys.OwnerConflict(live, owner, stamp)
}

// runKeys returns the keys of a run's locks, then their records, then their
// logs, then the operator's requests next to the first lock: the KEYS of
// acquire, heartbeat and release.
func runKeys(locks []*Lock) []string {
	ks := make([]string, 0, 3*len(locks)+1)
	for _, l := range locks {
		ks = append(ks, l.Key)
	}
	for _, l := range locks {
		ks = append(ks, keys.RecordKey(l.Key))
	}
	for _, l := range locks {
		ks = append(ks, keys.LogKey(l.Key))
	}
	return append(ks, keys.CtlKey(locks[0].Key))
}

// Release deletes every lock of locks that still holds its token, with the
// record, the log of changes and the requests kept next to it, in one
// compare-and-delete
// script, and never a lock someone else holds. If another rebuild holds
// some lock, the others are still released and the error matches
// [ErrLockLost]. A lock already gone (it expired, or this release ran
// before and its reply was lost) leaves nothing to release. The locks must
// share one token.
func (r Locks) Release(ctx context.Context, locks []*Lock) error {
	_, err := r.release(ctx, locks, false)
	return err
}

// ReleaseAfter releases locks once a rebuild has ended with err, on a
// [CleanupContext], and returns the rebuild's result. A lock that is no
// longer ours needs no release: the rebuild's own error already says so. Any
// other release failure is joined onto err, or logged when err is nil, so
// that it never hides the result.
func (r Locks) ReleaseAfter(ctx context.Context, locks []*Lock, err error) error {
	ctx, cancel := CleanupContext(ctx)
	defer cancel()
	rerr := r.Release(ctx, locks)
	switch {
	case rerr == nil:
	case errors.Is(rerr, ErrLockLost):
		r.log.Debug("keyswap: lock was no longer ours at release", "key", locks[0].Live, "lock_key", locks[0].Key)
	case err != nil:
		err = errors.Join(err, rerr)
	default:
		r.log.Warn("keyswap: could not release rebuild locks; they expire by themselves",
			"key", locks[0].Live, "lock_key", locks[0].Key, "ttl", locks[0].TTL, "err", rerr)
	}
	return err
}

// release releases locks, and reads the receipt a publish fenced on them
// left, in one script, and reports whether there was one. settle marks the
// receipt as read instead of deleting it, so that a retry of this script
// after its own reply was lost still finds it.
func (r Locks) release(ctx context.Context, locks []*Lock, settle bool) (receipt bool, err error) {
	const op = "release"
	_, token, err := CheckLocks(op, locks)
	if err != nil {
		return false, err
	}
	ks := append(runKeys(locks), keys.ReceiptKey(locks[0].Key))
	if err := r.SameSlot(op, locks[0].Live, ks...); err != nil {
		return false, err
	}
	mode := "0"
	if settle {
		mode = "1"
	}
	res, err := releaseScript.Exec(ctx, r.client, ks, []string{token, strconv.Itoa(len(locks)), mode}).AsIntSlice()
	if err != nil {
		return false, Fail(ctx, op, locks[0].Live, err)
	}
	if len(res) != 3 {
		return false, &Error{Op: op, Key: locks[0].Live, Err: fmt.Errorf("unexpected release script reply %v", res)}
	}
	if res[1] > 0 {
		return res[2] == 1, &Error{Op: op, Key: locks[0].Live, Err: ErrLockLost}
	}
	return res[2] == 1, nil
}

// CheckLocks validates locks that are used together and returns their keys
// and their common token.
func CheckLocks(op string, locks []*Lock) (keys []string, token string, err error) {
	if len(locks) == 0 {
		return nil, "", &Error{Op: op, Err: errors.New("no locks")}
	}
	keys = make([]string, len(locks))
	for i, l := range locks {
		if err := CheckLock(op, l); err != nil {
			return nil, "", err
		}
		if l.Token != locks[0].Token {
			return nil, "", &Error{Op: op, Key: l.Live, Err: errors.New("locks used together must share one token")}
		}
		keys[i] = l.Key
	}
	return keys, locks[0].Token, nil
}

// CheckLock refuses a nil lock, or one that could not fence anything.
func CheckLock(op string, l *Lock) error {
	switch {
	case l == nil:
		return &Error{Op: op, Err: errors.New("nil lock")}
	case l.Key == "":
		return &Error{Op: op, Key: l.Live, Err: errors.New("lock has an empty key")}
	case l.Token == "":
		// An empty token is the publish script's "unfenced" sentinel: a
		// fence with a blank token would silently be none.
		return &Error{Op: op, Key: l.Live, Err: errors.New("lock token must be non-empty")}
	}
	return nil
}

// FirstDuplicate returns the first string that occurs twice in ss, or "".
func FirstDuplicate(ss []string) string {
	seen := make(map[string]bool, len(ss))
	for _, x := range ss {
		if seen[x] {
			return x
		}
		seen[x] = true
	}
	return ""
}

// IsServerReply reports whether err is an error reply from Redis (as
// opposed to a transport error or a cancelled context), after which the
// command certainly did not run.
func IsServerReply(err error) bool {
	_, ok := rueidis.IsRedisErr(err)
	return ok
}

package protocol

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// ErrNoRun reports that no run holds the lock of a key.
var ErrNoRun = errors.New("no rebuild in progress")

// ErrTooLate reports an operator's request for a run that has already
// published: nothing changed.
var ErrTooLate = errors.New("too late: the run already published")

// RunInfo is a run in progress, found from one of its keys.
type RunInfo struct {
	// Live is the key it was found from.
	Live string
	// Lock is the lock of the run's first key, next to which its record
	// lives, and Token the run's token.
	Lock, Token string
	// Record is the run's record: its owner, options and status; Ctl the
	// operator's requests, as HGETALL returns them (see ParseRequests).
	Record map[string]string
	Ctl    map[string]string
}

// FindRun returns the run holding live's lock, or an error matching
// ErrNoRun. Another run's key leads to that run's own record. On a cluster
// two live keys can share a lock (X and {X}, SPEC C104): a run whose
// record does not name live is another index's, and live has none.
func (r Operator) FindRun(ctx context.Context, live string) (RunInfo, error) {
	const op = "find"
	lock := r.LockKey(live)
	token, err := r.client.Do(ctx, r.client.B().Get().Key(lock).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return RunInfo{}, &Error{Op: op, Key: live, Err: ErrNoRun}
	}
	if err != nil {
		return RunInfo{}, Fail(ctx, op, live, err)
	}
	record, err := r.client.Do(ctx, r.client.B().Hgetall().Key(keys.RecordKey(lock)).Build()).AsStrMap()
	if err != nil {
		return RunInfo{}, Fail(ctx, op, live, err)
	}
	first := lock
	if p := record[FieldPrimary]; p != "" {
		first = p
		if record, err = r.client.Do(ctx, r.client.B().Hgetall().Key(keys.RecordKey(p)).Build()).AsStrMap(); err != nil {
			return RunInfo{}, Fail(ctx, op, live, err)
		}
	}
	if record[FieldToken] != token {
		return RunInfo{}, &Error{Op: op, Key: live, Err: fmt.Errorf("%w: the lock is held, but not by a run that keeps a record (a store lock, or a run ending)", ErrNoRun)}
	}
	if ks, err := DecodeKeys(record[FieldKeys]); err == nil && len(ks) > 0 && !slices.Contains(ks, live) {
		return RunInfo{}, &Error{Op: op, Key: live, Err: fmt.Errorf("%w: its lock is held by the rebuild of %s, another index with the same base", ErrNoRun, strings.Join(ks, ", "))}
	}
	ctl, err := r.client.Do(ctx, r.client.B().Hgetall().Key(keys.CtlKey(first)).Build()).AsStrMap()
	if err != nil {
		return RunInfo{}, Fail(ctx, op, live, err)
	}
	return RunInfo{Live: live, Lock: first, Token: token, Record: record, Ctl: ctl}, nil
}

// Control records an operator's request (field/value pairs: cancel,
// max_rate, paused, action) in run's requests ("<lock>:ctl"), fenced by its
// token: it fails with an error matching ErrNoRun if that run no longer
// holds its lock, and with one matching ErrTooLate if it has published.
func (r Operator) Control(ctx context.Context, run RunInfo, fields ...string) error {
	const op = "control"
	if len(fields) == 0 || len(fields)%2 != 0 {
		return &Error{Op: op, Key: run.Live, Err: fmt.Errorf("%d arguments: want field/value pairs", len(fields))}
	}
	ks := []string{run.Lock, keys.RecordKey(run.Lock), keys.CtlKey(run.Lock), keys.ReceiptKey(run.Lock)}
	res, err := parseReply(controlScript.Exec(ctx, r.client, ks, append([]string{run.Token}, fields...)))
	if err != nil {
		return Fail(ctx, op, run.Live, err)
	}
	switch code, _ := res.code(); code {
	case codeOK:
		return nil
	case codeLockLost:
		return &Error{Op: op, Key: run.Live, Err: fmt.Errorf("%w: the run ended, or another took its lock", ErrNoRun)}
	case codeTooLate:
		return &Error{Op: op, Key: run.Live, Err: ErrTooLate}
	}
	return &Error{Op: op, Key: run.Live, Err: fmt.Errorf("unexpected control script reply %v", res)}
}

package protocol

import (
	"context"
	"fmt"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
)

// A run in Generations mode whose keys are not all in its locks' slot (a
// cluster's family without a hash tag) cannot replay the tail of its logs
// in its flip, which runs in that slot: every change logged for it must be
// replayed before the flip, which refuses otherwise. Under a steady stream
// of Apply the log grows between the run's last catch-up and its flip, and
// the flip would be refused again and again. So the run cuts over: it sets
// a mark next to each lock (keys.CutOverKey), holding its token, with a PX
// deadline; genapply.lua and genlog.lua answer a change for the indexes of
// a lock whose mark holds the lock's token with WAIT, writing nothing, so
// the log stops growing while the run drains it and flips. The flip
// deletes the marks in its atomic step; a run that dies before it leaves
// them to their PX (and Apply ignores a mark once the lock no longer holds
// its token). Apply waits and applies the change again, within its ctx and
// at most CutOverWait in all.

// CutOverWait bounds the time one Apply waits, in all, for cut-over marks:
// past it, the change fails with ErrInProgress, nothing written.
const CutOverWait = 10 * time.Second

// cutOverPoll bounds the pause between two tries of a change that found a
// cut-over mark: the flip usually deletes the mark well before its PX.
const (
	cutOverPollMin = time.Millisecond
	cutOverPollMax = 20 * time.Millisecond
)

// cutOverError is decode's error for the WAIT reply: the run holding lock
// is cutting over, for at most left more.
type cutOverError struct {
	lock string
	left time.Duration
}

func (e *cutOverError) Error() string {
	return fmt.Sprintf("the run holding %s is cutting over to its flip (for at most %v more)", e.lock, e.left)
}

// cutOverWaiter is the wait of one change for cut-over marks.
type cutOverWaiter struct {
	waited time.Duration
	pause  time.Duration
}

// wait waits after a cut-over's WAIT, co, and returns nil when the change
// is to be applied again; else (ctx ended, or CutOverWait in all) the
// error to return, nothing applied.
func (w *cutOverWaiter) wait(ctx context.Context, op, key string, co *cutOverError) error {
	if w.waited >= CutOverWait {
		return &Error{Op: op, Key: key, Err: fmt.Errorf("%w: %v, and this change waited %v for it in all; nothing applied: apply it again", ErrInProgress, co, w.waited)}
	}
	w.pause = min(max(cutOverPollMin, 2*w.pause), cutOverPollMax, max(co.left, cutOverPollMin), CutOverWait-w.waited)
	t := time.NewTimer(w.pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return Fail(ctx, op, key, fmt.Errorf("while waiting for a cut-over (%v), nothing applied: %w", co, context.Cause(ctx)))
	case <-t.C:
	}
	w.waited += w.pause
	return nil
}

// SetCutOver sets the cut-over mark of each of locks to its token, for px:
// Apply waits while it is set (see CutOverWait), and the flip deletes it.
// A mark left by a run that dies goes at its PX.
func (r Generations) SetCutOver(ctx context.Context, op, key string, locks []*Lock, px time.Duration) error {
	for _, l := range locks {
		mark := keys.CutOverKey(l.Key)
		if err := r.client.Do(ctx, r.client.B().Set().Key(mark).Value(l.Token).Px(px).Build()).Error(); err != nil {
			return Fail(ctx, op, key, fmt.Errorf("SET %s: %w", mark, err))
		}
	}
	return nil
}

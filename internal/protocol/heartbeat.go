package protocol

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// Control is what an operator asked of a run, read from its requests
// ("<lock>:ctl") by every heartbeat, and the counts of its logs.
type Control struct {
	// Cancel: end the run ("keyswap cancel").
	Cancel bool
	// Rate is the most items per second the run may pull, the requests'
	// max_rate; zero is no limit ("keyswap throttle").
	Rate float64
	// Paused: stop pulling the source, keep the lease ("keyswap pause").
	Paused bool
	// Action is a decision on a held publish: "publish" or "discard".
	Action string
	// Logs are the counts of each lock's log of changes, read in one step.
	Logs []LogCount
}

// Heartbeat is one renewal of a run's lease.
type Heartbeat struct {
	// Locks are the run's locks; the record is the first one's.
	Locks []*Lock
	// Acked is the number of the run's batches Redis acknowledged when the
	// heartbeat was sent: the record must hold at least as many.
	Acked int64
	// Status is field/value pairs for the run's record.
	Status []string
	// Seen is the highest count of each lock's log the run had seen when
	// the heartbeat was sent ([Logs.Seen]), for Control.Logs; nil is none.
	Seen []int64
}

// call validates h and returns its keys and args.
func (h Heartbeat) call(r *Core) (ks, args []string, err error) {
	const op = "lease"
	_, token, err := CheckLocks(op, h.Locks)
	if err != nil {
		return nil, nil, err
	}
	secs, err := Seconds(op, h.Locks[0].Live, "lock TTL", h.Locks[0].TTL)
	if err != nil {
		return nil, nil, err
	}
	ks = runKeys(h.Locks)
	if err := r.SameSlot(op, h.Locks[0].Live, ks...); err != nil {
		return nil, nil, err
	}
	args = append([]string{token, strconv.FormatInt(secs, 10), strconv.Itoa(len(h.Locks)), strconv.FormatInt(h.Acked, 10)}, h.Status...)
	return ks, args, nil
}

// Beat sends h alone.
func (r Lease) Beat(ctx context.Context, h Heartbeat) (Control, error) {
	ks, args, err := h.call(r.Core)
	if err != nil {
		return Control{}, err
	}
	return r.beatReply(ctx, h, heartbeatScript.Exec(ctx, r.client, ks, args))
}

// BeatCommand returns h as a command for the caller's own DoMulti, next to
// a batch's writes, so that the heartbeat costs no extra round trip. Pass
// its reply to [Lease.BeatReply].
func (r Lease) BeatCommand(h Heartbeat) (rueidis.Completed, error) {
	ks, args, err := h.call(r.Core)
	if err != nil {
		return rueidis.Completed{}, err
	}
	return heartbeatScript.command(r.client.B(), ks, args), nil
}

// BeatReply interprets the reply to a [Lease.BeatCommand] as [Lease.Beat]
// does. rueidis falls back from EVALSHA to EVAL only for commands sent
// alone, so when the server had no cached copy of the script (NOSCRIPT:
// first use, SCRIPT FLUSH, a restarted server) BeatReply sends the
// heartbeat again alone. The script only compares and extends, so running
// it twice is harmless.
func (r Lease) BeatReply(ctx context.Context, h Heartbeat, res rueidis.RedisResult) (Control, error) {
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		return r.Beat(ctx, h)
	}
	return r.beatReply(ctx, h, res)
}

// beatReply reads the heartbeat script's reply.
func (r Lease) beatReply(ctx context.Context, h Heartbeat, res rueidis.RedisResult) (Control, error) {
	const op = "lease"
	live := h.Locks[0].Live
	rep, err := parseReply(res)
	if err != nil {
		return Control{}, Fail(ctx, op, live, err)
	}
	code, err := rep.code()
	if err != nil {
		return Control{}, &Error{Op: op, Key: live, Err: err}
	}
	switch code {
	case codeLockLost:
		if i, _ := rep.int(1); i >= 1 && int(i) <= len(h.Locks) {
			return Control{}, &Error{Op: op, Key: h.Locks[i-1].Live, Err: ErrLockLost}
		}
	case codeWritesLost:
		have, _ := rep.int(1)
		return Control{}, &Error{Op: op, Key: live, Err: writesLost(have, h.Acked)}
	case codeNoRecord, codeTampered:
		if i, _ := rep.int(1); i >= 1 && int(i) <= len(h.Locks) {
			return Control{}, &Error{Op: op, Key: live, Err: recordError(code, keys.RecordKey(h.Locks[i-1].Key))}
		}
	case codeOK:
		if len(rep) != 6+2*len(h.Locks) {
			break
		}
		rate, _ := strconv.ParseFloat(rep.str(3), 64)
		if !(rate > 0) {
			rate = 0
		}
		counts, err := rep.ints(6)
		if err != nil {
			break
		}
		logs := make([]LogCount, len(h.Locks))
		for i := range logs {
			logs[i] = LogCount{Logged: counts[2*i], Len: counts[2*i+1]}
			if i < len(h.Seen) {
				logs[i].Seen = h.Seen[i]
			}
		}
		return Control{Cancel: rep.str(2) != "", Rate: rate, Paused: rep.str(4) != "", Action: rep.str(5), Logs: logs}, nil
	}
	return Control{}, &Error{Op: op, Key: live, Err: fmt.Errorf("unexpected heartbeat script reply %v", rep)}
}

// RecordError describes a run's record found gone, or without its token
// (an error matching ErrWritesLost), or carrying another token than the
// run's (forged: one matching ErrTampered).
func RecordError(record string, forged bool) error {
	if forged {
		return recordError(codeTampered, record)
	}
	return recordError(codeNoRecord, record)
}

// recordError describes record, found gone (codeNoRecord) or carrying
// another token (codeTampered).
func recordError(code int64, record string) error {
	if code == codeNoRecord {
		return fmt.Errorf("%w: the run's record %s is gone, or lost and re-created without its token (evicted?), with the counts it kept of the run's writes and of the changes logged for it; every live key left unchanged", ErrWritesLost, record)
	}
	return fmt.Errorf("%w: the run's record %s carries another token than the run's: it was overwritten, and changes applied meanwhile may not have been logged; every live key left unchanged (and holds every change)", ErrTampered, record)
}

// writesLost describes a record that holds have batches where the run
// wrote want.
func writesLost(have, want int64) error {
	return fmt.Errorf("%w: Redis acknowledged %d batches of this run but holds %d (a failover to a replica that was behind, or a restart from an older snapshot or AOF); every live key left unchanged", ErrWritesLost, want, have)
}

// Now returns the time as Redis hashes record: milliseconds since the epoch.
func Now(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

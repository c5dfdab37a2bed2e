package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	// krun, as main has a function named run.
	krun "github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

// A run of rebuild.Rebuilder keeps a record next to the lock of its first
// key, "<lock>:run": a hash holding its token, its keys and owner, and the
// status its heartbeats write, which only the run writes. The operator's
// requests go into a hash of their own next to it, "<lock>:ctl", which
// every heartbeat reads: the commands here read the record, and write
// requests with protocol.Control, fenced by the token they read.

// runRecord is a run's record, parsed.
type runRecord struct {
	// Lock is the lock of the run's first key, next to which the record
	// lives; Token the run's token.
	Lock, Token string
	// Keys are the run's builder keys (a family's prefix for a family),
	// and Families says which are families.
	Keys     []string
	Families []bool
	// Suffix ends every temp key of the run: keys.Base(live)+Suffix, or
	// "<bucket>"+Suffix for a bucket of a family. "" for a lock held by a
	// rollback, which builds nothing.
	Suffix string
	Host   string
	PID    int64
	// Started is when the run took its locks; LeaseSeconds its lease.
	Started      time.Time
	LeaseSeconds int64
	// Expected is the number of items expected (0: unknown).
	Expected int64
	Phase    string
	// Items pulled from the source, entries written, batches acknowledged.
	Items, Entries, Acked int64
	// Rate is items per second since the start; Limit the run's limit now
	// (0: none).
	Rate, Limit float64
	// RateNow is the current rate: items per second over about the last
	// five seconds; nil for a run of an older keyswap, which does not
	// write it.
	RateNow *float64
	// Latency is the 90th percentile of the last window of the run's
	// probes, when it has a latency budget (rebuild.Options.LatencyBudget);
	// 0 otherwise.
	Latency time.Duration
	// ETASeconds is the time left to build, when Expected is known; nil
	// otherwise.
	ETASeconds *int64
	// BeatAt is the last heartbeat, ProgressAt the last item pulled: zero
	// before the first heartbeat.
	BeatAt, ProgressAt time.Time
	// Changes logged for the run, and replayed onto its temp keys.
	Changes, Replayed int64
	Requests          runRequests
}

// runRequests are the operator's requests pending for a run.
type runRequests struct {
	Cancel  bool
	MaxRate float64 // 0: none
	Paused  bool
	Action  string // "publish", "discard", or ""
}

// The request fields, which the heartbeat reads (heartbeat.lua).
const (
	requestCancel  = krun.CtlCancel
	requestMaxRate = krun.CtlMaxRate
	requestPaused  = krun.CtlPaused
	requestAction  = krun.CtlAction
)

// phaseHeld is the phase of a held run (rebuild.PhaseHeld): built, waiting
// for a decision.
const phaseHeld = "held"

// parseRecord parses the record rec of the run holding lock, with the
// requests ctl. A record of a version this keyswap does not know shows
// that as its phase, and nothing else of it; a field that is not as
// keyswap writes it is read as zero, and the error names it.
func parseRecord(lock string, rec, ctl map[string]string) (runRecord, error) {
	p, err := krun.ParseRecord(rec)
	if errors.Is(err, krun.ErrRecordVersion) {
		return runRecord{Lock: lock, Token: rec[krun.FieldToken], Phase: unknownVersion + strconv.Quote(p.Version) + ": upgrade keyswap"}, err
	}
	r := runRecord{
		Lock: lock, Token: p.Token, Keys: p.Keys, Families: p.Families, Suffix: p.Suffix, Host: p.Host, Phase: p.Phase,
		PID: p.PID, Started: p.Started, LeaseSeconds: int64(p.TTL / time.Second), Expected: p.Expected,
		Items: p.Items, Entries: p.Entries, Acked: p.Acked, Rate: p.Rate, RateNow: p.RateNow, Limit: p.Limit, Latency: p.Latency,
		BeatAt: p.BeatAt, ProgressAt: p.ProgressAt, Changes: p.Changes, Replayed: p.Replayed,
		Requests: runRequests(krun.ParseRequests(ctl, p.Token)),
	}
	if p.ETA != nil {
		eta := int64(*p.ETA / time.Second)
		r.ETASeconds = &eta
	}
	return r, err
}

// unknownVersion starts the phase shown for a record of a version this
// keyswap does not know.
const unknownVersion = "unknown record version "

// atoi parses a decimal integer of a record, 0 when absent or malformed.
func atoi(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// fromMillis parses a time in milliseconds since the epoch, as records and
// metas keep it; the zero time when absent or malformed.
func fromMillis(s string) time.Time {
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// describe names the run in messages: its keys, owner and token prefix.
func (r runRecord) describe() string {
	ks := make([]string, len(r.Keys))
	for i, k := range r.Keys {
		ks[i] = displayKey(k)
	}
	what := "rebuild of " + strings.Join(ks, ", ")
	if len(ks) == 0 {
		what = "run holding " + displayKey(r.Lock)
	}
	return fmt.Sprintf("%s (host %s, pid %d, token %s)", what, displayKey(r.Host), r.PID, prefix(r.Token, tokenPrefixLen))
}

// findRun returns the record of the rebuild in progress that holds key's
// lock, through any of the run's keys. When there is none, or the lock is
// held by something that takes no requests (store.WithRebuild, a
// rollback), it returns an error matching protocol.ErrNoRun.
func findRun(ctx context.Context, rr *krun.Redis, key string) (krun.RunInfo, runRecord, error) {
	info, err := rr.Operator.FindRun(ctx, key)
	if err != nil {
		var e *krun.Error
		if errors.Is(err, krun.ErrNoRun) && errors.As(err, &e) {
			return info, runRecord{}, fmt.Errorf("%s: %w", displayKey(key), e.Err)
		}
		return info, runRecord{}, err
	}
	rec, err := parseRecord(info.Lock, info.Record, info.Ctl)
	if err != nil {
		return info, rec, fmt.Errorf("%s: the record of the run holding its lock: %w", displayKey(key), err)
	}
	if rec.Suffix == "" {
		return info, rec, fmt.Errorf("%s: %w: its lock is held by a %s, which takes no requests", displayKey(key), krun.ErrNoRun, phaseOr(rec.Phase, "run"))
	}
	return info, rec, nil
}

// phaseOr returns phase, or def when it is empty.
func phaseOr(phase, def string) string {
	if phase == "" {
		return def
	}
	return phase
}

// errNotHeld reports that a command meant for a held run found a run in
// another phase: exit status exitConflict.
var errNotHeld = errors.New("the rebuild is not held")

// requireHeld returns an error matching errNotHeld unless rec is a held run.
// cmd names the command in the message.
func requireHeld(cmd, key string, rec runRecord) error {
	if rec.Phase == phaseHeld {
		return nil
	}
	return fmt.Errorf("%s %s: %w: its phase is %q; %s acts on a run that rebuild.Rebuilder.Build holds before its publish (phase %q)",
		cmd, displayKey(key), errNotHeld, phaseOr(rec.Phase, "unknown"), cmd, phaseHeld)
}

// generation is an index's generation, from its meta ("<base>:rebuild-gen"),
// which every publish advances.
type generation struct {
	// Gen is the generation live now; Seq the last one published (a
	// rollback sets Gen back, not Seq).
	Gen, Seq int64
	// At is when Gen became live: its publish, or the rollback.
	At time.Time
	// Prev is the generation kept for a rollback (nil: none), until
	// PrevUntil.
	Prev      *int64
	PrevUntil time.Time
	// RolledBack is the time of the last rollback, if any.
	RolledBack time.Time
	// Family reports that the index is a family of keys, of type
	// FamilyType ("set", say), which the publish recorded in the meta.
	Family     bool
	FamilyType string
}

// parseMeta parses a meta; ok is false when there is none.
func parseMeta(m map[string]string) (g generation, ok bool) {
	if m["gen"] == "" && m["seq"] == "" {
		return generation{}, false
	}
	g = generation{Gen: atoi(m["gen"]), Seq: atoi(m["seq"]), At: fromMillis(m["at"]),
		RolledBack: fromMillis(m["rolled_back"]), Family: m["family"] != "", FamilyType: m["family"]}
	if p, err := strconv.ParseInt(m["prev"], 10, 64); err == nil {
		g.Prev = &p
		g.PrevUntil = fromMillis(m["prev_until"])
	}
	return g, true
}

// readGenerations returns the generation of each of lives (nil where none
// was recorded), with one pipelined HGETALL per meta.
func readGenerations(ctx context.Context, client rueidis.Client, lives []string) ([]*generation, error) {
	return readGroupGenerations(ctx, client, "", lives)
}

// readGroupGenerations is readGenerations for indexes in group (none when
// empty).
func readGroupGenerations(ctx context.Context, client rueidis.Client, group string, lives []string) ([]*generation, error) {
	cluster := namesOf(client, group)
	cmds := make(rueidis.Commands, len(lives))
	for i, l := range lives {
		cmds[i] = client.B().Hgetall().Key(keys.MetaKey(l, cluster)).Build()
	}
	out := make([]*generation, len(lives))
	for i, res := range client.DoMulti(ctx, cmds...) {
		m, err := res.AsStrMap()
		if err != nil {
			return nil, fmt.Errorf("HGETALL %s: %w", displayKey(keys.MetaKey(lives[i], cluster)), err)
		}
		if g, ok := parseMeta(m); ok {
			out[i] = &g
		}
	}
	return out, nil
}

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
	krun "github.com/keyswap/keyswap/internal/run"
	"github.com/redis/rueidis"
)

// A run of rebuild.Rebuilder keeps a record next to the lock of its first
// key, "<lock>:run": a hash holding its token, its keys and owner, the
// status its heartbeats write, and the operator's requests, which every
// heartbeat reads. The commands here read that record and write requests
// into it with run.Control, fenced by the token they read.

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

// runRequests are the operator's requests pending in a run's record.
type runRequests struct {
	Cancel  bool
	MaxRate float64 // 0: none
	Paused  bool
	Action  string // "publish", "discard", or ""
}

// The record's request fields, which the heartbeat reads (heartbeat.lua).
const (
	requestCancel  = "cancel"
	requestMaxRate = "max_rate"
	requestPaused  = "paused"
	requestAction  = "action"
)

// phaseHeld is the phase of a held run (rebuild.PhaseHeld): built, waiting
// for a decision.
const phaseHeld = "held"

// parseRecord parses the record rec of the run holding lock.
func parseRecord(lock string, rec map[string]string) runRecord {
	r := runRecord{
		Lock: lock, Token: rec["token"], Suffix: rec["suffix"], Host: rec["host"], Phase: rec["phase"],
		PID: atoi(rec["pid"]), Started: fromMillis(rec["started"]), LeaseSeconds: atoi(rec["ttl"]),
		Expected: atoi(rec["expected"]), Items: atoi(rec["items"]), Entries: atoi(rec["entries"]), Acked: atoi(rec["acked"]),
		Rate: atof(rec["rate"]), Limit: atof(rec["limit"]), Latency: time.Duration(atoi(rec["latency_us"])) * time.Microsecond,
		BeatAt: fromMillis(rec["beat_at"]), ProgressAt: fromMillis(rec["progress_at"]),
		Changes: atoi(rec["changes"]), Replayed: atoi(rec["replayed"]),
		Requests: runRequests{
			Cancel: rec[requestCancel] != "", MaxRate: atof(rec[requestMaxRate]),
			Paused: rec[requestPaused] != "", Action: rec[requestAction],
		},
	}
	if ks := rec["keys"]; ks != "" {
		r.Keys = strings.Split(ks, "\n")
		r.Families = make([]bool, len(r.Keys))
		for i := range r.Keys {
			r.Families[i] = i < len(rec["families"]) && rec["families"][i] == '1'
		}
	}
	if eta, err := strconv.ParseInt(rec["eta"], 10, 64); err == nil {
		r.ETASeconds = &eta
	}
	return r
}

// atoi parses a decimal integer of a record, 0 when absent or malformed.
func atoi(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// atof parses a number of a record, 0 when absent or malformed.
func atof(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64)
	return f
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
// rollback), it returns an error matching run.ErrNoRun.
func findRun(ctx context.Context, rr *krun.Redis, key string) (krun.RunInfo, runRecord, error) {
	info, err := rr.FindRun(ctx, key)
	if err != nil {
		var e *krun.Error
		if errors.Is(err, krun.ErrNoRun) && errors.As(err, &e) {
			return info, runRecord{}, fmt.Errorf("%s: %w", displayKey(key), e.Err)
		}
		return info, runRecord{}, err
	}
	rec := parseRecord(info.Lock, info.Record)
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
	cluster := client.Mode() == rueidis.ClientModeCluster
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

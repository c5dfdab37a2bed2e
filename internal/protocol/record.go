package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The state of a run in Redis, in one place. A run holding the lock L
// (keys.LockKey of a live key, "<base>:rebuild-lock") keeps, in L's slot:
//
//   - L: the run's token (SET NX EX), as Familia's lock.
//   - L:run, the run's record (keys.RecordKey): a hash that only the run
//     writes, and, for the counters logged and work, Apply. It has the
//     fields below. Each lock of a run has a record of its own: the first
//     lock's holds the run's owner, options and status; another lock's
//     names the first (primary). Every record holds the counters of its own
//     lock's log.
//   - L:ctl, the operator's requests (keys.CtlKey): a hash that only the
//     control commands write, with the token of the run they meant, fenced
//     by the lock and the record. The run reads it at every heartbeat, and
//     ignores it unless its token is the run's. Only the first lock has one.
//   - L:log, the log of changes (keys.LogKey), and L:done, the publish's
//     receipt (keys.ReceiptKey).
//
// The Lua scripts name the same fields as literal strings; a test checks
// that each of them is one of the names here.

// RecordVersion is the version of the record's schema this keyswap writes
// and reads. A record without a version is one of an older keyswap (v1),
// whose apply script logged changes without counting them. A process that
// finds a version it does not know refuses to act on the run.
const RecordVersion = "2"

// The fields of a run's record.
const (
	FieldVersion = "v"       // RecordVersion
	FieldToken   = "token"   // the run's token, as its locks hold it
	FieldPrimary = "primary" // on the record of a lock but the first: the first lock's key
	FieldMode    = "mode"    // ModeRebuild or ModeRollback
	// FieldKeys is the live keys (a family's prefix for a family) as
	// EncodeKeys writes them: on the first lock's record, every key of the
	// run; on another lock's record, that lock's own key. Either way the
	// first key is the lock's own.
	FieldKeys = "keys"
	// FieldFamilies has one character per key of FieldKeys: '1' for a
	// family, '0' for a plain key.
	FieldFamilies = "families"
	FieldSuffix   = "suffix"   // every temp key of the run ends with it
	FieldHost     = "host"     // the run's owner
	FieldPID      = "pid"      //
	FieldStarted  = "started"  // when the run took its locks, in ms since the epoch
	FieldTTL      = "ttl"      // the lease, in seconds
	FieldExpected = "expected" // the items the source will yield; 0: unknown
	// FieldBatches counts the batches that reached Redis: every batch's
	// MULTI/EXEC advances it.
	FieldBatches = "batches"
	// FieldLogged counts the entries Apply appended to this lock's log,
	// and FieldWork their ops and arguments, advanced by the apply script
	// in the same step as the append.
	FieldLogged = "logged"
	FieldWork   = "work"
	// FieldWaits counts the durability waits; a wait's write, which WAIT
	// then counts from.
	FieldWaits = "waits"
	// The status the heartbeat writes.
	FieldPhase      = "phase"
	FieldItems      = "items"
	FieldEntries    = "entries"
	FieldAcked      = "acked"
	FieldRate       = "rate"
	FieldBeatAt     = "beat_at"
	FieldProgressAt = "progress_at"
	FieldLimit      = "limit"
	FieldLatency    = "latency_us"
	FieldETA        = "eta"
	FieldChanges    = "changes"
	FieldReplayed   = "replayed"
	// FieldRate is the average rate since the start, in items/s, and
	// FieldRateNow the current rate: over about the last five seconds. A
	// record of an older keyswap has no current rate.
	FieldRateNow = "rate_now"
)

// The modes of a run.
const (
	// ModeRebuild is a Rebuilder's run: Apply logs the changes to its keys,
	// and the run replays them.
	ModeRebuild = "rebuild"
	// ModeRollback is a rollback's: it logs nothing, so Apply refuses
	// changes to its keys while it holds them.
	ModeRollback = "rollback"
)

// The fields of the operator's requests ("<lock>:ctl").
const (
	CtlToken   = "token"    // the token of the run the requests are for
	CtlCancel  = "cancel"   // non-empty: end the run
	CtlMaxRate = "max_rate" // the most items per second; "": no limit
	CtlPaused  = "paused"   // non-empty: pull nothing from the source
	CtlAction  = "action"   // a held run's decision: "publish" or "discard"
)

// The fields of a live key's meta ("<base>:rebuild-gen"), which the
// publish and rollback scripts write.
const (
	MetaGen        = "gen"
	MetaSeq        = "seq"
	MetaAt         = "at"
	MetaFamily     = "family"
	MetaPrev       = "prev"
	MetaPrevUntil  = "prev_until"
	MetaRolledBack = "rolled_back"
)

// RecordFields, CtlFields and MetaFields list the field names above.
var (
	RecordFields = []string{FieldVersion, FieldToken, FieldPrimary, FieldMode, FieldKeys, FieldFamilies,
		FieldSuffix, FieldHost, FieldPID, FieldStarted, FieldTTL, FieldExpected, FieldBatches, FieldLogged,
		FieldWork, FieldWaits, FieldPhase, FieldItems, FieldEntries, FieldAcked, FieldRate, FieldRateNow, FieldBeatAt,
		FieldProgressAt, FieldLimit, FieldLatency, FieldETA, FieldChanges, FieldReplayed}
	CtlFields  = []string{CtlToken, CtlCancel, CtlMaxRate, CtlPaused, CtlAction}
	MetaFields = []string{MetaGen, MetaSeq, MetaAt, MetaFamily, MetaPrev, MetaPrevUntil, MetaRolledBack}
)

// ErrRecordVersion reports a record of a schema version this keyswap does
// not know: written by a newer keyswap. Nothing of it is read.
var ErrRecordVersion = errors.New("the run's record has a version this keyswap does not know; upgrade keyswap")

// Record is a run's record, parsed.
type Record struct {
	// Version is RecordVersion, or "" for a record of an older keyswap
	// (v1), which ParseRecord reads as far as it can.
	Version string
	Token   string
	Primary string
	Mode    string
	// Keys are the live keys, and Families says which are families.
	Keys     []string
	Families []bool
	Suffix   string
	Host     string
	PID      int64
	Started  time.Time
	TTL      time.Duration
	Expected int64
	// The counters.
	Batches, Logged, Work int64
	// The status.
	Phase                 string
	Items, Entries, Acked int64
	Rate, Limit           float64
	RateNow               *float64 // nil: unknown (an older keyswap's run)
	BeatAt, ProgressAt    time.Time
	Latency               time.Duration
	ETA                   *time.Duration // nil: unknown
	Changes, Replayed     int64
}

// ParseRecord parses a record as HGETALL returns it. A field that is not as
// keyswap writes it gives an error naming the field; a version this
// keyswap does not know gives an error matching ErrRecordVersion, with the
// version (and nothing else) in the Record. Absent fields are zero.
func ParseRecord(h map[string]string) (Record, error) {
	r := Record{Version: h[FieldVersion], Token: h[FieldToken], Primary: h[FieldPrimary], Mode: h[FieldMode],
		Suffix: h[FieldSuffix], Host: h[FieldHost], Phase: h[FieldPhase]}
	switch r.Version {
	case RecordVersion:
	case "":
		// v1: keys joined by "\n", no mode (every run was a Rebuilder's or
		// a rollback's, without counters).
	default:
		return Record{Version: r.Version}, fmt.Errorf("%w: version %q (this keyswap knows %q)", ErrRecordVersion, r.Version, RecordVersion)
	}
	var errs []error
	field := func(name string, parse func(string) error) {
		if v, ok := h[name]; ok && v != "" {
			if err := parse(v); err != nil {
				errs = append(errs, fmt.Errorf("record field %q: %q %w", name, v, err))
			}
		}
	}
	integer := func(dst *int64) func(string) error {
		return func(s string) error {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return errors.New("is not an integer")
			}
			*dst = n
			return nil
		}
	}
	float := func(dst *float64) func(string) error {
		return func(s string) error {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return errors.New("is not a number")
			}
			*dst = f
			return nil
		}
	}
	millis := func(dst *time.Time) func(string) error {
		var ms int64
		parse := integer(&ms)
		return func(s string) error {
			if err := parse(s); err != nil || ms <= 0 {
				return errors.New("is not a time in milliseconds since the epoch")
			}
			*dst = time.UnixMilli(ms).UTC()
			return nil
		}
	}
	field(FieldKeys, func(s string) error {
		var err error
		if r.Version == "" {
			r.Keys = strings.Split(s, "\n")
		} else if r.Keys, err = DecodeKeys(s); err != nil {
			return err
		}
		return nil
	})
	field(FieldFamilies, func(s string) error {
		if strings.Trim(s, "01") != "" {
			return errors.New("is not a '0' or '1' per key")
		}
		return nil
	})
	if len(r.Keys) > 0 {
		f := h[FieldFamilies]
		if len(f) != len(r.Keys) && r.Version != "" {
			errs = append(errs, fmt.Errorf("record field %q: %q has %d flags for %d keys", FieldFamilies, f, len(f), len(r.Keys)))
		}
		r.Families = make([]bool, len(r.Keys))
		for i := range r.Keys {
			r.Families[i] = i < len(f) && f[i] == '1'
		}
	}
	var ttl, eta, latency int64
	field(FieldPID, integer(&r.PID))
	field(FieldStarted, millis(&r.Started))
	field(FieldTTL, integer(&ttl))
	field(FieldExpected, integer(&r.Expected))
	field(FieldBatches, integer(&r.Batches))
	field(FieldLogged, integer(&r.Logged))
	field(FieldWork, integer(&r.Work))
	field(FieldItems, integer(&r.Items))
	field(FieldEntries, integer(&r.Entries))
	field(FieldAcked, integer(&r.Acked))
	field(FieldRate, float(&r.Rate))
	field(FieldLimit, float(&r.Limit))
	field(FieldRateNow, func(s string) error {
		var f float64
		if err := float(&f)(s); err != nil {
			return err
		}
		r.RateNow = &f
		return nil
	})
	field(FieldBeatAt, millis(&r.BeatAt))
	field(FieldProgressAt, millis(&r.ProgressAt))
	field(FieldLatency, integer(&latency))
	field(FieldETA, func(s string) error {
		if err := integer(&eta)(s); err != nil {
			return err
		}
		d := time.Duration(eta) * time.Second
		r.ETA = &d
		return nil
	})
	field(FieldChanges, integer(&r.Changes))
	field(FieldReplayed, integer(&r.Replayed))
	r.TTL = time.Duration(ttl) * time.Second
	r.Latency = time.Duration(latency) * time.Microsecond
	return r, errors.Join(errs...)
}

// Requests are the operator's requests to a run, parsed from its ctl
// hash.
type Requests struct {
	Cancel  bool
	MaxRate float64 // 0: none
	Paused  bool
	Action  string // "publish", "discard", or ""
}

// ParseRequests returns the requests of the ctl hash h that are for the
// run holding token: none when h was written for another run. A rate that
// is not a positive number is none.
func ParseRequests(h map[string]string, token string) Requests {
	if token == "" || h[CtlToken] != token {
		return Requests{}
	}
	rate, err := strconv.ParseFloat(h[CtlMaxRate], 64)
	if err != nil || !(rate > 0) {
		rate = 0
	}
	return Requests{Cancel: h[CtlCancel] != "", MaxRate: rate, Paused: h[CtlPaused] != "", Action: h[CtlAction]}
}

// EncodeKeys returns ks as the record keeps them: netstrings
// "<len>:<bytes>", one per key, end to end, as a log entry encodes its
// arguments, so that any byte of a key (a newline, invalid UTF-8)
// survives.
func EncodeKeys(ks []string) string {
	var b strings.Builder
	for _, k := range ks {
		b.WriteString(strconv.Itoa(len(k)))
		b.WriteByte(':')
		b.WriteString(k)
	}
	return b.String()
}

// DecodeKeys returns the keys EncodeKeys wrote in s, or an error if s is
// not such an encoding.
func DecodeKeys(s string) ([]string, error) {
	var out []string
	for s != "" {
		colon := strings.IndexByte(s, ':')
		if colon < 1 {
			return nil, errors.New("is not a list of keys as keyswap encodes it")
		}
		n, ok := count(s[:colon])
		if !ok || n > len(s)-colon-1 {
			return nil, errors.New("is not a list of keys as keyswap encodes it")
		}
		out = append(out, s[colon+1:colon+1+n])
		s = s[colon+1+n:]
	}
	return out, nil
}

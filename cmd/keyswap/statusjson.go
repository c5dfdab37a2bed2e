package main

import (
	"math"
	"time"
)

// statusJSON is the -json document of 'keyswap status' (see statusUsage).
// Its field names are stable.
type statusJSON struct {
	Server           serverJSON        `json:"server"`
	Time             time.Time         `json:"time"`
	Pattern          *string           `json:"pattern,omitempty"`
	PatternBase64    []byte            `json:"pattern_base64,omitempty"`
	Key              *string           `json:"key,omitempty"`
	KeyBase64        []byte            `json:"key_base64,omitempty"`
	Scanned          bool              `json:"scanned"`
	Cluster          bool              `json:"cluster"`
	OlderThanSeconds int64             `json:"older_than_seconds"`
	GraceMillis      int64             `json:"grace_ms"`
	Locks            []lockJSON        `json:"locks"`
	TempKeys         []tempJSON        `json:"temp_keys"`
	Runs             []runJSON         `json:"runs"`
	Indexes          []indexStatusJSON `json:"indexes"`
}

// indexStatusJSON is an indexStatus in statusJSON.
type indexStatusJSON struct {
	jsonKey
	Group         string            `json:"group,omitempty"`
	MetaKey       *string           `json:"meta_key,omitempty"`
	MetaKeyBase64 []byte            `json:"meta_key_base64,omitempty"`
	Family        bool              `json:"family"`
	Generation    *generationJSON   `json:"generation"`
	Locked        bool              `json:"locked"`
	Rollback      rollbackStateJSON `json:"rollback"`
	// Mode is "generations" for an index with a pointer, "group" for one
	// whose pointer without a group holds a group's claim (its
	// generations' in_group names the group), else "rename".
	Mode        string         `json:"mode"`
	Generations *genStatusJSON `json:"generations"`
	// Ambiguous says why the index may be another's: its base is that of
	// two live keys (SPEC C104), and its owner stamp names neither.
	Ambiguous string `json:"ambiguous,omitempty"`
	// BaseOwner is the other index whose base the index's is, by the
	// base's owner stamp (SPEC C104): only from status by key.
	BaseOwner       *string `json:"base_owner,omitempty"`
	BaseOwnerBase64 []byte  `json:"base_owner_base64,omitempty"`
}

// rollbackStateJSON is a rollbackState in JSON.
type rollbackStateJSON struct {
	Possible bool       `json:"possible"`
	Until    *time.Time `json:"until"`
	WhyNot   string     `json:"why_not"`
}

// lockJSON is a lockStatus in statusJSON.
type lockJSON struct {
	jsonKey
	Base        *string `json:"base,omitempty"`
	BaseBase64  []byte  `json:"base_base64,omitempty"`
	TTLSeconds  int64   `json:"ttl_seconds"`
	TokenPrefix string  `json:"token_prefix"`
}

// tempJSON is a tempStatus in statusJSON.
type tempJSON struct {
	jsonKey
	Base           *string `json:"base,omitempty"`
	BaseBase64     []byte  `json:"base_base64,omitempty"`
	Timestamp      int64   `json:"timestamp"`
	AgeSeconds     int64   `json:"age_seconds"`
	TTLSeconds     int64   `json:"ttl_seconds"`
	Type           string  `json:"type"`
	Size           *int64  `json:"size"`
	MemoryBytes    *int64  `json:"memory_bytes"`
	Locked         bool    `json:"locked"`
	LockKey        *string `json:"lock_key,omitempty"`
	LockKeyBase64  []byte  `json:"lock_key_base64,omitempty"`
	SweepCandidate bool    `json:"sweep_candidate"`
}

// json returns rep's -json document.
func (rep *statusReport) json() statusJSON {
	out := statusJSON{
		Server:           rep.Server.json(),
		Time:             rep.Time,
		Cluster:          rep.Cluster,
		OlderThanSeconds: rep.OlderThanSeconds,
		GraceMillis:      rep.Grace.Milliseconds(),
		Locks:            make([]lockJSON, 0, len(rep.Locks)),
		TempKeys:         make([]tempJSON, 0, len(rep.TempKeys)),
	}
	if rep.ByKey {
		out.Key, out.KeyBase64 = jsonName(rep.Key)
	} else {
		out.Pattern, out.PatternBase64 = jsonName(rep.Pattern)
	}
	out.Scanned = !rep.ByKey
	out.Indexes = make([]indexStatusJSON, 0, len(rep.Indexes))
	for _, ix := range rep.Indexes {
		j := indexStatusJSON{jsonKey: newJSONKey(ix.Key), Group: ix.Group, Generation: ix.Generation.json(), Locked: ix.LockKey != "",
			Rollback: rollbackStateJSON{Possible: ix.Rollback.Possible, Until: jsonTime(ix.Rollback.Until), WhyNot: ix.Rollback.WhyNot},
			Mode:     ix.Gens.mode(), Generations: ix.Gens.json()}
		j.MetaKey, j.MetaKeyBase64 = jsonName(ix.MetaKey)
		j.Family = ix.Generation != nil && ix.Generation.Family
		if ix.Ambiguous != nil {
			j.Ambiguous = ix.Ambiguous.note()
		}
		if ix.BaseOwner != "" {
			j.BaseOwner, j.BaseOwnerBase64 = jsonName(ix.BaseOwner)
		}
		out.Indexes = append(out.Indexes, j)
	}
	out.Runs = make([]runJSON, 0, len(rep.Runs))
	for _, r := range rep.Runs {
		out.Runs = append(out.Runs, r.json())
	}
	for _, l := range rep.Locks {
		j := lockJSON{jsonKey: newJSONKey(l.Key), TTLSeconds: l.TTLSeconds, TokenPrefix: l.TokenPrefix}
		j.Base, j.BaseBase64 = jsonName(l.Base)
		out.Locks = append(out.Locks, j)
	}
	for _, t := range rep.TempKeys {
		j := tempJSON{jsonKey: newJSONKey(t.Key), Timestamp: t.Timestamp, AgeSeconds: t.AgeSeconds,
			TTLSeconds: t.TTLSeconds, Type: t.Type, Size: t.Size, MemoryBytes: t.MemoryBytes,
			Locked: t.Locked, SweepCandidate: t.SweepCandidate}
		j.Base, j.BaseBase64 = jsonName(t.Base)
		j.LockKey, j.LockKeyBase64 = jsonName(t.LockKey)
		out.TempKeys = append(out.TempKeys, j)
	}
	return out
}

// runJSON is a runStatus in statusJSON.
type runJSON struct {
	LockKey       *string      `json:"lock_key,omitempty"`
	LockKeyBase64 []byte       `json:"lock_key_base64,omitempty"`
	TokenPrefix   string       `json:"token_prefix"`
	Host          string       `json:"host"`
	PID           int64        `json:"pid"`
	Started       *time.Time   `json:"started"`
	LeaseSeconds  int64        `json:"lease_seconds"`
	Phase         string       `json:"phase"`
	Items         int64        `json:"items"`
	Entries       int64        `json:"entries"`
	Acked         int64        `json:"acked"`
	Expected      int64        `json:"expected"`
	Rate          float64      `json:"rate"`
	RateNow       *float64     `json:"rate_now"`
	Limit         float64      `json:"limit"`
	LatencyMicros int64        `json:"latency_us"`
	ETASeconds    *int64       `json:"eta_seconds"`
	BeatAt        *time.Time   `json:"beat_at"`
	ProgressAt    *time.Time   `json:"progress_at"`
	Changes       int64        `json:"changes"`
	Replayed      int64        `json:"replayed"`
	Requests      requestsJSON `json:"requests"`
	TempSuffix    string       `json:"temp_suffix"`
	Keys          []indexJSON  `json:"keys"`
}

// requestsJSON is a runRequests in JSON.
type requestsJSON struct {
	Cancel  bool    `json:"cancel"`
	MaxRate float64 `json:"max_rate"`
	Paused  bool    `json:"paused"`
	Action  string  `json:"action"`
}

// indexJSON is an index (a key or a family) and its generation.
type indexJSON struct {
	jsonKey
	Family     bool            `json:"family"`
	Generation *generationJSON `json:"generation"`
	// Mode and Generations are set by a rollback in Generations mode
	// only: "generations", and the index's registry after it.
	Mode        string         `json:"mode,omitempty"`
	Generations *genStatusJSON `json:"generations,omitempty"`
}

// generationJSON is a generation in JSON.
type generationJSON struct {
	Gen        int64      `json:"gen"`
	At         *time.Time `json:"at"`
	Prev       *int64     `json:"prev"`
	PrevUntil  *time.Time `json:"prev_until"`
	RolledBack *time.Time `json:"rolled_back"`
}

// json returns r in statusJSON.
func (r runStatus) json() runJSON {
	j := runJSON{
		TokenPrefix: prefix(r.Token, tokenPrefixLen), Host: r.Host, PID: r.PID, Started: jsonTime(r.Started),
		LeaseSeconds: r.LeaseSeconds, Phase: r.Phase, Items: r.Items, Entries: r.Entries, Acked: r.Acked,
		Expected: r.Expected, Rate: finite(r.Rate), RateNow: finitePtr(r.RateNow), Limit: finite(r.Limit), LatencyMicros: r.Latency.Microseconds(), ETASeconds: r.ETASeconds,
		BeatAt: jsonTime(r.BeatAt), ProgressAt: jsonTime(r.ProgressAt), Changes: r.Changes, Replayed: r.Replayed,
		Requests: requestsJSON{Cancel: r.Requests.Cancel, MaxRate: finite(r.Requests.MaxRate), Paused: r.Requests.Paused,
			Action: r.Requests.Action},
		TempSuffix: r.Suffix,
	}
	j.LockKey, j.LockKeyBase64 = jsonName(r.Lock)
	j.Keys = indexesJSON(r.Generations)
	return j
}

// indexesJSON returns gs in JSON, never nil.
func indexesJSON(gs []keyGeneration) []indexJSON {
	out := make([]indexJSON, 0, len(gs))
	for _, g := range gs {
		out = append(out, indexJSON{jsonKey: newJSONKey(g.Key), Family: g.Family, Generation: g.Generation.json()})
	}
	return out
}

// json returns g in JSON: null when nil.
func (g *generation) json() *generationJSON {
	if g == nil {
		return nil
	}
	return &generationJSON{Gen: g.Gen, At: jsonTime(g.At), Prev: g.Prev, PrevUntil: jsonTime(g.PrevUntil), RolledBack: jsonTime(g.RolledBack)}
}

// jsonTime returns t for JSON: null when zero.
func jsonTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// finitePtr returns *f as finite does, or nil when f is nil.
func finitePtr(f *float64) *float64 {
	if f == nil {
		return nil
	}
	v := finite(*f)
	return &v
}

// finite returns f, or 0 when encoding/json cannot write it (a record
// holding "inf" or "nan").
func finite(f float64) float64 {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return 0
	}
	return f
}

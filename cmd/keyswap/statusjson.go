package main

import "time"

// statusJSON is the -json document of 'keyswap status' (see statusUsage).
// Its field names are stable.
type statusJSON struct {
	Time             time.Time  `json:"time"`
	Pattern          *string    `json:"pattern,omitempty"`
	PatternBase64    []byte     `json:"pattern_base64,omitempty"`
	Cluster          bool       `json:"cluster"`
	OlderThanSeconds int64      `json:"older_than_seconds"`
	Locks            []lockJSON `json:"locks"`
	TempKeys         []tempJSON `json:"temp_keys"`
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
		Time:             rep.Time,
		Cluster:          rep.Cluster,
		OlderThanSeconds: rep.OlderThanSeconds,
		Locks:            make([]lockJSON, 0, len(rep.Locks)),
		TempKeys:         make([]tempJSON, 0, len(rep.TempKeys)),
	}
	out.Pattern, out.PatternBase64 = jsonName(rep.Pattern)
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

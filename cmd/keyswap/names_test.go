package main

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/keyswap/keyswap/internal/keys"
)

// name returns the name k holds.
func (k jsonKey) name() string { return fieldName(k.Key, k.KeyBase64) }

// fieldName returns the name that a pair of JSON name fields holds: text
// when it is set, else the bytes of raw.
func fieldName(text *string, raw []byte) string {
	if text != nil {
		return *text
	}
	return string(raw)
}

// wantOneField fails unless exactly one of a pair of JSON name fields is
// set, and the right one: text for a valid UTF-8 name, raw otherwise.
func wantOneField(t *testing.T, field string, text *string, raw []byte) {
	t.Helper()
	switch {
	case text != nil && raw != nil:
		t.Errorf("%s: both %q and %s_base64 %q are set", field, *text, field, raw)
	case text == nil && raw == nil:
		t.Errorf("%s: neither %s nor %s_base64 is set", field, field, field)
	case raw != nil && utf8.Valid(raw):
		t.Errorf("%s_base64 holds %q, which is valid UTF-8: want it in %s", field, raw, field)
	}
}

// decodeStatus decodes the output of 'status -json' into a statusReport,
// checking that each name is given once, in the right field.
func decodeStatus(t *testing.T, out string) *statusReport {
	t.Helper()
	var j statusJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("status -json: %v\n%s", err, out)
	}
	wantOneField(t, "pattern", j.Pattern, j.PatternBase64)
	rep := &statusReport{Time: j.Time, Pattern: fieldName(j.Pattern, j.PatternBase64), Cluster: j.Cluster,
		OlderThanSeconds: j.OlderThanSeconds, Locks: []lockStatus{}, TempKeys: []tempStatus{}}
	for _, l := range j.Locks {
		wantOneField(t, "locks[].key", l.Key, l.KeyBase64)
		wantOneField(t, "locks[].base", l.Base, l.BaseBase64)
		rep.Locks = append(rep.Locks, lockStatus{Key: l.name(), Base: fieldName(l.Base, l.BaseBase64),
			TTLSeconds: l.TTLSeconds, TokenPrefix: l.TokenPrefix})
	}
	for _, tk := range j.TempKeys {
		wantOneField(t, "temp_keys[].key", tk.Key, tk.KeyBase64)
		wantOneField(t, "temp_keys[].base", tk.Base, tk.BaseBase64)
		wantOneField(t, "temp_keys[].lock_key", tk.LockKey, tk.LockKeyBase64)
		rep.TempKeys = append(rep.TempKeys, tempStatus{Key: tk.name(), Base: fieldName(tk.Base, tk.BaseBase64),
			Timestamp: tk.Timestamp, AgeSeconds: tk.AgeSeconds, TTLSeconds: tk.TTLSeconds, Type: tk.Type,
			Size: tk.Size, MemoryBytes: tk.MemoryBytes, Locked: tk.Locked,
			LockKey: fieldName(tk.LockKey, tk.LockKeyBase64), SweepCandidate: tk.SweepCandidate})
	}
	return rep
}

// sweepResult is the output of 'sweep -json', with the names decoded.
type sweepResult struct {
	DryRun           bool
	Pattern          string
	OlderThanSeconds int64
	Keys             []string
	Count            int
	Error            string
}

// decodeSweep decodes the output of 'sweep -json', checking that each name
// is given once, in the right field.
func decodeSweep(t *testing.T, out string) sweepResult {
	t.Helper()
	var j sweepJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("sweep -json: %v\n%s", err, out)
	}
	wantOneField(t, "pattern", j.Pattern, j.PatternBase64)
	r := sweepResult{DryRun: j.DryRun, Pattern: fieldName(j.Pattern, j.PatternBase64), OlderThanSeconds: j.OlderThanSeconds,
		Keys: []string{}, Count: j.Count, Error: j.Error}
	for _, k := range j.Keys {
		wantOneField(t, "keys[].key", k.Key, k.KeyBase64)
		r.Keys = append(r.Keys, k.name())
	}
	return r
}

// TestJSONExactNames puts real keys whose names hold the byte 0xff (not
// UTF-8) in Redis, beside one with a valid UTF-8 name, and checks that the
// JSON of status and sweep names each exactly: the bytes decoded from
// "*_base64" are the key's, and a script that deletes the listed key
// deletes that key.
func TestJSONExactNames(t *testing.T) {
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			old := time.Now().Add(-2 * time.Hour).Unix()
			bin := p + "bin\xff"
			orphan := keys.TempKey(bin+"orphan", d.cluster, old, 1)
			held := keys.TempKey(bin+"held", d.cluster, old, 2)
			heldLock := keys.LockKey(bin+"held", d.cluster)
			text := keys.TempKey(bin[:len(bin)-1]+"ünï", d.cluster, old, 3)
			for _, k := range []string{orphan, held, text} {
				do(t, d.client, "SET", k, "x")
			}
			do(t, d.client, "SET", heldLock, "0123456789abcdef0123456789abcdef", "EX", "600")
			// A temp key whose name is orphan's with U+FFFD for 0xff, as
			// the JSON used to name orphan; its TTL keeps it from the sweep.
			lookalike := strings.ReplaceAll(orphan, "\xff", "\ufffd")
			do(t, d.client, "SET", lookalike, "x", "EX", "600")

			pattern := p + "bin*"
			r := keyswap(t, d.args("status", "-json", pattern)...)
			r.wantCode(t, exitOrphans)
			rep := decodeStatus(t, r.stdout)
			if len(rep.Locks) != 1 || rep.Locks[0].Key != heldLock || rep.Locks[0].Base != keys.Base(bin+"held", d.cluster) {
				t.Errorf("locks: got %+v, want %q", rep.Locks, heldLock)
			}
			got := map[string]tempStatus{}
			for _, tk := range rep.TempKeys {
				got[tk.Key] = tk
			}
			if len(got) != 4 || !got[orphan].SweepCandidate || !got[text].SweepCandidate ||
				got[held].SweepCandidate || got[held].LockKey != heldLock || got[lookalike].SweepCandidate {
				t.Errorf("temp keys: got %+v, want %q and %q as candidates, %q locked by %q, and %q", rep.TempKeys, orphan, text, held, heldLock, lookalike)
			}
			wantJSONField(t, r.stdout, "key", text, true)
			wantJSONField(t, r.stdout, "key", lookalike, true)
			wantJSONField(t, r.stdout, "key_base64", base64.StdEncoding.EncodeToString([]byte(orphan)), true)
			wantJSONField(t, r.stdout, "lock_key_base64", base64.StdEncoding.EncodeToString([]byte(heldLock)), true)

			// Sweep: a pattern and keys that are not UTF-8.
			sweepPat := "*" + bin + "*:rebuild:*"
			r = keyswap(t, d.args("sweep", "-json", "--pattern", sweepPat)...)
			r.wantCode(t, exitOrphans)
			sw := decodeSweep(t, r.stdout)
			if sw.Pattern != sweepPat || !slices.Equal(sw.Keys, []string{orphan}) {
				t.Errorf("sweep -json: got pattern %q, keys %q, want %q, [%q]", sw.Pattern, sw.Keys, sweepPat, orphan)
			}
			wantJSONField(t, r.stdout, "pattern_base64", base64.StdEncoding.EncodeToString([]byte(sweepPat)), true)

			// Delete what the JSON names, as a script would.
			for _, k := range sw.Keys {
				do(t, d.client, "UNLINK", k)
			}
			wantKeys(t, d, []string{orphan}, false)
			wantKeys(t, d, []string{lookalike, held, text}, true)
		})
	}
}

// wantJSONField fails unless out, a JSON document, has (want true) or has
// not the field name with the string value.
func wantJSONField(t *testing.T, out, name, value string, want bool) {
	t.Helper()
	field, err := json.Marshal(value)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Contains(out, `"`+name+`": `+string(field)); got != want {
		t.Errorf("JSON has %q: %s: got %v, want %v\n%s", name, field, got, want, out)
	}
}

package main

import "unicode/utf8"

// A Redis name (key, pattern) is bytes, and encoding/json would write each
// byte that is not valid UTF-8 as U+FFFD: a script reading such a name back
// would name another key. So every name field X of the JSON output is
// written as "X": "<name>" when the name is valid UTF-8, and otherwise as
// "X_base64": "<standard base64 of its bytes>", without "X".

// jsonName returns the two fields of name: text when name is valid UTF-8,
// else raw, which encoding/json writes as standard base64.
func jsonName(name string) (text *string, raw []byte) {
	if utf8.ValidString(name) {
		return &name, nil
	}
	return nil, []byte(name)
}

// jsonKey is a key name, as "key" or "key_base64".
type jsonKey struct {
	Key       *string `json:"key,omitempty"`
	KeyBase64 []byte  `json:"key_base64,omitempty"`
}

// newJSONKey returns the jsonKey of key.
func newJSONKey(key string) jsonKey {
	var k jsonKey
	k.Key, k.KeyBase64 = jsonName(key)
	return k
}

// jsonKeys returns the jsonKeys of ks, never nil (JSON [] rather than null).
func jsonKeys(ks []string) []jsonKey {
	out := make([]jsonKey, 0, len(ks))
	for _, k := range ks {
		out = append(out, newJSONKey(k))
	}
	return out
}

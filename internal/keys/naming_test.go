package keys

import (
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// rubyPattern is Familia's TEMP_KEY_SUFFIX_PATTERN, /:rebuild:(\d+)(?::\h{16})?\z/,
// with the pre-match made explicit. The lazy prefix gives Ruby's leftmost
// match, so it serves as an oracle for ParseTempKey.
var rubyPattern = regexp.MustCompile(`(?s)^(.*?):rebuild:([0-9]+)(?::[0-9a-fA-F]{16})?$`)

func TestStandaloneShapesAreFamilias(t *testing.T) {
	// C1, C4, C5+: on standalone the shapes are Familia's, byte for byte.
	for _, live := range []string{"users:by-email", "a{}b", "a}b", "user{42}:idx", "with space", "ü"} {
		if got, want := LockKey(live, false), live+":rebuild-lock"; got != want {
			t.Errorf("LockKey(%q) = %q, want %q", live, got, want)
		}
		if got, want := TempKey(live, false, 1700000000, 0x00ab00cd00ef0012), live+":rebuild:1700000000:00ab00cd00ef0012"; got != want {
			t.Errorf("TempKey(%q) = %q, want %q", live, got, want)
		}
	}
}

func TestClusterShapes(t *testing.T) {
	tests := []struct {
		live, base string
	}{
		{"user{42}:idx", "user{42}:idx"},
		{"users:by-email", "{users:by-email}"},
		{"a{b", "{a{b}"},
		{"a{}b", "{" + SyntheticTag(Slot("a{}b")) + "}a{}b"},
		{"a}b", "{" + SyntheticTag(Slot("a}b")) + "}a}b"},
		{"}", "{" + SyntheticTag(Slot("}")) + "}}"},
	}
	for _, tt := range tests {
		t.Run(tt.live, func(t *testing.T) {
			if got := Base(tt.live, true); got != tt.base {
				t.Fatalf("Base(%q) = %q, want %q", tt.live, got, tt.base)
			}
			lock := LockKey(tt.live, true)
			temp := TempKey(tt.live, true, 42, math.MaxUint64)
			if lock != tt.base+":rebuild-lock" {
				t.Errorf("LockKey = %q, want %q", lock, tt.base+":rebuild-lock")
			}
			if temp != tt.base+":rebuild:42:ffffffffffffffff" {
				t.Errorf("TempKey = %q", temp)
			}
			want := Slot(tt.live)
			for _, k := range []string{lock, temp, tt.base} {
				if got := Slot(k); got != want {
					t.Errorf("Slot(%q) = %d, want Slot(%q) = %d", k, got, tt.live, want)
				}
			}
		})
	}
}

func TestParseTempKey(t *testing.T) {
	tests := []struct {
		key  string
		base string
		unix int64
		ok   bool
	}{
		{"idx:rebuild:1700000000:0123456789abcdef", "idx", 1700000000, true},
		{"idx:rebuild:1700000000:0123456789ABCDEF", "idx", 1700000000, true}, // C5: either case
		{"idx:rebuild:1700000000", "idx", 1700000000, true},                  // C3: legacy
		{"a:rebuild:1:rebuild:2", "a:rebuild:1", 2, true},                    // C5: anchored at the end
		{"a:rebuild:1:rebuild:2:ffffffffffffffff", "a:rebuild:1", 2, true},
		{":rebuild:5", "", 5, true},
		{"x:rebuild:1234567890123456", "x", 1234567890123456, true},  // 16 digits are a timestamp here
		{"x:rebuild:99999999999999999999", "x", math.MaxInt64, true}, // overflow saturates: never old
		{"x:rebuild:123:abc", "", 0, false},
		{"x:rebuild:", "", 0, false},
		{"x:rebuild:12x", "", 0, false},
		{"x:rebuild:12:0123456789abcde", "", 0, false},   // 15 hex
		{"x:rebuild:12:0123456789abcdef0", "", 0, false}, // 17 hex
		{"x:rebuild:12:0123456789abcdeg", "", 0, false},
		{"x:rebuild-lock", "", 0, false}, // C4
		{"x:rebuild:1:rebuild-lock", "", 0, false},
		{"x:rebuild:-1", "", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			base, unix, ok := ParseTempKey(tt.key)
			if base != tt.base || unix != tt.unix || ok != tt.ok {
				t.Errorf("ParseTempKey(%q) = %q, %d, %v; want %q, %d, %v", tt.key, base, unix, ok, tt.base, tt.unix, tt.ok)
			}
			if m := rubyPattern.FindStringSubmatch(tt.key); (m != nil) != tt.ok || m != nil && m[1] != tt.base {
				t.Errorf("table disagrees with Familia's pattern on %q: %q", tt.key, m)
			}
		})
	}
}

func TestLockKeyIsNeverATempKey(t *testing.T) {
	// C4: the lock key never matches *:rebuild:* nor the recogniser.
	for _, live := range []string{"a", "a:rebuild:1", "a:rebuild:1:0123456789abcdef", "x}y"} {
		for _, cluster := range []bool{false, true} {
			lock := LockKey(live, cluster)
			if _, _, ok := ParseTempKey(lock); ok {
				t.Errorf("ParseTempKey(LockKey(%q)) recognised %q", live, lock)
			}
			if strings.HasSuffix(live, ":rebuild") || strings.Contains(live, ":rebuild:") {
				continue // the live key itself matches the glob; its lock adds nothing
			}
			if strings.Contains(lock, ":rebuild:") {
				t.Errorf("LockKey(%q) = %q matches *:rebuild:*", live, lock)
			}
		}
	}
}

func FuzzNaming(f *testing.F) {
	for _, s := range []string{"users:by-email", "user{42}:idx", "a{}b", "a}b", "{", "}", "", "{}", "a:rebuild:1"} {
		f.Add(s, int64(1700000000), uint64(0xdeadbeef))
	}
	f.Fuzz(func(t *testing.T, live string, unix int64, nonce uint64) {
		if unix < 0 {
			unix = -unix
			if unix < 0 {
				unix = 0
			}
		}
		for _, cluster := range []bool{false, true} {
			base := Base(live, cluster)
			lock := LockKey(live, cluster)
			temp := TempKey(live, cluster, unix, nonce)
			if cluster {
				// Every derived key lands in the live key's slot.
				want := Slot(live)
				for _, k := range []string{base, lock, temp} {
					if got := Slot(k); got != want {
						t.Fatalf("Slot(%q) = %d, want %d (live %q)", k, got, want, live)
					}
				}
			} else if base != live {
				t.Fatalf("standalone Base(%q) = %q", live, base)
			}
			// Parsing inverts naming.
			b, u, ok := ParseTempKey(temp)
			if !ok || b != base || u != unix {
				t.Fatalf("ParseTempKey(%q) = %q, %d, %v; want %q, %d", temp, b, u, ok, base, unix)
			}
			if LockKeyForBase(b) != lock {
				t.Fatalf("LockKeyForBase(%q) = %q, want %q", b, LockKeyForBase(b), lock)
			}
			if _, _, ok := ParseTempKey(lock); ok {
				t.Fatalf("lock key %q recognised as a temp key", lock)
			}
		}
	})
}

func FuzzParseTempKey(f *testing.F) {
	for _, s := range []string{"a:rebuild:1", "a:rebuild:1:0123456789abcdef", "x:rebuild:123:abc", "a:rebuild:1:rebuild:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		base, _, ok := ParseTempKey(key)
		m := rubyPattern.FindStringSubmatch(key)
		if ok != (m != nil) || ok && base != m[1] {
			t.Fatalf("ParseTempKey(%q) = %q, %v; Familia's pattern gives %q", key, base, ok, m)
		}
	})
}

func TestVetoLocks(t *testing.T) {
	for _, tt := range []struct {
		base string
		want []string
	}{
		{"idx", []string{"idx:rebuild-lock"}},
		{"users:by-country:fr", []string{"users:by-country:fr:rebuild-lock", "users:by-country:rebuild-lock", "users:rebuild-lock"}},
		{"{u}:fam:a:b", []string{"{u}:fam:a:b:rebuild-lock", "{u}:fam:a:rebuild-lock", "{u}:fam:rebuild-lock", "{u}:rebuild-lock"}},
		{":x", []string{":x:rebuild-lock"}},
	} {
		if got := VetoLocks(tt.base); !slices.Equal(got, tt.want) {
			t.Errorf("VetoLocks(%q) = %q, want %q", tt.base, got, tt.want)
		}
	}
}

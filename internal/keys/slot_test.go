package keys

import (
	"strconv"
	"testing"
)

func TestSlot(t *testing.T) {
	tests := []struct {
		key  string
		want uint16
	}{
		// Vectors from the Redis Cluster specification and CLUSTER KEYSLOT.
		{"123456789", 0x31C3 % SlotCount},
		{"foo", 12182},
		{"bar", 5061},
		{"", 0},
		{"{user1000}.following", Slot("user1000")},
		{"{user1000}.followers", Slot("user1000")},
		{"foo{}{bar}", crc16("foo{}{bar}") % SlotCount}, // empty first tag: whole key
		{"foo{{bar}}zap", Slot("{bar")},                 // tag is "{bar"
		{"foo{bar}{zap}", Slot("bar")},                  // only the first tag counts
		{"a}b", crc16("a}b") % SlotCount},
		{"}{a}", Slot("a")},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			if got := Slot(tt.key); got != tt.want {
				t.Errorf("Slot(%q) = %d, want %d", tt.key, got, tt.want)
			}
		})
	}
}

func TestHashTag(t *testing.T) {
	tests := []struct {
		key, tag string
		ok       bool
	}{
		{"user{42}:idx", "42", true},
		{"{a}", "a", true},
		{"a{}b", "", false},
		{"a}b", "", false},
		{"a{b", "", false},
		{"plain", "", false},
		{"{}{x}", "", false}, // Redis looks only at the first '{'
		{"x{{y}", "{y", true},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			tag, ok := HashTag(tt.key)
			if tag != tt.tag || ok != tt.ok {
				t.Errorf("HashTag(%q) = %q, %v; want %q, %v", tt.key, tag, ok, tt.tag, tt.ok)
			}
		})
	}
}

func TestSyntheticTagCoversEverySlot(t *testing.T) {
	// One pass finds the first "rbN" of every slot; SyntheticTag must agree.
	first := make(map[uint16]string, SlotCount)
	n := 0
	for ; len(first) < SlotCount; n++ {
		if n >= 200000 {
			t.Fatalf("only %d of %d slots reached by rb0..rb%d", len(first), SlotCount, n)
		}
		tag := "rb" + strconv.Itoa(n)
		if _, ok := first[Slot(tag)]; !ok {
			first[Slot(tag)] = tag
		}
	}
	for slot := uint16(0); slot < SlotCount; slot++ {
		if got := SyntheticTag(slot); got != first[slot] {
			t.Fatalf("SyntheticTag(%d) = %q, want %q", slot, got, first[slot])
		}
	}
	last := "rb" + strconv.Itoa(n-1) // the slot reached last costs the most
	if got := SyntheticTag(Slot(last)); got != last {
		t.Fatalf("SyntheticTag(%d) = %q, want %q", Slot(last), got, last)
	}
}

func BenchmarkSyntheticTag(b *testing.B) {
	for i := 0; b.Loop(); i++ {
		SyntheticTag(uint16(i % SlotCount))
	}
}

// BenchmarkBaseSyntheticTag measures Base of a key with a '}' and no hash
// tag, which borrows a synthetic tag in its slot: a lookup once the first
// call computed every slot's.
func BenchmarkBaseSyntheticTag(b *testing.B) {
	for i := 0; b.Loop(); i++ {
		Base("users}"+strconv.Itoa(i%1000), true)
	}
}

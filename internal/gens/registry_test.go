package gens_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
)

// TestParse parses a registry with a generation in every state.
func TestParse(t *testing.T) {
	t.Parallel()
	r, err := gens.Parse("k", map[string]string{
		keys.RegNext: "12",
		"3":          keys.RegRetired + "1700000000123",
		"10":         keys.RegPrevious,
		"11":         keys.RegCurrent,
		"12":         keys.RegBuilding + "tok",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := gens.Registry{Key: "k", Next: 12, Gens: map[int64]gens.State{
		3:  {Kind: gens.Retired, RetiredAt: time.UnixMilli(1700000000123), Raw: keys.RegRetired + "1700000000123"},
		10: {Kind: gens.Previous, Raw: keys.RegPrevious},
		11: {Kind: gens.Current, Raw: keys.RegCurrent},
		12: {Kind: gens.Building, Token: "tok", Raw: keys.RegBuilding + "tok"},
	}}
	if diff := cmp.Diff(want, r); diff != "" {
		t.Errorf("Parse (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{3, 10, 11, 12}, r.Sorted()); diff != "" {
		t.Errorf("Sorted (-want +got):\n%s", diff)
	}
	if g, ok := r.Find(gens.Current); g != 11 || !ok {
		t.Errorf("Find(Current) = %d, %v; want 11, true", g, ok)
	}
	if g, ok := r.Find(gens.Previous); g != 10 || !ok {
		t.Errorf("Find(Previous) = %d, %v; want 10, true", g, ok)
	}
	// No registry at all: empty, valid.
	if r, err := gens.Parse("k", nil); err != nil || r.Next != 0 || len(r.Gens) != 0 {
		t.Errorf("Parse(nil) = %+v, %v; want an empty registry", r, err)
	}
}

// TestParseRefuses checks the registries Parse refuses, and that the error
// names the field and the value.
func TestParseRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fields       map[string]string
		field, value string
	}{
		{map[string]string{"1": keys.RegCurrent}, "1", keys.RegCurrent}, // no next
		{map[string]string{keys.RegNext: "+2"}, keys.RegNext, "+2"},
		{map[string]string{keys.RegNext: "2", " 1": keys.RegCurrent}, " 1", keys.RegCurrent},
		{map[string]string{keys.RegNext: "2", "1": "Current"}, "1", "Current"},
		{map[string]string{keys.RegNext: "2", "1": keys.RegRetired + "-5"}, "1", keys.RegRetired + "-5"},
		{map[string]string{keys.RegNext: "2", "1": keys.RegPrevious, "2": keys.RegPrevious}, "2", keys.RegPrevious},
		{map[string]string{keys.RegNext: "99999999999999999999"}, keys.RegNext, "99999999999999999999"},
	} {
		_, err := gens.Parse("k", tc.fields)
		var c *gens.CorruptError
		if !errors.As(err, &c) || c.Key != "k" || c.Field != tc.field || c.Value != tc.value {
			t.Errorf("Parse(%q) = %v, want a CorruptError of field %q value %q", tc.fields, err, tc.field, tc.value)
		}
	}
}

// TestReadRefusesWrongTypes gives the registry, the pointer and the lock a
// type keyswap never gives them: Read names the key and its type.
func TestReadRefusesWrongTypes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		key  func(f *fixture) string
		cmd  []string // its arguments after the key
	}{
		{"registry", (*fixture).registryKey, []string{"SET", "v"}},
		{"pointer", (*fixture).pointerKey, []string{"SADD", "1"}},
		{"lock", (*fixture).lockKey, []string{"RPUSH", "tok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, shape{family: true})
			key := tc.key(f)
			redistest.Cmd(t, f.c, tc.cmd[0], key, tc.cmd[1])
			_, err := gens.Read(redistest.Ctx(t), f.c, f.idx)
			var c *gens.CorruptError
			if !errors.As(err, &c) || c.Key != key || c.Field != "" {
				t.Fatalf("Read = %v, want a CorruptError naming %s", err, key)
			}
			t.Log(err)
		})
	}
}

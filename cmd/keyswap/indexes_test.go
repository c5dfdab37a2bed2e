package main

import (
	"slices"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
)

func TestRollbackOf(t *testing.T) {
	// The rollback script's order: a held lock refuses first (ErrInProgress)
	// only once there is something to roll back; then no meta, no kept
	// generation, or one kept past its time (ErrNothingToRollBack).
	now := time.Date(2025, 1, 2, 15, 4, 5, 0, time.UTC)
	prev := int64(6)
	kept := &generation{Gen: 7, Prev: &prev, PrevUntil: now.Add(time.Minute)}
	for _, tc := range []struct {
		name string
		g    *generation
		lock string
		want rollbackState
	}{
		{"never published", nil, "", rollbackState{WhyNot: rollbackNeverPublished}},
		{"none kept", &generation{Gen: 7}, "", rollbackState{WhyNot: rollbackNoneKept}},
		{"none kept, locked", &generation{Gen: 7}, "k:rebuild-lock", rollbackState{WhyNot: rollbackNoneKept}},
		{"expired", &generation{Gen: 7, Prev: &prev, PrevUntil: now}, "", rollbackState{WhyNot: rollbackExpired}},
		{"kept, locked", kept, "k:rebuild-lock", rollbackState{WhyNot: rollbackLocked}},
		{"kept", kept, "", rollbackState{Possible: true, Until: now.Add(time.Minute)}},
	} {
		if got := rollbackOf(tc.g, tc.lock, now); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestLiveCandidates(t *testing.T) {
	// The live keys of a meta, registry or pointer found by a scan: the
	// key itself and, on a cluster, the key without the hash tag keyswap
	// adds, when that names the same key: then two, which share the base
	// (SPEC C104), and only the owner stamp tells which it is.
	for _, tc := range []struct {
		live    string
		cluster bool
		want    []string
	}{
		{"users:by-email", false, []string{"users:by-email"}},
		{"{users:by-email}", false, []string{"{users:by-email}"}},
		{"{users}:by-email", true, []string{"{users}:by-email"}},
		{"users:by-email", true, []string{"{users:by-email}", "users:by-email"}},
		{"{users}", true, []string{"{users}", "users"}},
		{"a}b", true, []string{keys.Base("a}b", true), "a}b"}},
		{"a{}b", true, []string{keys.Base("a{}b", true), "a{}b"}}, // "{}" is no tag
	} {
		base := keys.Base(tc.live, tc.cluster)
		for _, keyOf := range []func(string, bool) string{keys.MetaKey[bool], keys.RegistryKey[bool], keys.PointerKey[bool]} {
			f := foundKey{key: keyOf(tc.live, tc.cluster), base: base, keyOf: keyOf}
			if got := liveCandidates(f, tc.cluster); !slices.Equal(got, tc.want) {
				t.Errorf("%q (cluster %v): %s, got %q, want %q", tc.live, tc.cluster, f.key, got, tc.want)
			}
		}
	}
}

package main

import (
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

func TestIndexKey(t *testing.T) {
	// The live key of a meta found by a scan: on a cluster, without the
	// hash tag keyswap adds, when that names the same meta.
	for _, tc := range []struct {
		live    string
		cluster bool
		want    string
	}{
		{"users:by-email", false, "users:by-email"},
		{"{users:by-email}", false, "{users:by-email}"},
		{"users:by-email", true, "users:by-email"},
		{"{users}:by-email", true, "{users}:by-email"},
		{"a{}b", true, "a{}b"},
		{"a}b", true, "a}b"},
		// A key spelled with the braces shares the meta of the key without.
		{"{users}", true, "users"},
	} {
		base := keys.Base(tc.live, tc.cluster)
		meta := base + ":rebuild-gen"
		if got := indexKey(meta, base, tc.cluster); got != tc.want {
			t.Errorf("%q (cluster %v): base %q, got %q, want %q", tc.live, tc.cluster, base, got, tc.want)
		}
	}
}

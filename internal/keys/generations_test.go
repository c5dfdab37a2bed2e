package keys

import "testing"

func TestGenerationShapes(t *testing.T) {
	if got, want := PointerKey("users:by-email", false), "users:by-email:rebuild-ptr"; got != want {
		t.Errorf("PointerKey = %q, want %q", got, want)
	}
	if got, want := PointerKey("users:by-email", true), "{users:by-email}:rebuild-ptr"; got != want {
		t.Errorf("PointerKey(cluster) = %q, want %q", got, want)
	}
	if got, want := RegistryKey("tags", true), "{tags}:rebuild-gens"; got != want {
		t.Errorf("RegistryKey(cluster) = %q, want %q", got, want)
	}
	if got, want := GenKey("users:by-email", 12), "users:by-email:rebuild-g:12"; got != want {
		t.Errorf("GenKey = %q, want %q", got, want)
	}
	if got, want := GenBucketKey("tags", 3, "go"), "tags:rebuild-g:3:go"; got != want {
		t.Errorf("GenBucketKey = %q, want %q", got, want)
	}
	// The pointer shares the lock's slot; a user's own tag pins the data
	// keys, and an untagged family's buckets spread over the slots.
	for _, live := range []string{"tags", "user{42}:idx", "a{}b"} {
		if Slot(PointerKey(live, true)) != Slot(LockKey(live, true)) || Slot(RegistryKey(live, true)) != Slot(LockKey(live, true)) {
			t.Errorf("%q: pointer or registry not in the lock's slot", live)
		}
	}
	if Slot(GenBucketKey("user{42}:idx", 9, "x")) != Slot("{42}") {
		t.Errorf("a bucket of a tagged family left the tag's slot")
	}
	if Slot(GenBucketKey("tags", 9, "go")) == Slot(GenBucketKey("tags", 9, "rust")) && Slot(GenBucketKey("tags", 9, "go")) == Slot(GenBucketKey("tags", 9, "zig")) {
		t.Errorf("buckets of an untagged family all in one slot")
	}
}

func TestGenPatternEscapesGlobs(t *testing.T) {
	if got, want := GenPattern(`t*[a]?\`, 2), `t\*\[a\]\?\\:rebuild-g:2:*`; got != want {
		t.Errorf("GenPattern = %q, want %q", got, want)
	}
}

func TestGenerationKeysAreReserved(t *testing.T) {
	for key, want := range map[string]bool{
		"tags:rebuild-g:3:go":          true,
		"users:by-email:rebuild-g:12":  true,
		"tags:rebuild-g:3":             true,
		"{tags}:rebuild-ptr":           true,
		"tags:rebuild-gens":            true,
		"tags:rebuild-g:":              false,
		"tags:rebuild-g:x:go":          false,
		"tags:rebuild-g:3x":            false,
		"a@rebuild-g:3":                false,
		"bob@example.com":              false,
		"tags:go":                      false,
		"x:rebuild-g:y:rebuild-g:7:go": true,
		"{rb12}{users}:rebuild-n:3":    true,
		"users:rebuild-n:3":            true,
		"users:rebuild-n:":             false,
		"users:rebuild-n:3x":           false,
		"users:rebuild-n:3:go":         false,
		"{users}:rebuild-m:3":          true,
		"users:rebuild-m:12":           true,
		"users:rebuild-m:":             false,
		"users:rebuild-m:3x":           false,
		"{users}:rebuild-l:3":          true,
		"users:rebuild-l:x":            false,
	} {
		if got := Reserved(key); got != want {
			t.Errorf("Reserved(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestManifestKey(t *testing.T) {
	// C99: a generation's manifest is in its registry's slot on a cluster,
	// and is one of keyswap's own keys.
	for _, live := range []string{"users:by-bucket", "{users}:by-email", "a}b"} {
		for _, cluster := range []bool{false, true} {
			for k, want := range map[string]string{
				ManifestKey(live, cluster, 7):     Base(live, cluster) + ":rebuild-m:7",
				ManifestListKey(live, cluster, 7): Base(live, cluster) + ":rebuild-l:7",
			} {
				if k != want {
					t.Errorf("got %q, want %q", k, want)
				}
				if cluster && Slot(k) != Slot(RegistryKey(live, cluster)) {
					t.Errorf("%q is not in the registry's slot", k)
				}
				if !Reserved(k) {
					t.Errorf("Reserved(%q) = false, want true", k)
				}
			}
		}
	}
}

func TestCounterKey(t *testing.T) {
	// C90: a run's per-slot counter is in its slot, names the run's lock
	// base and generation, and is one of keyswap's own keys.
	for _, live := range []string{"users:by-bucket", "{users}:by-email", "a}b"} {
		for _, slot := range []uint16{0, 1, 5000, SlotCount - 1} {
			k := CounterKey(live, slot, 7)
			if Slot(k) != slot {
				t.Errorf("CounterKey(%q, %d, 7) = %q is in slot %d", live, slot, k, Slot(k))
			}
			if want := "{" + SyntheticTag(slot) + "}" + Base(live, true) + ":rebuild-n:7"; k != want {
				t.Errorf("CounterKey(%q, %d, 7) = %q, want %q", live, slot, k, want)
			}
			if !Reserved(k) {
				t.Errorf("Reserved(%q) = false, want true", k)
			}
		}
	}
}

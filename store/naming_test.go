package store_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyswap/keyswap/store"
)

// namingNow is the fixed clock of the naming tests.
var namingNow = time.Unix(1_700_000_000, 0)

func namingClock(t time.Time) func() time.Time { return func() time.Time { return t } }

// namingLives are live keys of every kind: plain, tagged, keys that hash
// as a whole despite their braces, and bytes a key may hold.
var namingLives = []string{
	"users:by-email",
	"user{42}:idx",
	"a{}b",
	"a}b",
	"}{",
	"{}{x}",
	"{}",
	"a{b",
	"{",
	"}",
	"key with space",
	"ключ:索引",
	"tab\there",
	"nl\nhere",
	"nul\x00byte",
	"x:rebuild",                    // ends like the infix
	"x:rebuild:1",                  // a legacy temp key as a live key
	"x:rebuild:1:0123456789abcdef", // a temp key as a live key
}

// TestNewTempKeyShape: C1 on standalone: "<live>:rebuild:<unix>:<16
// lowercase hex>", the base byte for byte, T unpadded decimal, and the key
// recognised with the right base and timestamp.
func TestNewTempKeyShape(t *testing.T) {
	c := env.Standalone.Client(t)
	for _, now := range []time.Time{namingNow, time.Unix(7, 0), time.Unix(0, 0), time.Unix(1_700_000_000, 999_999_999)} {
		s := store.New(c, store.Options{Now: namingClock(now)})
		for _, live := range namingLives {
			t.Run(fmt.Sprintf("%d/%q", now.Unix(), live), func(t *testing.T) {
				temp := s.NewTempKey(live)
				prefix := live + ":rebuild:" + strconv.FormatInt(now.Unix(), 10) + ":"
				if !strings.HasPrefix(temp, prefix) {
					t.Fatalf("NewTempKey(%q) = %q, want prefix %q", live, temp, prefix)
				}
				if nonce := temp[len(prefix):]; !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(nonce) {
					t.Errorf("nonce %q, want 16 lowercase hex digits", nonce)
				}
				base, unix, ok := store.ParseTempKey(temp)
				if !ok || base != live || unix != now.Unix() {
					t.Errorf("ParseTempKey(%q) = %q, %d, %v; want %q, %d, true", temp, base, unix, ok, live, now.Unix())
				}
			})
		}
	}
}

// TestNewTempKeyUnique: C2 within one process: 100k keys from 8 goroutines
// within the same (fixed) second are all distinct.
func TestNewTempKeyUnique(t *testing.T) {
	t.Parallel()
	s := store.New(env.Standalone.Client(t), store.Options{Now: namingClock(namingNow)})
	const goroutines, per = 8, 12_500
	out := make([][]string, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			ks := make([]string, per)
			for i := range ks {
				ks[i] = s.NewTempKey("idx")
			}
			out[g] = ks
		})
	}
	wg.Wait()
	seen := make(map[string]bool, goroutines*per)
	prefix := "idx:rebuild:" + strconv.FormatInt(namingNow.Unix(), 10) + ":"
	for _, ks := range out {
		for _, k := range ks {
			if !strings.HasPrefix(k, prefix) {
				t.Fatalf("key %q, want prefix %q (all in the same second)", k, prefix)
			}
			if seen[k] {
				t.Fatalf("duplicate temp key %q", k)
			}
			seen[k] = true
		}
	}
	if got, want := len(seen), goroutines*per; got != want {
		t.Errorf("got %d distinct keys, want %d", got, want)
	}
}

// namingHelperEnv makes the test binary run TestHelperProcess as a child.
const namingHelperEnv = "KEYSWAP_NAMING_HELPER"

// namingHelperKeys is how many keys each child prints.
const namingHelperKeys = 10_000

// TestHelperProcess is not a test: TestNewTempKeyUniqueAcrossProcesses runs
// the test binary with it as a child that prints temp keys for the fixed
// clock. Run directly, it does nothing.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(namingHelperEnv) != "1" {
		return
	}
	s := store.New(env.Standalone.Client(t), store.Options{Now: namingClock(namingNow)})
	w := bufio.NewWriter(os.Stdout)
	for range namingHelperKeys {
		fmt.Fprintln(w, "KEY", s.NewTempKey("idx"))
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestNewTempKeyUniqueAcrossProcesses: C2 across processes: two processes
// naming temp keys for the same key in the same second never collide (the
// nonce is random, not a per-process counter or a seeded PRNG).
func TestNewTempKeyUniqueAcrossProcesses(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	outs := make([][]byte, 2)
	errs := make([]error, 2)
	for i := range outs {
		wg.Go(func() {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), namingHelperEnv+"=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			outs[i], errs[i] = cmd.Output()
			if errs[i] != nil {
				errs[i] = fmt.Errorf("child %d: %w\n%s", i, errs[i], stderr.Bytes())
			}
		})
	}
	wg.Wait()
	seen := map[string]int{}
	want := "idx:rebuild:" + strconv.FormatInt(namingNow.Unix(), 10) + ":"
	for i, out := range outs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		n := 0
		for line := range strings.Lines(string(out)) {
			k, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "KEY ")
			if !ok {
				continue
			}
			if !strings.HasPrefix(k, want) {
				t.Fatalf("child %d printed %q, want prefix %q", i, k, want)
			}
			if j, dup := seen[k]; dup {
				t.Fatalf("child %d and child %d both named %q", j, i, k)
			}
			seen[k] = i
			n++
		}
		if n != namingHelperKeys {
			t.Fatalf("child %d printed %d keys, want %d; output:\n%.2000s", i, n, namingHelperKeys, out)
		}
	}
}

// TestLockKeyNeverATempKey: C4: the lock key never matches the sweep's
// pattern "*:rebuild:*" nor the recogniser, on either deployment.
func TestLockKeyNeverATempKey(t *testing.T) {
	for _, tg := range []struct {
		name string
		s    *store.Store
	}{
		{"standalone", store.New(env.Standalone.Client(t), store.Options{})},
		{"cluster", store.New(env.Cluster.Client(t), store.Options{})},
	} {
		t.Run(tg.name, func(t *testing.T) {
			for _, live := range namingLives {
				lock := tg.s.LockKey(live)
				if base, unix, ok := store.ParseTempKey(lock); ok {
					t.Errorf("ParseTempKey(LockKey(%q) = %q) = %q, %d, true; want not recognised", live, lock, base, unix)
				}
				// A live key that itself matches the glob is matched with
				// its suffix; the suffix must not make a match of its own.
				// (path.Match's '*' stops at '/', which no key here has.)
				if m, _ := path.Match("*:rebuild:*", live+":"); m {
					continue
				}
				if m, err := path.Match(store.DefaultSweepPattern, lock); err != nil || m {
					t.Errorf("LockKey(%q) = %q matches %q (err %v)", live, lock, store.DefaultSweepPattern, err)
				}
			}
		})
	}
}

// TestParseTempKey: C3 and C5 through the store API: anchored at the end,
// digits, optional ':' + 16 hex of either case; the base is everything
// before the suffix.
func TestParseTempKey(t *testing.T) {
	for _, tt := range []struct {
		key  string
		base string
		unix int64
		ok   bool
	}{
		{"idx:rebuild:1700000000:0123456789abcdef", "idx", 1700000000, true},
		{"idx:rebuild:1700000000:0123456789ABCDEF", "idx", 1700000000, true},
		{"idx:rebuild:1700000000:0123456789AbCdEf", "idx", 1700000000, true},
		{"idx:rebuild:1700000000:1234567890123456", "idx", 1700000000, true}, // all-digit nonce
		{"idx:rebuild:1700000000", "idx", 1700000000, true},                  // C3 legacy
		{"idx:rebuild:0", "idx", 0, true},
		{"idx:rebuild:007", "idx", 7, true},
		{"a:rebuild:1:rebuild:2", "a:rebuild:1", 2, true},
		{"a:rebuild:1:0123456789abcdef:rebuild:2:fedcba9876543210", "a:rebuild:1:0123456789abcdef", 2, true},
		{"user{42}:idx:rebuild:5:0000000000000000", "user{42}:idx", 5, true},
		{"{users}:rebuild:5:0000000000000000", "{users}", 5, true},
		{"with space:rebuild:5", "with space", 5, true},
		{":rebuild:5", "", 5, true},
		{"x:rebuild:123:abc", "", 0, false},
		{"x:rebuild:", "", 0, false},
		{"x:rebuild:12x", "", 0, false},
		{"x:rebuild::0123456789abcdef", "", 0, false},
		{"x:rebuild:1:0123456789abcde", "", 0, false},   // 15 hex
		{"x:rebuild:1:0123456789abcdef0", "", 0, false}, // 17 hex
		{"x:rebuild:1:0123456789abcdeg", "", 0, false},
		{"x:rebuild:1:0123456789abcdef:", "", 0, false},
		{"x:rebuild:1:0123456789abcdef ", "", 0, false},
		{"x:rebuild:1 ", "", 0, false},
		{"x:rebuild:-1", "", 0, false},
		{"x:rebuild:+1", "", 0, false},
		{"x:rebuild-lock", "", 0, false},
		{"x:rebuild:1:rebuild-lock", "", 0, false},
		{"x:Rebuild:1", "", 0, false},
		{"x:rebuilt:1", "", 0, false},
		{"xrebuild:1", "", 0, false},
		{"", "", 0, false},
	} {
		t.Run(fmt.Sprintf("%q", tt.key), func(t *testing.T) {
			base, unix, ok := store.ParseTempKey(tt.key)
			if ok != tt.ok || base != tt.base || unix != tt.unix {
				t.Errorf("ParseTempKey(%q) = %q, %d, %v; want %q, %d, %v", tt.key, base, unix, ok, tt.base, tt.unix, tt.ok)
			}
		})
	}
}

// TestDerivedKeysShareSlot: C5+: on a cluster every derived key (lock, temp
// key) is in the live key's slot, as the server itself computes it; the
// temp key's recognised base leads back to the same lock, so the sweep's
// veto finds it. On standalone the shapes are exactly Familia's (C1, C4).
func TestDerivedKeysShareSlot(t *testing.T) {
	cluster := store.New(env.Cluster.Client(t), store.Options{Now: namingClock(namingNow)})
	standalone := store.New(env.Standalone.Client(t), store.Options{Now: namingClock(namingNow)})
	for _, live := range namingLives {
		t.Run(fmt.Sprintf("%q", live), func(t *testing.T) {
			want := env.Cluster.KeySlot(t, live)
			lock := cluster.LockKey(live)
			temps := []string{cluster.NewTempKey(live), cluster.NewTempKey(live)}
			for _, k := range append([]string{lock}, temps...) {
				if got := env.Cluster.KeySlot(t, k); got != want {
					t.Errorf("CLUSTER KEYSLOT %q = %d, want %d, the slot of %q", k, got, want, live)
				}
			}
			if !strings.HasSuffix(lock, ":rebuild-lock") {
				t.Errorf("LockKey(%q) = %q, want suffix :rebuild-lock", live, lock)
			}
			for _, temp := range temps {
				base, unix, ok := store.ParseTempKey(temp)
				if !ok || unix != namingNow.Unix() || base+":rebuild-lock" != lock {
					t.Errorf("ParseTempKey(%q) = %q, %d, %v; want a base whose lock is %q", temp, base, unix, ok, lock)
				}
				if !strings.Contains(temp, live) {
					t.Errorf("temp key %q does not contain the live key %q", temp, live)
				}
			}
			if temps[0] == temps[1] {
				t.Errorf("NewTempKey returned %q twice", temps[0])
			}

			// Standalone: Familia's shapes, byte for byte.
			if got, want := standalone.LockKey(live), live+":rebuild-lock"; got != want {
				t.Errorf("standalone LockKey(%q) = %q, want %q", live, got, want)
			}
			temp := standalone.NewTempKey(live)
			stem := live + ":rebuild:" + strconv.FormatInt(namingNow.Unix(), 10) + ":"
			if !strings.HasPrefix(temp, stem) || len(temp) != len(stem)+16 {
				t.Errorf("standalone NewTempKey(%q) = %q, want %q + 16 hex", live, temp, stem)
			}
		})
	}
}

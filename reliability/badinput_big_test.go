//go:build unix

package reliability

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// bigString returns a string of n zero bytes that costs no memory until
// read: a private anonymous mapping, whose untouched pages the kernel backs
// with its one zero page even when read. Its length is a real length, so a
// run sees a real 512 MB + 1 byte value, without the test allocating it
// (the mapping is unmapped when the test ends).
func bigString(t *testing.T, n int) string {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatalf("mmap %d bytes: %v", n, err)
	}
	t.Cleanup(func() {
		if err := syscall.Munmap(b); err != nil {
			t.Errorf("munmap: %v", err)
		}
	})
	return unsafe.String(&b[0], len(b))
}

// TestBadInputOver512MB: a value over Redis's 512 MB limit
// (proto-max-bulk-len) fails the run before its batch is sent, with an
// error that names the command, the key and the size, and writes nothing:
// no lock, no temp key, the live keys exactly as they were (C52, C35, C45).
// Both ways a builder turns entries into commands are checked: a command
// it adds (a hash's HSET), and entries it merges (a SetIndex's SADD, which
// the run groups into commands itself). Without the check, the value went
// out and Redis reset the connection in the middle of it: the error was
// "write: connection reset by peer", naming neither the key nor the size.
func TestBadInputOver512MB(t *testing.T) {
	t.Parallel()
	const size = 512<<20 + 1
	big := bigString(t, size)
	const items, batch, at = 3000, 500, 1200 // the big value is in the third batch
	for _, tc := range []struct {
		name string
		// value and member are an item's hash value (the added entry)
		// and SetIndex member (the merged entry).
		value, member func(badItem) string
		want          []string // in the error message, after prefix p
		key           string   // the *rebuild.Error's Key, after prefix p
	}{
		{
			name:   "hash value, added",
			value:  func(it badItem) string { return it.Value },
			member: func(it badItem) string { return "m" + strconv.Itoa(it.I) },
			want:   []string{"HSET on ", "h:rebuild:", "536870913 bytes", "over the 512 MB Redis accepts"},
			key:    "h",
		},
		{
			name:   "set member, merged",
			value:  func(it badItem) string { return "v" + strconv.Itoa(it.I) },
			member: func(it badItem) string { return it.Value },
			want:   []string{`SADD on "` + "{p}" + `idx:0"`, "536870913 bytes", "over the 512 MB Redis accepts"},
			key:    "idx",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// An argument over 1 MB that reaches the client is a failure
			// of the check (the value is sent), whatever the run returns.
			var mu sync.Mutex
			var sent []string
			see := func(cmds ...rueidis.Completed) {
				for _, cmd := range cmds {
					for _, a := range cmd.Commands() {
						if len(a) > 1<<20 {
							mu.Lock()
							sent = append(sent, fmt.Sprintf("%s of %d bytes", cmd.Commands()[0], len(a)))
							mu.Unlock()
						}
					}
				}
			}
			c := redistest.Watch(redistest.OwnServer(t).Client(t), see)
			p := redistest.Prefix(t)
			bs := []index.Builder[badItem]{
				builders.Hash(p+"h", func(it badItem) (string, string, bool) { return "f" + strconv.Itoa(it.I), tc.value(it), true }),
				badZset(p + "z"),
				builders.SetIndex(p+"idx", func(it badItem) (string, string, bool) { return strconv.Itoa(it.I % 3), tc.member(it), true }),
			}
			if err := badRun(c, rebuild.Options{}, bs...); err != nil {
				t.Fatalf("first run: %v", err)
			}
			// The live keys, exactly: 100 items.
			wantH, wantZ, wantIdx := map[string]string{}, map[string]float64{}, [3][]string{}
			for i := range 100 {
				it := badItem{I: i, Value: "v" + strconv.Itoa(i)}
				wantH["f"+strconv.Itoa(i)], wantZ["m"+strconv.Itoa(i)] = it.Value, float64(i)
				wantIdx[i%3] = append(wantIdx[i%3], tc.member(it))
			}
			check := func(when string) {
				t.Helper()
				if diff := cmp.Diff(wantH, redistest.HGetAll(t, c, p+"h")); diff != "" {
					t.Errorf("%s: hash %s (-want +got):\n%s", when, p+"h", diff)
				}
				if diff := cmp.Diff(wantZ, redistest.ZScores(t, c, p+"z")); diff != "" {
					t.Errorf("%s: sorted set %s (-want +got):\n%s", when, p+"z", diff)
				}
				for b, want := range wantIdx {
					k := p + "idx:" + strconv.Itoa(b)
					got := redistest.SMembers(t, c, k)
					slices.Sort(got)
					slices.Sort(want)
					if !slices.Equal(got, want) {
						t.Errorf("%s: set %s: got %q, want %q", when, k, got, want)
					}
				}
				for _, k := range []string{p + "h", p + "z", p + "idx:0"} {
					if ttl := redistest.PTTL(t, c, k); ttl != -1 {
						t.Errorf("%s: TTL of %s: got %v, want none (-1)", when, k, ttl)
					}
				}
			}
			check("first run")
			before := redistest.Snapshot(t, c, p)

			err := badRunSource(c, rebuild.Options{BatchSize: batch}, badItems(items, at, big), bs...)
			var e *rebuild.Error
			if !errors.As(err, &e) || e.Op != "build" || e.Key != p+tc.key {
				t.Fatalf("got %T %v, want a *rebuild.Error of Op build and Key %q", err, err, p+tc.key)
			}
			// The key names hold the test's name, "…512MB": look past them.
			msg := strings.ReplaceAll(err.Error(), p, "{p}")
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("got %q, want it to mention %q", msg, w)
				}
			}
			if len(sent) > 0 {
				t.Errorf("sent %q, want no argument over 1 MB sent", sent)
			}
			if left := redistest.Leftovers(t, c, p); len(left) > 0 {
				t.Errorf("leftovers: got %q, want none", left)
			}
			check("after the refused run")
			if diff := cmp.Diff(before, redistest.Snapshot(t, c, p)); diff != "" {
				t.Errorf("live keys changed (-before +after):\n%s", diff)
			}
		})
	}
}

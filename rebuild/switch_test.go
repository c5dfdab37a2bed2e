package rebuild_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/reader"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

// switchUsers returns version v of the users of TestSwitchModes: each
// version differs from the others, and every one has the user "always",
// in bucket b00 with the email always@example.com.
func switchUsers(v int) []user {
	us := genUsers(10+5*v, 3+v)
	for i := range us {
		us[i].ID = fmt.Sprintf("v%d-%s", v, us[i].ID)
		us[i].Email = fmt.Sprintf("v%d-%s", v, us[i].Email)
	}
	return append(us, user{ID: "always", Email: "always@example.com", Country: "b00"})
}

// switchReader reads the item every version has, through r, until stop
// closes, and counts the reads and the misses.
type switchReader struct {
	name          string
	r             *reader.Reader
	reads, misses atomic.Int64
	mu            sync.Mutex
	first         error
}

func (s *switchReader) run(ctx context.Context, stop <-chan struct{}, email, bucket string) {
	miss := func(err error) {
		s.misses.Add(1)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.first == nil {
			s.first = err
		}
	}
	for {
		select {
		case <-stop:
			return
		default:
		}
		id, ok, err := s.r.HGet(ctx, reader.Plain(email), "always@example.com")
		switch {
		case err != nil:
			miss(err)
		case !ok || id != "always":
			miss(fmt.Errorf("HGET %s always@example.com = %q, %v", email, id, ok))
		}
		in, err := s.r.SIsMember(ctx, reader.InBucket(bucket, "b00"), "always")
		switch {
		case err != nil:
			miss(err)
		case !in:
			miss(fmt.Errorf("SISMEMBER %s:b00 always = false", bucket))
		}
		s.reads.Add(1)
	}
}

func TestSwitchModes(t *testing.T) {
	// C92: an index goes from RenameInPlace to Generations (the first flip
	// creates the pointer, DropPlain removes the plain keys) and back (the
	// rename-in-place publish deletes the pointer and retires the
	// generations, which a sweep removes) while readers, with and without
	// the client-side cache, read it: none ever misses the item every
	// version holds. On the cluster the family carries a hash tag, which
	// RenameInPlace needs.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		email, bucket := d.Prefix+"users:by-email", d.Prefix+"users:by-bucket"
		const grace = 200 * time.Millisecond
		rebuilder := func(mode rebuild.PublishMode) *rebuild.Rebuilder[user] {
			return redistest.Rebuilder(t, d.Client, rebuild.Options{Publish: mode, Grace: grace, BatchSize: 7},
				builders.Hash(email, func(u user) (string, string, bool) { return u.Email, u.ID, true }),
				builders.SetIndex(bucket, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
		}
		var readers []*switchReader
		for _, disable := range []bool{false, true} {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: d.Addrs, DisableCache: disable})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			r, err := reader.New(c, reader.Options{CacheTTL: grace / 4})
			if err != nil {
				t.Fatal(err)
			}
			readers = append(readers, &switchReader{name: fmt.Sprintf("DisableCache=%v", disable), r: r})
		}
		run := func(mode rebuild.PublishMode, v int) {
			t.Helper()
			if _, err := rebuilder(mode).Run(ctx, sources.Slice(switchUsers(v))); err != nil {
				t.Fatalf("%v run of version %d: %v", mode, v, err)
			}
		}
		run(rebuild.RenameInPlace, 0)

		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, sr := range readers {
			wg.Go(func() { sr.run(ctx, stop, email, bucket) })
		}
		// Each reader reads at least once in each state of the index.
		waitReads := func() {
			t.Helper()
			for _, sr := range readers {
				want := sr.reads.Load() + 2
				for deadline := time.Now().Add(10 * time.Second); sr.reads.Load() < want; {
					if time.Now().After(deadline) {
						t.Fatalf("reader %s stalled", sr.name)
					}
					time.Sleep(time.Millisecond) // polling
				}
			}
		}
		waitReads()
		run(rebuild.Generations, 1)
		waitReads()
		gen := rebuilder(rebuild.Generations)
		dropped, err := gen.DropPlain(ctx)
		if err != nil {
			t.Fatalf("DropPlain: %v", err)
		}
		if dropped.Keys != int64(1+len(bucketsOf(switchUsers(0)))) {
			t.Errorf("DropPlain deleted %d keys, want the hash and the %d buckets of version 0", dropped.Keys, len(bucketsOf(switchUsers(0))))
		}
		waitReads()
		run(rebuild.Generations, 2)
		waitReads()
		run(rebuild.RenameInPlace, 3)
		waitReads()
		// The sweep removes generation 2, retired by the switch back, once
		// its grace has passed.
		for deadline := time.Now().Add(10 * time.Second); ; {
			stats, err := gen.Sweep(ctx)
			if err != nil {
				t.Fatalf("Sweep: %v", err)
			}
			if len(stats.Indexes[email].Kept) == 0 && len(stats.Indexes[bucket].Kept) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Sweep keeps %+v", stats)
			}
		}
		waitReads()
		close(stop)
		wg.Wait()
		for _, sr := range readers {
			if n := sr.misses.Load(); n > 0 {
				t.Errorf("reader %s missed the item every version holds %d times in %d reads; first: %v", sr.name, n, sr.reads.Load(), sr.first)
			}
		}

		// The plain shape of version 3, exactly; no pointer, no generation
		// key, a registry with no generation left.
		us := switchUsers(3)
		wantEmails := map[string]string{}
		for _, u := range us {
			wantEmails[u.Email] = u.ID
		}
		redistest.WantHash(t, d.Other, email, wantEmails)
		buckets := bucketsOf(us)
		for b, ids := range buckets {
			if got := redistest.SMembers(t, d.Other, bucket+":"+b); !slices.Equal(got, ids) {
				t.Errorf("%s:%s = %v, want %v", bucket, b, got, ids)
			}
		}
		for _, live := range []string{email, bucket} {
			redistest.WantAbsent(t, d.Other, keys.PointerKey(live, d.Cluster))
			redistest.WantHash(t, d.Other, keys.RegistryKey(live, d.Cluster), map[string]string{keys.RegNext: "2"})
		}
		var want []string
		for _, b := range slices.Sorted(maps.Keys(buckets)) {
			want = append(want, bucket+":"+b)
		}
		// The owner stamps stay too (C104): switching modes keeps the base's.
		want = append(want, email, keys.MetaKey(email, d.Cluster), keys.MetaKey(bucket, d.Cluster),
			keys.RegistryKey(email, d.Cluster), keys.RegistryKey(bucket, d.Cluster))
		want = append(want, redistest.OwnerStamps(d.Cluster, email, bucket)...)
		slices.Sort(want)
		if got := redistest.Keys(t, d.Other, d.Prefix); !slices.Equal(got, want) {
			t.Errorf("keys %v, want %v", got, want)
		}
	})
}

// bucketsOf returns the members of each bucket of us, sorted.
func bucketsOf(us []user) map[string][]string {
	out := map[string][]string{}
	for _, u := range us {
		out[u.Country] = append(out[u.Country], u.ID)
	}
	for _, ids := range out {
		slices.Sort(ids)
	}
	return out
}

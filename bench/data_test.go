package main

import (
	"fmt"
	"testing"
)

func TestDatasetItem(t *testing.T) {
	d := newDataset(100, 1000)
	for _, i := range []int{0, 42, 99, 1234567} {
		it := d.item(i)
		if want := fmt.Sprintf("user:%07d", i); it.member != want {
			t.Errorf("item(%d).member: got %q, want %q", i, it.member, want)
		}
		if want := fmt.Sprintf("user%07d@example.test", i); it.value != want || len(it.value) != 24 {
			t.Errorf("item(%d).value: got %q, want %q (24 bytes)", i, it.value, want)
		}
		if it != d.item(i) {
			t.Errorf("item(%d) is not deterministic", i)
		}
		if old := d.previous().item(i); old.member == it.member || len(old.member) != len(it.member) {
			t.Errorf("previous item(%d).member: got %q, want another member as long as %q", i, old.member, it.member)
		}
	}
}

func TestDatasetBucketCount(t *testing.T) {
	for _, tt := range []struct{ n, buckets, want int }{
		{1, 1000, 1},
		{100000, 1000, 1000},
		{5, 1, 1},
	} {
		d := newDataset(tt.n, tt.buckets)
		seen := map[string]bool{}
		for it := range d.all() {
			seen[it.bucket] = true
		}
		if got := d.bucketCount(); got != len(seen) || got != tt.want {
			t.Errorf("bucketCount(n=%d, buckets=%d): got %d, counted %d, want %d", tt.n, tt.buckets, got, len(seen), tt.want)
		}
	}
}

// TestCommands checks that every workload's commands carry each entry
// exactly once, at most perCmd per command.
func TestCommands(t *testing.T) {
	d := newDataset(2500, 10)
	for _, w := range allWorkloads(10) {
		for _, perCmd := range []int{1, 1000} {
			t.Run(fmt.Sprintf("%s/%d", w.name, perCmd), func(t *testing.T) {
				entries := map[string]int{} // per command name and target
				commands := 0
				err := w.commands(d, perCmd, func(name, key string, args []string, n int) error {
					commands++
					perEntry := 1
					if name != "SADD" {
						perEntry = 2
					}
					if len(args) != n*perEntry || n < 1 || n > perCmd {
						t.Fatalf("%s %s: %d args for %d entries, want %d per entry and at most %d entries", name, key, len(args), n, perEntry, perCmd)
					}
					entries[name] += n
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				for _, tg := range w.targets {
					name := map[kind]string{kindHash: "HSET", kindZset: "ZADD", kindSet: "SADD", kindIndex: "SADD"}[tg.kind]
					if entries[name] != d.n {
						t.Errorf("%s: got %d entries, want %d", name, entries[name], d.n)
					}
				}
				if perCmd == 1000 && w.name == "setindex" && commands != 10 {
					t.Errorf("setindex: got %d commands, want 10: one per bucket, grouped across the source", commands)
				}
			})
		}
	}
}

// TestDatasetAll checks that the sequential source, which counts in decimal,
// yields exactly item(i) for each i.
func TestDatasetAll(t *testing.T) {
	d := newDataset(12_000, 7)
	i := 0
	for it := range d.all() {
		if want := d.item(i); it != want {
			t.Fatalf("item %d: got %+v, want %+v", i, it, want)
		}
		i++
	}
	if i != d.n {
		t.Errorf("got %d items, want %d", i, d.n)
	}
	// Around the 7-digit boundary.
	digits := []byte("9999998")
	for _, i := range []int{9_999_998, 9_999_999} {
		if got, want := d.make(i, digits), d.item(i); got != want {
			t.Errorf("item %d: got %+v, want %+v", i, got, want)
		}
		digits = []byte("9999999")
	}
	if got := d.item(10_000_000).member; got != "user:10000000" {
		t.Errorf("item 10000000: got member %q, want user:10000000", got)
	}
}

// TestFamilyDataset checks the publish section's data: every bucket holds
// its share of the items, and a tenth of the previous dataset's buckets are
// orphans.
func TestFamilyDataset(t *testing.T) {
	for _, tt := range []struct{ buckets, perBucket, orphans int }{
		{1000, 10, 100},
		{10, 3, 1},
		{5, 2, 0}, // a tenth of 5 rounds down
	} {
		d := familyDataset(tt.buckets, tt.perBucket)
		if got := d.orphans(); got != tt.orphans {
			t.Errorf("%d buckets: got %d orphans, want %d", tt.buckets, got, tt.orphans)
		}
		for _, ds := range []dataset{d, d.previous()} {
			count := map[string]int{}
			for it := range ds.all() {
				count[it.bucket]++
			}
			if len(count) != tt.buckets || ds.bucketCount() != tt.buckets {
				t.Errorf("%d buckets (old %v): got %d buckets, bucketCount %d", tt.buckets, ds.old, len(count), ds.bucketCount())
			}
			for j, b := range ds.buckets {
				if count[b] != tt.perBucket || ds.bucketSize(j) != tt.perBucket {
					t.Errorf("%d buckets (old %v): bucket %s holds %d items, bucketSize %d, want %d", tt.buckets, ds.old, b, count[b], ds.bucketSize(j), tt.perBucket)
				}
			}
		}
		if old := d.previous(); old.buckets[0] != "b000000" || d.buckets[0] != fmt.Sprintf("b%06d", tt.orphans) {
			t.Errorf("%d buckets: first buckets old %s, new %s; want b000000 and the new family shifted by its orphans", tt.buckets, old.buckets[0], d.buckets[0])
		}
	}
	if d := newDataset(100, 10); d.orphans() != 0 || d.previous().buckets[0] != d.buckets[0] {
		t.Errorf("newDataset: the previous dataset has other buckets")
	}
	// Fewer items than buckets: the first buckets get one each.
	d := familyDataset(100, 1)
	d.n = 30
	if d.bucketCount() != 30 || d.bucketSize(29) != 1 || d.bucketSize(30) != 0 {
		t.Errorf("30 items in 100 buckets: bucketCount %d, sizes %d, %d; want 30, 1, 0", d.bucketCount(), d.bucketSize(29), d.bucketSize(30))
	}
}

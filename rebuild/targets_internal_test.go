package rebuild

import (
	"fmt"
	"sync"
	"testing"
)

func TestBucketIndexFindsEveryBucketAdded(t *testing.T) {
	var ix bucketIndex
	if got := ix.find("b0"); got != nil {
		t.Fatalf("find on an empty index: %v, want nil", got)
	}
	ts := make([]*target, 1000)
	for i := range ts {
		ts[i] = &target{bucket: fmt.Sprintf("b%d", i)}
		ix.add(ts[i])
		// Every bucket added so far is found, whether in the map that
		// lookups read or among those added since.
		for _, j := range []int{0, i / 2, i} {
			if got := ix.find(ts[j].bucket); got != ts[j] {
				t.Fatalf("after adding %d buckets, find(%q) = %v, want its target", i+1, ts[j].bucket, got)
			}
		}
	}
	if got := ix.find("b1000"); got != nil {
		t.Errorf("find of a bucket never added: %v, want nil", got)
	}
	// Lookups that missed the read map have promoted the buckets added:
	// after as many misses as the map has entries, all are in it.
	for range 1000 {
		ix.find(ts[999].bucket)
	}
	read := *ix.read.Load()
	if len(read) != 1000 || len(ix.added) != 0 {
		t.Errorf("read map holds %d buckets and %d wait, want 1000 and 0", len(read), len(ix.added))
	}
}

func TestBucketIndexConcurrent(t *testing.T) {
	var ix bucketIndex
	const goroutines, buckets = 4, 2000
	ts := make([]*target, buckets)
	for i := range ts {
		ts[i] = &target{bucket: fmt.Sprintf("b%d", i)}
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			// Each goroutine adds a quarter of the buckets and looks up
			// all of them, as build goroutines do: a bucket another
			// goroutine may not have added yet can be missing, one this
			// goroutine added cannot, whatever the others promote.
			for i := g; i < buckets; i += goroutines {
				ix.add(ts[i])
				for j := g; j <= i; j += goroutines {
					if got := ix.find(ts[j].bucket); got != ts[j] {
						t.Errorf("after adding %q, find(%q) = %v, want its target", ts[i].bucket, ts[j].bucket, got)
						return
					}
				}
			}
			for round := range 3 {
				for i := range ts {
					if got := ix.find(ts[i].bucket); got != nil && got != ts[i] {
						t.Errorf("round %d: find(%q) returned another bucket's target", round, ts[i].bucket)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for i := range ts {
		if got := ix.find(ts[i].bucket); got != ts[i] {
			t.Fatalf("after every add: find(%q) = %v, want its target", ts[i].bucket, got)
		}
	}
}

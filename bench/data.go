package main

import (
	"fmt"
	"iter"
	"strconv"
)

// item is one source entry. Every workload derives its writes from it: a
// hash field and value, a sorted-set member and score, a set member, a
// SetIndex bucket and member.
type item struct {
	member string  // "user:0000042": hash field, sorted-set and set member
	value  string  // "user0000042@example.test": 24 bytes, the hash value
	score  float64 // a pseudo-random integer score
	bucket string  // the SetIndex bucket, one of dataset.buckets
}

// dataset generates n items deterministically, one at a time, so that a
// source of any size holds no memory: item i is a function of i alone.
type dataset struct {
	n       int
	old     bool     // generate the "old" variant: members "oldu:%07d"
	buckets []string // SetIndex bucket names
	// spread puts item i in bucket i mod len(buckets), rather than in a
	// pseudo-random one, so that every bucket holds n/len(buckets) items
	// (the first n mod len(buckets) one more).
	spread bool
	// oldBuckets, when not nil, are the buckets of the previous dataset,
	// instead of buckets.
	oldBuckets []string
}

// newDataset returns the dataset of n items over buckets SetIndex buckets.
func newDataset(n, buckets int) dataset {
	names := make([]string, buckets)
	for i := range names {
		names[i] = fmt.Sprintf("b%03d", i)
	}
	return dataset{n: n, buckets: names}
}

// familyDataset returns the publish section's dataset: perBucket members
// in each of buckets buckets, "b%06d", spread evenly. Its previous dataset
// has as many buckets, but a tenth of them (rounded down) are not among the
// new ones, which start that much further: the orphans that the publish
// deletes, while it replaces the other nine tenths.
func familyDataset(buckets, perBucket int) dataset {
	shift := buckets / 10
	names := make([]string, buckets+shift)
	for i := range names {
		names[i] = fmt.Sprintf("b%06d", i)
	}
	return dataset{n: buckets * perBucket, buckets: names[shift:], oldBuckets: names[:buckets], spread: true}
}

// orphans returns how many of the previous dataset's buckets d does not
// have: buckets a SetIndex publish of d deletes.
func (d dataset) orphans() int {
	if d.oldBuckets == nil {
		return 0
	}
	have := make(map[string]bool, len(d.buckets))
	for _, b := range d.buckets[:min(d.n, len(d.buckets))] {
		have[b] = true
	}
	old := d.previous()
	n := 0
	for _, b := range old.buckets[:old.bucketCount()] {
		if !have[b] {
			n++
		}
	}
	return n
}

// previous returns the dataset a keyswap run replaces: as many items, with
// different members, so that a run that did not publish shows up; and in
// oldBuckets, when d has them.
func (d dataset) previous() dataset {
	d.old = true
	if d.oldBuckets != nil {
		d.buckets, d.oldBuckets = d.oldBuckets, nil
	}
	return d
}

// item returns item i.
func (d dataset) item(i int) item {
	digits := appendPadded(nil, i)
	return d.make(i, digits)
}

// make returns item i, whose zero-padded decimal digits are given. It
// allocates once: member and value share one string.
func (d dataset) make(i int, digits []byte) item {
	prefix := d.prefix()
	var buf [36]byte // "user:0000042" + "user0000042@example.test"
	b := append(buf[:0], prefix...)
	b = append(b, ':')
	b = append(b, digits...)
	b = append(b, prefix...)
	b = append(b, digits...)
	b = append(b, "@example.test"...)
	s := string(b)
	h := mix(uint64(i))
	member := len(prefix) + 1 + len(digits)
	return item{
		member: s[:member],
		value:  s[member:],
		score:  float64(h % 10_000_000),
		bucket: d.buckets[d.bucketIndex(i, h)],
	}
}

// bucketIndex returns the index in d.buckets of item i, whose mix is h.
func (d dataset) bucketIndex(i int, h uint64) int {
	if d.spread {
		return i % len(d.buckets)
	}
	return int((h >> 32) % uint64(len(d.buckets)))
}

func (d dataset) prefix() string {
	if d.old {
		return "oldu"
	}
	return "user"
}

// all yields every item in order. It counts in decimal rather than
// formatting each index: the source should cost the client little, as
// redis-cli's pre-generated input costs it nothing.
func (d dataset) all() iter.Seq[item] {
	return func(yield func(item) bool) {
		digits := []byte("0000000")
		for i := range d.n {
			if i == 10_000_000 { // past 7 digits, %07d pads no more
				digits = []byte("10000000")
			}
			if !yield(d.make(i, digits)) {
				return
			}
			for j := len(digits) - 1; j >= 0; j-- {
				if digits[j] != '9' {
					digits[j]++
					break
				}
				digits[j] = '0'
			}
		}
	}
}

// bucketCount returns how many distinct buckets the items fall in: the
// number of keys a SetIndex of this dataset must end with. A spread
// dataset's are its first buckets.
func (d dataset) bucketCount() int {
	if d.spread {
		return min(d.n, len(d.buckets))
	}
	seen := make([]bool, len(d.buckets))
	count := 0
	for i := range d.n {
		b := d.bucketIndex(i, mix(uint64(i)))
		if !seen[b] {
			seen[b] = true
			count++
		}
	}
	return count
}

// bucketSize returns how many items a spread dataset puts in bucket j of
// d.buckets.
func (d dataset) bucketSize(j int) int {
	n := d.n / len(d.buckets)
	if j < d.n%len(d.buckets) {
		n++
	}
	return n
}

// appendPadded appends i in decimal, zero-padded to 7 digits (%07d).
func appendPadded(b []byte, i int) []byte {
	var digits [20]byte
	s := strconv.AppendInt(digits[:0], int64(i), 10)
	for range 7 - len(s) {
		b = append(b, '0')
	}
	return append(b, s...)
}

// mix is splitmix64's finaliser: a cheap, well-spread hash of i.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// formatScore formats a score as the sorted-set builder does.
func formatScore(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

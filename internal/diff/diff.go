// Package diff compares a rebuilt temp key with its live key, and counts
// the entries of keys, without blocking Redis: cardinalities come from
// O(1) commands, and a comparison reads at most a bounded number of
// entries, with SCAN cursors (HSCAN, ZSCAN, SSCAN) and batched lookups
// (HMGET, ZMSCORE, SMISMEMBER). The counts are exact when one of the two
// keys is within the bound: reading it, and looking its entries up in the
// other, counts all three kinds. Past the bound on both sides they are
// estimated from random samples (HRANDFIELD, ZRANDMEMBER, SRANDMEMBER),
// each with a 95% confidence interval.
package diff

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/redis/rueidis"
)

// Sizes returns the TYPE and the number of entries of each key: fields,
// members or elements for a hash, sorted set, set, list or stream; 1 for
// any other key that exists; 0 for a missing one ("none"). It sends two
// pipelined round trips per chunk of keys.
func Sizes(ctx context.Context, c rueidis.Client, ks []string) (types []string, sizes []int64, err error) {
	types = make([]string, len(ks))
	sizes = make([]int64, len(ks))
	const chunk = 1000
	for start := 0; start < len(ks); start += chunk {
		part := ks[start:min(len(ks), start+chunk)]
		cmds := make(rueidis.Commands, len(part))
		for i, k := range part {
			cmds[i] = c.B().Type().Key(k).Build()
		}
		for i, res := range c.DoMulti(ctx, cmds...) {
			if types[start+i], err = res.ToString(); err != nil {
				return nil, nil, fmt.Errorf("TYPE %s: %w", part[i], err)
			}
		}
		cmds = cmds[:0]
		var at []int
		for i, k := range part {
			if cmd, ok := cardinality(c, types[start+i], k); ok {
				cmds = append(cmds, cmd)
				at = append(at, start+i)
			} else if types[start+i] != "none" {
				sizes[start+i] = 1
			}
		}
		for j, res := range c.DoMulti(ctx, cmds...) {
			if sizes[at[j]], err = res.AsInt64(); err != nil {
				return nil, nil, fmt.Errorf("size of %s: %w", ks[at[j]], err)
			}
		}
	}
	return types, sizes, nil
}

// cardinality returns the O(1) command that counts the entries of a key of
// type kind.
func cardinality(c rueidis.Client, kind, key string) (rueidis.Completed, bool) {
	switch kind {
	case "hash":
		return c.B().Hlen().Key(key).Build(), true
	case "zset":
		return c.B().Zcard().Key(key).Build(), true
	case "set":
		return c.B().Scard().Key(key).Build(), true
	case "list":
		return c.B().Llen().Key(key).Build(), true
	case "stream":
		return c.B().Xlen().Key(key).Build(), true
	}
	return rueidis.Completed{}, false
}

// Options bounds a comparison.
type Options struct {
	// Limit is the most entries a comparison reads from each of the two
	// keys before it samples instead. Zero means DefaultLimit.
	Limit int
	// Samples is the number of differing entries reported. Zero means
	// DefaultSamples.
	Samples int
	// SampleSize is the number of random entries drawn from each key past
	// Limit. Zero means DefaultSampleSize.
	SampleSize int
}

// Defaults for Options.
const (
	DefaultLimit      = 100_000
	DefaultSamples    = 10
	DefaultSampleSize = 1000
)

func (o Options) withDefaults() Options {
	if o.Limit <= 0 {
		o.Limit = DefaultLimit
	}
	if o.Samples <= 0 {
		o.Samples = DefaultSamples
	}
	if o.SampleSize <= 0 {
		o.SampleSize = DefaultSampleSize
	}
	return o
}

// Entry is one entry that differs between the two keys.
type Entry struct {
	// Kind is "added" (in the new key only), "removed" (in the live key
	// only) or "changed" (another value or score).
	Kind string `json:"kind"`
	// Entry is the field or member.
	Entry string `json:"entry"`
	// Old and New are its values (hash) or scores (sorted set), "" where
	// absent or for a set.
	Old string `json:"old,omitempty"`
	New string `json:"new,omitempty"`
}

// Key is the comparison of a new (temp) key with its live key.
type Key struct {
	Live string `json:"live"`
	Temp string `json:"temp"`
	// Type is the new key's type ("none" if it is empty), LiveType the
	// live key's.
	Type     string `json:"type"`
	LiveType string `json:"live_type"`
	// LiveSize and NewSize are the entry counts (see Sizes).
	LiveSize int64 `json:"live_size"`
	NewSize  int64 `json:"new_size"`
	// Added, Removed and Changed count the entries in the new key only, in
	// the live key only, and in both with another value or score.
	Added   int64 `json:"added"`
	Removed int64 `json:"removed"`
	Changed int64 `json:"changed"`
	// Exact is false when the counts are estimates from samples (both keys
	// larger than Options.Limit), or when the keys are of a type that is
	// not compared entry by entry (Added, Removed and Changed are then 0).
	Exact bool `json:"exact"`
	// Sampled is true when the counts are estimates from random samples;
	// AddedRange, RemovedRange and ChangedRange then bound each with a 95%
	// confidence interval (see Interval). They are the zero Interval
	// otherwise.
	Sampled      bool     `json:"sampled"`
	AddedRange   Interval `json:"added_range"`
	RemovedRange Interval `json:"removed_range"`
	ChangedRange Interval `json:"changed_range"`
	// Samples are some of the differing entries.
	Samples []Entry `json:"samples,omitempty"`
}

// Compare compares temp, the rebuilt value, with live. Hashes, sorted sets
// and sets are compared entry by entry: exactly when one of the two keys
// has at most o.Limit entries, by reading it whole; otherwise from random
// samples of both, with confidence intervals. Other types are compared
// only by size.
func Compare(ctx context.Context, c rueidis.Client, live, temp string, o Options) (Key, error) {
	o = o.withDefaults()
	types, sizes, err := Sizes(ctx, c, []string{temp, live})
	if err != nil {
		return Key{}, err
	}
	k := Key{Live: live, Temp: temp, Type: types[0], LiveType: types[1], NewSize: sizes[0], LiveSize: sizes[1]}
	kind := k.Type
	if kind == "none" {
		kind = k.LiveType
	}
	if k.LiveType != "none" && k.Type != "none" && k.LiveType != k.Type || !comparable(kind) {
		return k, nil
	}
	// Read the smaller key whole when it is within the limit.
	small, fromLive := k.NewSize, false
	if k.LiveSize < k.NewSize {
		small, fromLive = k.LiveSize, true
	}
	if small <= int64(o.Limit) {
		return k, exact(ctx, c, &k, kind, o, fromLive)
	}
	return k, sampled(ctx, c, &k, kind, o)
}

func comparable(kind string) bool {
	return kind == "hash" || kind == "zset" || kind == "set"
}

// exact counts exactly by reading one key whole, the new one or, with
// fromLive, the live one, and looking each page of it up in the other: the
// entries of the other key that are not in the one read are its size minus
// those found. A SCAN cursor may return an entry twice; each is counted
// once. It then reads at most Options.Limit entries of the other key to
// name a few of the entries only there.
func exact(ctx context.Context, c rueidis.Client, k *Key, kind string, o Options, fromLive bool) error {
	k.Exact = true
	read, other, size := k.Temp, k.Live, k.NewSize
	if fromLive {
		read, other, size = k.Live, k.Temp, k.LiveSize
	}
	var common, only int64 // entries of read found in other, and not
	if size > 0 {
		seen := make(map[string]struct{}, size)
		err := scanEntries(ctx, c, kind, read, func(entries, values []string) error {
			theirs, found, err := lookup(ctx, c, kind, other, entries)
			if err != nil {
				return err
			}
			for i, e := range entries {
				if _, dup := seen[e]; dup {
					continue
				}
				seen[e] = struct{}{}
				oldV, newV := theirs[i], values[i]
				if fromLive {
					oldV, newV = values[i], theirs[i]
				}
				switch {
				case !found[i]:
					only++
					if fromLive {
						k.sample(o, Entry{Kind: "removed", Entry: e, Old: values[i]})
					} else {
						k.sample(o, Entry{Kind: "added", Entry: e, New: values[i]})
					}
				case oldV != newV:
					common++
					k.Changed++
					k.sample(o, Entry{Kind: "changed", Entry: e, Old: oldV, New: newV})
				default:
					common++
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	otherSize, otherKind := k.LiveSize, "removed"
	if fromLive {
		k.Removed, k.Added = only, max(0, k.NewSize-common)
		otherSize, otherKind = k.NewSize, "added"
	} else {
		k.Added, k.Removed = only, max(0, k.LiveSize-common)
	}
	if otherSize-common > 0 && len(k.Samples) < o.Samples {
		// Name a few: scan the other key, at most Limit entries of it, for
		// entries that the one read lacks.
		budget := o.Limit
		return scanEntries(ctx, c, kind, other, func(entries, values []string) error {
			_, found, err := lookup(ctx, c, kind, read, entries)
			if err != nil {
				return err
			}
			for i, e := range entries {
				if found[i] {
					continue
				}
				if otherKind == "added" {
					k.sample(o, Entry{Kind: "added", Entry: e, New: values[i]})
				} else {
					k.sample(o, Entry{Kind: "removed", Entry: e, Old: values[i]})
				}
			}
			if budget -= len(entries); len(k.Samples) >= o.Samples || budget <= 0 {
				return errEnough
			}
			return nil
		})
	}
	return nil
}

// sampled estimates the counts from random entries of both keys.
func sampled(ctx context.Context, c rueidis.Client, k *Key, kind string, o Options) error {
	var added, changed, missing, drawnNew, drawnLive int64
	if k.NewSize > 0 {
		entries, values, err := random(ctx, c, kind, k.Temp, o.SampleSize)
		if err != nil {
			return err
		}
		old, found, err := lookup(ctx, c, kind, k.Live, entries)
		if err != nil {
			return err
		}
		drawnNew = int64(len(entries))
		for i, e := range entries {
			switch {
			case !found[i]:
				added++
				k.sample(o, Entry{Kind: "added", Entry: e, New: values[i]})
			case old[i] != values[i]:
				changed++
				k.sample(o, Entry{Kind: "changed", Entry: e, Old: old[i], New: values[i]})
			}
		}
	}
	if k.LiveSize > 0 {
		entries, values, err := random(ctx, c, kind, k.Live, o.SampleSize)
		if err != nil {
			return err
		}
		_, found, err := lookup(ctx, c, kind, k.Temp, entries)
		if err != nil {
			return err
		}
		drawnLive = int64(len(entries))
		for i, e := range entries {
			if !found[i] {
				missing++
				k.sample(o, Entry{Kind: "removed", Entry: e, Old: values[i]})
			}
		}
	}
	k.Sampled = true
	k.Added, k.AddedRange = estimate(added, drawnNew, k.NewSize)
	k.Changed, k.ChangedRange = estimate(changed, drawnNew, k.NewSize)
	k.Removed, k.RemovedRange = estimate(missing, drawnLive, k.LiveSize)
	return nil
}

// Interval bounds an estimated count: a 95% confidence interval, which
// holds the true count in 95 of 100 comparisons. It is the Wilson score
// interval of the proportion found in a sample drawn without replacement,
// with the finite population correction, scaled to the key's size and
// narrowed to what the sample proves: at least the entries found, at most
// the size less the entries sampled and not found.
type Interval struct {
	Low  int64 `json:"low"`
	High int64 `json:"high"`
}

// z95 is the normal quantile of a two-sided 95% interval.
const z95 = 1.959963984540054

// estimate returns the estimated count of entries with a property in a key
// of size entries, x of n distinct entries drawn at random having it, and
// its Interval. A sample of the whole key gives the exact count.
func estimate(x, n, size int64) (int64, Interval) {
	if n <= 0 || size <= 0 {
		return 0, Interval{}
	}
	if n >= size {
		return x, Interval{Low: x, High: x}
	}
	lo, hi := wilson(float64(x), float64(n), float64(size), z95)
	iv := Interval{Low: int64(math.Floor(lo * float64(size))), High: int64(math.Ceil(hi * float64(size)))}
	iv.Low = min(max(iv.Low, x), size-(n-x))
	iv.High = max(min(iv.High, size-(n-x)), iv.Low)
	return x * size / n, iv
}

// wilson returns the Wilson score interval, at the normal quantile z, of
// the proportion x/n in a sample of n drawn without replacement from size:
// the finite population correction enlarges the sample to n(size-1)/(size-n).
func wilson(x, n, size, z float64) (lo, hi float64) {
	if n < size {
		n2 := n * (size - 1) / (size - n)
		x, n = x*n2/n, n2
	}
	p := x / n
	z2 := z * z
	center := (p + z2/(2*n)) / (1 + z2/n)
	half := z * math.Sqrt(p*(1-p)/n+z2/(4*n*n)) / (1 + z2/n)
	return max(0, center-half), min(1, center+half)
}

func (k *Key) sample(o Options, e Entry) {
	if len(k.Samples) < o.Samples {
		k.Samples = append(k.Samples, e)
	}
}

// errEnough stops a scan early.
var errEnough = fmt.Errorf("enough")

// scanEntries calls f with each page of key's entries and their values
// (scores for a sorted set, "" for a set), as a SCAN cursor returns them:
// an entry can come twice, never missed.
func scanEntries(ctx context.Context, c rueidis.Client, kind, key string, f func(entries, values []string) error) error {
	cursor := uint64(0)
	for {
		var cmd rueidis.Completed
		switch kind {
		case "hash":
			cmd = c.B().Hscan().Key(key).Cursor(cursor).Count(1000).Build()
		case "zset":
			cmd = c.B().Zscan().Key(key).Cursor(cursor).Count(1000).Build()
		default:
			cmd = c.B().Sscan().Key(key).Cursor(cursor).Count(1000).Build()
		}
		page, err := c.Do(ctx, cmd).AsScanEntry()
		if err != nil {
			return fmt.Errorf("scanning %s: %w", key, err)
		}
		entries, values := split(kind, page.Elements)
		if err := f(entries, values); err == errEnough {
			return nil
		} else if err != nil {
			return err
		}
		if cursor = page.Cursor; cursor == 0 {
			return nil
		}
	}
}

// split splits a reply of entries, interleaved with values for a hash or a
// sorted set.
func split(kind string, elems []string) (entries, values []string) {
	if kind == "set" {
		return elems, make([]string, len(elems))
	}
	for i := 0; i+1 < len(elems); i += 2 {
		entries = append(entries, elems[i])
		values = append(values, normal(kind, elems[i+1]))
	}
	return entries, values
}

// normal returns a score as strconv formats it, so that "1" and "1.0"
// compare equal.
func normal(kind, v string) string {
	if kind != "zset" {
		return v
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return v
}

// lookup returns, for each entry, its value in key and whether it is there.
func lookup(ctx context.Context, c rueidis.Client, kind, key string, entries []string) (values []string, found []bool, err error) {
	values = make([]string, len(entries))
	found = make([]bool, len(entries))
	if len(entries) == 0 {
		return values, found, nil
	}
	switch kind {
	case "hash":
		ms, err := c.Do(ctx, c.B().Hmget().Key(key).Field(entries...).Build()).ToArray()
		if err != nil {
			return nil, nil, fmt.Errorf("HMGET %s: %w", key, err)
		}
		for i, m := range ms {
			if v, err := m.ToString(); err == nil {
				values[i], found[i] = v, true
			}
		}
	case "zset":
		ms, err := c.Do(ctx, c.B().Zmscore().Key(key).Member(entries...).Build()).ToArray()
		if err != nil {
			return nil, nil, fmt.Errorf("ZMSCORE %s: %w", key, err)
		}
		for i, m := range ms {
			if f, err := m.AsFloat64(); err == nil {
				values[i], found[i] = strconv.FormatFloat(f, 'g', -1, 64), true
			}
		}
	default:
		ns, err := c.Do(ctx, c.B().Smismember().Key(key).Member(entries...).Build()).AsIntSlice()
		if err != nil {
			return nil, nil, fmt.Errorf("SMISMEMBER %s: %w", key, err)
		}
		for i, n := range ns {
			found[i] = n == 1
		}
	}
	return values, found, nil
}

// random draws up to n distinct random entries of key, with their values.
func random(ctx context.Context, c rueidis.Client, kind, key string, n int) (entries, values []string, err error) {
	var cmd rueidis.Completed
	switch kind {
	case "hash":
		cmd = c.B().Hrandfield().Key(key).Count(int64(n)).Withvalues().Build()
	case "zset":
		cmd = c.B().Zrandmember().Key(key).Count(int64(n)).Withscores().Build()
	default:
		cmd = c.B().Srandmember().Key(key).Count(int64(n)).Build()
	}
	msgs, err := c.Do(ctx, cmd).ToArray()
	if err != nil {
		return nil, nil, fmt.Errorf("sampling %s: %w", key, err)
	}
	// RESP3 pairs an entry with its value in a nested array; RESP2 does not.
	var elems []string
	for _, m := range msgs {
		parts := []rueidis.RedisMessage{m}
		if pair, err := m.ToArray(); err == nil {
			parts = pair
		}
		for _, p := range parts {
			v, err := p.ToString()
			if err != nil {
				f, ferr := p.AsFloat64()
				if ferr != nil {
					return nil, nil, fmt.Errorf("sampling %s: %w", key, err)
				}
				v = strconv.FormatFloat(f, 'g', -1, 64)
			}
			elems = append(elems, v)
		}
	}
	entries, values = split(kind, elems)
	return entries, values, nil
}

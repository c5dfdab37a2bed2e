// Package diff compares a rebuilt temp key with its live key, and counts
// the entries of keys, without blocking Redis: cardinalities come from
// O(1) commands, and a comparison reads at most a bounded number of
// entries, with SCAN cursors (HSCAN, ZSCAN, SSCAN) and batched lookups
// (HMGET, ZMSCORE, SMISMEMBER), or, past the bound, from a random sample
// (HRANDFIELD, ZRANDMEMBER, SRANDMEMBER), which gives estimates.
package diff

import (
	"context"
	"fmt"
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
	// Exact is false when the counts are estimates from samples (keys
	// larger than Options.Limit), or when the keys are of a type that is
	// not compared entry by entry (Added, Removed and Changed are then 0).
	Exact bool `json:"exact"`
	// Samples are some of the differing entries.
	Samples []Entry `json:"samples,omitempty"`
}

// Compare compares temp, the rebuilt value, with live. Hashes, sorted sets
// and sets are compared entry by entry; other types only by size.
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
	if k.NewSize <= int64(o.Limit) && k.LiveSize <= int64(o.Limit) {
		return k, exact(ctx, c, &k, kind, o)
	}
	return k, sampled(ctx, c, &k, kind, o)
}

func comparable(kind string) bool {
	return kind == "hash" || kind == "zset" || kind == "set"
}

// exact scans the new key and looks each chunk up in the live key: the
// entries of both that are not in the new key are the live size minus
// those found in it.
func exact(ctx context.Context, c rueidis.Client, k *Key, kind string, o Options) error {
	k.Exact = true
	var common int64
	if k.NewSize > 0 {
		err := scanEntries(ctx, c, kind, k.Temp, func(entries, values []string) error {
			old, found, err := lookup(ctx, c, kind, k.Live, entries)
			if err != nil {
				return err
			}
			for i, e := range entries {
				switch {
				case !found[i]:
					k.Added++
					k.sample(o, Entry{Kind: "added", Entry: e, New: values[i]})
				case old[i] != values[i]:
					common++
					k.Changed++
					k.sample(o, Entry{Kind: "changed", Entry: e, Old: old[i], New: values[i]})
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
	k.Removed = max(0, k.LiveSize-common)
	if k.Removed > 0 && len(k.Samples) < o.Samples {
		// Name a few: scan the live key for entries the new key lacks.
		return scanEntries(ctx, c, kind, k.Live, func(entries, values []string) error {
			_, found, err := lookup(ctx, c, kind, k.Temp, entries)
			if err != nil {
				return err
			}
			for i, e := range entries {
				if !found[i] {
					k.sample(o, Entry{Kind: "removed", Entry: e, Old: values[i]})
				}
			}
			if len(k.Samples) >= o.Samples {
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
	if drawnNew > 0 {
		k.Added = added * k.NewSize / drawnNew
		k.Changed = changed * k.NewSize / drawnNew
	}
	if drawnLive > 0 {
		k.Removed = missing * k.LiveSize / drawnLive
	}
	return nil
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

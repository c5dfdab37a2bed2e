package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/redis/rueidis"
)

// keyPrefix starts every key the bench writes. With -addr, it deletes only
// keys under it.
const keyPrefix = "keyswap-bench:"

// perCommand is the most entries one variadic command carries, as in
// package builders and redis-cli --pipe's documented mass insertion.
const perCommand = index.MaxArgs

// kind is the Redis type a target is rebuilt as.
type kind int

const (
	kindHash  kind = iota // HSET field value
	kindZset              // ZADD score member
	kindSet               // SADD member
	kindIndex             // SADD member to <prefix>:<bucket>: builders.SetIndex
)

// target is one builder of a workload.
type target struct {
	kind kind
	key  string // the live key, or the SetIndex family's prefix
}

// workload is what one rebuild writes: one builder, or several fed by one
// source.
type workload struct {
	name    string // short name, for flags and JSON
	title   string // for the report
	targets []target
}

// allWorkloads returns the workloads of the throughput section.
func allWorkloads(buckets int) []workload {
	return []workload{
		hashWorkload(),
		{name: "zset", title: "sorted set", targets: []target{{kindZset, keyPrefix + "zset"}}},
		{name: "set", title: "set", targets: []target{{kindSet, keyPrefix + "set"}}},
		{name: "setindex", title: fmt.Sprintf("SetIndex (%d buckets)", buckets), targets: []target{{kindIndex, keyPrefix + "idx"}}},
		{name: "multi", title: "hash + sorted set + SetIndex", targets: []target{
			{kindHash, keyPrefix + "multi:hash"},
			{kindZset, keyPrefix + "multi:zset"},
			{kindIndex, keyPrefix + "multi:idx"},
		}},
	}
}

// hashWorkload is the workload of the swap, scaling and knobs sections.
func hashWorkload() workload {
	return workload{name: "hash", title: "hash", targets: []target{{kindHash, keyPrefix + "hash"}}}
}

// emitFunc receives one variadic command: name key args..., carrying
// entries entries. args is reused once it returns.
type emitFunc func(name, key string, args []string, entries int) error

// accumulator gathers the arguments of one variadic command.
type accumulator struct {
	name, key string
	args      []string
	n         int
}

func (a *accumulator) flush(emit emitFunc) error {
	if a.n == 0 {
		return nil
	}
	err := emit(a.name, a.key, a.args, a.n)
	a.args, a.n = a.args[:0], 0
	return err
}

// commands generates the writes of w for d, with at most perCmd entries per
// command, in source order: the commands that redis-cli --pipe, raw and
// naive send. A SetIndex's members are grouped per bucket across the whole
// source, so that every command but the last of each bucket is full.
func (w workload) commands(d dataset, perCmd int, emit emitFunc) error {
	accs := make([]*accumulator, len(w.targets))
	index := make([]map[string]*accumulator, len(w.targets))
	for i, t := range w.targets {
		switch t.kind {
		case kindHash:
			accs[i] = &accumulator{name: "HSET", key: t.key}
		case kindZset:
			accs[i] = &accumulator{name: "ZADD", key: t.key}
		case kindSet:
			accs[i] = &accumulator{name: "SADD", key: t.key}
		case kindIndex:
			index[i] = map[string]*accumulator{}
		}
	}
	for it := range d.all() {
		for i, t := range w.targets {
			a := accs[i]
			switch t.kind {
			case kindHash:
				a.args = append(a.args, it.member, it.value)
			case kindZset:
				a.args = append(a.args, formatScore(it.score), it.member)
			case kindSet:
				a.args = append(a.args, it.member)
			case kindIndex:
				if a = index[i][it.bucket]; a == nil {
					a = &accumulator{name: "SADD", key: t.key + ":" + it.bucket}
					index[i][it.bucket] = a
				}
				a.args = append(a.args, it.member)
			}
			if a.n++; a.n == perCmd {
				if err := a.flush(emit); err != nil {
					return err
				}
			}
		}
	}
	for i := range w.targets {
		if accs[i] != nil {
			if err := accs[i].flush(emit); err != nil {
				return err
			}
			continue
		}
		for _, b := range slices.Sorted(maps.Keys(index[i])) {
			if err := index[i][b].flush(emit); err != nil {
				return err
			}
		}
	}
	return nil
}

// builders returns the keyswap builders of w.
func (w workload) builders() []index.Builder[item] {
	out := make([]index.Builder[item], len(w.targets))
	for i, t := range w.targets {
		switch t.kind {
		case kindHash:
			out[i] = builders.Hash(t.key, func(it item) (string, string, bool) { return it.member, it.value, true })
		case kindZset:
			out[i] = builders.SortedSet(t.key, func(it item) (string, float64, bool) { return it.member, it.score, true })
		case kindSet:
			out[i] = builders.Set(t.key, func(it item) (string, bool) { return it.member, true })
		case kindIndex:
			out[i] = builders.SetIndex(t.key, func(it item) (string, string, bool) { return it.bucket, it.member, true })
		}
	}
	return out
}

// keyCount returns how many keys w leaves for d: one per plain target, one
// per bucket for a SetIndex.
func (w workload) keyCount(d dataset) int {
	n := 0
	for _, t := range w.targets {
		if t.kind == kindIndex {
			n += d.bucketCount()
		} else {
			n++
		}
	}
	return n
}

// verify checks that the server holds exactly what w writes for d, and
// nothing else under keyPrefix but generation records: every cardinality exact, the first and last
// items present with their values, no item of the previous dataset, and no
// temp key or lock left behind.
func (w workload) verify(ctx context.Context, c rueidis.Client, d dataset) error {
	if d.n == 0 {
		return nil
	}
	all, err := scanKeys(ctx, c, keyPrefix+"*")
	if err != nil {
		return err
	}
	// Each publish leaves one generation record per target (see
	// store.Store.Swap): it is keyswap's, by design, and not a leftover.
	all = slices.DeleteFunc(all, isGeneration)
	if want := w.keyCount(d); len(all) != want {
		return fmt.Errorf("%s: %d keys under %s*, want %d: %s", w.name, len(all), keyPrefix, want, firstKeys(all))
	}
	old := d.previous()
	for _, t := range w.targets {
		if err := t.verify(ctx, c, d, []item{d.item(0), d.item(d.n - 1)}, old.item(0)); err != nil {
			return fmt.Errorf("%s: %w", w.name, err)
		}
	}
	return nil
}

// verify checks one target's cardinality, that the items in want are there
// and that gone is not.
func (t target) verify(ctx context.Context, c rueidis.Client, d dataset, want []item, gone item) error {
	do := func(cmd rueidis.Completed) rueidis.RedisResult { return c.Do(ctx, cmd) }
	var card int64
	var err error
	switch t.kind {
	case kindHash:
		card, err = do(c.B().Hlen().Key(t.key).Build()).AsInt64()
	case kindZset:
		card, err = do(c.B().Zcard().Key(t.key).Build()).AsInt64()
	case kindSet:
		card, err = do(c.B().Scard().Key(t.key).Build()).AsInt64()
	case kindIndex:
		card, err = t.indexCard(ctx, c, d)
	}
	if err != nil {
		return fmt.Errorf("cardinality of %s: %w", t.key, err)
	}
	if card != int64(d.n) {
		return fmt.Errorf("%s holds %d entries, want %d", t.key, card, d.n)
	}
	for _, it := range want {
		if err := t.check(ctx, c, it, true); err != nil {
			return err
		}
	}
	return t.check(ctx, c, gone, false)
}

// indexCard returns the total members of a SetIndex family, after checking
// that it has exactly the dataset's buckets, and for a spread dataset that
// each bucket holds exactly its items.
func (t target) indexCard(ctx context.Context, c rueidis.Client, d dataset) (int64, error) {
	ks, err := scanKeys(ctx, c, t.key+":*")
	if err != nil {
		return 0, err
	}
	ks = slices.DeleteFunc(ks, isGeneration)
	if want := d.bucketCount(); len(ks) != want {
		return 0, fmt.Errorf("%d buckets, want %d: %s", len(ks), want, firstKeys(ks))
	}
	var size map[string]int // a spread dataset's bucket sizes, by key
	if d.spread {
		size = make(map[string]int, d.bucketCount())
		for j, b := range d.buckets[:d.bucketCount()] {
			size[t.key+":"+b] = d.bucketSize(j)
		}
	}
	cmds := make(rueidis.Commands, len(ks))
	for i, k := range ks {
		cmds[i] = c.B().Scard().Key(k).Build()
	}
	var sum int64
	for i, r := range c.DoMulti(ctx, cmds...) {
		n, err := r.AsInt64()
		if err != nil {
			return 0, err
		}
		if want, ok := size[ks[i]]; d.spread && (!ok || n != int64(want)) {
			return 0, fmt.Errorf("bucket %s holds %d members, want %d (a bucket of the previous dataset is 0)", ks[i], n, want)
		}
		sum += n
	}
	return sum, nil
}

// check reports an error unless it is present (or absent, when present is
// false) in the target.
func (t target) check(ctx context.Context, c rueidis.Client, it item, present bool) error {
	var got bool
	var err error
	switch t.kind {
	case kindHash:
		var v string
		v, err = c.Do(ctx, c.B().Hget().Key(t.key).Field(it.member).Build()).ToString()
		if rueidis.IsRedisNil(err) {
			err = nil
		} else if err == nil {
			got = true
			if v != it.value {
				return fmt.Errorf("%s[%s] = %q, want %q", t.key, it.member, v, it.value)
			}
		}
	case kindZset:
		var s float64
		s, err = c.Do(ctx, c.B().Zscore().Key(t.key).Member(it.member).Build()).AsFloat64()
		if rueidis.IsRedisNil(err) {
			err = nil
		} else if err == nil {
			got = true
			if s != it.score {
				return fmt.Errorf("score of %s in %s = %v, want %v", it.member, t.key, s, it.score)
			}
		}
	case kindSet:
		got, err = c.Do(ctx, c.B().Sismember().Key(t.key).Member(it.member).Build()).AsBool()
	case kindIndex:
		got, err = c.Do(ctx, c.B().Sismember().Key(t.key+":"+it.bucket).Member(it.member).Build()).AsBool()
	}
	switch {
	case err != nil:
		return fmt.Errorf("look up %s in %s: %w", it.member, t.key, err)
	case got != present && present:
		return fmt.Errorf("%s is missing from %s", it.member, t.key)
	case got != present:
		return fmt.Errorf("%s is still in %s: the previous value was not replaced", it.member, t.key)
	}
	return nil
}

// firstKeys formats up to 5 keys for an error message.
func firstKeys(ks []string) string {
	if len(ks) > 5 {
		return strings.Join(ks[:5], ", ") + ", ..."
	}
	return strings.Join(ks, ", ")
}

// isGeneration reports whether k is a generation record, which every
// publish leaves, one per target, as keyswap's own: "<live>:rebuild-gen".
func isGeneration(k string) bool { return strings.HasSuffix(k, ":rebuild-gen") }

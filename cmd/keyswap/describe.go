package main

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// describeLocks returns the TTL and token prefix of locks (lock key ->
// base), sorted by key. Locks that vanished since the scan are left out.
func describeLocks(ctx context.Context, client rueidis.Client, locks map[string]string) ([]lockStatus, error) {
	ks := slices.Sorted(maps.Keys(locks))
	cmds := make(rueidis.Commands, 0, 2*len(ks))
	for _, k := range ks {
		cmds = append(cmds, client.B().Ttl().Key(k).Build(), client.B().Get().Key(k).Build())
	}
	res := client.DoMulti(ctx, cmds...)
	out := []lockStatus{}
	for i, k := range ks {
		ttl, err := res[2*i].AsInt64()
		if err != nil {
			return nil, fmt.Errorf("TTL %s: %w", displayKey(k), err)
		}
		if ttl == -2 {
			continue // released since the scan
		}
		// A lock that is not a string (never one of ours) shows no token.
		token, _ := res[2*i+1].ToString()
		out = append(out, lockStatus{Key: k, Base: locks[k], TTLSeconds: ttl, TokenPrefix: prefix(token, tokenPrefixLen), token: token})
	}
	return out, nil
}

// sizeCommands maps a Redis type to the command that gives its size.
var sizeCommands = map[string]func(cb rueidis.Builder, key string) rueidis.Completed{
	"hash":   func(cb rueidis.Builder, k string) rueidis.Completed { return cb.Hlen().Key(k).Build() },
	"zset":   func(cb rueidis.Builder, k string) rueidis.Completed { return cb.Zcard().Key(k).Build() },
	"set":    func(cb rueidis.Builder, k string) rueidis.Completed { return cb.Scard().Key(k).Build() },
	"list":   func(cb rueidis.Builder, k string) rueidis.Completed { return cb.Llen().Key(k).Build() },
	"string": func(cb rueidis.Builder, k string) rueidis.Completed { return cb.Strlen().Key(k).Build() },
	"stream": func(cb rueidis.Builder, k string) rueidis.Completed { return cb.Xlen().Key(k).Build() },
}

// describeTemps fills in the TTL, type, size, memory and lock of temps,
// and returns them sorted by key. Keys that vanished since the scan are
// left out.
func describeTemps(ctx context.Context, client rueidis.Client, temps map[string]tempStatus) ([]tempStatus, error) {
	out, err := describeTempKeys(ctx, client, temps)
	if err != nil {
		return nil, err
	}
	addSizes(ctx, client, out)
	if err := addLocks(ctx, client, out); err != nil {
		return nil, err
	}
	return out, nil
}

// describeTempKeys fills in the TTL, type and memory of temps, and returns
// them sorted by key, without the keys that vanished since the scan.
func describeTempKeys(ctx context.Context, client rueidis.Client, temps map[string]tempStatus) ([]tempStatus, error) {
	ks := slices.Sorted(maps.Keys(temps))
	cb := client.B()
	cmds := make(rueidis.Commands, 0, 3*len(ks))
	for _, k := range ks {
		cmds = append(cmds, cb.Ttl().Key(k).Build(), cb.Type().Key(k).Build(), cb.MemoryUsage().Key(k).Build())
	}
	res := client.DoMulti(ctx, cmds...)
	out := []tempStatus{}
	for i, k := range ks {
		t := temps[k]
		var err error
		if t.TTLSeconds, err = res[3*i].AsInt64(); err != nil {
			return nil, fmt.Errorf("TTL %s: %w", displayKey(k), err)
		}
		if t.Type, err = res[3*i+1].ToString(); err != nil {
			return nil, fmt.Errorf("TYPE %s: %w", displayKey(k), err)
		}
		if t.TTLSeconds == -2 || t.Type == "none" {
			continue // deleted or swapped since the scan
		}
		// MEMORY USAGE may be refused (ACLs, managed services): unknown.
		if n, err := res[3*i+2].AsInt64(); err == nil {
			t.MemoryBytes = &n
		}
		out = append(out, t)
	}
	return out, nil
}

// addSizes fills in the size of the temp keys whose type has one. A size
// that cannot be read is left unknown.
func addSizes(ctx context.Context, client rueidis.Client, out []tempStatus) {
	cb := client.B()
	cmds, idx := rueidis.Commands{}, []int{}
	for i, t := range out {
		if size, ok := sizeCommands[t.Type]; ok {
			cmds = append(cmds, size(cb, t.Key))
			idx = append(idx, i)
		}
	}
	for j, r := range client.DoMulti(ctx, cmds...) {
		if n, err := r.AsInt64(); err == nil {
			out[idx[j]].Size = &n
		}
	}
}

// addLocks fills in the held lock, if any, that would stop the sweep from
// deleting each temp key: its base's, or that of a ':'-prefix of its base.
func addLocks(ctx context.Context, client rueidis.Client, out []tempStatus) error {
	lockSet := map[string]bool{}
	for _, t := range out {
		for _, l := range keys.VetoLocks(t.Base) {
			lockSet[l] = true
		}
	}
	held, err := existing(ctx, client, slices.Sorted(maps.Keys(lockSet)))
	if err != nil {
		return err
	}
	for i := range out {
		for _, l := range keys.VetoLocks(out[i].Base) {
			if held[l] {
				out[i].Locked, out[i].LockKey = true, l
				break
			}
		}
	}
	return nil
}

// describeRuns returns the runs that hold locks (one or more of each run's
// locks), sorted by the lock of their first key: a lock whose record
// carries its token is held by a run of rebuild.Rebuilder, and the record
// of a run's other keys names the first one's ("primary"). Locks without
// such a record (store.WithRebuild's) are not runs. Each run's keys come
// with their generations.
func describeRuns(ctx context.Context, client rueidis.Client, locks []lockStatus) ([]runStatus, error) {
	cmds := make(rueidis.Commands, len(locks))
	for i, l := range locks {
		cmds[i] = client.B().Hgetall().Key(keys.RecordKey(l.Key)).Build()
	}
	records := map[string]map[string]string{} // first lock -> its record
	tokens := map[string]string{}             // first lock -> the token of a lock of its run
	for i, res := range client.DoMulti(ctx, cmds...) {
		rec, err := res.AsStrMap()
		if err != nil {
			return nil, fmt.Errorf("HGETALL %s: %w", displayKey(keys.RecordKey(locks[i].Key)), err)
		}
		if locks[i].token == "" || rec["token"] != locks[i].token {
			continue // not a run's record, or the record of a run that ended since
		}
		if p := rec["primary"]; p != "" {
			tokens[p] = locks[i].token
			continue
		}
		records[locks[i].Key], tokens[locks[i].Key] = rec, locks[i].token
	}
	// The first locks that only another lock of their run led to.
	var firsts []string
	for l := range tokens {
		if records[l] == nil {
			firsts = append(firsts, l)
		}
	}
	slices.Sort(firsts)
	cmds = cmds[:0]
	for _, l := range firsts {
		cmds = append(cmds, client.B().Hgetall().Key(keys.RecordKey(l)).Build())
	}
	for i, res := range client.DoMulti(ctx, cmds...) {
		rec, err := res.AsStrMap()
		if err != nil {
			return nil, fmt.Errorf("HGETALL %s: %w", displayKey(keys.RecordKey(firsts[i])), err)
		}
		if rec["token"] == tokens[firsts[i]] {
			records[firsts[i]] = rec
		}
	}

	// The operator's requests of each run.
	firsts = slices.Sorted(maps.Keys(records))
	cmds = cmds[:0]
	for _, l := range firsts {
		cmds = append(cmds, client.B().Hgetall().Key(keys.CtlKey(l)).Build())
	}
	ctls := make([]map[string]string, len(firsts))
	for i, res := range client.DoMulti(ctx, cmds...) {
		var err error
		if ctls[i], err = res.AsStrMap(); err != nil {
			return nil, fmt.Errorf("HGETALL %s: %w", displayKey(keys.CtlKey(firsts[i])), err)
		}
	}

	out := []runStatus{}
	var lives []string
	for i, l := range firsts {
		// A field that is not as keyswap writes it shows as zero.
		r, _ := parseRecord(l, records[l], ctls[i])
		out = append(out, runStatus{runRecord: r})
		lives = append(lives, r.Keys...)
	}
	gens, err := readGenerations(ctx, client, lives)
	if err != nil {
		return nil, err
	}
	for i := range out {
		for j, k := range out[i].Keys {
			out[i].Generations = append(out[i].Generations, keyGeneration{Key: k, Family: out[i].Families[j], Generation: gens[0]})
			gens = gens[1:]
		}
	}
	return out, nil
}

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// collectKeyStatus takes the snapshot of the live key live (a family's
// prefix for a family) at time now, without scanning the keyspace: its
// lock; the run that holds it, whichever of the run's keys live is, with
// the run's other locks; the run's temp keys, but a family's, whose
// buckets only a scan finds; and live's index, with its generations when
// it has a registry or a pointer of Generations mode. It reads a few keys, and
// costs the same whatever the size of the keyspace. Orphaned temp keys are
// not looked for: that takes a scan. An index in a group (group not
// empty) has its lock, meta, pointer and registry in the group's shape.
func collectKeyStatus(ctx context.Context, client rueidis.Client, live, group string, olderThan, grace time.Duration, now time.Time) (*statusReport, error) {
	cluster := client.Mode() == rueidis.ClientModeCluster
	names := namesOf(client, group)
	rep := &statusReport{
		Time:             now.UTC(),
		Key:              live,
		ByKey:            true,
		Cluster:          cluster,
		OlderThanSeconds: int64(olderThan / time.Second),
		Grace:            grace,
		TempKeys:         []tempStatus{},
	}
	lock := keys.LockKey(live, names)
	locks := map[string]string{lock: keys.Base(live, names)}
	var err error
	if rep.Locks, err = describeLocks(ctx, client, locks); err != nil {
		return nil, err
	}
	if rep.Runs, err = describeRuns(ctx, client, rep.Locks); err != nil {
		return nil, err
	}
	temps := map[string]tempStatus{}
	for _, r := range rep.Runs {
		for i, k := range r.Keys {
			locks[keys.LockKey(k, names)] = keys.Base(k, names)
			if r.Suffix == "" || r.Families[i] {
				continue
			}
			t := keys.Base(k, cluster) + r.Suffix
			if base, unix, ok := keys.ParseTempKey(t); ok {
				temps[t] = tempStatus{Key: t, Base: base, Timestamp: unix, AgeSeconds: now.Unix() - unix}
			}
		}
	}
	if len(locks) > len(rep.Locks) {
		if rep.Locks, err = describeLocks(ctx, client, locks); err != nil {
			return nil, err
		}
	}
	if rep.TempKeys, err = describeTemps(ctx, client, temps); err != nil {
		return nil, err
	}
	gens, err := readGroupGenerations(ctx, client, group, []string{live})
	if err != nil {
		return nil, err
	}
	held := ""
	if rep.held()[lock] {
		held = lock
	}
	rep.Indexes = []indexStatus{{Key: live, Group: group, MetaKey: keys.MetaKey(live, names), Generation: gens[0], LockKey: held,
		Rollback: rollbackOf(gens[0], held, now)}}
	withGens, err := hasGenKeys(ctx, client, group, []string{live})
	if err != nil {
		return nil, err
	}
	if err := addGenerations(ctx, client, rep.Indexes, withGens, grace); err != nil {
		return nil, err
	}
	if g := rep.Indexes[0].Gens; g != nil && g.InGroup != "" {
		// SPEC C102: the index's keys are behind the group's names.
		return nil, fmt.Errorf("%w: index %s is in group %s; pass --group %s", keys.ErrGroupConflict, displayKey(live), displayKey(g.InGroup), displayKey(g.InGroup))
	}
	return rep, nil
}

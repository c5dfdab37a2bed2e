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
//
// On a cluster, for a live key outside a group whose base another live
// key can have (keys.Aliasable, SPEC C104), it reads the base's owner
// stamp with one GET: when the stamp names the other key, live's index
// is one rebuilt in place, and the base's meta, pointer, registry and lock
// are the other's; they are not read as live's, and the index gets the
// other key as its BaseOwner. A stamp that is absent where the base has a
// pointer or a registry, is of another type, or names neither key marks
// the index Ambiguous, as a scan does.
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
	var owner liveOwner
	aliased := false
	if group == "" {
		var err error
		if owner, aliased, err = readOwner(ctx, client, live); err != nil {
			return nil, err
		}
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
	if aliased && owner.Ambiguous == nil && owner.Live != live {
		// The base is the other index's: its pointer may even hold a
		// group's claim, which is not live's to pass --group for.
		rep.Indexes = []indexStatus{{Key: live, MetaKey: keys.MetaKey(live, names),
			Rollback: rollbackState{WhyNot: rollbackBaseOwned}, BaseOwner: owner.Live}}
		return rep, nil
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
	if aliased && owner.Ambiguous != nil && (!owner.Ambiguous.NoStamp || withGens[0]) {
		// Without a stamp, a base without a pointer or a registry is of
		// an index that only ever rebuilt in place, as a scan has it.
		rep.Indexes[0].Ambiguous = owner.Ambiguous
	}
	if err := addGenerations(ctx, client, rep.Indexes, withGens, grace); err != nil {
		return nil, err
	}
	if g := rep.Indexes[0].Gens; g != nil && g.InGroup != "" && rep.Indexes[0].Ambiguous == nil {
		// SPEC C102: the index's keys are behind the group's names.
		return nil, fmt.Errorf("%w: index %s is in group %s; pass --group %s", keys.ErrGroupConflict, displayKey(live), displayKey(g.InGroup), displayKey(g.InGroup))
	}
	return rep, nil
}

package rebuild_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// bucketFamily is a builder that merges each user into the bucket of its
// country, item by item, with Commands.MergeBucket. It is not a Family:
// familyOf makes it one.
type bucketFamily struct{ prefix string }

func (b bucketFamily) Key() string        { return b.prefix }
func (b bucketFamily) Order() index.Order { return index.AnyOrder }

func (b bucketFamily) Build(c *index.Commands, items []user) error {
	for _, u := range items {
		if err := c.MergeBucket(u.Country, "SADD", u.ID); err != nil {
			return err
		}
	}
	return nil
}

// familyOf makes b a index.Family.
type familyOf struct{ bucketFamily }

func (familyOf) KeyType() string { return "set" }

func TestMergeBucket(t *testing.T) {
	// A family that merges item by item, in batches of 7 over three
	// buckets, where an item is in the bucket of the one before it or in
	// another: every member lands in its bucket, a live bucket the run
	// does not produce goes, every entry is counted, and no temp key or
	// lock is left.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		prefix := d.Prefix + "by-country"
		redistest.Do(t, d.Other, d.Other.B().Sadd().Key(prefix+":it").Member("old").Build())
		src := users(100)
		for i := range src {
			src[i].Country = []string{"fr", "fr", "de", "us", "us", "us", "fr", "de"}[i%8]
		}
		want := map[string][]string{}
		for _, u := range src {
			want[prefix+":"+u.Country] = append(want[prefix+":"+u.Country], u.ID)
		}
		// A second family merges the same items: the batch's entries then
		// outgrow the room made for one per item.
		second := d.Prefix + "again"
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 7, Writers: 2},
			index.Builder[user](familyOf{bucketFamily{prefix: prefix}}), familyOf{bucketFamily{prefix: second}})
		stats, err := r.Run(redistest.Ctx(t), sources.Slice(src))
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		for k := range want {
			slices.Sort(want[k])
		}
		for _, p := range []string{prefix, second} {
			if got := stats.Entries[p]; got != int64(len(src)) {
				t.Errorf("Stats.Entries[%q]: got %d, want %d", p, got, len(src))
			}
			got := map[string][]string{}
			for _, k := range redistest.LiveKeys(t, d.Other, p) {
				got[strings.Replace(k, p, prefix, 1)] = redistest.SMembers(t, d.Other, k)
				if ttl := redistest.PTTL(t, d.Other, k); ttl != -1 {
					t.Errorf("%s: PTTL %v, want no expiry", k, ttl)
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("live buckets of %s (-want +got):\n%s", p, diff)
			}
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestMergeBucketOutsideAFamily(t *testing.T) {
	// A builder that is not a Family has no buckets: its MergeBucket fails
	// the run with an error that says so, and nothing is written.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "plain"
		redistest.SeedHash(t, d.Other, key, map[string]string{"a": "1"})
		before := redistest.Snapshot(t, d.Other, d.Prefix)
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{}, index.Builder[user](bucketFamily{prefix: key}))
		_, err := r.Run(redistest.Ctx(t), sources.Slice(users(10)))
		var rerr *rebuild.Error
		if !errors.As(err, &rerr) || rerr.Op != "build" || rerr.Key != key || !strings.Contains(err.Error(), "called MergeBucket but is not a Family") {
			t.Fatalf("Run: got %v, want a build error of %q saying it is not a Family", err, key)
		}
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

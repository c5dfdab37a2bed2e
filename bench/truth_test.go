package main

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// TestTruthSource checks that a run's source is the truth as it stands
// when the run pulls its first item: changes committed before are in it,
// changes committed after are not.
func TestTruthSource(t *testing.T) {
	d := newDataset(10, 4)
	tr := newTruth(d)
	set := func(i int, value string) {
		tr.commit(i, func(old item) item {
			old.value = value
			return old
		})
	}
	set(3, "before")
	seq := tr.source()(t.Context())
	set(4, "after the source was made, before it started")
	var got []item
	for it, err := range seq {
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			set(5, "after it started")
		}
		got = append(got, it)
	}
	if len(got) != d.n {
		t.Fatalf("got %d items, want %d", len(got), d.n)
	}
	for i, it := range got {
		want := d.item(i)
		switch i {
		case 3:
			want.value = "before"
		case 4:
			want.value = "after the source was made, before it started"
		}
		if it != want {
			t.Errorf("item %d: got %+v, want %+v", i, it, want)
		}
	}
	if at := tr.view(); at(5).value != "after it started" || tr.changes() != 3 {
		t.Errorf("the truth: item 5 = %+v, %d changes; want the last commit and 3 changes", at(5), tr.changes())
	}
}

// TestTruthVerify checks that verify fails on every way the live keys can
// differ from the truth: a committed change not applied (lost), an entry
// missing, stale or in the wrong bucket, and a key left behind.
func TestTruthVerify(t *testing.T) {
	ctx := t.Context()
	srv, err := openServer(ctx, env.Standalone.Addr, -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.close() })
	w := onlineWorkload(8)
	hash, zset, idx := w.targets[0].key, w.targets[1].key, w.targets[2].key
	c := srv.admin
	do := func(t *testing.T, cmd rueidis.Completed) {
		t.Helper()
		if err := c.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name   string
		mutate func(t *testing.T, a *application) // breaks the keys or the truth after some changes
		want   string                             // in the error; "" for none
	}{
		{"in sync", func(*testing.T, *application) {}, ""},
		{"generation record", func(t *testing.T, _ *application) {
			do(t, c.B().Set().Key(hash+":rebuild-gen").Value("1").Build())
		}, ""},
		{"committed, not applied", func(t *testing.T, a *application) {
			a.truth.commit(7, func(old item) item {
				old.score++
				return old
			})
		}, "1 entries missing or out of date (lost changes), 0 stale"},
		{"field missing", func(t *testing.T, a *application) {
			do(t, c.B().Hdel().Key(hash).Field(a.truth.d.item(2).member).Build())
		}, "1 entries missing or out of date"},
		{"stale field", func(t *testing.T, _ *application) {
			do(t, c.B().Hset().Key(hash).FieldValue().FieldValue("user:9999999", "x").Build())
		}, "0 entries missing or out of date (lost changes), 1 stale"},
		{"old item in the sorted set", func(t *testing.T, a *application) {
			do(t, c.B().Zadd().Key(zset).ScoreMember().ScoreMember(1, a.truth.d.previous().item(1).member).Build())
		}, "1 stale"},
		{"member in another bucket too", func(t *testing.T, a *application) {
			it := a.truth.view()(1)
			other := a.truth.d.buckets[0]
			if other == it.bucket {
				other = a.truth.d.buckets[1]
			}
			do(t, c.B().Sadd().Key(idx+":"+other).Member(it.member).Build())
		}, "1 stale"},
		{"key left behind", func(t *testing.T, _ *application) {
			do(t, c.B().Set().Key(hash+":rebuild-lock").Value("token").Build())
		}, "1 keys left behind: " + hash + ":rebuild-lock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := srv.reset(ctx); err != nil {
				t.Fatal(err)
			}
			d := newDataset(50, 8)
			if err := pipeline(ctx, srv.client, w, d, perCommand, rebuild.Defaults().Writers); err != nil {
				t.Fatal(err)
			}
			rb, err := rebuilder(srv.client, w, rebuild.Options{})
			if err != nil {
				t.Fatal(err)
			}
			a := &application{rb: rb, truth: newTruth(d)}
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range 10 {
				if _, err := a.change(ctx, i, rng); err != nil {
					t.Fatal(err)
				}
			}
			tt.mutate(t, a)
			err = a.truth.verify(ctx, c, w)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("got %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/keyswap/keyswap/store"
)

// ownedCase is an index x rebuilt in Generations mode, which on a cluster
// stamps its base, and the key other that shares that base there.
type ownedCase struct {
	name     string
	x, other string
}

// ownedCases returns the untagged x with other "{x}", and the reverse.
func ownedCases(p string) []ownedCase {
	x := p + "owned"
	return []ownedCase{
		{name: "untagged owns", x: x + "u", other: "{" + x + "u}"},
		{name: "tagged owns", x: "{" + x + "t}", other: x + "t"},
	}
}

// genIndex rebuilds x, a hash of emails, in Generations mode.
func genIndex(t *testing.T, d redistest.Deployment, x string) {
	t.Helper()
	rb := redistest.Rebuilder(t, d.Client, rebuild.Options{Publish: rebuild.Generations},
		builders.Hash(x, func(u redistest.User) (string, string, bool) { return u.Email, u.ID, true }))
	if _, err := rb.Run(redistest.Ctx(t), sources.Slice(redistest.Users(3))); err != nil {
		t.Fatalf("Generations run of %s: %v", x, err)
	}
}

// ownerPrefixes are the prefixes of every key of an ownedCase of the test
// whose untagged prefix is p: the untagged keys, and the tagged ones.
func ownerPrefixes(p string) []string { return []string{p, "{" + p} }

// snapshot returns the state of every key under prefixes.
func snapshot(t *testing.T, d redistest.Deployment, prefixes []string) map[string]redistest.KeyState {
	t.Helper()
	out := map[string]redistest.KeyState{}
	for _, p := range prefixes {
		for k, s := range redistest.Snapshot(t, d.Other, p) {
			out[k] = s
		}
	}
	return out
}

// wantOwnedBy checks that err is the Store's refusal, at op, of live,
// whose base owner owns: an *Error naming live that matches
// ErrGroupConflict and names both and the stamp.
func wantOwnedBy(t *testing.T, what, op string, err error, live, owner string) {
	t.Helper()
	if !errors.Is(err, store.ErrGroupConflict) {
		t.Fatalf("%s: got %v, want ErrGroupConflict", what, err)
	}
	var e *store.Error
	if !errors.As(err, &e) || e.Op != op || e.Key != live {
		t.Errorf("%s: got %#v, want a *store.Error of op %s for %s", what, err, op, live)
	}
	for _, s := range []string{"index " + live + " and index " + owner, keys.OwnerKey(owner, true), "nothing written"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: got %v, want it to say %q", what, err, s)
		}
	}
}

func TestOwnerStampStore(t *testing.T) {
	// C104: once x's Generations run stamped the base it shares on a
	// cluster with other ("x" and "{x}"), the Store refuses other before
	// it writes anything: WithRebuild and Acquire would take x's lock,
	// and a Swap would advance x's meta (and drop its previous
	// generation's record). x's pointer, registry, meta, data and stamp
	// stay as they were. On a standalone server the bases differ, and
	// each call goes through.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		p := strings.Trim(d.Prefix, "{}")
		s := store.New(d.Client, store.Options{})
		for _, c := range ownedCases(p) {
			t.Run(c.name, func(t *testing.T) {
				genIndex(t, d, c.x)
				before := snapshot(t, d, ownerPrefixes(p))

				ran := false
				err := s.WithRebuild(ctx, c.other, store.RebuildOptions{}, func(ctx context.Context, temp string, touch func(context.Context) error) error {
					ran = true
					if err := d.Client.Do(ctx, d.Client.B().Hset().Key(temp).FieldValue().FieldValue("f", "v").Build()).Error(); err != nil {
						return err
					}
					return touch(ctx)
				})
				if !d.Cluster {
					if err != nil || !ran {
						t.Fatalf("WithRebuild of %s on a standalone server: %v (callback ran: %v)", c.other, err, ran)
					}
					redistest.WantHash(t, d.Other, c.other, map[string]string{"f": "v"})
					redistest.WantString(t, d.Other, keys.OwnerKey(c.x, false), "")
					return
				}
				wantOwnedBy(t, "WithRebuild of "+c.other, "acquire", err, c.other, c.x)
				if ran {
					t.Errorf("WithRebuild of %s ran its callback", c.other)
				}

				l, err := s.Acquire(ctx, c.other, store.DefaultTTL)
				wantOwnedBy(t, "Acquire of "+c.other, "acquire", err, c.other, c.x)
				if l != nil {
					t.Errorf("Acquire of %s returned a lock %+v", c.other, l)
				}

				// An unfenced swap, as a caller of the lower-level API may
				// send: its temp key is the caller's, and stays.
				temp := s.NewTempKey(c.other)
				redistest.Cmd(t, d.Other, "HSET", temp, "f", "v")
				_, err = s.Swap(ctx, temp, c.other, store.SwapOptions{})
				wantOwnedBy(t, "Swap of "+c.other, "swap", err, c.other, c.x)
				redistest.WantHash(t, d.Other, temp, map[string]string{"f": "v"})
				redistest.Cmd(t, d.Other, "DEL", temp)

				redistest.WantUnchanged(t, d.Other, p, filter(before, p))
				redistest.WantUnchanged(t, d.Other, "{"+p, filter(before, "{"+p))
				redistest.WantString(t, d.Other, keys.OwnerKey(c.x, true), c.x)
			})
		}
	})
}

func TestOwnerStampStoreOwnKey(t *testing.T) {
	// C104: the stamp is checked, never written, by the Store: a stamp
	// that names the key itself lets it through, and a key whose base
	// has no stamp is locked and swapped without one. A stamp of another
	// type fails it with ErrTampered, nothing written.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		p := strings.Trim(d.Prefix, "{}")
		s := store.New(d.Client, store.Options{})
		own, fresh, tampered := "{"+p+"own}", p+"fresh", p+"tampered"
		stamp := keys.OwnerKey(own, d.Cluster)
		if d.Cluster {
			redistest.Cmd(t, d.Other, "SET", stamp, own)
		}
		for _, live := range []string{own, fresh} {
			err := s.WithRebuild(ctx, live, store.RebuildOptions{}, func(ctx context.Context, temp string, touch func(context.Context) error) error {
				if err := d.Client.Do(ctx, d.Client.B().Hset().Key(temp).FieldValue().FieldValue("f", "v").Build()).Error(); err != nil {
					return err
				}
				return touch(ctx)
			})
			if err != nil {
				t.Fatalf("WithRebuild of %s: %v", live, err)
			}
			redistest.WantHash(t, d.Other, live, map[string]string{"f": "v"})
		}
		if d.Cluster {
			redistest.WantString(t, d.Other, stamp, own)
		}
		redistest.WantString(t, d.Other, keys.OwnerKey(fresh, d.Cluster), "")
		for _, pre := range ownerPrefixes(p) {
			redistest.WantClean(t, d.Other, pre)
		}

		bad := keys.OwnerKey(tampered, d.Cluster)
		redistest.Cmd(t, d.Other, "HSET", bad, "f", "v")
		before := snapshot(t, d, ownerPrefixes(p))
		l, err := s.Acquire(ctx, tampered, store.DefaultTTL)
		temp := s.NewTempKey(tampered)
		if !d.Cluster {
			if err != nil {
				t.Fatalf("Acquire of %s on a standalone server: %v", tampered, err)
			}
			if err := s.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
			return
		}
		redistest.WantErr(t, err, store.ErrTampered)
		if !strings.Contains(err.Error(), bad+" is a hash") {
			t.Errorf("Acquire of %s: got %v, want it to name %s, a hash", tampered, err, bad)
		}
		redistest.Cmd(t, d.Other, "HSET", temp, "f", "v")
		_, err = s.Swap(ctx, temp, tampered, store.SwapOptions{Populated: store.PopulatedYes})
		redistest.WantErr(t, err, store.ErrTampered)
		redistest.Cmd(t, d.Other, "DEL", temp)
		redistest.WantUnchanged(t, d.Other, p, filter(before, p))
		redistest.WantUnchanged(t, d.Other, "{"+p, filter(before, "{"+p))
	})
}

// filter returns the states of before whose keys start with prefix.
func filter(before map[string]redistest.KeyState, prefix string) map[string]redistest.KeyState {
	out := map[string]redistest.KeyState{}
	for k, s := range before {
		if strings.HasPrefix(k, prefix) {
			out[k] = s
		}
	}
	return out
}

package rebuild_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/reader"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

// wantOwned checks that err is the refusal, at the acquire of op, of index
// live whose base another index, owner, owns: ErrGroupConflict naming
// both, the base and the stamp.
func wantOwned(t *testing.T, what, op string, err error, live, owner string) {
	t.Helper()
	stamp := keys.OwnerKey(owner, true)
	t.Logf("%s: %v", what, err)
	wantGroupConflict(t, what, err, "index "+live+" and index "+owner, "same base "+strings.TrimSuffix(stamp, keys.OwnerSuffix),
		fmt.Sprintf("(%s holds %q)", stamp, owner), "hash tag of its own", "nothing written")
	var e *rebuild.Error
	if !errors.As(err, &e) || e.Op != op || e.Key != live {
		t.Errorf("%s: got %v, want an *Error of op %s for %s", what, err, op, live)
	}
}

// wantStamps checks that the owner stamps under the test's prefixes (and
// more) are exactly want, each a string naming the live key whose base it
// is (the stamp of live is keys.OwnerKey(live, true)).
func wantStamps(t *testing.T, d deployment, want []string, more ...string) {
	t.Helper()
	var got []string
	for _, p := range append(fencePrefixes(d), more...) {
		for _, k := range redistest.Keys(t, d.Other, p) {
			if strings.HasSuffix(k, keys.OwnerSuffix) && !slices.Contains(got, k) {
				got = append(got, k)
			}
		}
	}
	var keysWant []string
	for _, live := range want {
		keysWant = append(keysWant, keys.OwnerKey(live, true))
		redistest.WantString(t, d.Other, keys.OwnerKey(live, true), live)
	}
	slices.Sort(got)
	slices.Sort(keysWant)
	if !slices.Equal(got, keysWant) {
		t.Errorf("owner stamps %q, want %q", got, keysWant)
	}
}

// readBucket returns the members of bucket b of family prefix, read
// through package reader without a group.
func readBucket(t *testing.T, d deployment, prefix, b string) []string {
	t.Helper()
	rd, err := reader.New(d.Other, reader.Options{})
	if err != nil {
		t.Fatalf("reader.New: %v", err)
	}
	k, err := rd.Bucket(redistest.Ctx(t), prefix, b)
	if err != nil {
		t.Fatalf("reader Bucket(%s, %s): %v", prefix, b, err)
	}
	return redistest.SMembers(t, d.Other, k)
}

// wantReadable checks that bucket b01 of family prefix, read through
// package reader, holds the users of us in it.
func wantReadable(t *testing.T, d deployment, prefix string, us []user) {
	t.Helper()
	var want []string
	for _, u := range us {
		if u.Country == "b01" {
			want = append(want, u.ID)
		}
	}
	slices.Sort(want)
	if got := readBucket(t, d, prefix, "b01"); !slices.Equal(got, want) {
		t.Errorf("reader: bucket b01 of %s holds %v, want %v", prefix, got, want)
	}
}

// hashRebuilder returns a Rebuilder in RenameInPlace mode of a hash of
// emails at live.
func hashRebuilder(t *testing.T, d deployment, live string) *rebuild.Rebuilder[user] {
	t.Helper()
	return redistest.Rebuilder(t, d.Client, rebuild.Options{},
		builders.Hash(live, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
}

func TestOwnerStampRefusesAlias(t *testing.T) {
	// C104: on a cluster the untagged family prefix X and the tagged
	// "{X}" share the base "{X}". Whichever runs first in Generations
	// mode stamps it; a run of the other is refused at the acquire with
	// ErrGroupConflict naming both, the base and what to do, writing
	// nothing: the first's pointer, registry and generation stay,
	// readable. On a standalone server the bases differ, both run, and no
	// stamp is written.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		for _, tagged := range []bool{false, true} {
			x := genPrefix(d) + fmt.Sprintf("alias%v", tagged)
			first, second := x, "{"+x+"}"
			if tagged {
				first, second = second, first
			}
			us := genUsers(30, 3)
			if _, err := genRebuilder(t, d, first, rebuild.Options{}).Run(ctx, sources.Slice(us)); err != nil {
				t.Fatal(err)
			}
			before := dumps(t, d)
			_, err := genRebuilder(t, d, second, rebuild.Options{}).Run(ctx, sources.Slice(genUsers(20, 2)))
			if !d.Cluster {
				if err != nil {
					t.Fatalf("run of %s on a standalone server: %v", second, err)
				}
				wantGeneration(t, d, first, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
				continue
			}
			wantOwned(t, "run of "+second, "acquire", err, second, first)
			wantDumps(t, d, before)
			wantGeneration(t, d, first, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
			wantReadable(t, d, first, us)
		}
		if d.Cluster {
			wantStamps(t, d, []string{genPrefix(d) + "aliasfalse", "{" + genPrefix(d) + "aliastrue}"})
		} else {
			wantStamps(t, d, nil)
		}
	})
}

func TestOwnerStampSyntheticTag(t *testing.T) {
	// C104: a key with a '}' and no valid tag, "a}b", has the base
	// "{rbN}a}b", which is a tagged key whose base is itself: a
	// Generations run of one refuses a run of the other.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		p := strings.Trim(d.Prefix, "{}")
		x := p + "a}b"
		y := "{" + keys.SyntheticTag(keys.Slot(x)) + "}" + x
		syn := "{" + keys.SyntheticTag(keys.Slot(x)) + "}" + p
		us := genUsers(30, 3)
		if _, err := genRebuilder(t, d, x, rebuild.Options{}).Run(ctx, sources.Slice(us)); err != nil {
			t.Fatal(err)
		}
		before := dumps(t, d, syn)
		_, err := genRebuilder(t, d, y, rebuild.Options{}).Run(ctx, sources.Slice(genUsers(20, 2)))
		if !d.Cluster {
			if err != nil {
				t.Fatalf("run of %s on a standalone server: %v", y, err)
			}
			wantStamps(t, d, nil, syn)
			return
		}
		wantOwned(t, "run of "+y, "acquire", err, y, x)
		wantDumps(t, d, before, syn)
		wantGeneration(t, d, x, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
		wantStamps(t, d, []string{x}, syn)
	})
}

func TestOwnerStampRenameInPlaceChecks(t *testing.T) {
	// C104: a run in RenameInPlace mode checks the stamp and writes none.
	// After a Generations run of X, a RenameInPlace run of "{X}" is
	// refused at the acquire, nothing written: its publish would have
	// deleted X's pointer (the switch back to RenameInPlace), and X's
	// readers would have lost the index. On a standalone server it runs.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		x := genPrefix(d) + "rip"
		y := "{" + x + "}"
		us := genUsers(30, 3)
		if _, err := genRebuilder(t, d, x, rebuild.Options{}).Run(ctx, sources.Slice(us)); err != nil {
			t.Fatal(err)
		}
		before := dumps(t, d)
		_, err := hashRebuilder(t, d, y).Run(ctx, sources.Slice(users(5)))
		if !d.Cluster {
			if err != nil {
				t.Fatalf("run of %s on a standalone server: %v", y, err)
			}
			wantStamps(t, d, nil)
			return
		}
		wantOwned(t, "run of "+y, "acquire", err, y, x)
		wantDumps(t, d, before)
		wantGeneration(t, d, x, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
		wantReadable(t, d, x, us)
		wantStamps(t, d, []string{x})
	})
}

func TestOwnerStampRollback(t *testing.T) {
	// C104: a rollback of "{X}" in Generations mode would flip X's
	// pointer back: its acquire checks the stamp and is refused, X left
	// at its generation, nothing written. A rollback writes no stamp.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		x := genPrefix(d) + "back"
		y := "{" + x + "}"
		a, b := genUsers(30, 3), genUsers(40, 4)
		rx := genRebuilder(t, d, x, rebuild.Options{KeepPrevious: time.Minute})
		for _, us := range [][]user{a, b} {
			if _, err := rx.Run(ctx, sources.Slice(us)); err != nil {
				t.Fatal(err)
			}
		}
		before := dumps(t, d)
		_, err := genRebuilder(t, d, y, rebuild.Options{KeepPrevious: time.Minute}).Rollback(ctx)
		if !d.Cluster {
			redistest.WantErr(t, err, rebuild.ErrNothingToRollBack)
			wantStamps(t, d, nil)
			return
		}
		wantOwned(t, "rollback of "+y, "rollback", err, y, x)
		wantDumps(t, d, before)
		wantGeneration(t, d, x, 2, 2, map[string]string{"1": keys.RegPrevious, "2": keys.RegCurrent}, b)
	})
}

func TestOwnerStampGroupClaim(t *testing.T) {
	// C104, C102: group a's claim of the untagged X is in X's own base
	// "{X}", the base of the tagged "{X}" without a group. A run of "{X}"
	// after group a's run of X, and a run of X in group a after a run of
	// "{X}", are refused with the stamp's error (not "pass the group"),
	// nothing written.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, _, _ := fenceNames(d)
		var stamped []string
		for _, tc := range []struct {
			name           string
			first, second  string
			group1, group2 string
		}{
			{"grouped first", "ownerg1", "{ownerg1}", ga, ""},
			{"ungrouped first", "{ownerg2}", "ownerg2", "", ga},
		} {
			first, second := genPrefix(d)+tc.first, genPrefix(d)+tc.second
			if strings.HasPrefix(tc.first, "{") {
				first = "{" + genPrefix(d) + strings.Trim(tc.first, "{}") + "}"
			} else {
				second = "{" + genPrefix(d) + strings.Trim(tc.second, "{}") + "}"
			}
			us := genUsers(30, 3)
			if _, err := genRebuilder(t, d, first, rebuild.Options{Group: tc.group1}).Run(ctx, sources.Slice(us)); err != nil {
				t.Fatalf("%s: run of %s: %v", tc.name, first, err)
			}
			stamped = append(stamped, first)
			before := dumps(t, d)
			_, err := genRebuilder(t, d, second, rebuild.Options{Group: tc.group2}).Run(ctx, sources.Slice(genUsers(20, 2)))
			if !d.Cluster {
				if err != nil {
					t.Errorf("%s: run of %s on a standalone server: %v", tc.name, second, err)
				}
				continue
			}
			wantOwned(t, tc.name+": run of "+second, "acquire", err, second, first)
			wantDumps(t, d, before)
			wantBuckets(t, d, first, 1, us)
		}
		if !d.Cluster {
			stamped = nil
		}
		wantStamps(t, d, stamped)
	})
}

func TestOwnerStampWhereLeft(t *testing.T) {
	// C104: the stamp is left by runs in Generations mode on a cluster,
	// for keys whose base another can have, and only there: not by a run
	// in RenameInPlace mode, nor for a key with a tag of its own ("{T}rest"),
	// nor on a standalone server. A mode switch keeps it.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		tagged := taggedFencePrefix(d) + "where"
		inPlace := genPrefix(d) + "where:inplace"
		gen := genPrefix(d) + "where:gen"
		if _, err := genRebuilder(t, d, tagged, rebuild.Options{}).Run(ctx, sources.Slice(genUsers(20, 2))); err != nil {
			t.Fatalf("run of %s: %v", tagged, err)
		}
		for range 2 {
			if _, err := hashRebuilder(t, d, inPlace).Run(ctx, sources.Slice(users(5))); err != nil {
				t.Fatalf("run of %s: %v", inPlace, err)
			}
		}
		wantStamps(t, d, nil)
		genHash := redistest.Rebuilder(t, d.Client, rebuild.Options{Publish: rebuild.Generations},
			builders.Hash(gen, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
		if _, err := genHash.Run(ctx, sources.Slice(users(5))); err != nil {
			t.Fatalf("run of %s: %v", gen, err)
		}
		var want []string
		if d.Cluster {
			want = []string{gen}
		}
		wantStamps(t, d, want)
		// Back to RenameInPlace (deleting the pointer), then Generations
		// again: the stamp stays, and the base is still gen's.
		if _, err := hashRebuilder(t, d, gen).Run(ctx, sources.Slice(users(5))); err != nil {
			t.Fatalf("RenameInPlace run of %s: %v", gen, err)
		}
		redistest.WantAbsent(t, d.Other, keys.PointerKey(gen, d.Cluster))
		wantStamps(t, d, want)
		if _, err := genHash.Run(ctx, sources.Slice(users(5))); err != nil {
			t.Fatalf("second Generations run of %s: %v", gen, err)
		}
		wantStamps(t, d, want)
	})
}

func TestOwnerStampTampered(t *testing.T) {
	// C104: on a cluster a stamp that is not a string (written by hand)
	// fails the run at the acquire with ErrTampered naming it, nothing
	// written. A standalone server has no stamp to read: the run goes on,
	// the list left as it is.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		x := genPrefix(d) + "tampered"
		stamp := keys.OwnerKey(x, true)
		redistest.Cmd(t, d.Other, "RPUSH", stamp, x)
		before := dumps(t, d)
		_, err := genRebuilder(t, d, x, rebuild.Options{}).Run(ctx, sources.Slice(genUsers(20, 2)))
		if !d.Cluster {
			if err != nil {
				t.Fatalf("run of %s on a standalone server: %v", x, err)
			}
			if got, _ := redistest.Cmd(t, d.Other, "LRANGE", stamp, "0", "-1").AsStrSlice(); !slices.Equal(got, []string{x}) {
				t.Errorf("%s holds %v, want [%s]", stamp, got, x)
			}
			return
		}
		redistest.WantErr(t, err, rebuild.ErrTampered)
		if err == nil || !strings.Contains(err.Error(), stamp+" is a list") {
			t.Errorf("Run: %v, want it to name %s", err, stamp)
		}
		wantDumps(t, d, before)
	})
}

func TestOwnerStampACL(t *testing.T) {
	// C104, C93: the stamp's SET is among the rights checked up front only
	// where the run writes it. A user who may not SET the stamp fails a
	// Generations run on a cluster at the acquire with ErrNoPermission
	// naming SET on it, nothing written; runs in RenameInPlace mode on a
	// cluster, and every run on a standalone server, need no such right.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		x := genPrefix(d) + "acl"
		plain := genPrefix(d) + "aclhash"
		stamp := keys.OwnerKey(x, true)
		var sets []string
		for _, l := range []string{x, plain} {
			sets = append(sets, "~"+keys.Base(l, d.Cluster)+":rebuild-[^o]*")
		}
		// Every command on every key but SET, and SET on every key of
		// the indexes but the stamps (a selector: patterns cannot exclude).
		c := clientAs(t, d, "+@all", "-set", "~*", "("+strings.Join(append([]string{"+set"}, sets...), " ")+")")
		if _, err := redistest.Rebuilder(t, c, rebuild.Options{},
			builders.Hash(plain, func(u user) (string, string, bool) { return u.Email, u.ID, true })).Run(ctx, sources.Slice(users(5))); err != nil {
			t.Fatalf("RenameInPlace run of %s without SET on its stamp: %v", plain, err)
		}
		before := dumps(t, d)
		opts := rebuild.Options{Publish: rebuild.Generations, BatchSize: 50}
		_, err := redistest.Rebuilder(t, c, opts,
			builders.SetIndex(x, func(u user) (string, string, bool) { return u.Country, u.ID, true })).Run(ctx, sources.Slice(genUsers(20, 2)))
		if !d.Cluster {
			if err != nil {
				t.Fatalf("Generations run of %s on a standalone server without SET on %s: %v", x, stamp, err)
			}
			wantStamps(t, d, nil)
			return
		}
		redistest.WantErr(t, err, rebuild.ErrNoPermission)
		var e *rebuild.Error
		if !errors.As(err, &e) || e.Op != "acquire" || !strings.Contains(err.Error(), fmt.Sprintf("SET on %q", stamp)) {
			t.Errorf("Run: %v, want an *Error of op acquire naming SET on %s", err, stamp)
		}
		wantDumps(t, d, before)
	})
}

func TestOwnerStampSweepOfAlias(t *testing.T) {
	// C104: the registry of X is its base's, which on a cluster is
	// "{X}"'s too once "{X}" owns it. Rebuilder.Sweep of X must not take
	// a generation of "{X}" out of that registry while leaving its data
	// keys (they hang off "{X}", not X), which nothing finds again.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		x := genPrefix(d) + "sweepalias"
		owner := "{" + x + "}"
		// Generation 1 kept as the previous one, then marked retired long
		// ago: the run removes the one it flips away from otherwise.
		ry := genRebuilder(t, d, owner, rebuild.Options{KeepPrevious: time.Minute})
		for range 2 {
			if _, err := ry.Run(ctx, sources.Slice(genUsers(20, 2))); err != nil {
				t.Fatalf("run of %s: %v", owner, err)
			}
		}
		redistest.Cmd(t, d.Other, "HSET", keys.RegistryKey(owner, d.Cluster), "1", keys.RegRetired+"1000")
		if len(redistest.Keys(t, d.Other, keys.GenPrefix(owner, 1))) == 0 {
			t.Fatalf("generation 1 of %s has no keys before the sweep", owner)
		}
		_, err := genRebuilder(t, d, x, rebuild.Options{}).Sweep(ctx)
		t.Logf("Sweep of %s: %v", x, err)
		reg := redistest.HGetAll(t, d.Other, keys.RegistryKey(owner, d.Cluster))
		if left := redistest.Keys(t, d.Other, keys.GenPrefix(owner, 1)); len(left) > 0 && reg["1"] == "" {
			t.Errorf("Sweep of %s: registry of %s %v no longer lists generation 1, whose keys %q are left", x, owner, reg, left)
		}
	})
}

func TestOwnerStampDropPlainOfAlias(t *testing.T) {
	// C104: DropPlain deletes the plain key of X only while X's pointer
	// exists, its proof that X's readers read generations. On a cluster
	// the pointer of X's base is "{X}"'s once "{X}" runs in Generations
	// mode: X's live key, published in RenameInPlace mode, must stay.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		x := genPrefix(d) + "dropalias"
		y := "{" + x + "}"
		hashGen := func(live string) *rebuild.Rebuilder[user] {
			return redistest.Rebuilder(t, d.Client, rebuild.Options{Publish: rebuild.Generations},
				builders.Hash(live, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
		}
		us := users(5)
		if _, err := hashRebuilder(t, d, x).Run(ctx, sources.Slice(us)); err != nil {
			t.Fatalf("RenameInPlace run of %s: %v", x, err)
		}
		_, err := hashGen(y).Run(ctx, sources.Slice(users(2)))
		t.Logf("Generations run of %s: %v", y, err)
		_, err = hashGen(x).DropPlain(ctx)
		t.Logf("DropPlain of %s: %v", x, err)
		if d.Cluster && !errors.Is(err, rebuild.ErrGroupConflict) {
			t.Errorf("DropPlain of %s: got %v, want an error matching ErrGroupConflict", x, err)
		}
		if d.Cluster {
			// A stamp naming neither key of the base proves nothing.
			stamp := keys.OwnerKey(x, true)
			redistest.Cmd(t, d.Other, "SET", stamp, "stray")
			_, err = hashGen(x).DropPlain(ctx)
			if ce := (*gens.CorruptError)(nil); !errors.As(err, &ce) || ce.Key != stamp || ce.Value != "stray" {
				t.Errorf("DropPlain of %s under a stamp naming neither key: got %v, want a *gens.CorruptError naming %s", x, err, stamp)
			}
		}
		want := map[string]string{}
		for _, u := range us {
			want[u.Email] = u.ID
		}
		redistest.WantHash(t, d.Other, x, want)
	})
}

func TestOwnerStampApplyOfAlias(t *testing.T) {
	// C104: Apply of an index in Generations mode resolves the pointer of
	// its base, which on a cluster is the other index's once that one
	// owns it: the change would go into the other index's generation,
	// listed in its manifest, keys that hang off this index and that
	// nothing removes. Apply checks the stamp in the step that resolves
	// the pointer and fails with ErrGroupConflict, nothing written or
	// logged: for the untagged X, whose change goes across slots, and for
	// "{X}", whose goes in one step. On a standalone server the bases
	// differ, and Apply writes the index's own plain keys.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		for _, tagged := range []bool{false, true} {
			t.Run(fmt.Sprintf("tagged owns %v", !tagged), func(t *testing.T) {
				x := genPrefix(d) + fmt.Sprintf("apply%v", tagged)
				owner, other := "{"+x+"}", x
				if tagged {
					owner, other = other, owner
				}
				us := genUsers(30, 3)
				if _, err := genRebuilder(t, d, owner, rebuild.Options{}).Run(ctx, sources.Slice(us)); err != nil {
					t.Fatal(err)
				}
				before := dumps(t, d)
				extra := user{ID: "extra", Email: "extra@example.com", Country: "b01"}
				err := genRebuilder(t, d, other, rebuild.Options{}).Apply(ctx, index.Change[user]{New: &extra})
				if !d.Cluster {
					if err != nil {
						t.Fatalf("Apply of %s on a standalone server: %v", other, err)
					}
					if got := redistest.SMembers(t, d.Other, other+":b01"); !slices.Equal(got, []string{"extra"}) {
						t.Errorf("Apply of %s on a standalone server: %s:b01 holds %v, want [extra]", other, other, got)
					}
					return
				}
				wantOwned(t, "Apply of "+other, "apply", err, other, owner)
				wantDumps(t, d, before)
				wantReadable(t, d, owner, us)
			})
		}
	})
}

func TestOwnerStampInPlaceIndexKeepsReaders(t *testing.T) {
	// C104: an index published in RenameInPlace mode leaves no stamp, so
	// the first Generations run of the other key of its base ("X" and
	// "{X}" on a cluster) takes that base, stamps it with its own name and
	// flips the pointer the first index's readers resolve. Those readers
	// must go on reading the first index's live key, as published, and
	// the second index's readers its generation.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		for _, tagged := range []bool{false, true} {
			x := genPrefix(d) + fmt.Sprintf("inplace%v", tagged)
			first, second := x, "{"+x+"}"
			if tagged {
				first, second = second, first
			}
			hash := func(us []user) map[string]string {
				m := map[string]string{}
				for _, u := range us {
					m[u.Email] = u.ID
				}
				return m
			}
			us, them := users(5), users(2)
			if _, err := hashRebuilder(t, d, first).Run(ctx, sources.Slice(us)); err != nil {
				t.Fatalf("RenameInPlace run of %s: %v", first, err)
			}
			gen := redistest.Rebuilder(t, d.Client, rebuild.Options{Publish: rebuild.Generations},
				builders.Hash(second, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
			if _, err := gen.Run(ctx, sources.Slice(them)); err != nil {
				t.Fatalf("Generations run of %s after the RenameInPlace run of %s: %v", second, first, err)
			}
			if d.Cluster {
				if got, ok := redistest.Get(t, d.Other, keys.OwnerKey(second, true)); !ok || got != second {
					t.Fatalf("owner stamp %s = %q, %v; want %q", keys.OwnerKey(second, true), got, ok, second)
				}
			}
			for _, c := range []*reader.Reader{newReaderOf(t, d.Other), newReaderOf(t, d.Client)} {
				for live, want := range map[string]map[string]string{first: hash(us), second: hash(them)} {
					k, err := c.Key(ctx, live)
					if err != nil {
						t.Fatalf("reader Key(%s): %v", live, err)
					}
					if got := redistest.HGetAll(t, d.Other, k); !maps.Equal(got, want) {
						t.Errorf("reader of %s resolves %s holding %v, want %v", live, k, got, want)
					}
				}
			}
		}
	})
}

// newReaderOf returns a reader over c, failing t on error.
func newReaderOf(t *testing.T, c rueidis.Client) *reader.Reader {
	t.Helper()
	r, err := reader.New(c, reader.Options{})
	if err != nil {
		t.Fatalf("reader.New: %v", err)
	}
	return r
}

package rebuild_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/reader"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// wantOwned checks that err is the acquire's refusal of index live whose
// base another index, owner, owns: ErrGroupConflict naming both, the base
// and the stamp.
func wantOwned(t *testing.T, what string, err error, live, owner string, cluster bool) {
	t.Helper()
	stamp := keys.OwnerKey(owner, cluster)
	t.Logf("%s: %v", what, err)
	wantGroupConflict(t, what, err, "index "+live+" and index "+owner, "same base "+strings.TrimSuffix(stamp, keys.OwnerSuffix),
		fmt.Sprintf("(%s holds %q)", stamp, owner), "hash tag of its own", "nothing written")
	var e *rebuild.Error
	if !errors.As(err, &e) || e.Op != "acquire" || e.Key != live {
		t.Errorf("%s: got %v, want an *Error of op acquire for %s", what, err, live)
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

func TestOwnerStampRefusesAlias(t *testing.T) {
	// C104: on a cluster the untagged family prefix X and the tagged
	// "{X}" share the base "{X}". X runs in Generations mode; a run of
	// "{X}" is refused at the acquire with ErrGroupConflict naming both,
	// the base and what to do, writing nothing: X's pointer, registry and
	// generation stay, readable. On a standalone server the bases differ
	// and both run, each stamping its own.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		x := genPrefix(d) + "alias"
		y := "{" + x + "}"
		usX := genUsers(30, 3)
		if _, err := genRebuilder(t, d, x, rebuild.Options{}).Run(ctx, sources.Slice(usX)); err != nil {
			t.Fatal(err)
		}
		redistest.WantString(t, d.Other, keys.OwnerKey(x, d.Cluster), x)
		before := dumps(t, d)
		_, err := genRebuilder(t, d, y, rebuild.Options{}).Run(ctx, sources.Slice(genUsers(20, 2)))
		if !d.Cluster {
			if err != nil {
				t.Fatalf("run of %s on a standalone server: %v", y, err)
			}
			redistest.WantString(t, d.Other, keys.OwnerKey(y, d.Cluster), y)
			wantGeneration(t, d, x, 1, 1, map[string]string{"1": keys.RegCurrent}, usX)
			return
		}
		wantOwned(t, "run of "+y, err, y, x, d.Cluster)
		wantDumps(t, d, before)
		wantGeneration(t, d, x, 1, 1, map[string]string{"1": keys.RegCurrent}, usX)
		var want []string
		for _, u := range usX {
			if u.Country == "b01" {
				want = append(want, u.ID)
			}
		}
		slices.Sort(want)
		if got := readBucket(t, d, x, "b01"); !slices.Equal(got, want) {
			t.Errorf("reader: bucket b01 of %s holds %v, want %v", x, got, want)
		}
	})
}

func TestOwnerStampSyntheticTag(t *testing.T) {
	// C104: a key with a '}' and no valid tag, "a}b", has the base
	// "{rbN}a}b", which is a tagged key whose base is itself: a run of
	// one refuses the other, in either order of the test's two indexes.
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
		redistest.WantString(t, d.Other, keys.OwnerKey(x, d.Cluster), x)
		before := dumps(t, d, syn)
		_, err := genRebuilder(t, d, y, rebuild.Options{}).Run(ctx, sources.Slice(genUsers(20, 2)))
		if !d.Cluster {
			if err != nil {
				t.Fatalf("run of %s on a standalone server: %v", y, err)
			}
			return
		}
		wantOwned(t, "run of "+y, err, y, x, d.Cluster)
		wantDumps(t, d, before, syn)
		wantGeneration(t, d, x, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
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
			own := keys.Names{Cluster: d.Cluster}
			redistest.WantString(t, d.Other, keys.OwnerKey(first, own), first)
			before := dumps(t, d)
			_, err := genRebuilder(t, d, second, rebuild.Options{Group: tc.group2}).Run(ctx, sources.Slice(genUsers(20, 2)))
			if !d.Cluster {
				if err != nil {
					t.Errorf("%s: run of %s on a standalone server: %v", tc.name, second, err)
				}
				continue
			}
			wantOwned(t, tc.name+": run of "+second, err, second, first, d.Cluster)
			wantDumps(t, d, before)
			wantBuckets(t, d, first, 1, us)
		}
	})
}

func TestOwnerStampRenameInPlace(t *testing.T) {
	// C104: RenameInPlace mode shares temp keys and kept previous values
	// through the base too: the plain key X rebuilt in place, then a
	// rebuild of "{X}" is refused at the acquire, X keeping its value and
	// "{X}" not created.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		x := strings.Trim(d.Prefix, "{}") + "users:by-email"
		y := "{" + x + "}"
		hash := func(live string) index.Builder[user] {
			return builders.Hash(live, func(u user) (string, string, bool) { return u.Email, u.ID, true })
		}
		us := users(20)
		if _, err := redistest.Rebuilder(t, d.Client, rebuild.Options{}, hash(x)).Run(ctx, sources.Slice(us)); err != nil {
			t.Fatal(err)
		}
		redistest.WantString(t, d.Other, keys.OwnerKey(x, d.Cluster), x)
		before := dumps(t, d)
		_, err := redistest.Rebuilder(t, d.Client, rebuild.Options{}, hash(y)).Run(ctx, sources.Slice(users(5)))
		if !d.Cluster {
			if err != nil {
				t.Fatalf("run of %s on a standalone server: %v", y, err)
			}
			return
		}
		wantOwned(t, "run of "+y, err, y, x, d.Cluster)
		wantDumps(t, d, before)
	})
}

func TestOwnerStampApplyDuringRun(t *testing.T) {
	// C104, C95: Apply of "{X}" while X's run holds the shared lock finds
	// in its record keys that are not "{X}"'s, and is refused with
	// ErrInProgress, writing and logging nothing; X's run publishes only
	// X's data.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		x := genPrefix(d) + "aliasapply"
		y := "{" + x + "}"
		if _, err := genRebuilder(t, d, x, rebuild.Options{}).Run(ctx, sources.Slice(genUsers(10, 3))); err != nil {
			t.Fatal(err)
		}
		us := genUsers(30, 3)
		ry := genRebuilder(t, d, y, rebuild.Options{})
		var applyErr error
		src := genSource(us, 10, func() error {
			u := genUsers(1, 1)[0]
			applyErr = ry.Apply(ctx, index.Change[user]{New: &u})
			return nil
		})
		if _, err := genRebuilder(t, d, x, rebuild.Options{}).Run(ctx, src); err != nil {
			t.Fatal(err)
		}
		if d.Cluster {
			redistest.WantErr(t, applyErr, rebuild.ErrInProgress)
		} else if applyErr != nil {
			t.Errorf("Apply of %s on a standalone server: %v", y, applyErr)
		}
		redistest.WantString(t, d.Other, keys.PointerKey(x, d.Cluster), "2")
		wantBuckets(t, d, x, 2, us)
		if d.Cluster {
			// Nothing of "{X}"'s data: neither in a generation nor plain.
			for _, p := range []string{y + keys.GenInfix, y + ":b"} {
				if left := redistest.Keys(t, d.Other, p); len(left) > 0 {
					t.Errorf("Apply of %s wrote %v", y, left)
				}
			}
		}
	})
}

func TestOwnerStampTampered(t *testing.T) {
	// C104: a stamp that is not a string (written by hand) fails the run
	// at the acquire with ErrTampered naming it, nothing written.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		x := genPrefix(d) + "tampered"
		stamp := keys.OwnerKey(x, d.Cluster)
		redistest.Cmd(t, d.Other, "RPUSH", stamp, x)
		before := dumps(t, d)
		_, err := genRebuilder(t, d, x, rebuild.Options{}).Run(ctx, sources.Slice(genUsers(20, 2)))
		redistest.WantErr(t, err, rebuild.ErrTampered)
		if err == nil || !strings.Contains(err.Error(), stamp+" is a list") {
			t.Errorf("Run: %v, want it to name %s", err, stamp)
		}
		wantDumps(t, d, before)
	})
}

func TestOwnerStampACL(t *testing.T) {
	// C104, C93: a user who may read the stamp but not SET it fails at the
	// acquire with ErrNoPermission naming SET on it, and the server holds
	// no key.
	t.Parallel()
	x := redistest.Prefix(t) + "users:by-email"
	srv := redistest.OwnServer(t)
	c := srv.ClientAs(t, "ks-"+strings.ReplaceAll(t.Name(), "/", "-"),
		// Every command but SET on every key, and SET on every key of the
		// index but the stamp (a selector: ACL patterns cannot exclude).
		"+@all", "-set", "~*", "(+set ~"+x+" ~"+x+":rebuild:* ~"+x+":rebuild-[^o]*)")
	r := redistest.Rebuilder(t, c, rebuild.Options{},
		builders.Hash(x, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
	_, err := r.Run(redistest.Ctx(t), sources.Slice(users(8)))
	redistest.WantErr(t, err, rebuild.ErrNoPermission)
	stamp := keys.OwnerKey(x, false)
	var e *rebuild.Error
	if !errors.As(err, &e) || e.Op != "acquire" || !strings.Contains(err.Error(), fmt.Sprintf("SET on %q", stamp)) {
		t.Errorf("Run: %v, want an *Error of op acquire naming SET on %s", err, stamp)
	}
	if left := redistest.Keys(t, srv.Client(t), ""); len(left) > 0 {
		t.Errorf("the refused run left %v", left)
	}
}

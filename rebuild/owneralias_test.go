package rebuild_test

import (
	"maps"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

func TestOwnerStampInPlaceApplyBesideGroupClaim(t *testing.T) {
	// C104, C102: on a cluster group a's claim of the untagged X is in X's
	// own base "{X}", the base of the tagged "{X}" without a group, and
	// the stamp names X. "{X}" rebuilds in place: its data is its plain
	// key, which its readers read (the stamp names the other key), and
	// its Apply in RenameInPlace mode writes that key, with no pointer of
	// its own. The claim in the shared pointer is X's, not "{X}"'s: the
	// Apply must not be refused as if "{X}" were in group a.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, _, _ := fenceNames(d)
		x := genPrefix(d) + "inplaceclaim"
		tagged := "{" + x + "}"
		if _, err := genRebuilder(t, d, x, rebuild.Options{Group: ga}).Run(ctx, sources.Slice(genUsers(30, 3))); err != nil {
			t.Fatalf("run of %s in group %s: %v", x, ga, err)
		}
		extra := users(1)[0]
		if err := hashRebuilder(t, d, tagged).Apply(ctx, index.Change[user]{New: &extra}); err != nil {
			t.Fatalf("RenameInPlace Apply of %s beside group %s's claim of %s: %v", tagged, ga, x, err)
		}
		wantApplied(t, d, tagged, extra)
		k, err := newReaderOf(t, d.Other).Key(ctx, tagged)
		if err != nil {
			t.Fatalf("reader Key(%s): %v", tagged, err)
		}
		if k != tagged {
			t.Errorf("reader of %s resolves %s, want its plain key", tagged, k)
		}
	})
}

func TestOwnerStampInPlaceApplyOwnOrTampered(t *testing.T) {
	// C104, C102: the stamp lets the RenameInPlace Apply of "{X}" pass a
	// claim only when it names another live key. A stamp naming "{X}"
	// itself keeps the pointer "{X}"'s: its claim refuses the Apply with
	// ErrGroupConflict naming the group. A stamp of another type fails it
	// with ErrTampered naming the stamp. Nothing written either way. A
	// standalone server reads no stamp: the claim refuses, and without one
	// the Apply goes on.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, _, _ := fenceNames(d)
		tagged := "{" + genPrefix(d) + "inplaceown}"
		ptr, stamp := keys.PointerKey(tagged, d.Cluster), keys.OwnerKey(tagged, true)
		extra := users(1)[0]
		r := hashRebuilder(t, d, tagged)

		redistest.Cmd(t, d.Other, "SET", ptr, keys.GroupMarker(ga))
		redistest.Cmd(t, d.Other, "SET", stamp, tagged)
		before := dumps(t, d)
		err := r.Apply(ctx, index.Change[user]{New: &extra})
		redistest.WantErr(t, err, rebuild.ErrGroupConflict)
		if err == nil || !strings.Contains(err.Error(), "in group") {
			t.Errorf("Apply of %s under its own stamp and group %s's claim: %v, want it refused as in the group", tagged, ga, err)
		}
		wantDumps(t, d, before)

		redistest.Cmd(t, d.Other, "DEL", ptr, stamp)
		redistest.Cmd(t, d.Other, "RPUSH", stamp, tagged)
		before = dumps(t, d)
		err = r.Apply(ctx, index.Change[user]{New: &extra})
		if !d.Cluster {
			if err != nil {
				t.Fatalf("Apply of %s on a standalone server: %v", tagged, err)
			}
			wantApplied(t, d, tagged, extra)
			return
		}
		redistest.WantErr(t, err, rebuild.ErrTampered)
		if err == nil || !strings.Contains(err.Error(), stamp+" is a list") {
			t.Errorf("Apply: %v, want it to name %s", err, stamp)
		}
		wantDumps(t, d, before)
	})
}

func TestOwnerStampInPlaceApplyNoRight(t *testing.T) {
	// C104, C93: on a cluster the RenameInPlace Apply of "{X}" reads its
	// base's stamp, whose TYPE is in its rights check before anything
	// else: a user without TYPE is refused with ErrNoPermission naming
	// TYPE and the stamp, nothing written.
	t.Parallel()
	ctx := redistest.Ctx(t)
	tagged := "{" + strings.Trim(redistest.Prefix(t), "{}") + "inplaceright}"
	admin := env.Cluster.Client(t)
	c := env.Cluster.ClientAs(t, "ks-"+t.Name(), "~*", "+@all", "-type")
	r := redistest.Rebuilder(t, c, rebuild.Options{},
		builders.Hash(tagged, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
	extra := users(1)[0]
	err := r.Apply(ctx, index.Change[user]{New: &extra})
	redistest.WantErr(t, err, rebuild.ErrNoPermission)
	if stamp := keys.OwnerKey(tagged, true); err == nil || !strings.Contains(err.Error(), "TYPE") || !strings.Contains(err.Error(), stamp) {
		t.Errorf("Apply of %s without TYPE: %v, want it to name TYPE and %s", tagged, err, stamp)
	}
	if n, _ := redistest.Cmd(t, admin, "EXISTS", tagged).AsInt64(); n != 0 {
		t.Errorf("%s exists after a refused Apply", tagged)
	}
}

func TestOwnerStampInPlaceApplyBesideRunOfOwner(t *testing.T) {
	// C104, C95: the stamp lets the RenameInPlace Apply of "{X}" past the
	// pointer of X, the base's owner, not past the lock the two share:
	// while a run of X holds it, the change, none of whose keys is the
	// run's, is refused with ErrInProgress, neither written nor logged for
	// X's run. On a standalone server the locks differ, and the Apply
	// writes "{X}".
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		x := genPrefix(d) + "inplacerun"
		tagged := "{" + x + "}"
		h, _, err := genRebuilder(t, d, x, rebuild.Options{}).Build(ctx, sources.Slice(genUsers(30, 3)))
		if err != nil {
			t.Fatalf("Build of %s: %v", x, err)
		}
		defer func() {
			if err := h.Discard(ctx); err != nil {
				t.Errorf("Discard of %s: %v", x, err)
			}
		}()
		extra := users(1)[0]
		err = hashRebuilder(t, d, tagged).Apply(ctx, index.Change[user]{New: &extra})
		if !d.Cluster {
			if err != nil {
				t.Fatalf("Apply of %s on a standalone server: %v", tagged, err)
			}
			wantApplied(t, d, tagged, extra)
			return
		}
		redistest.WantErr(t, err, rebuild.ErrInProgress)
		if n, _ := redistest.Cmd(t, d.Other, "EXISTS", tagged).AsInt64(); n != 0 {
			t.Errorf("%s exists after a refused Apply", tagged)
		}
		if log := keys.LogKey(keys.LockKey(x, true)); redistest.Exists(t, d.Other, log) {
			t.Errorf("%s holds entries after a refused Apply of %s", log, tagged)
		}
	})
}

// wantApplied fails t unless the hash live holds exactly u's entry, as
// the Apply of u alone to an empty index in place writes it.
func wantApplied(t *testing.T, d deployment, live string, u user) {
	t.Helper()
	if got, want := redistest.HGetAll(t, d.Other, live), map[string]string{u.Email: u.ID}; !maps.Equal(got, want) {
		t.Errorf("%s holds %v after its Apply, want %v", live, got, want)
	}
}

func TestOwnerStampStray(t *testing.T) {
	// C104: an owner stamp that is a string naming neither live key of its
	// base (written by hand) is not trusted. On a cluster a RenameInPlace
	// Apply of the tagged "{X}", which would otherwise take the stamp for
	// X's and pass the group's claim in the shared pointer, and a run of
	// X, fail with ErrTampered naming the stamp and what it holds, nothing
	// written. A standalone server reads no stamp: the claim refuses the
	// Apply as in the group.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, _, _ := fenceNames(d)
		x := genPrefix(d) + "stray"
		tagged := "{" + x + "}"
		ptr, stamp := keys.PointerKey(tagged, d.Cluster), keys.OwnerKey(tagged, true)
		redistest.Cmd(t, d.Other, "SET", ptr, keys.GroupMarker(ga))
		redistest.Cmd(t, d.Other, "SET", stamp, "stray")
		before := dumps(t, d)
		wantStray := func(what string, err error) {
			t.Helper()
			redistest.WantErr(t, err, rebuild.ErrTampered)
			if err == nil || !strings.Contains(err.Error(), stamp) || !strings.Contains(err.Error(), `"stray"`) {
				t.Errorf("%s: %v, want it to name %s and what it holds", what, err, stamp)
			}
			wantDumps(t, d, before)
		}

		extra := users(1)[0]
		err := hashRebuilder(t, d, tagged).Apply(ctx, index.Change[user]{New: &extra})
		if !d.Cluster {
			redistest.WantErr(t, err, rebuild.ErrGroupConflict)
			wantDumps(t, d, before)
			return
		}
		wantStray("RenameInPlace Apply of "+tagged, err)
		_, err = genRebuilder(t, d, x, rebuild.Options{}).Run(ctx, sources.Slice(genUsers(20, 2)))
		wantStray("run of "+x, err)
	})
}

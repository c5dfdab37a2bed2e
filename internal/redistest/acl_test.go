package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/redis/rueidis"
)

// isNoPerm reports whether err is Redis's ACL error.
func isNoPerm(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	return ok && strings.HasPrefix(re.Error(), "NOPERM")
}

func TestClientAsWithoutRename(t *testing.T) {
	t.Parallel()
	s := env.Standalone
	admin := s.Client(t)
	prefix := Prefix(t)
	name := "ks-" + t.Name()

	t.Run("user", func(t *testing.T) {
		c := s.ClientAs(t, name, "~"+prefix+"*", "+@all", "-rename")
		ctx := t.Context()
		if err := c.Do(ctx, c.B().Set().Key(prefix+"a").Value("v").Build()).Error(); err != nil {
			t.Fatalf("SET as %s: %v", name, err)
		}
		err := c.Do(ctx, c.B().Rename().Key(prefix+"a").Newkey(prefix+"b").Build()).Error()
		if !isNoPerm(err) {
			t.Errorf("RENAME as %s: got %v, want NOPERM", name, err)
		}
		err = c.Do(ctx, c.B().Get().Key("elsewhere").Build()).Error()
		if !isNoPerm(err) {
			t.Errorf("GET of a key outside %s* as %s: got %v, want NOPERM", prefix, name, err)
		}
		if n, err := admin.Do(ctx, admin.B().Exists().Key(prefix+"b").Build()).AsInt64(); err != nil || n != 0 {
			t.Errorf("EXISTS %sb after the denied RENAME: got %d, %v, want 0", prefix, n, err)
		}
	})

	err := admin.Do(t.Context(), admin.B().AclGetuser().Username(name).Build()).Error()
	if !rueidis.IsRedisNil(err) {
		t.Errorf("ACL GETUSER %s after its test: got %v, want nil (deleted)", name, err)
	}
}

func TestClientAsWithNoPermissionAtAll(t *testing.T) {
	t.Parallel()
	s := startTestServer(t)
	admin := s.Client(t)
	const name = "nobody"
	c := s.ClientAs(t, name, "-@all")
	ctx := t.Context()

	if err := c.Do(ctx, c.B().Get().Key(Prefix(t)+"k").Build()).Error(); !isNoPerm(err) {
		t.Fatalf("GET as %s: got %v, want NOPERM", name, err)
	}
	conns := clientIDs(t, admin, name)
	if len(conns) == 0 {
		t.Fatalf("CLIENT LIST: got no connection of user %s, want one", name)
	}
	// The keep-alive PING of the idle client is denied, and ACL LOG says so.
	eventually(t, "ACL LOG records the keep-alive PING", func(ctx context.Context) error {
		objects, err := deniedCommands(ctx, admin, name)
		if err != nil {
			return err
		}
		if !slices.Contains(objects, "ping") {
			return fmt.Errorf("ACL LOG of %s: got %q, want ping among them", name, objects)
		}
		return nil
	})
	// rueidis ignores the denial: the same connection serves the next command.
	if err := c.Do(ctx, c.B().Get().Key(Prefix(t)+"k").Build()).Error(); !isNoPerm(err) {
		t.Fatalf("GET as %s after the PING: got %v, want NOPERM", name, err)
	}
	// The client may have opened another connection meanwhile (a single
	// rueidis client multiplexes over more than one), but closed none.
	got := clientIDs(t, admin, name)
	for _, id := range conns {
		if !slices.Contains(got, id) {
			t.Errorf("connections of %s after the denied PING: got %v, want all of those before, %v", name, got, conns)
			break
		}
	}
}

// clientIDs returns the IDs of the connections authenticated as user, from
// CLIENT LIST, sorted.
func clientIDs(t *testing.T, admin rueidis.Client, user string) []string {
	t.Helper()
	list, err := admin.Do(t.Context(), admin.B().ClientList().Build()).ToString()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	var ids []string
	for line := range strings.Lines(list) {
		fields := strings.Fields(line)
		if !slices.Contains(fields, "user="+user) {
			continue
		}
		for _, f := range fields {
			if id, ok := strings.CutPrefix(f, "id="); ok {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// deniedCommands returns the commands ACL LOG records as denied to user,
// among the last 128 entries (Redis keeps 128 by default).
func deniedCommands(ctx context.Context, admin rueidis.Client, user string) ([]string, error) {
	entries, err := admin.Do(ctx, admin.B().AclLog().Count(128).Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("ACL LOG: %w", err)
	}
	var objects []string
	for _, e := range entries {
		m, err := e.AsMap()
		if err != nil {
			return nil, fmt.Errorf("ACL LOG entry: %w", err)
		}
		field := func(name string) string {
			v := m[name]
			s, _ := v.ToString()
			return s
		}
		if field("username") == user && field("reason") == "command" {
			objects = append(objects, field("object"))
		}
	}
	return objects, nil
}

// TestRenameCommandOnTheCommandLine checks that --rename-command works as
// StartServer arguments, "" included, and that ACL rules still name a
// renamed command by its original name.
func TestRenameCommandOnTheCommandLine(t *testing.T) {
	t.Parallel()
	s := startTestServer(t, "--rename-command", "RENAME", "", "--rename-command", "FLUSHALL", "ks-flushall")
	admin := s.Client(t)
	ctx := t.Context()
	prefix := Prefix(t)

	err := admin.Do(ctx, admin.B().Rename().Key(prefix+"a").Newkey(prefix+"b").Build()).Error()
	if !isUnknownCommand(err) {
		t.Errorf("RENAME renamed to \"\": got %v, want an unknown command error", err)
	}
	if err := admin.Do(ctx, admin.B().Flushall().Build()).Error(); !isUnknownCommand(err) {
		t.Errorf("FLUSHALL renamed to ks-flushall: got %v, want an unknown command error", err)
	}
	if err := admin.Do(ctx, admin.B().Arbitrary("ks-flushall").Build()).Error(); err != nil {
		t.Errorf("ks-flushall: got %v, want OK", err)
	}

	// ACL rules know the command by its original name only.
	err = admin.Do(ctx, admin.B().AclSetuser().Username("probe").Rule("-ks-flushall").Build()).Error()
	if !errors.As(err, new(*rueidis.RedisError)) {
		t.Errorf("ACL SETUSER probe -ks-flushall: got %v, want an error", err)
	}
	c := s.ClientAs(t, "noflush", "+@all", "-flushall", "-rename")
	if err := c.Do(ctx, c.B().Arbitrary("ks-flushall").Build()).Error(); !isNoPerm(err) {
		t.Errorf("ks-flushall as a user with -flushall: got %v, want NOPERM", err)
	}
}

// isUnknownCommand reports whether err is Redis's error for a command it
// does not know.
func isUnknownCommand(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	return ok && strings.Contains(re.Error(), "unknown command")
}

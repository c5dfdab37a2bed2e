package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

// dbClient returns a client of addr's database db, closed when t ends.
func dbClient(t *testing.T, addr string, db int) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, SelectDB: db, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// seedOrphans writes n orphaned temp keys (no TTL, no lock, two hours old)
// under the test's prefix through c, deletes them when t ends, and returns
// them sorted.
func seedOrphans(t *testing.T, c rueidis.Client, n int) []string {
	t.Helper()
	old := time.Now().Add(-2 * time.Hour).Unix()
	var out []string
	for i := range n {
		k := keys.TempKey(fmt.Sprintf("%sidx%d", redistest.Prefix(t), i), false, old, uint64(i))
		do(t, c, "SET", k, "x")
		out = append(out, k)
	}
	t.Cleanup(func() { redistest.Clean(t, c, out...) })
	slices.Sort(out)
	return out
}

// TestRedisCLIFlags connects with redis-cli's flags: -h, -p, -s, -n, -a,
// --pass, and -u, which wins over -h and -p.
func TestRedisCLIFlags(t *testing.T) {
	t.Parallel()
	addr := env.Standalone.Addr
	host, port, _ := strings.Cut(addr, ":")
	user := aclUser(t, "cli-pw", "~*", "&*", "+@all")
	sock := filepath.Join(t.TempDir(), "redis.sock")
	sockSrv := redistest.OwnServer(t, "--unixsocket", sock, "--unixsocketperm", "700")
	orphans := seedOrphans(t, dbClient(t, addr, 3), 2)
	sockOrphans := seedOrphans(t, sockSrv.Client(t), 1)
	pattern := redistest.Prefix(t) + "*"
	const warnA = "keyswap: warning: other users of this machine can read a password given with -a in the process list;" +
		" set $KEYSWAP_PASSWORD or $REDISCLI_AUTH, or pass --askpass (--no-auth-warning silences this)\n"

	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		addrs   []string // the server status names
		db      int
		found   []string // the sweep candidates status finds
		stderr  string   // its start
		noCheck bool     // an error: no report
	}{
		{"-h -p -n", []string{"-h", host, "-p", port, "-n", "3"}, exitOrphans, []string{addr}, 3, orphans, "", false},
		{"-p -n", []string{"-p", port, "-n", "3"}, exitOrphans, []string{"127.0.0.1:" + port}, 3, orphans, "", false},
		{"-n over the URL's", []string{"-u", "redis://" + addr + "/5", "-n", "3"}, exitOrphans, []string{addr}, 3, orphans, "", false},
		{"the URL's database", []string{"-u", "redis://" + addr + "/3"}, exitOrphans, []string{addr}, 3, orphans, "", false},
		{"database 0", []string{"-h", host, "-p", port}, exitOK, []string{addr}, 0, nil, "", false},
		{"-s", []string{"-s", sock}, exitOrphans, []string{sock}, 0, sockOrphans, "", false},
		{"-s over -h and -p", []string{"-h", host, "-p", "1", "-s", sock}, exitOrphans, []string{sock}, 0, sockOrphans, "", false},
		{"-a and --user", []string{"-p", port, "-n", "3", "--user", user, "-a", "cli-pw"}, exitOrphans, []string{"127.0.0.1:" + port}, 3, orphans, warnA, false},
		{"--pass", []string{"-p", port, "-n", "3", "--user", user, "--pass", "cli-pw", "--no-auth-warning"}, exitOrphans, []string{"127.0.0.1:" + port}, 3, orphans, "", false},
		{"-a over the URL's", []string{"-u", "redis://" + user + ":wrong@" + addr + "/3", "-a", "cli-pw"}, exitOrphans, []string{addr}, 3, orphans, warnA, false},
		{"-a wrong", []string{"-p", port, "--user", user, "-a", "wrong", "--no-auth-warning"}, exitError, nil, 0, nil,
			"keyswap: authentication failed for user " + user + " at 127.0.0.1:" + port + ": " + wrongPass + " (the password came from -a)\n", true},
		{"-u over -h and -p", []string{"-h", host, "-p", port, "-u", "redis://127.0.0.1:1"}, exitError, nil, 0, nil,
			"keyswap: warning: -u gives the address: -h, -p and -s are ignored\nkeyswap: cannot reach Redis at 127.0.0.1:1: ", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// $REDIS_URL names a server nobody runs: only the flags may
			// lead to the test's servers.
			r := keyswapEnv(t, map[string]string{"REDIS_URL": "redis://127.0.0.1:1"}, append([]string{"status", "-json", pattern}, tc.args...)...)
			r.wantCode(t, tc.code)
			if !strings.HasPrefix(r.stderr, tc.stderr) || tc.stderr == "" && r.stderr != "" {
				t.Errorf("stderr: got %q, want %q...", r.stderr, tc.stderr)
			}
			if tc.noCheck {
				return
			}
			var j statusJSON
			if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
				t.Fatalf("%v\n%s", err, r.stdout)
			}
			if j.Server.Mode != "standalone" || !slices.Equal(j.Server.Addrs, tc.addrs) || j.Server.DB != tc.db {
				t.Errorf("server: got %+v, want standalone %q, database %d", j.Server, tc.addrs, tc.db)
			}
			var found []string
			for _, tk := range decodeStatus(t, r.stdout).TempKeys {
				if tk.SweepCandidate {
					found = append(found, tk.Key)
				}
			}
			if !slices.Equal(found, tc.found) {
				t.Errorf("sweep candidates: got %q, want %q", found, tc.found)
			}
		})
	}
}

// TestSuggestedSweepReachesTheSameServer runs status with connection flags
// and a password on the command line, then the sweep command it suggests,
// word for word as a shell splits it, with $REDIS_URL naming a server
// nobody runs: the suggestion never holds the password (it asks for it
// with --askpass, which reads it from stdin here), and lists exactly the
// orphans that status found, on the same server and database.
func TestSuggestedSweepReachesTheSameServer(t *testing.T) {
	t.Parallel()
	addr := env.Standalone.Addr
	host, port, _ := strings.Cut(addr, ":")
	user := aclUser(t, "s3cret-pw", "~*", "&*", "+@all")
	orphans := seedOrphans(t, dbClient(t, addr, 4), 2)
	pattern := redistest.Prefix(t) + "*"
	environ := map[string]string{"REDIS_URL": "redis://127.0.0.1:1"}
	for _, tc := range []struct {
		name string
		args []string
		want string // the connection flags the suggestion ends with
	}{
		{"-h -p -n -a", []string{"-h", host, "-p", port, "-n", "4", "--user", user, "-a", "s3cret-pw", "--no-auth-warning"},
			"-h " + host + " -p " + port + " -n 4 --user " + user + " --askpass"},
		{"a URL with a password", []string{"-u", "redis://" + user + ":s3cret-pw@" + addr + "/4", "--no-auth-warning"},
			"-u redis://" + user + "@" + addr + "/4 --askpass"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := keyswapEnv(t, environ, append([]string{"status", pattern}, tc.args...)...)
			r.wantCode(t, exitOrphans)
			_, cmds, ok := strings.Cut(r.stdout, "List them with the following, and add --delete to delete them:\n")
			if !ok || strings.Count(cmds, "\n") != 1 {
				t.Fatalf("want one sweep command in:\n%s", r.stdout)
			}
			cmd := strings.TrimSpace(cmds)
			if strings.Contains(cmd, "s3cret") {
				t.Errorf("the suggested command repeats the password: %s", cmd)
			}
			if !strings.HasSuffix(cmd, " "+tc.want) {
				t.Errorf("suggested %q, want it to end with %q", cmd, tc.want)
			}
			words := shellWords(t, cmd)
			if words[0] != "keyswap" || words[1] != "sweep" {
				t.Fatalf("suggested %q, want keyswap sweep ...", cmd)
			}
			r = keyswapWith(t, invocation{env: environ, stdin: strings.NewReader("s3cret-pw\n")}, append(words[1:], "-json")...)
			r.wantCode(t, exitOrphans)
			if got := decodeSweep(t, r.stdout).Keys; !slices.Equal(got, orphans) {
				t.Errorf("the suggested sweep lists %q, want %q", got, orphans)
			}
		})
	}
}

// shellWords splits a command line as bash does.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash splits the suggested command: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bash, "-c", `printf '%s\0' `+line).Output()
	if err != nil {
		t.Fatalf("bash -c %q: %v", line, err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
}

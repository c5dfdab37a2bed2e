package main

import (
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

// wrongPass is the end of Redis's reply to a login with a wrong password.
const wrongPass = "WRONGPASS invalid username-password pair or user is disabled."

// TestAuthFailure logs in with a wrong password, or none, and wants the
// failure reported as such, with where the password came from, and not as
// an unreachable server.
func TestAuthFailure(t *testing.T) {
	t.Parallel()
	addr := env.Standalone.Addr
	user := aclUser(t, "right-pw", "~*", "&*", "+@all")
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"URL", nil, []string{"-u", "redis://" + user + ":wrong@" + addr, "--no-auth-warning"},
			wrongPass + " (the password came from the -u URL)"},
		{"REDIS_URL", map[string]string{"REDIS_URL": "redis://" + user + ":wrong@" + addr}, nil,
			wrongPass + " (the password came from the $REDIS_URL URL)"},
		{"KEYSWAP_PASSWORD", map[string]string{envPassword: "wrong"}, []string{"-u", addr, "--user", user},
			wrongPass + " (the password came from $KEYSWAP_PASSWORD)"},
		{"REDISCLI_AUTH", map[string]string{envRedisCLIAuth: "wrong"}, []string{"-u", addr, "--user", user},
			wrongPass + " (the password came from $REDISCLI_AUTH)"},
		{"none", nil, []string{"-u", addr, "--user", user},
			wrongPass + " (no password was given: put it in the URL, set $KEYSWAP_PASSWORD or $REDISCLI_AUTH, or pass --askpass)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range []string{"status", "sweep"} {
				r := keyswapEnv(t, tc.env, append([]string{cmd}, tc.args...)...)
				r.wantCode(t, exitError)
				if want := "keyswap: authentication failed for user " + user + " at " + addr + ": " + tc.want + "\n"; r.stderr != want {
					t.Errorf("%s: got stderr\n%q\nwant\n%q", cmd, r.stderr, want)
				}
				if r.stdout != "" {
					t.Errorf("%s: got stdout %q, want none", cmd, r.stdout)
				}
			}
		})
	}
}

// TestAuthRequired connects without a password to a server that wants
// one for its default user: NOAUTH, reported as a failed login.
func TestAuthRequired(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	// Not --requirepass: the server would refuse the readiness probe.
	do(t, srv.Client(t), "CONFIG", "SET", "requirepass", "server-pw")
	r := keyswap(t, "status", "-u", srv.Addr)
	r.wantCode(t, exitError)
	want := "keyswap: authentication failed for user default at " + srv.Addr + ": NOAUTH "
	if !strings.HasPrefix(r.stderr, want) || !strings.HasSuffix(r.stderr, " (no password was given: put it in the URL, set $KEYSWAP_PASSWORD or $REDISCLI_AUTH, or pass --askpass)\n") {
		t.Errorf("got stderr %q, want %q... and the hint", r.stderr, want)
	}
	r = keyswapEnv(t, map[string]string{envRedisCLIAuth: "server-pw"}, "status", "-u", srv.Addr)
	r.wantCode(t, exitOK)
}

// TestPasswordPrecedence logs in with passwords from several sources at
// once, one right and the others wrong: the documented order decides which
// is used.
func TestPasswordPrecedence(t *testing.T) {
	t.Parallel()
	addr := env.Standalone.Addr
	user := aclUser(t, "right-pw", "~*", "&*", "+@all")
	pattern := redistest.Prefix(t) + "*"
	for _, tc := range []struct {
		name string
		env  map[string]string
		url  string
		want int
	}{
		{"URL over the environment", map[string]string{envPassword: "wrong", envRedisCLIAuth: "wrong"},
			"redis://" + user + ":right-pw@" + addr, exitOK},
		{"URL over the environment, wrong", map[string]string{envPassword: "right-pw", envRedisCLIAuth: "right-pw"},
			"redis://" + user + ":wrong@" + addr, exitError},
		{"KEYSWAP_PASSWORD over REDISCLI_AUTH", map[string]string{envPassword: "right-pw", envRedisCLIAuth: "wrong"},
			"redis://" + user + "@" + addr, exitOK},
		{"KEYSWAP_PASSWORD over REDISCLI_AUTH, wrong", map[string]string{envPassword: "wrong", envRedisCLIAuth: "right-pw"},
			"redis://" + user + "@" + addr, exitError},
		{"REDISCLI_AUTH alone", map[string]string{envRedisCLIAuth: "right-pw"}, "redis://" + user + "@" + addr, exitOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := keyswapEnv(t, tc.env, "status", "-u", tc.url, pattern)
			r.wantCode(t, tc.want)
		})
	}

	// --user overrides the URL's user.
	r := keyswap(t, "status", "-u", "redis://nobody:right-pw@"+addr, "--user", user, "--no-auth-warning", pattern)
	r.wantCode(t, exitOK)
}

// TestAuthWarning: a password in a URL on the command line is visible in
// the process list, and keyswap says so on stderr, unless --no-auth-warning
// or the URL came from $REDIS_URL.
func TestAuthWarning(t *testing.T) {
	t.Parallel()
	addr := env.Standalone.Addr
	user := aclUser(t, "right-pw", "~*", "&*", "+@all")
	url := "redis://" + user + ":right-pw@" + addr
	pattern := redistest.Prefix(t) + "*"

	r := keyswap(t, "status", "-redis", url, pattern)
	r.wantCode(t, exitOK)
	want := "keyswap: warning: other users of this machine can read the password of a -redis URL in the process list;" +
		" set $KEYSWAP_PASSWORD or $REDISCLI_AUTH, or pass --askpass (--no-auth-warning silences this)\n"
	if r.stderr != want {
		t.Errorf("got stderr %q, want %q", r.stderr, want)
	}
	for _, r := range []result{
		keyswap(t, "status", "-redis", url, "--no-auth-warning", pattern),
		keyswapEnv(t, map[string]string{"REDIS_URL": url}, "status", pattern),
	} {
		r.wantCode(t, exitOK)
		if r.stderr != "" {
			t.Errorf("got stderr %q, want none", r.stderr)
		}
	}
}

// TestNoPermission runs status and sweep as ACL users that lack a command
// they need: the error is Redis's NOPERM, under one "keyswap:" prefix.
func TestNoPermission(t *testing.T) {
	t.Parallel()
	d := deployments(t)[0]
	s := seedSweep(t, d)
	addr := env.Standalone.Addr
	for _, tc := range []struct {
		name  string
		rules []string
		args  []string
		url   string // "": the server's address
		want  string // the start of stderr, after "keyswap: "
		tail  string // the end of stderr
		code  int
	}{
		{"status without scan", []string{"-scan"}, []string{"status", redistest.Prefix(t) + "*"}, "", "status: NOPERM ", "'scan' command\n", exitError},
		{"sweep without scan", []string{"-scan"}, []string{"sweep", "--pattern", testSweepPattern(t)}, "", "sweep: NOPERM ", "'scan' command\n", exitError},
		{"sweep --delete without unlink", []string{"-unlink"}, []string{"sweep", "--delete", "--pattern", testSweepPattern(t)}, "",
			"sweep: NOPERM ", "'unlink' command (deleted 0 keys before the error)\n", exitError},
		{"dry run without unlink", []string{"-unlink"}, []string{"sweep", "--pattern", testSweepPattern(t)}, "", "", "", exitOrphans},
		{"connect to database 1 without select", []string{"-select"}, []string{"status"}, "redis://" + addr + "/1",
			"user %s at " + addr + " may not run a command that connecting needs: NOPERM ", "'select' command\n", exitError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := aclUser(t, "pw", append([]string{"~*", "&*", "+@all"}, tc.rules...)...)
			url := tc.url
			if url == "" {
				url = addr
			}
			r := keyswapEnv(t, map[string]string{envPassword: "pw"}, append(tc.args, "-u", url, "--user", user)...)
			r.wantCode(t, tc.code)
			want := strings.Replace(tc.want, "%s", user, 1)
			if tc.want != "" && (!strings.HasPrefix(r.stderr, "keyswap: "+want) || !strings.HasSuffix(r.stderr, tc.tail)) {
				t.Errorf("got stderr %q, want %q...%q", r.stderr, "keyswap: "+want, tc.tail)
			}
			if n := strings.Count(r.stderr, "keyswap:"); tc.want != "" && n != 1 {
				t.Errorf("stderr %q has %d \"keyswap:\" prefixes, want 1", r.stderr, n)
			}
		})
	}
	wantKeys(t, d, s.orphans, true)
}

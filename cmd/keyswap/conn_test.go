package main

import (
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

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

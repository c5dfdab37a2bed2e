package main

import (
	"flag"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
)

// TestRedisURLs checks where the address comes from: -u (over -h, -p and
// -s, with a warning), -s (over -h and -p), -h and -p, $REDIS_URL, the
// default.
func TestRedisURLs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		env      string
		want     []string
		wantFrom string
		warning  string
	}{
		{"default", nil, "", []string{defaultRedisURL}, "the default URL", ""},
		{"environment", nil, "redis://a:1, redis://b:2", []string{"redis://a:1", "redis://b:2"}, "$REDIS_URL", ""},
		{"flag wins", []string{"-u", "redis://c:3"}, "redis://a:1", []string{"redis://c:3"}, "-u", ""},
		{"-h", []string{"-h", "10.0.0.5"}, "redis://a:1", []string{"redis://10.0.0.5:6379"}, "-h and -p", ""},
		{"-p", []string{"-p", "7000"}, "", []string{"redis://127.0.0.1:7000"}, "-h and -p", ""},
		{"-h -p", []string{"-p", "7000", "-h", "::1"}, "", []string{"redis://[::1]:7000"}, "-h and -p", ""},
		{"-s", []string{"-s", "/run/redis.sock"}, "redis://a:1", []string{"unix:///run/redis.sock"}, "-s", ""},
		{"-s over -h", []string{"-h", "10.0.0.5", "-s", "/run/redis.sock"}, "", []string{"unix:///run/redis.sock"}, "-s", ""},
		{"-u over -h and -p", []string{"-h", "10.0.0.5", "-p", "7000", "-redis", "redis://c:3"}, "", []string{"redis://c:3"}, "-redis",
			"keyswap: warning: -redis gives the address: -h, -p and -s are ignored\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlagSet("test")
			f := addConnFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			c := &cli{getenv: func(string) string { return tc.env }, stderr: &stderr}
			got, from := c.redisURLs(f)
			if !slices.Equal(got, tc.want) || from != tc.wantFrom {
				t.Errorf("got %q from %s, want %q from %s", got, from, tc.want, tc.wantFrom)
			}
			if stderr.String() != tc.warning {
				t.Errorf("stderr: got %q, want %q", &stderr, tc.warning)
			}
		})
	}
}

// TestURLFlags gives URLs through -redis and its alias -u: they add up, in
// order, and the first flag used names them in messages.
func TestURLFlags(t *testing.T) {
	fs := newFlagSet("test")
	f := addConnFlags(fs)
	err := fs.Parse([]string{"-u", "redis://a:1", "-redis", " redis://b:2 ,redis://c:3,", "--u", "d:4"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"redis://a:1", "redis://b:2", "redis://c:3", "d:4"}; !slices.Equal(f.urls.urls, want) || f.urls.flag != "-u" {
		t.Errorf("got %q from %s, want %q from -u", f.urls.urls, f.urls.flag, want)
	}
	if err := fs.Parse([]string{"-redis", " , "}); err == nil || !strings.Contains(err.Error(), "no URL") {
		t.Errorf("-redis \" , \": got %v, want no URL", err)
	}
	// flag.PrintDefaults calls String on a zero value.
	if got := (urlFlag{}).String(); got != "" {
		t.Errorf("zero urlFlag: got %q, want \"\"", got)
	}
	var _ flag.Value = urlFlag{}
}

func TestParseURLs(t *testing.T) {
	opt, err := parseURLs([]string{"redis://u:pw@h1:7000/2", "h2:7001", "redis://u:pw@h3/2"})
	if err == nil {
		t.Fatalf("got %+v, want an error: h2:7001 has no password", opt.InitAddress)
	}
	if strings.Contains(err.Error(), "pw") {
		t.Errorf("error %q leaks the password", err)
	}

	opt, err = parseURLs([]string{"redis://u:pw@h1:7000/2", "redis://u:pw@h3/2"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"h1:7000", "h3:6379"}; !slices.Equal(opt.InitAddress, want) {
		t.Errorf("InitAddress: got %q, want %q", opt.InitAddress, want)
	}
	if opt.Username != "u" || opt.Password != "pw" || opt.SelectDB != 2 {
		t.Errorf("got user %q, password %q, db %d, want u, pw, 2", opt.Username, opt.Password, opt.SelectDB)
	}
	if opt.Dialer.Timeout != dialTimeout || !opt.DisableCache {
		t.Errorf("got dial timeout %v, DisableCache %v, want %v, true", opt.Dialer.Timeout, opt.DisableCache, dialTimeout)
	}

	opt, err = parseURLs([]string{"127.0.0.1:7000?dial_timeout=10s"})
	if err != nil {
		t.Fatal(err)
	}
	if opt.Dialer.Timeout != 10*time.Second || !slices.Equal(opt.InitAddress, []string{"127.0.0.1:7000"}) {
		t.Errorf("got %q with dial timeout %v, want 127.0.0.1:7000 with 10s", opt.InitAddress, opt.Dialer.Timeout)
	}

	// Sentinel: the addresses are the sentinels', the master set a parameter.
	opt, err = parseURLs([]string{"redis://s1:26379?master_set=mymaster", "redis://s2:26379?master_set=mymaster"})
	if err != nil {
		t.Fatal(err)
	}
	if opt.Sentinel.MasterSet != "mymaster" || !slices.Equal(opt.InitAddress, []string{"s1:26379", "s2:26379"}) {
		t.Errorf("got master set %q at %q, want mymaster at s1, s2", opt.Sentinel.MasterSet, opt.InitAddress)
	}

	// A unix socket, as a URL or as a path.
	for _, u := range []string{"unix:///run/redis.sock?db=3", "/run/redis.sock?db=3"} {
		opt, err = parseURLs([]string{u})
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if opt.DialCtxFn == nil || !slices.Equal(opt.InitAddress, []string{"/run/redis.sock"}) || opt.SelectDB != 3 {
			t.Errorf("%s: got %q, db %d, dialer set %v, want a unix dialer to /run/redis.sock, db 3", u, opt.InitAddress, opt.SelectDB, opt.DialCtxFn != nil)
		}
	}

	for _, bad := range [][]string{
		{"redis://u:secret@h:1/x/y"},
		{"redis://u:secret@h:notaport"},
		{"http://u:secret@h"},
		{"redis://u:secret@a:1", "rediss://u:secret@b:2"},
		{"redis://u:secret@a:1", "unix://u:secret@/run/redis.sock"},
		{"redis://u:secret@a:1?master_set=m", "redis://u:secret@b:2"},
	} {
		_, err := parseURLs(bad)
		if err == nil {
			t.Errorf("parseURLs(%q): got nil, want an error", bad)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("parseURLs(%q): error %q leaks the password", bad, err)
		}
	}
}

// TestUnixSocket connects through a unix socket, given as a unix:// URL or
// as a path, and fails clearly on a socket that does not exist.
func TestUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "redis.sock")
	srv := redistest.OwnServer(t, "--unixsocket", sock, "--unixsocketperm", "700")
	c := srv.Client(t)
	p := redistest.Prefix(t)
	do(t, c, "SET", p+"x:rebuild-lock", "0123456789abcdef", "EX", "600")

	for _, url := range []string{"unix://" + sock, sock, "unix://" + sock + "?db=0"} {
		r := keyswap(t, "status", "-json", "-u", url, p+"*")
		r.wantCode(t, exitOK)
		rep := decodeStatus(t, r.stdout)
		if len(rep.Locks) != 1 || rep.Locks[0].Key != p+"x:rebuild-lock" {
			t.Errorf("%s: got locks %+v, want %sx:rebuild-lock", url, rep.Locks, p)
		}
	}

	missing := filepath.Join(t.TempDir(), "none.sock")
	r := keyswap(t, "status", "-u", missing)
	r.wantCode(t, exitError)
	if want := "keyswap: cannot reach Redis at " + missing + ": dial unix " + missing + ": connect: no such file or directory\n"; r.stderr != want {
		t.Errorf("got stderr %q, want %q", r.stderr, want)
	}
}

package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRedisURLs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		flag     redisFlag
		env      string
		want     []string
		wantFrom string
	}{
		{"default", nil, "", []string{defaultRedisURL}, "the default URL"},
		{"environment", nil, "redis://a:1, redis://b:2", []string{"redis://a:1", "redis://b:2"}, "$REDIS_URL"},
		{"flag wins", redisFlag{"redis://c:3"}, "redis://a:1", []string{"redis://c:3"}, "-redis"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &cli{getenv: func(string) string { return tc.env }}
			got, from := c.redisURLs(tc.flag)
			if !slices.Equal(got, tc.want) || from != tc.wantFrom {
				t.Errorf("got %q from %s, want %q from %s", got, from, tc.want, tc.wantFrom)
			}
		})
	}
}

func TestRedisFlag(t *testing.T) {
	var r redisFlag
	for _, v := range []string{"redis://a:1", " redis://b:2 ,redis://c:3,"} {
		if err := r.Set(v); err != nil {
			t.Fatalf("Set(%q): %v", v, err)
		}
	}
	if want := []string{"redis://a:1", "redis://b:2", "redis://c:3"}; !slices.Equal(r, want) {
		t.Errorf("got %q, want %q", r, want)
	}
	if err := r.Set(" , "); err == nil {
		t.Errorf("Set(\" , \"): got nil, want an error")
	}
}

func TestClientOption(t *testing.T) {
	opt, err := clientOption([]string{"redis://u:pw@h1:7000/2", "h2:7001", "redis://u:pw@h3/2"})
	if err == nil {
		t.Fatalf("got %+v, want an error: h2:7001 has no password", opt.InitAddress)
	}
	if strings.Contains(err.Error(), "pw") {
		t.Errorf("error %q leaks the password", err)
	}

	opt, err = clientOption([]string{"redis://u:pw@h1:7000/2", "redis://u:pw@h3/2"})
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

	opt, err = clientOption([]string{"127.0.0.1:7000?dial_timeout=10s"})
	if err != nil {
		t.Fatal(err)
	}
	if opt.Dialer.Timeout != 10*time.Second || !slices.Equal(opt.InitAddress, []string{"127.0.0.1:7000"}) {
		t.Errorf("got %q with dial timeout %v, want 127.0.0.1:7000 with 10s", opt.InitAddress, opt.Dialer.Timeout)
	}

	for _, bad := range []string{"redis://u:secret@h:1/x/y", "redis://u:secret@h:notaport", "http://u:secret@h"} {
		_, err := clientOption([]string{bad})
		if err == nil {
			t.Errorf("clientOption(%q): got nil, want an error", bad)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("clientOption(%q): error %q leaks the password", bad, err)
		}
	}
}

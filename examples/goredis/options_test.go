package main

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// optionSummary is what ClientOption and ClusterClientOption carry over,
// comparable with ==.
type optionSummary struct {
	Addrs               string
	User, Password      string
	DB                  int
	TLS                 bool
	ServerName          string
	DialTimeout         time.Duration
	WriteTimeout        time.Duration
	ClientName          string
	RESP2, Single, Dial bool // Dial: a DialCtxFn of its own (the unix socket's)
}

func summarize(o rueidis.ClientOption) optionSummary {
	s := optionSummary{
		User: o.Username, Password: o.Password, DB: o.SelectDB, TLS: o.TLSConfig != nil,
		DialTimeout: o.Dialer.Timeout, WriteTimeout: o.ConnWriteTimeout, ClientName: o.ClientName,
		RESP2: o.AlwaysRESP2, Single: o.ForceSingleClient, Dial: o.DialCtxFn != nil,
	}
	for i, a := range o.InitAddress {
		if i > 0 {
			s.Addrs += ","
		}
		s.Addrs += a
	}
	if o.TLSConfig != nil {
		s.ServerName = o.TLSConfig.ServerName
	}
	return s
}

func TestClientOption(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want optionSummary
	}{
		{"redis://localhost:6379", optionSummary{Addrs: "localhost:6379", Single: true}},
		{"redis://10.0.0.5", optionSummary{Addrs: "10.0.0.5:6379", Single: true}},
		{"redis://:s3cret@10.0.0.5:6380/2", optionSummary{Addrs: "10.0.0.5:6380", Password: "s3cret", DB: 2, Single: true}},
		{"redis://ops:s3cret@10.0.0.5/3", optionSummary{Addrs: "10.0.0.5:6379", User: "ops", Password: "s3cret", DB: 3, Single: true}},
		{"redis://ops:p%40ss@[::1]:7000/0?db=5", optionSummary{Addrs: "[::1]:7000", User: "ops", Password: "p@ss", DB: 5, Single: true}},
		{"redis://host?client_name=indexer&dial_timeout=2&write_timeout=750ms", optionSummary{
			Addrs: "host:6379", ClientName: "indexer", DialTimeout: 2 * time.Second, WriteTimeout: 750 * time.Millisecond, Single: true}},
		{"redis://host?protocol=2", optionSummary{Addrs: "host:6379", RESP2: true, Single: true}},
		{"rediss://ops:s3cret@redis.example.com:6390/1", optionSummary{
			Addrs: "redis.example.com:6390", User: "ops", Password: "s3cret", DB: 1, TLS: true, ServerName: "redis.example.com", Single: true}},
		{"unix:///run/redis.sock", optionSummary{Addrs: "/run/redis.sock", Single: true, Dial: true}},
		{"unix://ops:s3cret@/run/redis.sock?db=4", optionSummary{Addrs: "/run/redis.sock", User: "ops", Password: "s3cret", DB: 4, Single: true, Dial: true}},
	} {
		t.Run(tc.url, func(t *testing.T) {
			o, err := redis.ParseURL(tc.url)
			if err != nil {
				t.Fatalf("redis.ParseURL: %v", err)
			}
			opt := ClientOption(o)
			if got := summarize(opt); got != tc.want {
				t.Errorf("ClientOption:\ngot  %+v\nwant %+v", got, tc.want)
			}
			if !opt.DisableCache {
				t.Error("DisableCache: got false, want true (keyswap never reads through the cache)")
			}
			if o.TLSConfig != nil && opt.TLSConfig == o.TLSConfig {
				t.Error("TLSConfig: got go-redis's own, want a clone")
			}
			if o.TLSConfig != nil && opt.TLSConfig.MinVersion != tls.VersionTLS12 {
				t.Errorf("TLSConfig.MinVersion: got %x, want go-redis's TLS 1.2", opt.TLSConfig.MinVersion)
			}
		})
	}
}

func TestClusterClientOption(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want optionSummary
	}{
		{"redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002", optionSummary{Addrs: "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"}},
		{"redis://ops:s3cret@10.0.0.5:7000?addr=10.0.0.6:7000&client_name=indexer&dial_timeout=1s", optionSummary{
			Addrs: "10.0.0.5:7000,10.0.0.6:7000", User: "ops", Password: "s3cret", ClientName: "indexer", DialTimeout: time.Second}},
		{"rediss://ops:s3cret@redis.example.com:7000?protocol=2", optionSummary{
			Addrs: "redis.example.com:7000", User: "ops", Password: "s3cret", TLS: true, ServerName: "redis.example.com", RESP2: true}},
	} {
		t.Run(tc.url, func(t *testing.T) {
			o, err := redis.ParseClusterURL(tc.url)
			if err != nil {
				t.Fatalf("redis.ParseClusterURL: %v", err)
			}
			if got := summarize(ClusterClientOption(o)); got != tc.want {
				t.Errorf("ClusterClientOption:\ngot  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestClientOptionUnixDial checks that the unix socket's DialCtxFn dials
// the socket, not TCP.
func TestClientOptionUnixDial(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	o, err := redis.ParseURL("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	opt := ClientOption(o)
	conn, err := opt.DialCtxFn(context.Background(), opt.InitAddress[0], &net.Dialer{Timeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatalf("DialCtxFn: %v", err)
	}
	defer conn.Close()
	if got := conn.RemoteAddr().Network(); got != "unix" {
		t.Errorf("dialled network: got %q, want unix", got)
	}
}

func TestClientOptionCredentialsProvider(t *testing.T) {
	errVault := errors.New("the vault is sealed")
	for _, tc := range []struct {
		name     string
		o        redis.Options
		user, pw string
		err      error
	}{
		{"CredentialsProvider", redis.Options{CredentialsProvider: func() (string, string) { return "ops", "rotated" }}, "ops", "rotated", nil},
		{"CredentialsProviderContext wins", redis.Options{
			CredentialsProvider:        func() (string, string) { return "old", "old" },
			CredentialsProviderContext: func(context.Context) (string, string, error) { return "ops", "newer", nil },
		}, "ops", "newer", nil},
		{"its error", redis.Options{CredentialsProviderContext: func(context.Context) (string, string, error) { return "", "", errVault }}, "", "", errVault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt := ClientOption(&tc.o)
			if opt.AuthCredentialsFn == nil {
				t.Fatal("AuthCredentialsFn: got nil, want the provider")
			}
			c, err := opt.AuthCredentialsFn(rueidis.AuthCredentialsContext{})
			if c.Username != tc.user || c.Password != tc.pw || !errors.Is(err, tc.err) {
				t.Errorf("AuthCredentialsFn: got %q, %q, %v, want %q, %q, %v", c.Username, c.Password, err, tc.user, tc.pw, tc.err)
			}
		})
	}
	if opt := ClientOption(&redis.Options{Username: "ops", Password: "static"}); opt.AuthCredentialsFn != nil {
		t.Error("AuthCredentialsFn without a provider: got one, want nil (Username and Password are enough)")
	}
	if got := summarize(ClusterClientOption(&redis.ClusterOptions{Addrs: []string{"a:1"}})); got.Addrs != "a:1" || got.Single {
		t.Errorf("ClusterClientOption of bare options: got %+v, want a:1, not single", got)
	}
}

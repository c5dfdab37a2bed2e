package goredis

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// summary is what the conversions carry over, comparable with ==.
type summary struct {
	Addrs          string
	User, Password string
	DB             int
	TLS            bool
	ServerName     string
	DialTimeout    time.Duration
	ClientName     string
	RESP2, NoCache bool
	Single         bool
	Dial           bool // a DialCtxFn of its own (a unix socket's, a custom Dialer's)
	NoRetry        bool
	NoSetInfo      bool
	// The sentinels' settings.
	MasterSet, SentinelUser, SentinelPassword, SentinelClientName string
	SentinelTLS                                                   bool
	SentinelDialTimeout                                           time.Duration
}

func summarize(o rueidis.ClientOption) summary {
	s := summary{
		Addrs: strings.Join(o.InitAddress, ","), User: o.Username, Password: o.Password, DB: o.SelectDB,
		TLS: o.TLSConfig != nil, DialTimeout: o.Dialer.Timeout, ClientName: o.ClientName,
		RESP2: o.AlwaysRESP2, NoCache: o.DisableCache, Single: o.ForceSingleClient, Dial: o.DialCtxFn != nil,
		NoRetry: o.DisableRetry, NoSetInfo: len(o.ClientSetInfo) == len(rueidis.DisableClientSetInfo) && o.ClientSetInfo != nil,
		MasterSet: o.Sentinel.MasterSet, SentinelUser: o.Sentinel.Username, SentinelPassword: o.Sentinel.Password,
		SentinelClientName: o.Sentinel.ClientName, SentinelTLS: o.Sentinel.TLSConfig != nil,
		SentinelDialTimeout: o.Sentinel.Dialer.Timeout,
	}
	if o.TLSConfig != nil {
		s.ServerName = o.TLSConfig.ServerName
	}
	return s
}

func TestClientOption(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want summary
	}{
		{"redis://localhost:6379", summary{Addrs: "localhost:6379", Single: true}},
		{"redis://10.0.0.5", summary{Addrs: "10.0.0.5:6379", Single: true}},
		{"redis://:s3cret@10.0.0.5:6380/2", summary{Addrs: "10.0.0.5:6380", Password: "s3cret", DB: 2, Single: true}},
		{"redis://ops:s3cret@10.0.0.5/3", summary{Addrs: "10.0.0.5:6379", User: "ops", Password: "s3cret", DB: 3, Single: true}},
		{"redis://ops:p%40ss@[::1]:7000/0?db=5", summary{Addrs: "[::1]:7000", User: "ops", Password: "p@ss", DB: 5, Single: true}},
		{"redis://host?client_name=indexer&dial_timeout=2", summary{
			Addrs: "host:6379", ClientName: "indexer", DialTimeout: 2 * time.Second, Single: true}},
		// Neither timeout of go-redis's connections is rueidis's ConnWriteTimeout.
		{"redis://host?read_timeout=750ms&write_timeout=750ms", summary{Addrs: "host:6379", Single: true}},
		{"redis://host?protocol=2", summary{Addrs: "host:6379", RESP2: true, NoCache: true, Single: true}},
		{"redis://host?protocol=3", summary{Addrs: "host:6379", Single: true}},
		{"redis://host?max_retries=-1", summary{Addrs: "host:6379", Single: true, NoRetry: true}},
		{"redis://host?max_retries=5", summary{Addrs: "host:6379", Single: true}},
		{"rediss://ops:s3cret@redis.example.com:6390/1", summary{
			Addrs: "redis.example.com:6390", User: "ops", Password: "s3cret", DB: 1, TLS: true, ServerName: "redis.example.com", Single: true}},
		{"unix:///run/redis.sock", summary{Addrs: "/run/redis.sock", Single: true, Dial: true}},
		{"unix://ops:s3cret@/run/redis.sock?db=4", summary{Addrs: "/run/redis.sock", User: "ops", Password: "s3cret", DB: 4, Single: true, Dial: true}},
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
			if o.TLSConfig != nil && opt.TLSConfig == o.TLSConfig {
				t.Error("TLSConfig: got go-redis's own, want a clone")
			}
			if o.TLSConfig != nil && opt.TLSConfig.MinVersion != tls.VersionTLS12 {
				t.Errorf("TLSConfig.MinVersion: got %x, want go-redis's TLS 1.2", opt.TLSConfig.MinVersion)
			}
		})
	}
}

// TestClientOptionDefaults checks the defaults redis.NewClient fills in
// for bare options: the address, and a path's network.
func TestClientOptionDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    redis.Options
		want summary
	}{
		{"no address", redis.Options{}, summary{Addrs: "localhost:6379", Single: true}},
		{"a path", redis.Options{Addr: "/run/redis.sock"}, summary{Addrs: "/run/redis.sock", Single: true, Dial: true}},
		{"tcp4", redis.Options{Network: "tcp4", Addr: "10.0.0.5:6379"}, summary{Addrs: "10.0.0.5:6379", Single: true, Dial: true}},
		{"DisableIdentity", redis.Options{DisableIdentity: true}, summary{Addrs: "localhost:6379", Single: true, NoSetInfo: true}},
		//lint:ignore SA1019 go-redis still honours the misspelt field
		{"DisableIndentity", redis.Options{DisableIndentity: true}, summary{Addrs: "localhost:6379", Single: true, NoSetInfo: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := summarize(ClientOption(&tc.o)); got != tc.want {
				t.Errorf("ClientOption:\ngot  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestClusterClientOption(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want summary
	}{
		{"redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002", summary{Addrs: "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"}},
		{"redis://ops:s3cret@10.0.0.5:7000?addr=10.0.0.6:7000&client_name=indexer&dial_timeout=1s", summary{
			Addrs: "10.0.0.5:7000,10.0.0.6:7000", User: "ops", Password: "s3cret", ClientName: "indexer", DialTimeout: time.Second}},
		{"rediss://ops:s3cret@redis.example.com:7000?protocol=2", summary{
			Addrs: "redis.example.com:7000", User: "ops", Password: "s3cret", TLS: true, ServerName: "redis.example.com", RESP2: true, NoCache: true}},
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
	if got := summarize(ClusterClientOption(&redis.ClusterOptions{})); got.Addrs != "127.0.0.1:6379" || got.Single {
		t.Errorf("ClusterClientOption of bare options: got %+v, want go-redis's default seed 127.0.0.1:6379, not single", got)
	}
}

func TestFailoverClientOption(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want summary
	}{
		// The URL's user and password are the sentinels'; the master's are
		// parameters.
		{"redis://:sentinel-pw@10.0.0.5:26379/2?master_name=mymaster&addr=10.0.0.6:26379&password=master-pw&client_name=indexer", summary{
			Addrs: "10.0.0.5:26379,10.0.0.6:26379", Password: "master-pw", DB: 2, ClientName: "indexer",
			MasterSet: "mymaster", SentinelPassword: "sentinel-pw", SentinelClientName: "indexer"}},
		{"redis://watcher:sentinel-pw@10.0.0.5:26379?master_name=mymaster&username=ops&password=master-pw&dial_timeout=2s", summary{
			Addrs: "10.0.0.5:26379", User: "ops", Password: "master-pw", DialTimeout: 2 * time.Second,
			MasterSet: "mymaster", SentinelUser: "watcher", SentinelPassword: "sentinel-pw", SentinelDialTimeout: 2 * time.Second}},
		{"rediss://10.0.0.5:26379?master_name=mymaster&protocol=2", summary{
			Addrs: "10.0.0.5:26379", TLS: true, ServerName: "10.0.0.5", RESP2: true, NoCache: true,
			MasterSet: "mymaster", SentinelTLS: true}},
		// No master: a DialCtxFn that refuses (TestFailoverWithoutMasterName).
		{"redis://10.0.0.5:26379", summary{Addrs: "10.0.0.5:26379", Dial: true}},
	} {
		t.Run(tc.url, func(t *testing.T) {
			o, err := redis.ParseFailoverURL(tc.url)
			if err != nil {
				t.Fatalf("redis.ParseFailoverURL: %v", err)
			}
			opt := FailoverClientOption(o)
			if got := summarize(opt); got != tc.want {
				t.Errorf("FailoverClientOption:\ngot  %+v\nwant %+v", got, tc.want)
			}
			if o.TLSConfig != nil && (opt.Sentinel.TLSConfig == o.TLSConfig || opt.Sentinel.TLSConfig == opt.TLSConfig) {
				t.Error("Sentinel.TLSConfig: got a shared one, want a clone of its own")
			}
		})
	}
}

func TestUniversalClientOption(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    redis.UniversalOptions
		want summary
	}{
		{"one address", redis.UniversalOptions{Addrs: []string{"10.0.0.5:6379"}, DB: 3},
			summary{Addrs: "10.0.0.5:6379", DB: 3, Single: true}},
		{"no address", redis.UniversalOptions{}, summary{Addrs: "127.0.0.1:6379", Single: true}},
		{"several addresses", redis.UniversalOptions{Addrs: []string{"10.0.0.5:7000", "10.0.0.6:7000"}, Password: "pw"},
			summary{Addrs: "10.0.0.5:7000,10.0.0.6:7000", Password: "pw"}},
		{"IsClusterMode", redis.UniversalOptions{Addrs: []string{"10.0.0.5:7000"}, IsClusterMode: true},
			summary{Addrs: "10.0.0.5:7000"}},
		{"MasterName", redis.UniversalOptions{Addrs: []string{"10.0.0.5:26379"}, MasterName: "mymaster", DB: 1, SentinelPassword: "spw"},
			summary{Addrs: "10.0.0.5:26379", DB: 1, MasterSet: "mymaster", SentinelPassword: "spw"}},
		// A failover cluster client reads from replicas; keyswap writes, to the master.
		{"MasterName, RouteRandomly", redis.UniversalOptions{Addrs: []string{"10.0.0.5:26379"}, MasterName: "mymaster", RouteRandomly: true},
			summary{Addrs: "10.0.0.5:26379", MasterSet: "mymaster"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := summarize(UniversalClientOption(&tc.o)); got != tc.want {
				t.Errorf("UniversalClientOption:\ngot  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestNilOptionsPanic checks that each function panics on nil options, as
// go-redis's constructors do, with a message that names it.
func TestNilOptionsPanic(t *testing.T) {
	for name, f := range map[string]func(){
		"ClientOption":          func() { ClientOption(nil) },
		"ClusterClientOption":   func() { ClusterClientOption(nil) },
		"FailoverClientOption":  func() { FailoverClientOption(nil) },
		"UniversalClientOption": func() { UniversalClientOption(nil) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				want := "keyswap: goredis." + name + ": nil options"
				if got := recover(); got != want {
					t.Errorf("panic: got %v, want %q", got, want)
				}
			}()
			f()
		})
	}
}

// TestUnixDial checks that a unix socket's DialCtxFn dials the socket, not
// TCP.
func TestUnixDial(t *testing.T) {
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
	conn, err := opt.DialCtxFn(t.Context(), opt.InitAddress[0], &net.Dialer{Timeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatalf("DialCtxFn: %v", err)
	}
	defer conn.Close()
	if got := conn.RemoteAddr().Network(); got != "unix" {
		t.Errorf("dialled network: got %q, want unix", got)
	}
}

// TestCustomDialer checks that go-redis's Dialer is what dials, with the
// network and the address it would get from go-redis, for every kind of
// client.
func TestCustomDialer(t *testing.T) {
	errDialed := errors.New("dialled")
	var network, addr string
	dial := func(_ context.Context, n, a string) (net.Conn, error) {
		network, addr = n, a
		return nil, errDialed
	}
	for _, tc := range []struct {
		name        string
		opt         rueidis.ClientOption
		wantNetwork string
	}{
		{"Options", ClientOption(&redis.Options{Addr: "10.0.0.5:6379", Dialer: dial}), "tcp"},
		{"Options, unix", ClientOption(&redis.Options{Network: "unix", Addr: "/run/redis.sock", Dialer: dial}), "unix"},
		{"ClusterOptions", ClusterClientOption(&redis.ClusterOptions{Addrs: []string{"10.0.0.5:7000"}, Dialer: dial}), "tcp"},
		{"FailoverOptions", FailoverClientOption(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"10.0.0.5:26379"}, Dialer: dial}), "tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			network, addr = "", ""
			if tc.opt.DialCtxFn == nil {
				t.Fatal("DialCtxFn: got nil, want go-redis's Dialer")
			}
			_, err := tc.opt.DialCtxFn(t.Context(), tc.opt.InitAddress[0], &net.Dialer{}, nil)
			if !errors.Is(err, errDialed) || network != tc.wantNetwork || addr != tc.opt.InitAddress[0] {
				t.Errorf("DialCtxFn: got %v, dialled %q %q, want %v, %q %q", err, network, addr, errDialed, tc.wantNetwork, tc.opt.InitAddress[0])
			}
		})
	}
}

func TestCredentialsProvider(t *testing.T) {
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
}

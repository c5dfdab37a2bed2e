package goredis

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// env holds the package's redis-server processes: a standalone server and a
// 3-master cluster. No test uses a Redis it did not start.
var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// user is the record the tests rebuild indexes of.
type user struct{ ID, Email, Country string }

// users returns 60 users in three countries.
func users() []user {
	out := make([]user, 60)
	for i := range out {
		out[i] = user{ID: fmt.Sprintf("u%02d", i), Email: fmt.Sprintf("user%02d@example.com", i), Country: []string{"de", "fr", "nl"}[i%3]}
	}
	return out
}

// connect returns a client made with opt, closed when t ends.
func connect(t *testing.T, opt rueidis.ClientOption) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("rueidis.NewClient: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// rebuildThrough rebuilds a hash and a family of sets under prefix through
// client, then checks them exactly through check, a client of the same
// database of its own, and that nothing of the run is left.
func rebuildThrough(t *testing.T, client, check rueidis.Client, prefix string) {
	t.Helper()
	emails := builders.Hash(prefix+"users:by-email", func(u user) (string, string, bool) { return u.Email, u.ID, true })
	countries := builders.SetIndex(prefix+"users:by-country", func(u user) (string, string, bool) { return u.Country, u.ID, true })
	r, err := rebuild.New(client, rebuild.Options{}, emails, countries)
	if err != nil {
		t.Fatalf("rebuild.New: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stats, err := r.Run(ctx, sources.Slice(users()))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if stats.Items != 60 {
		t.Errorf("Stats.Items: got %d, want 60", stats.Items)
	}
	wantEmails, wantCountries := map[string]string{}, map[string][]string{}
	for _, u := range users() {
		wantEmails[u.Email] = u.ID
		wantCountries[u.Country] = append(wantCountries[u.Country], u.ID)
	}
	redistest.WantHash(t, check, prefix+"users:by-email", wantEmails)
	for cc, want := range wantCountries {
		if got := redistest.SMembers(t, check, prefix+"users:by-country:"+cc); !slices.Equal(got, want) {
			t.Errorf("SMEMBERS %susers:by-country:%s: got %v, want %v", prefix, cc, got, want)
		}
	}
	want := []string{prefix + "users:by-country:de", prefix + "users:by-country:fr", prefix + "users:by-country:nl", prefix + "users:by-email"}
	if got := redistest.LiveKeys(t, check, prefix); !slices.Equal(got, want) {
		t.Errorf("keys under %s: got %q, want %q", prefix, got, want)
	}
	redistest.WantClean(t, check, prefix)
}

// clientInfo returns the fields of CLIENT INFO for the connection of c that
// answers it.
func clientInfo(t *testing.T, c rueidis.Client) map[string]string {
	t.Helper()
	s, err := c.Do(t.Context(), c.B().ClientInfo().Build()).ToString()
	if err != nil {
		t.Fatalf("CLIENT INFO: %v", err)
	}
	info := map[string]string{}
	for f := range strings.FieldsSeq(s) {
		k, v, _ := strings.Cut(f, "=")
		info[k] = v
	}
	return info
}

// dbClient returns a client of srv's database db as its default user, with
// password pw ("" for none).
func dbClient(t *testing.T, addr string, db int, pw string) rueidis.Client {
	t.Helper()
	return connect(t, rueidis.ClientOption{InitAddress: []string{addr}, SelectDB: db, Password: pw, DisableCache: true, ForceSingleClient: true})
}

// TestStandalone rebuilds through clients made from go-redis URLs of a
// standalone server: as an ACL user, with a password, in a database other
// than 0, with a client name, over RESP3 and RESP2. The connection is the
// one the URL describes (CLIENT INFO), and the indexes land in its
// database.
func TestStandalone(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	admin := srv.Client(t)
	redistest.Cmd(t, admin, "ACL", "SETUSER", "indexer", "on", ">s3cret", "~*", "&*", "+@all")
	redistest.Cmd(t, admin, "CONFIG", "SET", "requirepass", "not-this-one") // the default user cannot get in
	for _, tc := range []struct {
		name, query string
		resp        string
		tracking    bool
	}{
		{"RESP3", "", "3", true},
		{"RESP2", "&protocol=2", "2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := redis.ParseURL("redis://indexer:s3cret@" + srv.Addr + "/3?client_name=ks-indexer" + tc.query)
			if err != nil {
				t.Fatal(err)
			}
			c := connect(t, ClientOption(o))
			if c.Mode() != rueidis.ClientModeStandalone {
				t.Errorf("Mode: got %v, want standalone", c.Mode())
			}
			info := clientInfo(t, c)
			if info["user"] != "indexer" || info["db"] != "3" || info["name"] != "ks-indexer" || info["resp"] != tc.resp {
				t.Errorf("CLIENT INFO: got user=%s db=%s name=%s resp=%s, want indexer, 3, ks-indexer, %s",
					info["user"], info["db"], info["name"], info["resp"], tc.resp)
			}
			// Flag t: CLIENT TRACKING is on, for rueidis's client-side cache.
			if got := strings.Contains(info["flags"], "t"); got != tc.tracking {
				t.Errorf("CLIENT INFO flags=%s: tracking %v, want %v", info["flags"], got, tc.tracking)
			}
			rebuildThrough(t, c, dbClient(t, srv.Addr, 3, "not-this-one"), redistest.Prefix(t))
		})
	}
}

// TestNoTrackingRight checks what the package documentation says of an
// ACL user that may not run CLIENT TRACKING: rueidis.NewClient fails with
// rueidis.ErrNoCache, and connects once DisableCache is set.
func TestNoTrackingRight(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	redistest.Cmd(t, srv.Client(t), "ACL", "SETUSER", "untracked", "on", ">s3cret", "~*", "&*", "+@all", "-client|tracking")
	o, err := redis.ParseURL("redis://untracked:s3cret@" + srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	opt := ClientOption(o)
	if c, err := rueidis.NewClient(opt); !errors.Is(err, rueidis.ErrNoCache) {
		if err == nil {
			c.Close()
		}
		t.Fatalf("NewClient: got %v, want %v", err, rueidis.ErrNoCache)
	}
	opt.DisableCache = true
	rebuildThrough(t, connect(t, opt), srv.Client(t), redistest.Prefix(t))
}

// TestClientSideCache checks that the result keeps rueidis's client-side
// cache: a second DoCache is served from it, and a write by another client
// invalidates it.
func TestClientSideCache(t *testing.T) {
	t.Parallel()
	o, err := redis.ParseURL("redis://" + env.Standalone.Addr)
	if err != nil {
		t.Fatal(err)
	}
	c := connect(t, ClientOption(o))
	other := env.Standalone.Client(t)
	key := redistest.Prefix(t) + "pointer"
	redistest.Cmd(t, other, "SET", key, "gen-1")
	t.Cleanup(func() { redistest.Clean(t, other, key) })
	ctx := t.Context()
	get := func() rueidis.RedisResult { return c.DoCache(ctx, c.B().Get().Key(key).Cache(), time.Minute) }
	if r := get(); r.IsCacheHit() {
		t.Error("first DoCache: got a cache hit, want a miss")
	}
	if r := get(); !r.IsCacheHit() {
		t.Fatal("second DoCache: got a miss, want a cache hit (is the cache disabled?)")
	}
	redistest.Cmd(t, other, "SET", key, "gen-2")
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := get().ToString()
		if err == nil && v == "gen-2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DoCache after another client's SET: got %q, %v for 10s, want gen-2 (no invalidation?)", v, err)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestUnixSocket rebuilds through a unix socket given by a unix:// URL.
func TestUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "redis.sock")
	srv := redistest.OwnServer(t, "--unixsocket", sock, "--unixsocketperm", "700")
	o, err := redis.ParseURL("unix://" + sock + "?db=2")
	if err != nil {
		t.Fatal(err)
	}
	c := connect(t, ClientOption(o))
	if info := clientInfo(t, c); info["db"] != "2" || !strings.HasPrefix(info["laddr"], sock) {
		t.Errorf("CLIENT INFO: got db=%s laddr=%s, want 2 and the socket %s", info["db"], info["laddr"], sock)
	}
	rebuildThrough(t, c, dbClient(t, srv.Addr, 2, ""), redistest.Prefix(t))
}

// TestCluster rebuilds through a cluster client made from a go-redis
// cluster URL, and from universal options with the cluster's addresses.
func TestCluster(t *testing.T) {
	t.Parallel()
	a := env.Cluster.Addrs
	fromURL, err := redis.ParseClusterURL("redis://" + a[0] + "?addr=" + a[1] + "&addr=" + a[2])
	if err != nil {
		t.Fatal(err)
	}
	for name, opt := range map[string]rueidis.ClientOption{
		"ClusterClientOption":   ClusterClientOption(fromURL),
		"UniversalClientOption": UniversalClientOption(&redis.UniversalOptions{Addrs: a}),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := connect(t, opt)
			if c.Mode() != rueidis.ClientModeCluster {
				t.Fatalf("Mode: got %v, want cluster", c.Mode())
			}
			rebuildThrough(t, c, env.Cluster.Client(t), "{"+redistest.Prefix(t)+"}")
		})
	}
}

// TestSentinel rebuilds through the master that a Redis Sentinel
// monitors, with the sentinel's password and the master's apart, as go-redis
// keeps them, and from universal options with a master name.
func TestSentinel(t *testing.T) {
	t.Parallel()
	master := passwordServer(t, "master-pw")
	sentinel := redistest.OwnSentinel(t, "ks-master", master.Addr, "sentinel auth-pass ks-master master-pw")
	redistest.Cmd(t, sentinel.Client(t), "ACL", "SETUSER", "default", "resetpass", ">sentinel-pw")
	check := dbClient(t, master.Addr, 2, "master-pw")

	fromURL, err := redis.ParseFailoverURL("redis://:sentinel-pw@" + sentinel.Addr + "/2?master_name=ks-master&password=master-pw")
	if err != nil {
		t.Fatal(err)
	}
	for name, opt := range map[string]rueidis.ClientOption{
		"FailoverClientOption": FailoverClientOption(fromURL),
		"UniversalClientOption": UniversalClientOption(&redis.UniversalOptions{
			Addrs: []string{sentinel.Addr}, MasterName: "ks-master", SentinelPassword: "sentinel-pw", Password: "master-pw", DB: 2}),
	} {
		t.Run(name, func(t *testing.T) {
			c := connect(t, opt)
			if c.Mode() != rueidis.ClientModeSentinel {
				t.Fatalf("Mode: got %v, want sentinel", c.Mode())
			}
			if info := clientInfo(t, c); info["db"] != "2" || !strings.HasSuffix(info["laddr"], fmt.Sprint(":", master.Port)) {
				t.Errorf("CLIENT INFO: got db=%s laddr=%s, want 2 and the master's port %d", info["db"], info["laddr"], master.Port)
			}
			rebuildThrough(t, c, check, redistest.Prefix(t))
		})
	}

	// The sentinels' password is the one they check: a wrong one fails.
	wrong := *fromURL
	wrong.SentinelPassword = "wrong"
	if c, err := rueidis.NewClient(FailoverClientOption(&wrong)); err == nil {
		c.Close()
		t.Error("NewClient with a wrong sentinel password: got a client, want an error")
	}
}

// passwordServer starts a redis-server of the test's own whose default
// user's password is pw (set once it answers PING without one).
func passwordServer(t *testing.T, pw string) *redistest.Server {
	t.Helper()
	srv := redistest.OwnServer(t)
	redistest.Cmd(t, srv.Client(t), "CONFIG", "SET", "requirepass", pw)
	return srv
}

// TestSentinelCredentialsProvider connects through a sentinel without a
// password to a master whose password a credentials provider gives:
// rueidis asks the provider for the sentinels' login too, which such a
// sentinel accepts for its default user.
func TestSentinelCredentialsProvider(t *testing.T) {
	t.Parallel()
	master := passwordServer(t, "master-pw")
	sentinel := redistest.OwnSentinel(t, "ks-master", master.Addr, "sentinel auth-pass ks-master master-pw")
	c := connect(t, FailoverClientOption(&redis.FailoverOptions{
		MasterName: "ks-master", SentinelAddrs: []string{sentinel.Addr},
		CredentialsProvider: func() (string, string) { return "", "master-pw" },
	}))
	rebuildThrough(t, c, dbClient(t, master.Addr, 0, "master-pw"), redistest.Prefix(t))
}

// TestFailoverWithoutMasterName checks that options without a master name
// give a client that refuses to connect, rather than one that takes the
// sentinels for servers.
func TestFailoverWithoutMasterName(t *testing.T) {
	t.Parallel()
	sentinel := redistest.OwnSentinel(t, "ks-master", env.Standalone.Addr)
	c, err := rueidis.NewClient(FailoverClientOption(&redis.FailoverOptions{SentinelAddrs: []string{sentinel.Addr}}))
	if err == nil {
		c.Close()
		t.Fatal("NewClient: got a client, want an error")
	}
	if !errors.Is(err, errNoMasterName) {
		t.Errorf("NewClient: got %v, want %v", err, errNoMasterName)
	}
}

// TestTLS rebuilds over TLS, with the CA the application gives go-redis.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	authority := redistest.NewCA(t, dir, "goredis test CA")
	certFile, keyFile := authority.Issue(t, dir, "server", true)
	srv, tlsAddr := redistest.OwnTLSServer(t, authority, certFile, keyFile, "no")
	_, port, _ := net.SplitHostPort(tlsAddr)
	o, err := redis.ParseURL("rediss://" + tlsAddr + "/4")
	if err != nil {
		t.Fatal(err)
	}
	o.TLSConfig.RootCAs = authority.Pool()
	c := connect(t, ClientOption(o))
	if info := clientInfo(t, c); info["db"] != "4" || !strings.HasSuffix(info["laddr"], ":"+port) {
		t.Errorf("CLIENT INFO: got db=%s laddr=%s, want 4 and the TLS port %s", info["db"], info["laddr"], port)
	}
	// The server's TLS port is the only one the client knows of: the
	// rebuild went over TLS. The check reads through the plain port.
	rebuildThrough(t, c, dbClient(t, srv.Addr, 4, ""), redistest.Prefix(t))

	// Without the CA, the server's certificate is not trusted.
	o.TLSConfig.RootCAs = x509.NewCertPool()
	if c, err := rueidis.NewClient(ClientOption(o)); err == nil {
		c.Close()
		t.Error("NewClient without the CA: got a client, want a certificate error")
	}
}

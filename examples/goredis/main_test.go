package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// wantIndexes checks the live indexes under prefix against the catalogue
// of 120 products, exactly, and that keyswap left nothing behind.
func wantIndexes(t *testing.T, c rueidis.Client, prefix string) {
	t.Helper()
	wantPrices := map[string]float64{}
	wantBuckets := map[string][]string{}
	for _, pr := range catalogue(120) {
		wantPrices[pr.SKU] = pr.Price
		wantBuckets[pr.Category] = append(wantBuckets[pr.Category], pr.SKU)
	}
	if diff := cmp.Diff(wantPrices, redistest.ZScores(t, c, prefix+"products:by-price")); diff != "" {
		t.Errorf("ZRANGE %sproducts:by-price (-want +got):\n%s", prefix, diff)
	}
	for b, want := range wantBuckets {
		if got := redistest.SMembers(t, c, prefix+"products:by-category:"+b); !slices.Equal(got, want) {
			t.Errorf("SMEMBERS %sproducts:by-category:%s: got %v, want %v", prefix, b, got, want)
		}
	}
	var indexes []string
	for _, k := range redistest.LiveKeys(t, c, prefix) {
		if !strings.HasPrefix(k, prefix+"product:") {
			indexes = append(indexes, strings.TrimPrefix(k, prefix))
		}
	}
	want := []string{"products:by-category:cocoa", "products:by-category:coffee", "products:by-category:mate", "products:by-category:tea", "products:by-price"}
	if !slices.Equal(indexes, want) {
		t.Errorf("keys under %s other than the records: got %q, want %q", prefix, indexes, want)
	}
	redistest.WantClean(t, c, prefix)
}

// wantSpans checks that rueidisotel recorded spans for the rebuild's
// commands, every one a child of the program's span around Run: the
// source's SCAN and HGETALLs, the batches' transactions with their ZADDs and
// SADDs, and the lock and publish scripts. (A pipeline's span is named after
// its first five commands. The "redis.dial" spans of new connections are
// not the rebuild's: rueidis dials outside any caller's context.)
func wantSpans(t *testing.T, rec *tracetest.SpanRecorder) {
	t.Helper()
	var root sdktrace.ReadOnlySpan
	var commands []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "rebuild product indexes" {
			root = s
		}
		if s.Name() != "redis.dial" && slices.Contains(s.Attributes(), attribute.String("db.system", "redis")) {
			commands = append(commands, s)
		}
	}
	if root == nil {
		t.Fatalf("no span named %q among %d", "rebuild product indexes", len(rec.Ended()))
	}
	var names []string
	for _, s := range commands {
		names = append(names, s.Name())
		if s.Parent().SpanID() != root.SpanContext().SpanID() || s.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("span %q is not a child of the rebuild's span", s.Name())
		}
	}
	for _, want := range []struct {
		what  string
		match func(name string) bool
	}{
		{"SCAN (the source)", func(n string) bool { return n == "SCAN" }},
		{"HGETALL (the source)", func(n string) bool { return strings.Contains(n, "HGETALL") }},
		{"MULTI … ZADD … (the price index)", func(n string) bool {
			return strings.HasPrefix(n, "MULTI ") && strings.Contains(n, " ZADD")
		}},
		{"MULTI … SADD … (the category sets)", func(n string) bool {
			return strings.HasPrefix(n, "MULTI ") && strings.Contains(n, " SADD")
		}},
		{"EVALSHA or EVAL (the scripts)", func(n string) bool { return n == "EVALSHA" || n == "EVAL" }},
	} {
		if !slices.ContainsFunc(names, want.match) {
			t.Errorf("no span of %s among the rebuild's %d: %q", want.what, len(names), names)
		}
	}
}

func TestGoredis(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	unixSrv := redistest.OwnServer(t, "--unixsocket", sock, "--unixsocketperm", "700")

	// A server that refuses the default user: only the URL's ACL user and
	// password get in.
	authSrv := redistest.OwnServer(t)
	redistest.Cmd(t, authSrv.Client(t), "ACL", "SETUSER", "indexer", "on", ">s3cret", "~*", "&*", "+@all")
	redistest.Cmd(t, authSrv.Client(t), "CONFIG", "SET", "requirepass", "not-this-one")
	authClient, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{authSrv.Addr}, Username: "indexer", Password: "s3cret", SelectDB: 1,
		DisableCache: true, ForceSingleClient: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(authClient.Close)
	db3, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{env.Standalone.Addr}, SelectDB: 3, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db3.Close)

	cl := env.Cluster.Addrs
	for _, tc := range []struct {
		name   string
		args   []string
		where  string
		prefix string
		check  rueidis.Client // reads the live keys; nil for the embedded Redis, gone when run returns
	}{
		{"embedded", nil, "", "goredis:", nil},
		{"standalone, database 3", []string{"-redis", "redis://" + env.Standalone.Addr + "/3"},
			"tcp " + env.Standalone.Addr + ", database 3", "goredis:", db3},
		{"ACL user and password", []string{"-redis", "redis://indexer:s3cret@" + authSrv.Addr + "/1?client_name=indexer"},
			"tcp " + authSrv.Addr + ", database 1", "goredis:", authClient},
		{"unix socket", []string{"-redis", "unix://" + sock},
			"unix " + sock + ", database 0", "goredis:", unixSrv.Client(t)},
		{"cluster", []string{"-cluster", "-redis", "redis://" + cl[0] + "?addr=" + cl[1] + "&addr=" + cl[2]},
			"a cluster seeded by " + strings.Join(cl, ", "), "{goredis}:", env.Cluster.Client(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("REDIS_URL", "") // never a server someone else runs
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			var out bytes.Buffer
			if err := run(context.Background(), tc.args, &out, tp); err != nil {
				t.Fatalf("run: %v\n%s", err, &out)
			}
			got := out.String()
			if tc.where == "" { // the embedded Redis's address is the program's own
				first, rest, _ := strings.Cut(got, "\n")
				if !strings.HasPrefix(first, "goredis on tcp 127.0.0.1:") {
					t.Errorf("first line: got %q, want the embedded Redis's address", first)
				}
				got = rest
			} else {
				got = strings.TrimPrefix(got, "goredis on "+tc.where+": go-redis for the application, rueidis (traced) for keyswap\n")
			}
			want := fmt.Sprintf(`the application wrote 120 products with go-redis
keyswap rebuilt %[1]sproducts:by-price and %[1]sproducts:by-category:{cocoa,coffee,mate,tea} from 120 products
the application reads them with go-redis: cheapest sku-000 (0.5), sku-025 (0.5), sku-050 (0.5); 30 mate products
`, tc.prefix)
			if got != want {
				t.Errorf("output (after the first line):\n%s\nwant:\n%s\nall of it:\n%s", got, want, &out)
			}
			if tc.check != nil {
				wantIndexes(t, tc.check, tc.prefix)
			}
			wantSpans(t, rec)
		})
	}
}

func TestGoredisBadURL(t *testing.T) {
	var out bytes.Buffer
	for _, args := range [][]string{
		{"-redis", "http://127.0.0.1:1"},
		{"-cluster"},
	} {
		t.Setenv("REDIS_URL", "")
		if err := run(context.Background(), args, &out, sdktrace.NewTracerProvider()); err == nil {
			t.Errorf("run(%q): got no error, want one", args)
		}
	}
}

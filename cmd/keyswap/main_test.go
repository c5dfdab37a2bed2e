package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
)

// env holds the package's redis-server processes: one standalone server and
// a 3-master cluster, started by TestMain. No test uses a Redis it did not
// start (and none uses 127.0.0.1:6379).
var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// result is what one invocation of the CLI returned and printed.
type result struct {
	code           int
	stdout, stderr string
}

// keyswap runs the CLI in-process with args, with $REDIS_URL unset and a
// stderr that is not a terminal, and returns what it did.
func keyswap(t *testing.T, args ...string) result {
	t.Helper()
	return keyswapEnv(t, nil, args...)
}

// keyswapEnv is keyswap with the environment variables in environ.
func keyswapEnv(t *testing.T, environ map[string]string, args ...string) result {
	t.Helper()
	return keyswapWith(t, invocation{env: environ}, args...)
}

// invocation is what a run of the CLI gets besides its arguments.
type invocation struct {
	env   map[string]string // the environment; nil: empty
	stdin io.Reader         // nil: an empty reader
	ctx   context.Context   // nil: t.Context()
}

// keyswapWith runs the CLI in-process with args and what inv gives it, with
// a stderr that is not a terminal, and returns what it did. The run gets a
// minute.
func keyswapWith(t *testing.T, inv invocation, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	c := &cli{
		stdin:      inv.stdin,
		stdout:     &stdout,
		stderr:     &stderr,
		now:        time.Now,
		getenv:     func(k string) string { return inv.env[k] },
		isTerminal: func(io.Writer) bool { return false },
	}
	if c.stdin == nil {
		c.stdin = strings.NewReader("")
	}
	ctx := inv.ctx
	if ctx == nil {
		ctx = t.Context()
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	code := c.main(ctx, args)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// wantCode fails the test unless r exited with code.
func (r result) wantCode(t *testing.T, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit status: got %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
}

// deployment is a Redis deployment the CLI tests run against.
type deployment struct {
	name    string
	cluster bool
	// redis are the -redis flags that reach the deployment.
	redis []string
	// client is a client of the deployment, for seeding and checking.
	client rueidis.Client
}

// deployments returns the standalone server and the cluster, the latter
// given by all three of its seeds.
func deployments(t *testing.T) []deployment {
	t.Helper()
	cluster := deployment{name: "cluster", cluster: true, client: env.Cluster.Client(t)}
	for _, a := range env.Cluster.Addrs {
		cluster.redis = append(cluster.redis, "-redis", "redis://"+a)
	}
	return []deployment{
		{name: "standalone", redis: []string{"-redis", "redis://" + env.Standalone.Addr}, client: env.Standalone.Client(t)},
		cluster,
	}
}

// server returns d's server as the CLI names it.
func (d deployment) server() server { return serverOf(d.client, nil) }

// args returns cmd, then d's -redis flags, then rest.
func (d deployment) args(cmd string, rest ...string) []string {
	return append(append([]string{cmd}, d.redis...), rest...)
}

// testPrefix returns the running test's key prefix (redistest.Prefix) after
// deleting any key that contains it on d, as left by an earlier run of the
// same test (go test -count=N), and deletes them again when the test ends.
func testPrefix(t *testing.T, d deployment) string {
	t.Helper()
	p := redistest.Prefix(t)
	clean := func() {
		ctx := context.Background()
		for page, err := range scan.Pages(ctx, d.client, scan.Options{Match: "*" + scan.EscapeGlob(p) + "*"}) {
			if err != nil {
				t.Errorf("SCAN for %s: %v", p, err)
				return
			}
			for _, k := range page {
				if err := d.client.Do(ctx, d.client.B().Unlink().Key(k).Build()).Error(); err != nil {
					t.Errorf("UNLINK %s: %v", k, err)
				}
			}
		}
	}
	clean()
	t.Cleanup(clean)
	return p
}

// do runs a command given as words on c, failing the test on error.
func do(t *testing.T, c rueidis.Client, words ...string) rueidis.RedisResult {
	t.Helper()
	r := c.Do(context.Background(), c.B().Arbitrary(words[0]).Keys(words[1]).Args(words[2:]...).Build())
	if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
		t.Fatalf("%q: %v", words, err)
	}
	return r
}

// aclUser creates an ACL user on the standalone server for the running
// test, with password and rules (after "reset on"), deletes it when the test
// ends, and returns its name.
func aclUser(t *testing.T, password string, rules ...string) string {
	t.Helper()
	name := strings.ReplaceAll(strings.Trim(redistest.Prefix(t), ":"), ":", "-")
	c := env.Standalone.Client(t)
	do(t, c, append([]string{"ACL", "SETUSER", name, "reset", "on", ">" + password}, rules...)...)
	t.Cleanup(func() {
		if err := c.Do(context.Background(), c.B().AclDeluser().Username(name).Build()).Error(); err != nil {
			t.Errorf("ACL DELUSER %s: %v", name, err)
		}
	})
	return name
}

// exists reports whether key exists.
func exists(t *testing.T, c rueidis.Client, key string) bool {
	t.Helper()
	n, err := do(t, c, "EXISTS", key).AsInt64()
	if err != nil {
		t.Fatalf("EXISTS %s: %v", key, err)
	}
	return n == 1
}

// rebuild is a store.WithRebuild held open in a goroutine: its callback has
// written three hash fields into its temp key and waits for finish.
type rebuild struct {
	final, temp, lockKey string
	release              chan struct{}
	once                 sync.Once
	done                 chan error
	err                  error
}

// startRebuild starts a rebuild of final through client and returns once its
// callback has written the temp key and, when touch is true, touched it (so
// that the temp key has a TTL). opts sets the Store's clock: an old clock
// gives the temp key an old timestamp. The rebuild is finished at cleanup if
// the test did not finish it.
func startRebuild(t *testing.T, client rueidis.Client, final string, opts store.Options, touch bool) *rebuild {
	t.Helper()
	s := store.New(client, opts)
	rb := &rebuild{final: final, lockKey: s.LockKey(final), release: make(chan struct{}), done: make(chan error, 1)}
	started := make(chan string, 1)
	go func() {
		// Not t.Context(): it is cancelled before cleanup lets the rebuild finish.
		rb.done <- s.WithRebuild(context.Background(), final, store.RebuildOptions{},
			func(ctx context.Context, temp string, touchFn func(context.Context) error) error {
				hset := client.B().Hset().Key(temp).FieldValue().FieldValue("a", "1").FieldValue("b", "2").FieldValue("c", "3")
				if err := client.Do(ctx, hset.Build()).Error(); err != nil {
					return err
				}
				if touch {
					if err := touchFn(ctx); err != nil {
						return err
					}
				}
				started <- temp
				<-rb.release
				return nil
			})
	}()
	select {
	case rb.temp = <-started:
	case err := <-rb.done:
		t.Fatalf("rebuild of %s ended before it started: %v", final, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("rebuild of %s did not start within 30s", final)
	}
	t.Cleanup(func() { rb.finish() })
	return rb
}

// finish lets the rebuild's callback return, waits for the swap, and
// returns the rebuild's result.
func (rb *rebuild) finish() error {
	rb.once.Do(func() {
		close(rb.release)
		rb.err = <-rb.done
	})
	return rb.err
}

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-h"}, "keyswap <command> [flags] [arguments]"},
		{[]string{"--help"}, "Commands:"},
		{[]string{"help"}, "Exit status"},
		{[]string{"help"}, "'keyswap help connect' describes them."},
		{[]string{"help", "sweep"}, "Usage: keyswap sweep [flags]"},
		{[]string{"status", "--help"}, "Usage: keyswap status [flags] [pattern | key]"},
		{[]string{"status", "-help"}, `"sweep_candidate": false`},
		{[]string{"status", "--help"}, `"server": {`},
		{[]string{"sweep", "--help"}, "WARNING: do not sweep during a rolling upgrade from a version without the\nrebuild lock."},
		{[]string{"sweep", "--help"}, "-delete\n"},
		{[]string{"sweep", "--help"}, "-dry-run\n"},
		{[]string{"sweep", "--help"}, `(default "*:rebuild:*")`},
		{[]string{"sweep", "--help"}, "\nIt takes the connection flags, as redis-cli names them (-u URL, -h HOST, -p PORT,\n" +
			"-s SOCKET, -n DB, -a PASSWORD, --user, --askpass, --tls, ...): see 'keyswap help connect'.\n"},
		{[]string{"status", "-json", "--help"}, "  -json\n    \tprint one JSON object (described above) instead of tables; with --watch, one per line\n"},
		{[]string{"help", "connect"}, "  -u URL\n    \tRedis URL: the same as -redis, as in redis-cli\n"},
		{[]string{"help", "connect"}, "  -h host\n    \tthe server's host, as in redis-cli (default 127.0.0.1 when -p is given); help is --help\n"},
		{[]string{"help", "connect"}, "  -a password\n"},
		{[]string{"help", "connect"}, "  -askpass\n"},
		{[]string{"help", "connect"}, "$KEYSWAP_PASSWORD"},
		{[]string{"help", "connect"}, "-u wins over -h, -p\n    and -s"},
		{[]string{"status", "--help"}, `"key_base64"`},
		{[]string{"sweep", "--help"}, `"key_base64"`},
		{[]string{"help"}, "3  status or a sweep without --delete found sweep candidates"},
		{[]string{"help"}, "4  no rebuild is in progress for the key given"},
		{[]string{"help"}, "7  publish, discard: the run had not ended within --wait"},
		{[]string{"help", "throttle"}, "Usage: keyswap throttle [flags] <key> <items/s>"},
		{[]string{"version", "-h"}, "Usage: keyswap version"},
		{[]string{"version", "--help"}, "-json"},
		{[]string{"cancel", "--help"}, "rebuild.ErrAborted"},
		{[]string{"cancel", "--help"}, "  -json\n"},
		{[]string{"cancel", "--help"}, "see 'keyswap help connect'"},
		{[]string{"pause", "--help"}, "Usage: keyswap pause [flags] <key>"},
		{[]string{"resume", "--help"}, "Usage: keyswap resume [flags] <key>"},
		{[]string{"throttle", "--help"}, "0 removes the limit"},
		{[]string{"throttle", "--help"}, `"field": "max_rate"`},
		{[]string{"diff", "--help"}, "  -max-keys int\n    \tthe most buckets of a family compared one by one; the others are only counted (default 100)\n"},
		{[]string{"diff", "--help"}, `"entry_base64"`},
		{[]string{"publish", "--help"}, "  -wait duration\n    \thow long to wait for the run to end; 0: record the decision and return at once (default 30s)\n"},
		{[]string{"discard", "--help"}, "rebuild.ErrDiscarded"},
		{[]string{"rollback", "--help"}, "Usage: keyswap rollback [flags] <key>..."},
		{[]string{"rollback", "--help"}, "6 when one keeps no previous generation"},
		{[]string{"status", "--help"}, `"requests": {"cancel": false, "max_rate": 0, "paused": false, "action": ""}`},
	} {
		r := keyswap(t, tc.args...)
		r.wantCode(t, exitOK)
		if !strings.Contains(r.stdout, tc.want) {
			t.Errorf("keyswap %q: stdout has no %q:\n%s", tc.args, tc.want, r.stdout)
		}
		if r.stderr != "" {
			t.Errorf("keyswap %q: got stderr %q, want none", tc.args, r.stderr)
		}
	}
	// A command's help lists its own flags, not the connection flags.
	for _, cmd := range []string{"status", "sweep", "cancel", "diff", "rollback"} {
		r := keyswap(t, cmd, "--help")
		for _, conn := range []string{"  -askpass", "  -u URL", "  -cacert", "  -h host"} {
			if strings.Contains(r.stdout, conn+"\n") {
				t.Errorf("keyswap %s --help lists the connection flag %s:\n%s", cmd, conn, r.stdout)
			}
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Usage:"},
		{[]string{"frobnicate"}, `keyswap: unknown command "frobnicate"` + "\nRun 'keyswap -h' for usage."},
		{[]string{"sweep", "--bogus"}, "keyswap sweep: flag provided but not defined: -bogus\nRun 'keyswap help sweep' for usage."},
		{[]string{"stauts"}, `keyswap: unknown command "stauts" (did you mean "status"?)` + "\nRun 'keyswap -h' for usage."},
		{[]string{"swep", "--delete"}, `keyswap: unknown command "swep" (did you mean "sweep"?)`},
		{[]string{"rollbak"}, `(did you mean "rollback"?)`},
		{[]string{"status", "--jsno"}, "flag provided but not defined: -jsno (did you mean --json?)"},
		{[]string{"sweep", "--older-then", "1h"}, "flag provided but not defined: -older-then (did you mean --older-than?)"},
		{[]string{"status", "-h"}, "keyswap status: -h needs a host, as in redis-cli; for help, pass --help"},
		{[]string{"status", "-h", "-bogus"}, "keyswap status: -h -bogus: a host does not start with '-'"},
		{[]string{"status", "-p", "0"}, `invalid value "0" for flag -p: want a port, 1 to 65535`},
		{[]string{"status", "-p", "http"}, `invalid value "http" for flag -p: want a port, 1 to 65535`},
		{[]string{"status", "-n", "-1"}, `invalid value "-1" for flag -n: want a database number, 0 or more`},
		{[]string{"sweep", "--delete", "--dry-run"}, "keyswap sweep: --delete and --dry-run contradict each other: give one"},
		{[]string{"sweep", "orphans"}, "did you mean --pattern?"},
		{[]string{"sweep", "--older-than", "-1h"}, "--older-than -1h0m0s: must be positive"},
		{[]string{"sweep", "--older-than", "0"}, "must be positive"},
		{[]string{"sweep", "--older-than", "soon"}, `invalid value "soon" for flag -older-than`},
		{[]string{"sweep", "--pattern", ""}, "--pattern must not be empty"},
		{[]string{"sweep", "--progress", "sometimes"}, `--progress "sometimes": want auto, always or never`},
		{[]string{"sweep", "--grace", "0"}, "keyswap sweep: --grace 0s: must be positive"},
		{[]string{"sweep", "--grace", "-10s"}, "--grace -10s: must be positive"},
		{[]string{"status", "--grace", "0"}, "keyswap status: --grace 0s: must be positive"},
		{[]string{"status", "a*", "b*"}, "keyswap status: want one key or pattern at most (an argument, --index or --pattern), got 2"},
		{[]string{"status", "a", "--index", "b"}, "want one key or pattern at most (an argument, --index or --pattern), got 2"},
		{[]string{"status", "--pattern", "a*", "--index", "b"}, "got 2"},
		{[]string{"status", "--index", ""}, "keyswap status: --index: want a key, got an empty one"},
		{[]string{"status", "--pattern", "users:["}, `keyswap status: pattern "users:[": a '[' is not closed`},
		{[]string{"status", "--watch", "--interval", "0s"}, "keyswap status: --interval 0s: must be positive"},
		{[]string{"status", "-older-than", "-5m"}, "must be positive"},
		{[]string{"status", "users:["}, `keyswap status: pattern "users:[": a '[' is not closed by a ']' (write \[ for a literal '[')`},
		{[]string{"status", `users\`}, `keyswap status: pattern "users\\": it ends in a '\' that escapes nothing`},
		{[]string{"version", "now"}, `keyswap version: unexpected arguments ["now"]`},
		{[]string{"status", "-redis", ""}, "no URL"},
		{[]string{"status", "-redis", "http://example.com"}, "-redis: invalid Redis URL http://example.com: redis: invalid URL scheme: http"},
		{[]string{"status", "-redis", "redis://a:1,rediss://b:2"}, "user, password, database, TLS, unix socket and master_set must be the same in every URL"},
		{[]string{"cancel"}, "keyswap cancel: want a key\n"},
		{[]string{"pause", "a", "b"}, `keyswap pause: want one key, got 2 arguments: ["a" "b"]`},
		{[]string{"resume", "--bogus", "a"}, "keyswap resume: flag provided but not defined: -bogus"},
		{[]string{"throttle", "a"}, "keyswap throttle: want a key and a rate in items per second, got 1 argument"},
		{[]string{"throttle", "a", "1", "2"}, "want a key and a rate in items per second, got 3 arguments"},
		{[]string{"throttle", "a", "--", "-1"}, `keyswap throttle: rate "-1": want a number of items per second, 0 or more (0 removes the limit)`},
		{[]string{"throttle", "a", "fast"}, `rate "fast": want a number`},
		{[]string{"throttle", "a", "+Inf"}, `rate "+Inf": want a number`},
		{[]string{"diff"}, "keyswap diff: want one key, got 0 arguments: []"},
		{[]string{"diff", "a", "--limit", "0"}, "--limit 0: must be at least 1"},
		{[]string{"diff", "a", "--samples", "-1"}, "--samples -1: must be at least 1"},
		{[]string{"diff", "a", "--max-keys", "0"}, "--max-keys 0: must be at least 1"},
		{[]string{"publish", "a", "b"}, `keyswap publish: want one key, got 2 arguments: ["a" "b"]`},
		{[]string{"discard", "a", "--wait", "-1s"}, "--wait -1s: must not be negative"},
		{[]string{"rollback"}, "keyswap rollback: want at least one key"},
	} {
		r := keyswap(t, tc.args...)
		r.wantCode(t, exitUsage)
		if !strings.Contains(r.stderr, tc.want) {
			t.Errorf("keyswap %q: stderr has no %q:\n%s", tc.args, tc.want, r.stderr)
		}
		if r.stdout != "" {
			t.Errorf("keyswap %q: got stdout %q, want none", tc.args, r.stdout)
		}
	}
}

// TestUnreachable runs the real entry point, run, against a port nobody
// listens on: a clear message and exit status 1, quickly.
func TestUnreachable(t *testing.T) {
	for _, args := range [][]string{
		{"status", "-redis", "redis://127.0.0.1:1"},
		{"sweep", "--delete", "-redis", "redis://127.0.0.1:1"},
		{"sweep", "-redis", "redis://127.0.0.1:1", "-redis", "redis://127.0.0.1:2"},
		{"status", "-h", "127.0.0.1", "-p", "1"},
	} {
		var stdout, stderr bytes.Buffer
		start := time.Now()
		code := run(t.Context(), args, strings.NewReader(""), &stdout, &stderr)
		if code != exitError {
			t.Errorf("keyswap %q: exit status %d, want %d", args, code, exitError)
		}
		const want = "keyswap: cannot reach Redis at 127.0.0.1:1"
		if got := stderr.String(); !strings.HasPrefix(got, want) || !strings.Contains(got, "connection refused") {
			t.Errorf("keyswap %q: got stderr %q, want %q... connection refused", args, got, want)
		}
		if stdout.Len() > 0 {
			t.Errorf("keyswap %q: got stdout %q, want none", args, stdout.String())
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("keyswap %q: took %v to fail, want it fast", args, d)
		}
	}
}

// TestRedisURLFromEnvironment connects with $REDIS_URL when -redis is not
// given.
func TestRedisURLFromEnvironment(t *testing.T) {
	t.Parallel()
	r := keyswapEnv(t, map[string]string{"REDIS_URL": "redis://" + env.Standalone.Addr}, "status", "-json", redistest.Prefix(t)+"*")
	r.wantCode(t, exitOK)
	r = keyswapEnv(t, map[string]string{"REDIS_URL": "redis://127.0.0.1:1"}, "status")
	r.wantCode(t, exitError)
	if !strings.Contains(r.stderr, "cannot reach Redis at 127.0.0.1:1") {
		t.Errorf("got stderr %q, want it to name $REDIS_URL's address", r.stderr)
	}
}

// TestJSONErrors fails commands given -json in each way: the error is a
// JSON object on stdout, with the exit status and its kind, and the
// message is on stderr as without -json.
func TestJSONErrors(t *testing.T) {
	t.Parallel()
	addr := "redis://" + env.Standalone.Addr
	p := redistest.Prefix(t)
	for _, tc := range []struct {
		args []string
		code int
		kind string
		msg  string // the start of "error"
	}{
		{[]string{"status", "-json", "-redis", "127.0.0.1:1"}, exitError, "error", "cannot reach Redis at 127.0.0.1:1: "},
		{[]string{"cancel", "--json", "-u", addr, p + "nothing"}, exitNoRun, "no_run", p + "nothing: no rebuild in progress"},
		{[]string{"throttle", "-json", "-u", addr, p + "nothing", "100"}, exitNoRun, "no_run", p + "nothing: no rebuild in progress"},
		{[]string{"pause", "-json", "-u", addr, p + "nothing"}, exitNoRun, "no_run", p + "nothing:"},
		{[]string{"resume", "-json", "-u", addr, p + "nothing"}, exitNoRun, "no_run", p + "nothing:"},
		{[]string{"throttle", "-json", "a", "fast"}, exitUsage, "usage", `rate "fast": want a number`},
		{[]string{"sweep", "-json", "--delete", "--dry-run"}, exitUsage, "usage", "--delete and --dry-run contradict each other"},
		{[]string{"stauts", "-json"}, exitUsage, "usage", `unknown command "stauts" (did you mean "status"?)`},
		{[]string{"rollback", "-json", "-u", addr, p + "never"}, exitNoPrev, "no_previous", "rollback " + p + "never: "},
	} {
		r := keyswap(t, tc.args...)
		r.wantCode(t, tc.code)
		var got errorJSON
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Errorf("keyswap %q: stdout is no JSON object: %v\n%s", tc.args, err, r.stdout)
			continue
		}
		if got.ExitStatus != tc.code || got.Kind != tc.kind || !strings.HasPrefix(got.Error, tc.msg) {
			t.Errorf("keyswap %q: got %+v, want exit status %d, kind %s, error %q...", tc.args, got, tc.code, tc.kind, tc.msg)
		}
		if !strings.Contains(r.stderr, got.Error) {
			t.Errorf("keyswap %q: stderr %q lacks the error %q", tc.args, r.stderr, got.Error)
		}
	}
}

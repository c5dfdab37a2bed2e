package pgcdc_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/capture/pgcdc"
	"github.com/keyswap/keyswap/capture/pgtest"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

var (
	pg  *pgtest.Server
	env *redistest.Env
)

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role))
	}
	os.Exit(pgtest.Main(&pg, func() int { return redistest.Main(m, &env, false) }))
}

// user is a row of the table users, and an item of the index.
type user struct {
	ID, Email, Country string
	Score              float64
}

// schema creates the table users (REPLICA IDENTITY FULL) and the
// publication keyswap of it.
var schema = []string{
	`CREATE TABLE users (id bigint PRIMARY KEY, email text, country text, score float8 NOT NULL DEFAULT 0, bio text)`,
	`ALTER TABLE users REPLICA IDENTITY FULL`,
	`CREATE PUBLICATION keyswap FOR TABLE users`,
}

// indexes returns the index of users under prefix: a hash email → id, a
// sorted set id → score, and one set of ids per country.
func indexes(prefix string) []index.Builder[user] {
	return []index.Builder[user]{
		builders.Hash(prefix+"by-email", func(u user) (string, string, bool) { return u.Email, u.ID, !builders.Blank(u.Email) }),
		builders.SortedSet(prefix+"by-score", func(u user) (string, float64, bool) { return u.ID, u.Score, true }),
		builders.SetIndex(prefix+"by-country", func(u user) (string, string, bool) { return u.Country, u.ID, !builders.Blank(u.Country) }),
	}
}

// decodeUser is the users table's row → item.
func decodeUser(r pgcdc.Row) (user, error) {
	id, ok := r["id"].(int64)
	if !ok {
		return user{}, fmt.Errorf("id is %T", r["id"])
	}
	u := user{ID: strconv.FormatInt(id, 10)}
	u.Email, _ = r["email"].(string)
	u.Country, _ = r["country"].(string)
	u.Score, _ = r["score"].(float64)
	return u, nil
}

// usersTable is the users table for a relay.
func usersTable() pgcdc.Table[user] {
	return pgcdc.Table[user]{Name: "users", Change: pgcdc.Decode(decodeUser)}
}

// slots numbers the test slots.
var slots atomic.Int64

// fixture is a database with the table users, a publication and a slot,
// and the index of users in Redis.
type fixture struct {
	dsn, prefix, slot string
	client            rueidis.Client
	rb                *rebuild.Rebuilder[user]
}

func newFixture(t testing.TB, srv *pgtest.Server, client rueidis.Client) *fixture {
	t.Helper()
	f := &fixture{dsn: srv.Database(t), prefix: redistest.Prefix(t), client: client, slot: fmt.Sprintf("ks_%d_%d", os.Getpid(), slots.Add(1))}
	redistest.ClearContaining(t, client, f.prefix) // keys an earlier run left (go test -count=N)
	srv.Exec(t, f.dsn, schema...)
	srv.Exec(t, f.dsn, fmt.Sprintf(`SELECT pg_create_logical_replication_slot('%s', 'pgoutput')`, f.slot))
	f.rb = redistest.Rebuilder(t, client, rebuild.Options{}, indexes(f.prefix)...)
	return f
}

// options returns the relay's options for the fixture, with short
// intervals for tests.
func (f *fixture) options() pgcdc.Options {
	return pgcdc.Options{Slot: f.slot, Publication: "keyswap", StatusInterval: 200 * time.Millisecond, CheckInterval: 200 * time.Millisecond}
}

// relay returns a relay of the users table with opts.
func (f *fixture) relay(t testing.TB, opts pgcdc.Options) *pgcdc.Relay[user] {
	t.Helper()
	r, err := pgcdc.New(f.dsn, f.rb, opts, usersTable())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// running runs r until the test ends, and returns a channel of Run's error.
func running(t testing.TB, r interface{ Run(context.Context) error }) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var stopped bool
	var err error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-done
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// pool returns a pool of connections to the fixture's database.
func (f *fixture) pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// contents is an index's contents, as read from Redis or computed from the
// table.
type contents struct {
	Emails    map[string]string
	Scores    map[string]float64
	Countries map[string][]string
}

// tableIndex computes the index from the table's rows.
func tableIndex(t testing.TB, dsn string) contents {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT id, coalesce(email, ''), coalesce(country, ''), score FROM users`)
	if err != nil {
		t.Fatal(err)
	}
	want := contents{Emails: map[string]string{}, Scores: map[string]float64{}, Countries: map[string][]string{}}
	for rows.Next() {
		var id int64
		var u user
		if err := rows.Scan(&id, &u.Email, &u.Country, &u.Score); err != nil {
			t.Fatal(err)
		}
		u.ID = strconv.FormatInt(id, 10)
		if u.Email != "" {
			want.Emails[u.Email] = u.ID
		}
		want.Scores[u.ID] = u.Score
		if u.Country != "" {
			want.Countries[u.Country] = append(want.Countries[u.Country], u.ID)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, ids := range want.Countries {
		slices.Sort(ids)
	}
	return want
}

// redisIndex reads the index from Redis.
func redisIndex(t testing.TB, c rueidis.Client, prefix string) contents {
	t.Helper()
	got := contents{
		Emails:    redistest.HGetAll(t, c, prefix+"by-email"),
		Scores:    redistest.ZScores(t, c, prefix+"by-score"),
		Countries: map[string][]string{},
	}
	family := prefix + "by-country:"
	for _, k := range redistest.LiveKeys(t, c, family) {
		got.Countries[strings.TrimPrefix(k, family)] = redistest.SMembers(t, c, k)
	}
	return got
}

// entries counts the entries of an index.
func (x contents) entries() map[string]bool {
	out := map[string]bool{}
	for e, id := range x.Emails {
		out["email "+e+"="+id] = true
	}
	for id, s := range x.Scores {
		out["score "+id+"="+strconv.FormatFloat(s, 'g', -1, 64)] = true
	}
	for c, ids := range x.Countries {
		for _, id := range ids {
			out["country "+c+" "+id] = true
		}
	}
	return out
}

// lostAndStale counts the entries of want missing from got, and those of
// got that want lacks.
func lostAndStale(want, got contents) (lost, stale int) {
	w, g := want.entries(), got.entries()
	for e := range w {
		if !g[e] {
			lost++
		}
	}
	for e := range g {
		if !w[e] {
			stale++
		}
	}
	return lost, stale
}

// waitIndex waits until the index in Redis is the one computed from the
// table, or fails t with the difference after a deadline. The table must
// no longer change.
func (f *fixture) waitIndex(t testing.TB) {
	t.Helper()
	want := tableIndex(t, f.dsn)
	deadline := time.Now().Add(redistest.Timeout)
	for {
		got := redisIndex(t, f.client, f.prefix)
		if cmp.Equal(want, got) {
			t.Logf("index of %d users: 0 lost, 0 stale", len(want.Scores))
			return
		}
		if time.Now().After(deadline) {
			lost, stale := lostAndStale(want, got)
			t.Fatalf("after %v: %d entries lost, %d stale; index (-table +redis):\n%s", redistest.Timeout, lost, stale, cmp.Diff(want, got))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writer changes random users of the table, as fast as it can or at a
// rate, in transactions of a few rows, until stopped. It rides out a
// server restart.
type writer struct {
	done     chan struct{}
	once     sync.Once
	finished chan struct{}
	err      error
	commits  atomic.Int64
}

// users is how many distinct users the writers change.
const users = 2000

// startWriter starts a writer on dsn. The rows it writes have unique
// emails: each user's email is its id and a version.
func startWriter(t testing.TB, dsn string, seed uint64, perSecond int) *writer {
	t.Helper()
	w := &writer{done: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		w.err = w.run(dsn, seed, perSecond)
		close(w.finished)
	}()
	t.Cleanup(func() { _ = w.stop() })
	return w
}

// stop stops the writer and waits for it.
func (w *writer) stop() error {
	w.once.Do(func() { close(w.done) })
	<-w.finished
	return w.err
}

func (w *writer) run(dsn string, seed uint64, perSecond int) error {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, seed+1))
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(ctx)
		}
	}()
	var tick <-chan time.Time
	if perSecond > 0 {
		ticker := time.NewTicker(time.Second / time.Duration(perSecond))
		defer ticker.Stop()
		tick = ticker.C
	}
	countries := []string{"fr", "de", "nl", "be", "es", "it", ""}
	for n := 0; ; n++ {
		select {
		case <-w.done:
			return nil
		default:
		}
		if tick != nil {
			select {
			case <-w.done:
				return nil
			case <-tick:
			}
		}
		if conn == nil {
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				continue // the server restarts
			}
			conn = c
		}
		batch := &pgx.Batch{}
		for range 1 + rng.IntN(3) {
			id := 1 + rng.IntN(users)
			switch rng.IntN(10) {
			case 0:
				batch.Queue(`DELETE FROM users WHERE id = $1`, id)
			default:
				email := fmt.Sprintf("u%d.%d@example.com", id, n)
				if rng.IntN(8) == 0 {
					email = "" // no email: no hash entry
				}
				batch.Queue(`INSERT INTO users (id, email, country, score) VALUES ($1, nullif($2, ''), nullif($3, ''), $4)
					ON CONFLICT (id) DO UPDATE SET email = excluded.email, country = excluded.country, score = excluded.score`,
					id, email, countries[rng.IntN(len(countries))], float64(rng.IntN(1000)))
			}
		}
		tx, err := conn.Begin(ctx)
		if err == nil {
			if err = tx.SendBatch(ctx, batch).Close(); err == nil {
				err = tx.Commit(ctx)
			} else {
				_ = tx.Rollback(ctx)
			}
		}
		if err != nil {
			conn.Close(ctx)
			conn = nil
			continue
		}
		w.commits.Add(1)
	}
}

// waitFor polls cond until it holds, or fails t after a deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(redistest.Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", redistest.Timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The other processes of the tests are copies of the test binary, which
// TestMain runs in a role when roleEnv is set.
const (
	roleEnv   = "KEYSWAP_TEST_PGCDC_ROLE" // "relay" or "app"
	dsnEnv    = "KEYSWAP_TEST_PGCDC_DSN"
	redisEnv  = "KEYSWAP_TEST_PGCDC_REDIS"
	prefixEnv = "KEYSWAP_TEST_PGCDC_PREFIX"
	slotEnv   = "KEYSWAP_TEST_PGCDC_SLOT"
	idEnv     = "KEYSWAP_TEST_PGCDC_ID"
)

// process is a copy of the test binary in a role.
type process struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan error
}

// startProcess starts a copy of the test binary in role, with env.
func startProcess(t *testing.T, role string, env ...string) *process {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), roleEnv+"="+role), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, lines: make(chan string, 100), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() { p.kill(t) })
	return p
}

// kill kills the process with SIGKILL, and waits for it.
func (p *process) kill(t *testing.T) {
	t.Helper()
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	p.done <- nil
}

// wait waits for a line of the process that starts with prefix.
func (p *process) wait(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(redistest.Timeout)
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case err := <-p.done:
			p.done <- err
			t.Fatalf("the process ended (%v) before it printed %q", err, prefix)
		case <-timeout:
			t.Fatalf("the process did not print %q within %v", prefix, redistest.Timeout)
		}
	}
}

// runRole runs this process in role and returns its exit code.
func runRole(role string) int {
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{os.Getenv(redisEnv)}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer c.Close()
	rb, err := rebuild.New(c, rebuild.Options{}, indexes(os.Getenv(prefixEnv))...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	switch role {
	case "relay":
		r, err := pgcdc.New(os.Getenv(dsnEnv), rb, pgcdc.Options{Slot: os.Getenv(slotEnv), Publication: "keyswap", StatusInterval: 100 * time.Millisecond}, usersTable())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		go func() {
			for {
				time.Sleep(20 * time.Millisecond)
				fmt.Printf("applied %d\n", r.Status().Applied)
			}
		}()
		fmt.Fprintln(os.Stderr, "relay:", r.Run(ctx))
		return 1
	case "app":
		// The application: it commits a new user, then would call Apply,
		// but it is killed first.
		conn, err := pgx.Connect(ctx, os.Getenv(dsnEnv))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		id, _ := strconv.Atoi(os.Getenv(idEnv))
		if _, err := conn.Exec(ctx, `INSERT INTO users (id, email, country, score) VALUES ($1, $2, 'fr', 7)`, id, fmt.Sprintf("app%d@example.com", id)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Println("committed")
		select {} // where it would call rb.Apply(ctx, index.Insert(u))
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

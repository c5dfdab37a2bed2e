package outbox_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/capture/outbox"
	"github.com/keyswap/keyswap/capture/pgtest"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
	_ "modernc.org/sqlite"
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

// user is an item of the index, and a row of the table users.
type user struct {
	ID, Email, Country string
}

// indexes returns the index of users under prefix: a hash email → id and
// one set of ids per country.
func indexes(prefix string) []index.Builder[user] {
	return []index.Builder[user]{
		builders.Hash(prefix+"by-email", func(u user) (string, string, bool) { return u.Email, u.ID, !builders.Blank(u.Email) }),
		builders.SetIndex(prefix+"by-country", func(u user) (string, string, bool) { return u.Country, u.ID, !builders.Blank(u.Country) }),
	}
}

// recorder is a builder of the tests that writes nothing and records, in
// order, the changes Apply gives it: the order in which the relay applied
// them.
type recorder struct {
	key  string
	mu   sync.Mutex
	seen []string
}

var _ index.Incremental[user] = (*recorder)(nil)

func (r *recorder) Key() string                                { return r.key }
func (r *recorder) Build(*index.Commands, []user) error        { return nil }
func (r *recorder) Diff(_ *index.Writes, old, new *user) error { r.add(old, new); return nil }

// add records a change as "id:old>new" (emails; "-" for no value).
func (r *recorder) add(old, new *user) {
	id, o, n := "", "-", "-"
	if old != nil {
		id, o = old.ID, old.Email
	}
	if new != nil {
		id, n = new.ID, new.Email
	}
	r.mu.Lock()
	r.seen = append(r.seen, id+":"+o+">"+n)
	r.mu.Unlock()
}

// changes returns the changes recorded so far.
func (r *recorder) changes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// db is a database of one dialect with the table users and an outbox.
type db struct {
	dialect        outbox.Dialect
	driver, source string
	sql            *sql.DB
	ob             *outbox.Outbox[user]
}

// dialects returns a fresh database of each dialect.
func dialects(t *testing.T) map[string]func(t *testing.T) *db {
	return map[string]func(t *testing.T) *db{
		"sqlite": func(t *testing.T) *db {
			path := filepath.Join(t.TempDir(), "app.db")
			return openDB(t, outbox.SQLite, "sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate", true)
		},
		"postgres": func(t *testing.T) *db {
			return openDB(t, outbox.Postgres, "pgx", pg.Database(t), true)
		},
	}
}

// openDB opens a database, and creates its tables if create is set.
func openDB(t testing.TB, d outbox.Dialect, driver, source string, create bool) *db {
	s, err := sql.Open(driver, source)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ob, err := outbox.New[user](outbox.Options{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	x := &db{dialect: d, driver: driver, source: source, sql: s, ob: ob}
	if create {
		ctx := context.Background()
		if _, err := s.ExecContext(ctx, `CREATE TABLE users (id TEXT PRIMARY KEY, email TEXT UNIQUE, country TEXT)`); err != nil {
			t.Fatal(err)
		}
		if err := ob.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	return x
}

// exec runs statements on x, and fails t on an error.
func (x *db) exec(t *testing.T, sql ...string) {
	t.Helper()
	for _, q := range sql {
		if _, err := x.sql.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// q rewrites the placeholders $1, $2... for the dialect.
func (x *db) q(query string) string {
	if x.dialect == outbox.SQLite {
		return strings.ReplaceAll(query, "$", "?")
	}
	return query
}

// versions numbers the changes of the writers: every change of the tests
// gets a version higher than every earlier one, across a delete and a
// re-insert of an item.
var versions atomic.Int64

// change makes a change to user id in one transaction, and writes it to
// the outbox: new nil deletes the user.
func (x *db) change(ctx context.Context, id string, new *user) error {
	tx, err := x.sql.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	var old user
	lock := ""
	if x.dialect == outbox.Postgres {
		lock = " FOR UPDATE"
	}
	err = tx.QueryRowContext(ctx, x.q(`SELECT id, coalesce(email, ''), coalesce(country, '') FROM users WHERE id = $1`+lock), id).Scan(&old.ID, &old.Email, &old.Country)
	exists := err == nil
	if err != nil && err != sql.ErrNoRows {
		return err
	}
	var c index.Change[user]
	switch {
	case new == nil && !exists:
		return nil
	case new == nil:
		_, err = tx.ExecContext(ctx, x.q(`DELETE FROM users WHERE id = $1`), id)
		c = index.Delete(old)
	case exists:
		_, err = tx.ExecContext(ctx, x.q(`UPDATE users SET email = nullif($1, ''), country = $2 WHERE id = $3`), new.Email, new.Country, id)
		c = index.Update(old, *new)
	default:
		_, err = tx.ExecContext(ctx, x.q(`INSERT INTO users (id, email, country) VALUES ($1, nullif($2, ''), $3)`), id, new.Email, new.Country)
		c = index.Insert(*new)
	}
	if err != nil {
		return err
	}
	if err := x.ob.Write(ctx, tx, "user:"+id, versions.Add(1), c); err != nil {
		return err
	}
	return tx.Commit()
}

// contents is an index's contents.
type contents struct {
	Emails    map[string]string
	Countries map[string][]string
}

// tableIndex computes the index from the table.
func (x *db) tableIndex(t *testing.T) contents {
	t.Helper()
	rows, err := x.sql.Query(`SELECT id, coalesce(email, ''), coalesce(country, '') FROM users`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := contents{Emails: map[string]string{}, Countries: map[string][]string{}}
	for rows.Next() {
		var u user
		if err := rows.Scan(&u.ID, &u.Email, &u.Country); err != nil {
			t.Fatal(err)
		}
		if u.Email != "" {
			want.Emails[u.Email] = u.ID
		}
		if u.Country != "" {
			want.Countries[u.Country] = append(want.Countries[u.Country], u.ID)
		}
	}
	for _, ids := range want.Countries {
		slices.Sort(ids)
	}
	return want
}

// redisIndex reads the index from Redis.
func redisIndex(t *testing.T, c rueidis.Client, prefix string) contents {
	t.Helper()
	got := contents{Emails: redistest.HGetAll(t, c, prefix+"by-email"), Countries: map[string][]string{}}
	family := prefix + "by-country:"
	for _, k := range redistest.LiveKeys(t, c, family) {
		got.Countries[strings.TrimPrefix(k, family)] = redistest.SMembers(t, c, k)
	}
	return got
}

// waitIndex waits until the index is the table's and the outbox is empty,
// or fails t with the difference.
func (x *db) waitIndex(t *testing.T, c rueidis.Client, prefix string) {
	t.Helper()
	want := x.tableIndex(t)
	deadline := time.Now().Add(redistest.Timeout)
	for {
		got := redisIndex(t, c, prefix)
		if cmp.Equal(want, got) && x.outboxRows(t) == 0 {
			t.Logf("index of %d emails: 0 lost, 0 stale; outbox empty", len(want.Emails))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v, %d rows in the outbox; index (-table +redis):\n%s", redistest.Timeout, x.outboxRows(t), cmp.Diff(want, got))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outboxRows counts the outbox's rows.
func (x *db) outboxRows(t *testing.T) int {
	t.Helper()
	var n int
	if err := x.sql.QueryRow(`SELECT count(*) FROM ` + x.ob.Table()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// running runs r until the test ends, and returns a function that stops
// it and returns Run's error.
func running(t *testing.T, r interface{ Run(context.Context) error }) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// writer changes random users until stopped.
type writer struct {
	done     chan struct{}
	once     sync.Once
	finished chan struct{}
	err      error
	commits  atomic.Int64
}

func startWriter(t *testing.T, x *db, seed uint64) *writer {
	w := &writer{done: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(w.finished)
		rng := rand.New(rand.NewPCG(seed, seed))
		countries := []string{"fr", "de", "nl", ""}
		for n := 0; ; n++ {
			select {
			case <-w.done:
				return
			default:
			}
			id := fmt.Sprint(1 + rng.IntN(300))
			var u *user
			if rng.IntN(8) > 0 {
				u = &user{ID: id, Email: fmt.Sprintf("u%s.%d@example.com", id, n), Country: countries[rng.IntN(len(countries))]}
			}
			if err := x.change(context.Background(), id, u); err != nil {
				w.err = err
				return
			}
			w.commits.Add(1)
		}
	}()
	t.Cleanup(func() { _ = w.stop() })
	return w
}

func (w *writer) stop() error {
	w.once.Do(func() { close(w.done) })
	<-w.finished
	return w.err
}

// waitFor polls cond until it holds, or fails t after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(redistest.Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", redistest.Timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The other processes of the tests are copies of the test binary.
const (
	roleEnv    = "KEYSWAP_TEST_OUTBOX_ROLE" // "relay" or "app"
	dialectEnv = "KEYSWAP_TEST_OUTBOX_DIALECT"
	driverEnv  = "KEYSWAP_TEST_OUTBOX_DRIVER"
	sourceEnv  = "KEYSWAP_TEST_OUTBOX_SOURCE"
	redisEnv   = "KEYSWAP_TEST_OUTBOX_REDIS"
	prefixEnv  = "KEYSWAP_TEST_OUTBOX_PREFIX"
)

// processEnv is the environment of another process on x.
func (x *db) processEnv(prefix string) []string {
	return []string{dialectEnv + "=" + fmt.Sprint(int(x.dialect)), driverEnv + "=" + x.driver, sourceEnv + "=" + x.source,
		redisEnv + "=" + env.Standalone.Addr, prefixEnv + "=" + prefix}
}

// process is a copy of the test binary in a role.
type process struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan error
}

func startProcess(t *testing.T, role string, env []string) *process {
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
	t.Cleanup(func() { p.kill() })
	return p
}

// kill kills the process with SIGKILL and waits for it.
func (p *process) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	p.done <- nil
}

// wait waits for a line that starts with prefix.
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

// runRole runs this process in role, and returns its exit code.
func runRole(role string) int {
	var d int
	fmt.Sscan(os.Getenv(dialectEnv), &d)
	x := openDB(&fakeTB{}, outbox.Dialect(d), os.Getenv(driverEnv), os.Getenv(sourceEnv), false)
	ctx := context.Background()
	switch role {
	case "app":
		// Commit a change with its outbox row, then be killed where Apply
		// would be called.
		if err := x.change(ctx, "42", &user{ID: "42", Email: "app42@example.com", Country: "fr"}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Println("committed")
		select {}
	case "relay":
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{os.Getenv(redisEnv)}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		rb, err := rebuild.New(c, rebuild.Options{}, indexes(os.Getenv(prefixEnv))...)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		r := x.ob.Relay(x.sql, rb, outbox.RelayOptions{PollInterval: 10 * time.Millisecond, BatchSize: 20})
		go func() {
			for {
				time.Sleep(10 * time.Millisecond)
				st := r.Status()
				fmt.Printf("applied %d\n", st.Applied)
				if st.Err != nil {
					fmt.Fprintln(os.Stderr, "relay:", st.Err)
				}
			}
		}()
		fmt.Fprintln(os.Stderr, "relay:", r.Run(ctx))
		return 1
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

// fakeTB is the testing.TB of another process: a failure ends it.
type fakeTB struct{ testing.TB }

func (fakeTB) Fatal(args ...any) { fmt.Fprintln(os.Stderr, args...); os.Exit(2) }
func (fakeTB) Cleanup(func())    {}

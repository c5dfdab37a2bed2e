package protocol_test

import (
	"context"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

// The raw tests of the run core's Lua scripts: each runs the script text,
// as embedded in the library, against a real redis-server, the standalone
// server and the 3-master cluster, and asserts its exact reply and the exact
// state of every key under the case's prefix afterwards. Between them they
// reach every branch of acquire.lua, heartbeat.lua, refresh.lua, control.lua,
// readlog.lua, replay.lua, release.lua and publish.lua (apply.lua and the tail of the
// publish are in changes_test.go). The refusals of an ACL user run on a server
// of the test's own and on the cluster node that serves the test's slot; a
// renamed command needs a server started with --rename-command, so those
// run on servers of the test's own. touch.lua is tested in store
// (TestScriptLease).

// scriptTok is the run's token in every case; thiefTok is another run's.
const (
	scriptTok = "0123456789abcdef0123456789abcdef"
	thiefTok  = "fedcba9876543210fedcba9876543210"
	// scriptNow is the publish's time for the metas, in milliseconds.
	scriptNow = "1700000000123"
)

// casePrefix returns the prefix of the keys of t's case under prefix (on
// the cluster it keeps the hash tag of prefix, so that every key of the
// case shares a slot), and deletes every key under it now and when t ends,
// so that the case starts from nothing even when run again (-count).
func casePrefix(t *testing.T, c rueidis.Client, prefix string) string {
	t.Helper()
	p := prefix + t.Name() + ":"
	clean := func() {
		for _, k := range redistest.Keys(t, c, p) {
			if err := c.Do(context.Background(), c.B().Del().Key(k).Build()).Error(); err != nil {
				t.Errorf("DEL %s: %v", k, err)
			}
		}
	}
	clean()
	t.Cleanup(clean)
	return p
}

// evalSource runs the Lua source src on c and returns its array reply, its
// integers as int64 and its strings as string.
func evalSource(t *testing.T, c rueidis.Client, src string, keys, args []string) []any {
	t.Helper()
	return replyOf(t, rueidis.NewLuaScript(src).Exec(context.Background(), c, keys, args), keys, args)
}

// evalScript runs keyswap's script name (scripts/<name>.lua) on c, as
// redistest.ScriptNamed(name).Lua() does, and returns its reply as
// evalSource does.
func evalScript(t *testing.T, c rueidis.Client, name string, keys, args []string) []any {
	t.Helper()
	return replyOf(t, redistest.ScriptNamed(name).Lua().Exec(context.Background(), c, keys, args), keys, args)
}

// replyOf reads a script's array reply.
func replyOf(t *testing.T, res rueidis.RedisResult, keys, args []string) []any {
	t.Helper()
	arr, err := res.ToArray()
	if err != nil {
		t.Fatalf("script with KEYS %q ARGV %q: got error %v, want an array reply", keys, args, err)
	}
	out := make([]any, len(arr))
	for i, m := range arr {
		switch {
		case m.IsInt64():
			out[i], _ = m.AsInt64()
		case m.IsNil():
			out[i] = nil
		default:
			s, err := m.ToString()
			if err != nil {
				t.Fatalf("script reply element %d: %v", i, err)
			}
			out[i] = s
		}
	}
	return out
}

// reply returns a script reply as replyOf reads it: ints become int64.
func reply(vs ...any) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		if n, ok := v.(int); ok {
			v = int64(n)
		}
		out[i] = v
	}
	return out
}

// formatReply writes a reply as Lua would: {1, "RENAME", "key"}.
func formatReply(r []any) string {
	parts := make([]string, len(r))
	for i, v := range r {
		switch v := v.(type) {
		case int64:
			parts[i] = strconv.FormatInt(v, 10)
		case string:
			parts[i] = strconv.Quote(v)
		default:
			parts[i] = "nil"
		}
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// wantReply fails t unless got is want.
func wantReply(t *testing.T, got []any, want ...any) {
	t.Helper()
	if w := reply(want...); !reflect.DeepEqual(got, w) {
		t.Errorf("reply: got %s, want %s", formatReply(got), formatReply(w))
	}
}

// cmds runs each command on c, in order, failing t on an error.
func cmds(t *testing.T, c rueidis.Client, commands ...[]string) {
	t.Helper()
	for _, words := range commands {
		redistest.Cmd(t, c, words...)
	}
}

// wantFields fails t unless key is a hash of exactly want (of any TTL).
func wantFields(t *testing.T, c rueidis.Client, key string, want map[string]string) {
	t.Helper()
	if diff := cmp.Diff(want, redistest.HGetAll(t, c, key)); diff != "" {
		t.Errorf("%s: got other fields (-want +got):\n%s", key, diff)
	}
}

// wantDump fails t unless key holds exactly the value before had, whatever
// its TTL.
func wantDump(t *testing.T, c rueidis.Client, key string, before map[string]redistest.KeyState) {
	t.Helper()
	b, ok := before[key]
	if !ok {
		t.Fatalf("%s was not in the snapshot", key)
	}
	got, err := c.Do(context.Background(), c.B().Dump().Key(key).Build()).ToString()
	switch {
	case rueidis.IsRedisNil(err):
		t.Errorf("%s: got it deleted, want its value unchanged", key)
	case err != nil:
		t.Fatalf("DUMP %s: %v", key, err)
	case got != b.Dump:
		t.Errorf("%s: got its value changed, want it unchanged", key)
	}
}

// ttlSlack is how far a key's TTL may have run down between two snapshots
// on a loaded machine. Every seeded TTL differs from the TTLs the scripts
// set, so a renewal shows as a TTL that went up.
const ttlSlack = 10 * time.Second

// wantUntouched fails t unless every key under prefix is as before, a
// [redistest.Snapshot] (byte-identical, its TTL not extended, gone or
// added), except the keys in written, which the caller checks itself; and
// unless no other key appeared.
func wantUntouched(t *testing.T, c rueidis.Client, prefix string, before map[string]redistest.KeyState, written ...string) {
	t.Helper()
	after := redistest.Snapshot(t, c, prefix)
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if slices.Contains(written, k) {
			continue
		}
		b := before[k]
		a, ok := after[k]
		switch {
		case !ok:
			t.Errorf("%s: got it deleted, want it unchanged", k)
		case a.Dump != b.Dump:
			t.Errorf("%s: got its value changed, want it unchanged", k)
		case (a.PTTL < 0 || b.PTTL < 0) && a.PTTL != b.PTTL,
			a.PTTL >= 0 && b.PTTL >= 0 && (a.PTTL > b.PTTL || b.PTTL-a.PTTL > ttlSlack):
			t.Errorf("%s: got PTTL %v, want %v (unchanged)", k, a.PTTL, b.PTTL)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[k]; !ok && !slices.Contains(written, k) {
			t.Errorf("%s: got it created, want nothing written", k)
		}
	}
}

// runKeys returns the keys of n locks under p: the locks "lock:<i>", then
// their records, then their logs. With ctlOf, they are the KEYS of
// acquire, heartbeat and release.
func runKeys(p string, n int) (locks, records, logs []string) {
	for i := 1; i <= n; i++ {
		l := p + "lock:" + strconv.Itoa(i)
		locks, records, logs = append(locks, l), append(records, l+":run"), append(logs, l+":log")
	}
	return locks, records, logs
}

// ctlOf returns the requests next to the first of locks.
func ctlOf(locks []string) string { return locks[0] + ":ctl" }

// runKS returns the KEYS of acquire, heartbeat and release: locks, records,
// logs, and the requests of the first lock.
func runKS(locks, records, logs []string) []string {
	return slices.Concat(locks, records, logs, []string{ctlOf(locks)})
}

// recordArgs returns the per-record ARGV of acquire for n records: a count
// and pairs each, fields for the first and the first lock for the others.
func recordArgs(locks []string, first ...string) []string {
	var out []string
	for i := range locks {
		rec := []string{"token", scriptTok}
		if i == 0 {
			rec = append(rec, first...)
		} else {
			rec = append(rec, "primary", locks[0])
		}
		out = append(out, strconv.Itoa(len(rec)/2))
		out = append(out, rec...)
	}
	return out
}

func TestScriptAcquire(t *testing.T) {
	// acquire.lua: {1} takes every lock with SET EX under one token
	// (C6), deletes the records and logs a previous holder left and the
	// requests of an earlier run, and opens the records, each with the
	// fields given for it. {0, i} for the first lock held, by anyone, with
	// nothing changed: the holder's lock keeps its value and TTL (C7).
	// {-5, cmd} for a command the server does not know; the refusals of an
	// ACL user are in TestScriptAcquireRefused.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		t.Run("taken", func(t *testing.T) {
			p := casePrefix(t, d.Other, d.Prefix)
			locks, records, logs := runKeys(p, 2)
			// What a previous run, whose locks expired, left behind.
			cmds(t, d.Other,
				[]string{"HSET", records[0], "token", thiefTok, "batches", "9", "logged", "4"},
				[]string{"EXPIRE", records[0], "40"},
				[]string{"HSET", records[1], "token", thiefTok, "primary", p + "elsewhere"},
				[]string{"EXPIRE", records[1], "40"},
				[]string{"RPUSH", logs[0], "a", "b"},
				[]string{"RPUSH", logs[1], "c"},
				[]string{"HSET", ctlOf(locks), "token", thiefTok, "cancel", "1"},
			)
			args := append([]string{scriptTok, "100", "2", "2", "false", "HINCRBY", records[0], "MULTI", ""}, recordArgs(locks, "owner", "me", "phase", "building")...)
			got := evalScript(t, d.Client, "acquire", runKS(locks, records, logs), args)
			wantReply(t, got, 1)
			for _, l := range locks {
				redistest.WantString(t, d.Other, l, scriptTok)
				redistest.WantPTTL(t, d.Other, l, 50*time.Second, 100*time.Second)
			}
			wantFields(t, d.Other, records[0], map[string]string{"token": scriptTok, "owner": "me", "phase": "building"})
			wantFields(t, d.Other, records[1], map[string]string{"token": scriptTok, "primary": locks[0]})
			for _, r := range records {
				redistest.WantPTTL(t, d.Other, r, 50*time.Second, 100*time.Second)
			}
			for _, l := range append(logs, ctlOf(locks)) {
				redistest.WantAbsent(t, d.Other, l)
			}
			if keys := redistest.Keys(t, d.Other, p); len(keys) != 4 {
				t.Errorf("keys under %s: got %q, want the 2 locks and their records", p, keys)
			}
		})

		t.Run("one lock, its token alone", func(t *testing.T) {
			p := casePrefix(t, d.Other, d.Prefix)
			locks, records, logs := runKeys(p, 1)
			got := evalScript(t, d.Client, "acquire", runKS(locks, records, logs), append([]string{scriptTok, "100", "1", "0", "false"}, recordArgs(locks)...))
			wantReply(t, got, 1)
			redistest.WantLock(t, d.Other, locks[0], scriptTok, 100*time.Second)
			wantFields(t, d.Other, records[0], map[string]string{"token": scriptTok})
			redistest.WantPTTL(t, d.Other, records[0], 50*time.Second, 100*time.Second)
			redistest.WantAbsent(t, d.Other, logs[0])
		})

		for _, tt := range []struct {
			name   string
			held   int    // which lock is held
			holder string // by whom
			checks []string
			want   []any
		}{
			{"second held", 2, thiefTok, nil, reply(0, 2)},
			{"first held", 1, thiefTok, nil, reply(0, 1)},
			{"third held", 3, thiefTok, nil, reply(0, 3)},
			{"held by our own token", 1, scriptTok, nil, reply(0, 1)},
			{"unknown command", 0, "", []string{"HINCRBY", "record", "NOSUCHCOMMAND", "key"}, reply(-5, "NOSUCHCOMMAND")},
			{"unknown command without a key", 0, "", []string{"NOSUCHCOMMAND", ""}, reply(-5, "NOSUCHCOMMAND")},
			{"unknown command before the held lock", 2, thiefTok, []string{"NOSUCHCOMMAND", "key"}, reply(-5, "NOSUCHCOMMAND")},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, d.Other, d.Prefix)
				locks, records, logs := runKeys(p, 3)
				for i := range locks {
					// Every lock's previous record and log, which a {1} would delete.
					cmds(t, d.Other,
						[]string{"HSET", records[i], "token", thiefTok},
						[]string{"EXPIRE", records[i], "40"},
						[]string{"RPUSH", logs[i], "x"},
					)
				}
				cmds(t, d.Other, []string{"HSET", ctlOf(locks), "token", thiefTok, "cancel", "1"})
				if tt.held > 0 {
					cmds(t, d.Other, []string{"SET", locks[tt.held-1], tt.holder, "EX", "40"})
				}
				before := redistest.Snapshot(t, d.Other, p)
				args := []string{scriptTok, "100", "3", strconv.Itoa(len(tt.checks) / 2), "false"}
				args = append(append(args, tt.checks...), recordArgs(locks, "owner", "me")...)
				got := evalScript(t, d.Client, "acquire", runKS(locks, records, logs), args)
				wantReply(t, got, tt.want...)
				wantUntouched(t, d.Other, p, before)
			})
		}
	})
}

// aclTarget is a server where a test creates ACL users, and the prefix
// of its keys there.
type aclTarget struct {
	name   string
	srv    *redistest.Server // where the users are created
	admin  rueidis.Client    // the default user: seeds and reads
	prefix string
}

// aclTargets returns a standalone server of t's own, and the node of the
// package's cluster that serves the slot of t's prefix, with a prefix that
// carries its hash tag. An ACL user lives on one node only, and its client
// talks to that node alone.
func aclTargets(t *testing.T) []aclTarget {
	t.Helper()
	own := redistest.OwnServer(t)
	p := redistest.Prefix(t)
	tagged := "{" + p + "}"
	return []aclTarget{
		{name: "standalone", srv: own, admin: own.Client(t), prefix: p},
		{name: "cluster", srv: env.Cluster.NodeFor(t, tagged), admin: env.Cluster.Client(t), prefix: tagged},
	}
}

// forEachACLTarget runs f as a parallel subtest per aclTarget.
func forEachACLTarget(t *testing.T, f func(t *testing.T, a aclTarget)) {
	t.Helper()
	for _, a := range aclTargets(t) {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			f(t, a)
		})
	}
}

// deniedRules returns the ACL rules of a user that may run every command
// on every key but cmd, and cmd too on the keys under p of the patterns
// allowOn (a selector). EVAL itself is allowed: the root rules keep every
// key.
func deniedRules(p, cmd string, allowOn ...string) []string {
	rules := []string{"~*", "+@all", "-" + cmd}
	if len(allowOn) > 0 {
		sel := "(+" + cmd
		for _, pat := range allowOn {
			sel += " ~" + p + pat
		}
		rules = append(rules, sel+")")
	}
	return rules
}

func TestScriptAcquireRefused(t *testing.T) {
	// acquire.lua, for a user that may not run one of the commands the
	// script sends itself (EXISTS and SET on each lock, DEL on its record
	// and log, HSET and EXPIRE on its record, lock by lock), or one of the
	// commands the run will send: {-2, cmd, key} for the first such
	// command, its own before the ARGV pairs, before the locks are even
	// looked at, and nothing changed.
	forEachACLTarget(t, func(t *testing.T, a aclTarget) {
		// own returns the reply {-2, cmd, key} for the key of section
		// (0 locks, 1 records, 2 logs, 3 the requests) of lock i.
		own := func(cmd string, section, i int) func(p string) []any {
			return func(p string) []any {
				locks, records, logs := runKeys(p, 2)
				return reply(-2, cmd, [][]string{locks, records, logs, {ctlOf(locks)}}[section][i-1])
			}
		}
		for _, tt := range []struct {
			name  string
			rules func(p string) []string
			held  bool // the first lock is held by another run
			want  func(p string) []any
		}{
			{
				name:  "command denied",
				rules: func(string) []string { return []string{"~*", "+@all", "-rename"} },
				want:  func(p string) []any { return reply(-2, "RENAME", p+"temp:1") },
			},
			{
				name:  "command denied, before the held lock",
				rules: func(string) []string { return []string{"~*", "+@all", "-rename"} },
				held:  true,
				want:  func(p string) []any { return reply(-2, "RENAME", p+"temp:1") },
			},
			{
				// The checked keys are ARGV, not KEYS: EVAL itself is allowed.
				name:  "key outside the user's patterns",
				rules: func(p string) []string { return []string{"~" + p + "lock:*", "~" + p + "temp:*", "+@all"} },
				want:  func(p string) []any { return reply(-2, "UNLINK", p+"live:1") },
			},
			// The script's own commands. Before they were checked, each
			// of these failed the script on the command itself: for DEL,
			// HSET and EXPIRE after the first lock had been taken.
			{
				name:  "EXISTS on a lock",
				rules: func(p string) []string { return deniedRules(p, "exists") },
				want:  own("EXISTS", 0, 1),
			},
			{
				name:  "EXISTS on the second lock",
				rules: func(p string) []string { return deniedRules(p, "exists", "lock:1") },
				want:  own("EXISTS", 0, 2),
			},
			{
				name:  "SET on a lock",
				rules: func(p string) []string { return deniedRules(p, "set") },
				want:  own("SET", 0, 1),
			},
			{
				name:  "SET on a lock, before the held lock",
				rules: func(p string) []string { return deniedRules(p, "set") },
				held:  true,
				want:  own("SET", 0, 1),
			},
			{
				name:  "DEL on the requests",
				rules: func(p string) []string { return deniedRules(p, "del") },
				want:  own("DEL", 3, 1),
			},
			{
				name:  "DEL on a record",
				rules: func(p string) []string { return deniedRules(p, "del", "lock:*:ctl") },
				want:  own("DEL", 1, 1),
			},
			{
				name:  "DEL on a log",
				rules: func(p string) []string { return deniedRules(p, "del", "lock:*:run", "lock:*:ctl") },
				want:  own("DEL", 2, 1),
			},
			{
				name:  "HSET on a record",
				rules: func(p string) []string { return deniedRules(p, "hset") },
				want:  own("HSET", 1, 1),
			},
			{
				name:  "HSET on the second record",
				rules: func(p string) []string { return deniedRules(p, "hset", "lock:1:run") },
				want:  own("HSET", 1, 2),
			},
			{
				// The run's EXPIRE on its temp key is allowed.
				name:  "EXPIRE on a record",
				rules: func(p string) []string { return deniedRules(p, "expire", "temp:*") },
				want:  own("EXPIRE", 1, 1),
			},
			{
				// The run's EXPIRE on its temp key is denied too, and
				// answers after the script's own.
				name:  "own commands before the run's",
				rules: func(p string) []string { return deniedRules(p, "expire") },
				want:  own("EXPIRE", 1, 1),
			},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, a.admin, a.prefix)
				c := a.srv.ClientAs(t, "ks-"+t.Name(), tt.rules(p)...)
				locks, records, logs := runKeys(p, 2)
				cmds(t, a.admin,
					[]string{"HSET", records[1], "token", thiefTok},
					[]string{"EXPIRE", records[1], "40"},
					[]string{"RPUSH", logs[0], "x"},
				)
				if tt.held {
					cmds(t, a.admin, []string{"SET", locks[0], thiefTok, "EX", "40"})
				}
				before := redistest.Snapshot(t, a.admin, p)
				args := append([]string{scriptTok, "100", "2", "4", "false",
					"HINCRBY", records[0], "EXPIRE", p + "temp:1", "RENAME", p + "temp:1", "UNLINK", p + "live:1"},
					recordArgs(locks, "owner", "me")...)
				got := evalScript(t, c, "acquire", runKS(locks, records, logs), args)
				wantReply(t, got, tt.want(p)...)
				wantUntouched(t, a.admin, p, before)
			})
		}
	})
}

func TestScriptHeartbeat(t *testing.T) {
	// heartbeat.lua: compare-and-extend (C9, C16+). {1, batches, cancel,
	// max_rate, paused, action, then logged and length of each log}: every
	// lock and record, and every log and the requests if they exist, reset
	// to the TTL, not left to decay (C13), and the status written into the
	// run's record; the requests are read only when they carry the run's
	// token (C70). {-1, i} for the first lock not ours; {-15, i} for the
	// first record gone or without a token, {-14, i} for one with another
	// token (C74); {-3, batches} when the first record holds fewer batches
	// than Redis acknowledged (C55); each way nothing changed.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		t.Run("renewed", func(t *testing.T) {
			p := casePrefix(t, d.Other, d.Prefix)
			locks, records, logs := runKeys(p, 2)
			ctl := ctlOf(locks)
			cmds(t, d.Other,
				[]string{"SET", locks[0], scriptTok, "EX", "50"},
				[]string{"SET", locks[1], scriptTok, "EX", "50"},
				[]string{"HSET", records[0], "token", scriptTok, "batches", "5", "logged", "3", "phase", "building", "rate", "12.5"},
				[]string{"EXPIRE", records[0], "50"},
				[]string{"HSET", records[1], "token", scriptTok, "primary", locks[0], "logged", "2"},
				[]string{"EXPIRE", records[1], "50"},
				[]string{"RPUSH", logs[0], "a", "b", "c"},
				[]string{"EXPIRE", logs[0], "50"},
				[]string{"HSET", ctl, "token", scriptTok, "cancel", "1", "max_rate", "250", "paused", "1", "action", "publish"},
				[]string{"EXPIRE", ctl, "50"},
			)
			before := redistest.Snapshot(t, d.Other, p)
			args := []string{scriptTok, "100", "2", "5", "phase", "publishing", "items", "42", "rate", "3.5"}
			got := evalScript(t, d.Client, "heartbeat", runKS(locks, records, logs), args)
			wantReply(t, got, 1, 5, "1", "250", "1", "publish", 3, 3, 2, 0)
			for _, l := range locks {
				redistest.WantString(t, d.Other, l, scriptTok)
			}
			wantFields(t, d.Other, records[0], map[string]string{
				"token": scriptTok, "batches": "5", "logged": "3", "phase": "publishing", "items": "42", "rate": "3.5",
			})
			wantFields(t, d.Other, records[1], map[string]string{"token": scriptTok, "primary": locks[0], "logged": "2"})
			wantDump(t, d.Other, logs[0], before)
			wantDump(t, d.Other, ctl, before)
			for _, k := range slices.Concat(locks, records, logs[:1], []string{ctl}) {
				redistest.WantPTTL(t, d.Other, k, 50*time.Second, 100*time.Second)
			}
			redistest.WantAbsent(t, d.Other, logs[1]) // EXPIRE does not create it
			wantUntouched(t, d.Other, p, before, slices.Concat(locks, records, logs[:1], []string{ctl})...)
		})

		t.Run("another run's requests", func(t *testing.T) {
			// Requests written for another token are not this run's.
			p := casePrefix(t, d.Other, d.Prefix)
			locks, records, logs := runKeys(p, 1)
			cmds(t, d.Other,
				[]string{"SET", locks[0], scriptTok, "EX", "50"},
				[]string{"HSET", records[0], "token", scriptTok},
				[]string{"EXPIRE", records[0], "50"},
				[]string{"HSET", ctlOf(locks), "token", thiefTok, "cancel", "1", "max_rate", "3"},
			)
			got := evalScript(t, d.Client, "heartbeat", runKS(locks, records, logs), []string{scriptTok, "100", "1", "0"})
			wantReply(t, got, 1, 0, "", "", "", "", 0, 0)
		})

		t.Run("bare record, no status", func(t *testing.T) {
			// No batches or logged field counts as 0; no request reads as "";
			// no status leaves the record as it was.
			p := casePrefix(t, d.Other, d.Prefix)
			locks, records, logs := runKeys(p, 1)
			cmds(t, d.Other,
				[]string{"SET", locks[0], scriptTok, "EX", "50"},
				[]string{"HSET", records[0], "token", scriptTok},
				[]string{"EXPIRE", records[0], "50"},
			)
			before := redistest.Snapshot(t, d.Other, p)
			got := evalScript(t, d.Client, "heartbeat", runKS(locks, records, logs), []string{scriptTok, "100", "1", "0"})
			wantReply(t, got, 1, 0, "", "", "", "", 0, 0)
			wantDump(t, d.Other, locks[0], before)
			wantDump(t, d.Other, records[0], before)
			redistest.WantPTTL(t, d.Other, locks[0], 50*time.Second, 100*time.Second)
			redistest.WantPTTL(t, d.Other, records[0], 50*time.Second, 100*time.Second)
			redistest.WantAbsent(t, d.Other, logs[0])
			redistest.WantAbsent(t, d.Other, ctlOf(locks))
		})

		t.Run("record ahead of the acknowledged batches", func(t *testing.T) {
			// Redis holds batches whose reply is still on its way: renewed.
			p := casePrefix(t, d.Other, d.Prefix)
			locks, records, logs := runKeys(p, 1)
			cmds(t, d.Other,
				[]string{"SET", locks[0], scriptTok, "EX", "50"},
				[]string{"HSET", records[0], "token", scriptTok, "batches", "7"},
				[]string{"EXPIRE", records[0], "50"},
			)
			got := evalScript(t, d.Client, "heartbeat", runKS(locks, records, logs), []string{scriptTok, "100", "1", "5"})
			wantReply(t, got, 1, 7, "", "", "", "", 0, 0)
			redistest.WantPTTL(t, d.Other, locks[0], 50*time.Second, 100*time.Second)
		})

		for _, tt := range []struct {
			name    string
			lost    int    // which lock is not ours (0: none)
			holder  string // its value ("": expired)
			batches string // the record's batches ("": no such field; "-": no record; "token": a record without a token)
			second  string // the second record's token ("-": no record)
			acked   string
			want    []any
		}{
			{"second stolen", 2, thiefTok, "5", scriptTok, "5", reply(-1, 2)},
			{"first stolen", 1, thiefTok, "5", scriptTok, "5", reply(-1, 1)},
			{"second expired", 2, "", "5", scriptTok, "5", reply(-1, 2)},
			{"first expired", 1, "", "5", scriptTok, "5", reply(-1, 1)},
			{"lock checked before the batches", 2, thiefTok, "3", scriptTok, "5", reply(-1, 2)},
			{"writes lost", 0, "", "3", scriptTok, "5", reply(-3, 3)},
			{"record without batches", 0, "", "", scriptTok, "1", reply(-3, 0)},
			// Renewing would re-create the record without a TTL.
			{"record gone", 0, "", "-", scriptTok, "1", reply(-15, 1)},
			{"record gone, nothing acknowledged", 0, "", "-", scriptTok, "0", reply(-15, 1)},
			{"record re-created by a batch, without its token", 0, "", "token", scriptTok, "0", reply(-15, 1)},
			{"second record gone", 0, "", "5", "-", "5", reply(-15, 2)},
			{"second record forged", 0, "", "5", thiefTok, "5", reply(-14, 2)},
			{"records checked before the batches", 0, "", "3", thiefTok, "5", reply(-14, 2)},
			{"lock checked before the missing record", 2, thiefTok, "-", scriptTok, "0", reply(-1, 2)},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, d.Other, d.Prefix)
				locks, records, logs := runKeys(p, 2)
				cmds(t, d.Other,
					[]string{"SET", locks[0], scriptTok, "EX", "50"},
					[]string{"SET", locks[1], scriptTok, "EX", "50"},
					[]string{"RPUSH", logs[0], "a"},
					[]string{"EXPIRE", logs[0], "50"},
				)
				if tt.second != "-" {
					cmds(t, d.Other, []string{"HSET", records[1], "token", tt.second, "primary", locks[0]}, []string{"EXPIRE", records[1], "50"})
				}
				switch tt.batches {
				case "-":
				case "":
					cmds(t, d.Other, []string{"HSET", records[0], "token", scriptTok}, []string{"EXPIRE", records[0], "50"})
				case "token":
					cmds(t, d.Other, []string{"HSET", records[0], "batches", "1"}, []string{"EXPIRE", records[0], "50"})
				default:
					cmds(t, d.Other, []string{"HSET", records[0], "token", scriptTok, "batches", tt.batches}, []string{"EXPIRE", records[0], "50"})
				}
				if tt.lost > 0 {
					if tt.holder == "" {
						cmds(t, d.Other, []string{"DEL", locks[tt.lost-1]})
					} else {
						cmds(t, d.Other, []string{"SET", locks[tt.lost-1], tt.holder, "EX", "40"})
					}
				}
				before := redistest.Snapshot(t, d.Other, p)
				args := []string{scriptTok, "100", "2", tt.acked, "phase", "publishing"}
				got := evalScript(t, d.Client, "heartbeat", runKS(locks, records, logs), args)
				wantReply(t, got, tt.want...)
				wantUntouched(t, d.Other, p, before)
			})
		}
	})
}

func TestScriptRefresh(t *testing.T) {
	// refresh.lua: {1, s...} resets the TTL of every temp key that exists,
	// whatever the lock's (C13), and says for each whether it was absent (0),
	// had a TTL (1) or had none (2); it never creates a key and never
	// extends the lock (the heartbeat does). {-1} when the lock is not
	// ours (C9), with nothing changed.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		seed := func(t *testing.T, p string) (lock string, temps []string) {
			lock, temps = p+"lock:1", []string{p + "temp:1", p + "temp:2", p + "temp:3"}
			cmds(t, d.Other, []string{"SET", lock, scriptTok, "EX", "50"})
			redistest.SeedHash(t, d.Other, temps[0], redistest.Fields("a", 3))
			cmds(t, d.Other, []string{"EXPIRE", temps[0], "80"})
			redistest.SeedHash(t, d.Other, temps[2], redistest.Fields("c", 3)) // no TTL
			return lock, temps
		}

		t.Run("renewed", func(t *testing.T) {
			p := casePrefix(t, d.Other, d.Prefix)
			lock, temps := seed(t, p)
			before := redistest.Snapshot(t, d.Other, p)
			got := evalScript(t, d.Client, "refresh", append([]string{lock}, temps...), []string{scriptTok, "200"})
			wantReply(t, got, 1, 1, 0, 2)
			for _, temp := range []string{temps[0], temps[2]} {
				wantDump(t, d.Other, temp, before)
				redistest.WantPTTL(t, d.Other, temp, 150*time.Second, 200*time.Second)
			}
			redistest.WantAbsent(t, d.Other, temps[1])
			wantUntouched(t, d.Other, p, before, temps[0], temps[2]) // the lock too
		})

		t.Run("no temp keys", func(t *testing.T) {
			p := casePrefix(t, d.Other, d.Prefix)
			lock, _ := seed(t, p)
			before := redistest.Snapshot(t, d.Other, p)
			wantReply(t, evalScript(t, d.Client, "refresh", []string{lock}, []string{scriptTok, "200"}), 1)
			wantUntouched(t, d.Other, p, before)
		})

		for _, tt := range []struct {
			name   string
			holder string // "": expired
		}{
			{"lock stolen", thiefTok},
			{"lock expired", ""},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, d.Other, d.Prefix)
				lock, temps := seed(t, p)
				if tt.holder == "" {
					cmds(t, d.Other, []string{"DEL", lock})
				} else {
					cmds(t, d.Other, []string{"SET", lock, tt.holder, "EX", "40"})
				}
				before := redistest.Snapshot(t, d.Other, p)
				got := evalScript(t, d.Client, "refresh", append([]string{lock}, temps...), []string{scriptTok, "200"})
				wantReply(t, got, -1)
				wantUntouched(t, d.Other, p, before)
			})
		}
	})
}

// releaseLock is the state of one lock before a release.
type releaseLock int

const (
	ours        releaseLock = iota // our lock, record and log
	foreign                        // another run's lock, record and log
	foreignOurs                    // another run's lock and log, and our record
	expiredOurs                    // no lock; our record and log
	lapsed                         // no lock; another run's record and log
	gone                           // nothing at all
)

// seedRelease seeds one lock of a release: lock, record and log.
func seedRelease(t *testing.T, c rueidis.Client, state releaseLock, lock, record, log string) {
	t.Helper()
	set := func(holder, recordToken string) {
		if holder != "" {
			cmds(t, c, []string{"SET", lock, holder, "EX", "40"})
		}
		cmds(t, c,
			[]string{"HSET", record, "token", recordToken, "batches", "3"},
			[]string{"EXPIRE", record, "40"},
			[]string{"RPUSH", log, "x", "y"},
			[]string{"EXPIRE", log, "40"},
		)
	}
	switch state {
	case ours:
		set(scriptTok, scriptTok)
	case foreign:
		set(thiefTok, thiefTok)
	case foreignOurs:
		set(thiefTok, scriptTok)
	case expiredOurs:
		set("", scriptTok)
	case lapsed:
		set("", thiefTok)
	}
}

func TestScriptRelease(t *testing.T) {
	// release.lua: compare-and-delete (C8). {deleted, foreign, receipt}:
	// each lock that holds our token is deleted with its record and log
	// (and the first with the requests next to it);
	// a lock another run holds counts as foreign and is left alone with its
	// log, and its record unless the record still holds our token; a lock
	// no one holds counts in neither, and the record and log next to it,
	// whoever's they are, are what a lapsed run left: deleted. Without a
	// receipt, receipt is 0 and none is created.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		for _, tt := range []struct {
			name  string
			locks []releaseLock
			want  []any
		}{
			{"mixed", []releaseLock{ours, foreign, foreignOurs, expiredOurs, lapsed, gone}, reply(1, 2, 0)},
			{"all ours", []releaseLock{ours, ours}, reply(2, 0, 0)},
			{"one ours", []releaseLock{ours}, reply(1, 0, 0)},
			{"none ours", []releaseLock{foreign, lapsed}, reply(0, 1, 0)},
			{"our records left", []releaseLock{expiredOurs, foreignOurs}, reply(0, 1, 0)},
			{"all gone", []releaseLock{gone, gone}, reply(0, 0, 0)},
		} {
			for _, mode := range []string{"0", "1"} {
				t.Run(tt.name+" mode "+mode, func(t *testing.T) {
					p := casePrefix(t, d.Other, d.Prefix)
					locks, records, logs := runKeys(p, len(tt.locks))
					var deleted []string
					for i, s := range tt.locks {
						seedRelease(t, d.Other, s, locks[i], records[i], logs[i])
						switch s {
						case ours, expiredOurs, lapsed:
							deleted = append(deleted, locks[i], records[i], logs[i])
						case foreignOurs:
							deleted = append(deleted, records[i])
						}
					}
					// The requests next to the first lock go with a lock of
					// ours or no one's, not with another run's.
					cmds(t, d.Other, []string{"HSET", ctlOf(locks), "token", scriptTok, "cancel", "1"})
					if first := tt.locks[0]; first != foreign && first != foreignOurs {
						deleted = append(deleted, ctlOf(locks))
					}
					receipt := locks[0] + ":done"
					before := redistest.Snapshot(t, d.Other, p)
					keys := append(runKS(locks, records, logs), receipt)
					got := evalScript(t, d.Client, "release", keys, []string{scriptTok, strconv.Itoa(len(locks)), mode})
					wantReply(t, got, tt.want...)
					for _, k := range deleted {
						redistest.WantAbsent(t, d.Other, k)
					}
					wantUntouched(t, d.Other, p, before, deleted...)
				})
			}
		}
	})
}

func TestScriptReleaseReceipt(t *testing.T) {
	// release.lua reads the receipt a fenced publish left, in the same
	// step as it releases the locks (C8): 1 when it holds our token, or
	// our token marked as read. Mode '0' deletes it; mode '1' (settling a
	// publish whose reply was lost) marks it "read:<token>" and keeps its
	// TTL. Another run's receipt, read or not, is 0 and left alone; an
	// absent one is 0 and not created.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		for _, tt := range []struct {
			name    string
			receipt string // "": absent
			mode    string
			want    []any
			after   string // the receipt afterwards ("": absent)
		}{
			{"ours mode 0", scriptTok, "0", reply(1, 0, 1), ""},
			{"ours mode 1", scriptTok, "1", reply(1, 0, 1), "read:" + scriptTok},
			{"ours read mode 0", "read:" + scriptTok, "0", reply(1, 0, 1), ""},
			{"ours read mode 1", "read:" + scriptTok, "1", reply(1, 0, 1), "read:" + scriptTok},
			{"another's mode 0", thiefTok, "0", reply(1, 0, 0), thiefTok},
			{"another's mode 1", thiefTok, "1", reply(1, 0, 0), thiefTok},
			{"another's read mode 1", "read:" + thiefTok, "1", reply(1, 0, 0), "read:" + thiefTok},
			{"absent mode 0", "", "0", reply(1, 0, 0), ""},
			{"absent mode 1", "", "1", reply(1, 0, 0), ""},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, d.Other, d.Prefix)
				locks, records, logs := runKeys(p, 1)
				seedRelease(t, d.Other, ours, locks[0], records[0], logs[0])
				receipt := locks[0] + ":done"
				if tt.receipt != "" {
					cmds(t, d.Other, []string{"SET", receipt, tt.receipt, "EX", "30"})
				}
				before := redistest.Snapshot(t, d.Other, p)
				keys := append(runKS(locks, records, logs), receipt)
				got := evalScript(t, d.Client, "release", keys, []string{scriptTok, "1", tt.mode})
				wantReply(t, got, tt.want...)
				redistest.WantString(t, d.Other, receipt, tt.after)
				if tt.after != "" {
					redistest.WantPTTL(t, d.Other, receipt, 20*time.Second, 30*time.Second) // KEEPTTL
				}
				wantUntouched(t, d.Other, p, before, slices.Concat(locks, records, logs, []string{receipt})...)
			})
		}
	})
}

func TestScriptReleaseRetried(t *testing.T) {
	// A release that settles a publish (mode '1') may run twice: rueidis
	// retries it when its reply is lost. The second run finds no lock of
	// ours left, and still the receipt, marked read, with its TTL (C8).
	// A plain release (mode '0') then deletes it, and one more finds none.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		p := casePrefix(t, d.Other, d.Prefix)
		locks, records, logs := runKeys(p, 2)
		for i := range locks {
			seedRelease(t, d.Other, ours, locks[i], records[i], logs[i])
		}
		receipt := locks[0] + ":done"
		cmds(t, d.Other, []string{"SET", receipt, scriptTok, "EX", "30"}, []string{"HSET", ctlOf(locks), "token", scriptTok, "paused", "1"})
		keys := append(runKS(locks, records, logs), receipt)
		for i, step := range []struct {
			mode    string
			want    []any
			receipt string
		}{
			{"1", reply(2, 0, 1), "read:" + scriptTok},
			{"1", reply(0, 0, 1), "read:" + scriptTok},
			{"0", reply(0, 0, 1), ""},
			{"0", reply(0, 0, 0), ""},
		} {
			got := evalScript(t, d.Client, "release", keys, []string{scriptTok, "2", step.mode})
			if w := reply(step.want...); !reflect.DeepEqual(got, w) {
				t.Errorf("run %d (mode %s): got %s, want %s", i+1, step.mode, formatReply(got), formatReply(w))
			}
			redistest.WantString(t, d.Other, receipt, step.receipt)
			if step.receipt != "" {
				redistest.WantPTTL(t, d.Other, receipt, 20*time.Second, 30*time.Second)
			}
			if left := redistest.Keys(t, d.Other, p); len(left) > 0 && step.receipt == "" {
				t.Errorf("run %d: got %q left, want nothing", i+1, left)
			}
		}
	})
}

// publishCall is one call of publish.lua: its keys by section, in the
// order of the script's header, and its arguments. It has no logs (X = 0);
// the tails are in TestScriptPublishTail and the tests after it.
type publishCall struct {
	token                                                                      string
	locks, records, receipts, temps, lives, orphans, prevs, drops, metas, ctls []string
	flags, batches, keep, receiptTTL, now                                      string
}

func (c publishCall) keys() []string {
	return slices.Concat(c.locks, c.records, c.receipts, c.temps, c.lives, c.orphans, c.prevs, c.drops, c.metas, c.ctls)
}

func (c publishCall) args() []string {
	args := []string{c.token}
	for _, s := range [][]string{c.locks, c.records, c.receipts, c.temps, c.orphans, c.prevs, c.drops, c.metas, nil, c.ctls} {
		args = append(args, strconv.Itoa(len(s)))
	}
	// X = 0: no logs, and so no per-log arguments after ARGV[16]; a tail of
	// at most 0 changes of 0 work.
	return append(args, c.flags, c.batches, c.keep, c.receiptTTL, c.now, "0", "0")
}

// run runs the publish on c and returns its reply.
func (c publishCall) run(t *testing.T, client rueidis.Client) []any {
	t.Helper()
	return evalScript(t, client, "publish", c.keys(), c.args())
}

// prevUntil is scriptNow plus the publish's ARGV[13], 600 s, in
// milliseconds: the prev_until of its metas.
const prevUntil = "1700000600123"

// seedPublish seeds, under p, a whole fenced publish with every section,
// and returns its call, which succeeds with
// {1, 1, 2, 1, 1, 8, 1, 0}:
//
//	lock:1, lock:2    our locks, EX 50
//	lock:1:run        our record, 4 batches, EX 50; lock:2:run our other record
//	lock:1:done       the receipt: absent
//	lock:1:ctl        the operator's requests: a pause, no cancel
//	temp:1 -> live:1  populated with a TTL (flag '2'); live:1 has old fields and a TTL
//	temp:2 -> live:2  absent, never populated (flag '0'): live:2 is emptied
//	temp:3 -> live:3  populated without a TTL (flag '1'); live:3 is absent
//	temp:4 -> live:4  present without a TTL, though flagged '0'
//	orphan:1          a bucket not produced; orphan:2 absent
//	prev:*            where the old values go, each with a stale value of an
//	                  earlier publish: prev:live:1, prev:live:3, prev:orphan:2
//	drop:1            an earlier prev to delete; drop:2 absent
//	meta:1            generation 7, with prev fields; meta:2 absent
func seedPublish(t *testing.T, c rueidis.Client, p string) publishCall {
	t.Helper()
	k := func(names ...string) []string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = p + n
		}
		return out
	}
	call := publishCall{
		token:      scriptTok,
		locks:      k("lock:1", "lock:2"),
		records:    k("lock:1:run", "lock:2:run"),
		receipts:   k("lock:1:done"),
		ctls:       k("lock:1:ctl"),
		temps:      k("temp:1", "temp:2", "temp:3", "temp:4"),
		lives:      k("live:1", "live:2", "live:3", "live:4"),
		orphans:    k("orphan:1", "orphan:2"),
		prevs:      k("prev:live:1", "prev:live:2", "prev:live:3", "prev:live:4", "prev:orphan:1", "prev:orphan:2"),
		drops:      k("drop:1", "drop:2"),
		metas:      k("meta:1", "meta:2"),
		flags:      "2010",
		batches:    "4",
		keep:       "600",
		receiptTTL: "30",
		now:        scriptNow,
	}
	cmds(t, c,
		[]string{"SET", call.locks[0], scriptTok, "EX", "50"},
		[]string{"SET", call.locks[1], scriptTok, "EX", "50"},
		[]string{"HSET", call.records[0], "token", scriptTok, "batches", "4"},
		[]string{"EXPIRE", call.records[0], "50"},
		[]string{"HSET", call.records[1], "token", scriptTok, "primary", call.locks[0]},
		[]string{"EXPIRE", call.records[1], "50"},
		[]string{"HSET", call.ctls[0], "token", scriptTok, "paused", "1"},
		[]string{"EXPIRE", call.ctls[0], "50"},
	)
	redistest.SeedHash(t, c, call.temps[0], redistest.Fields("new1", 3))
	cmds(t, c, []string{"EXPIRE", call.temps[0], "80"})
	redistest.SeedHash(t, c, call.temps[2], redistest.Fields("new3", 3))
	redistest.SeedHash(t, c, call.temps[3], redistest.Fields("new4", 3))
	redistest.SeedHash(t, c, call.lives[0], redistest.Fields("old1", 8))
	cmds(t, c, []string{"EXPIRE", call.lives[0], "1000"})
	redistest.SeedHash(t, c, call.lives[1], redistest.Fields("old2", 8))
	redistest.SeedHash(t, c, call.lives[3], redistest.Fields("old4", 8))
	redistest.SeedHash(t, c, call.orphans[0], redistest.Fields("orphan1", 2))
	cmds(t, c,
		[]string{"SET", call.prevs[0], "stale"},
		[]string{"SET", call.prevs[2], "stale"},
		[]string{"SET", call.prevs[5], "stale"},
		[]string{"SET", call.drops[0], "stale"},
		[]string{"HSET", call.metas[0], "seq", "7", "gen", "7", "at", "1", "prev", "6", "prev_until", "2"},
	)
	return call
}

// wantPublished checks the live keys after a seedPublish call that
// succeeded: each target renamed (fields, no TTL: C23) or emptied (C24),
// the temp keys and the orphans gone (C53+), the drops deleted.
func wantPublished(t *testing.T, c rueidis.Client, call publishCall) {
	t.Helper()
	redistest.WantHash(t, c, call.lives[0], redistest.Fields("new1", 3))
	redistest.WantAbsent(t, c, call.lives[1])
	redistest.WantHash(t, c, call.lives[2], redistest.Fields("new3", 3))
	redistest.WantHash(t, c, call.lives[3], redistest.Fields("new4", 3))
	for _, k := range slices.Concat(call.temps, call.orphans, call.drops) {
		redistest.WantAbsent(t, c, k)
	}
}

func TestScriptPublish(t *testing.T) {
	// publish.lua's successes (C22-C24, C53+): {1, o..., g..., 0}: every
	// target renamed (1), or its live key deleted for an absent temp key
	// (2); the orphans and drops deleted, the metas advanced; and, fenced,
	// the receipt set to the token with its TTL. The locks and the record
	// are neither extended nor released (C31).
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		t.Run("keep previous", func(t *testing.T) {
			// The old value of every live key and orphan is renamed to its
			// prev key with the TTL; a live key or orphan that is absent
			// leaves no prev, and the stale prev is gone. The metas record
			// the generation they replace, until when it is kept, and when.
			p := casePrefix(t, d.Other, d.Prefix)
			call := seedPublish(t, d.Other, p)
			before := redistest.Snapshot(t, d.Other, p)
			wantReply(t, call.run(t, d.Client), 1, 1, 2, 1, 1, 8, 1, 0)
			wantPublished(t, d.Other, call)
			for i, old := range []string{"old1", "old2", "", "old4", "orphan1", ""} {
				prev := call.prevs[i]
				if old == "" {
					redistest.WantAbsent(t, d.Other, prev)
					continue
				}
				n := 8
				if old == "orphan1" {
					n = 2
				}
				wantFields(t, d.Other, prev, redistest.Fields(old, n))
				redistest.WantPTTL(t, d.Other, prev, 500*time.Second, 600*time.Second)
			}
			redistest.WantHash(t, d.Other, call.metas[0], map[string]string{"seq": "8", "gen": "8", "at": scriptNow, "prev": "7", "prev_until": prevUntil})
			redistest.WantHash(t, d.Other, call.metas[1], map[string]string{"seq": "1", "gen": "1", "at": scriptNow, "prev": "", "prev_until": prevUntil})
			redistest.WantString(t, d.Other, call.receipts[0], scriptTok)
			redistest.WantPTTL(t, d.Other, call.receipts[0], 20*time.Second, 30*time.Second)
			wantUntouched(t, d.Other, p, before, slices.Concat(call.receipts, call.temps, call.lives, call.orphans, call.prevs, call.drops, call.metas)...)
		})

		t.Run("no keep", func(t *testing.T) {
			// The old values are UNLINKed (C23+); the prev keys of an
			// earlier publish, not in the call, stay; the metas lose their
			// prev fields.
			p := casePrefix(t, d.Other, d.Prefix)
			call := seedPublish(t, d.Other, p)
			call.prevs, call.keep = nil, "0"
			before := redistest.Snapshot(t, d.Other, p)
			wantReply(t, call.run(t, d.Client), 1, 1, 2, 1, 1, 8, 1, 0)
			wantPublished(t, d.Other, call)
			redistest.WantHash(t, d.Other, call.metas[0], map[string]string{"seq": "8", "gen": "8", "at": scriptNow})
			redistest.WantHash(t, d.Other, call.metas[1], map[string]string{"seq": "1", "gen": "1", "at": scriptNow})
			redistest.WantString(t, d.Other, call.receipts[0], scriptTok)
			redistest.WantPTTL(t, d.Other, call.receipts[0], 20*time.Second, 30*time.Second)
			wantUntouched(t, d.Other, p, before, slices.Concat(call.receipts, call.temps, call.lives, call.orphans, call.drops, call.metas)...)
		})

		t.Run("unfenced", func(t *testing.T) {
			// An empty token, no locks, no record and no receipt: nothing
			// is checked but the temp keys, and no receipt is written.
			p := casePrefix(t, d.Other, d.Prefix)
			call := seedPublish(t, d.Other, p)
			cmds(t, d.Other, []string{"SET", call.locks[1], thiefTok, "EX", "40"})
			receipt := call.receipts[0]
			call.token, call.locks, call.records, call.receipts, call.ctls = "", nil, nil, nil, nil
			before := redistest.Snapshot(t, d.Other, p)
			wantReply(t, call.run(t, d.Client), 1, 1, 2, 1, 1, 8, 1, 0)
			wantPublished(t, d.Other, call)
			redistest.WantAbsent(t, d.Other, receipt)
			wantUntouched(t, d.Other, p, before, slices.Concat(call.temps, call.lives, call.orphans, call.prevs, call.drops, call.metas)...)
		})

		t.Run("another run's cancel", func(t *testing.T) {
			// A cancel in requests written for another token is not this
			// run's (C70): published.
			p := casePrefix(t, d.Other, d.Prefix)
			call := seedPublish(t, d.Other, p)
			cmds(t, d.Other, []string{"HSET", call.ctls[0], "token", thiefTok, "cancel", "1"})
			wantReply(t, call.run(t, d.Client), 1, 1, 2, 1, 1, 8, 1, 0)
			wantPublished(t, d.Other, call)
		})

		t.Run("record ahead", func(t *testing.T) {
			// The record holds more batches than the run counted: published.
			p := casePrefix(t, d.Other, d.Prefix)
			call := seedPublish(t, d.Other, p)
			cmds(t, d.Other, []string{"HSET", call.records[0], "batches", "9"})
			wantReply(t, call.run(t, d.Client), 1, 1, 2, 1, 1, 8, 1, 0)
			wantPublished(t, d.Other, call)
		})

		t.Run("empty", func(t *testing.T) {
			// C24: the temp key is absent and was never populated: the live
			// key is deleted, and the fenced publish leaves its receipt.
			p := casePrefix(t, d.Other, d.Prefix)
			full := seedPublish(t, d.Other, p)
			call := publishCall{token: scriptTok, locks: full.locks, receipts: full.receipts,
				temps: full.temps[1:2], lives: full.lives[1:2], flags: "0", batches: "0", keep: "0", receiptTTL: "30", now: scriptNow}
			before := redistest.Snapshot(t, d.Other, p)
			wantReply(t, call.run(t, d.Client), 1, 2, 0)
			redistest.WantAbsent(t, d.Other, call.lives[0])
			redistest.WantString(t, d.Other, call.receipts[0], scriptTok)
			wantUntouched(t, d.Other, p, before, call.lives[0], call.receipts[0])
		})

		t.Run("empty and idempotent", func(t *testing.T) {
			// C24: neither key exists; the empty path succeeds and, unfenced,
			// writes nothing.
			p := casePrefix(t, d.Other, d.Prefix)
			full := seedPublish(t, d.Other, p)
			call := publishCall{temps: full.temps[1:2], lives: full.lives[2:3], flags: "0", batches: "0", keep: "600", receiptTTL: "30", now: scriptNow}
			before := redistest.Snapshot(t, d.Other, p)
			wantReply(t, call.run(t, d.Client), 1, 2, 0)
			wantUntouched(t, d.Other, p, before)
		})

		t.Run("no targets", func(t *testing.T) {
			// Only drops and a meta: the reply is the generation alone.
			p := casePrefix(t, d.Other, d.Prefix)
			full := seedPublish(t, d.Other, p)
			call := publishCall{token: scriptTok, locks: full.locks, drops: full.drops[:1], metas: full.metas[:1],
				batches: "0", keep: "0", receiptTTL: "30", now: scriptNow}
			before := redistest.Snapshot(t, d.Other, p)
			wantReply(t, call.run(t, d.Client), 1, 8, 0)
			redistest.WantAbsent(t, d.Other, call.drops[0])
			redistest.WantHash(t, d.Other, call.metas[0], map[string]string{"seq": "8", "gen": "8", "at": scriptNow})
			wantUntouched(t, d.Other, p, before, call.drops[0], call.metas[0])
		})
	})
}

func TestScriptPublishFailsClosed(t *testing.T) {
	// publish.lua's failures: in this order (C22), {-1, i} for the first
	// lock not ours (C27), checked before the records and the temp keys
	// (C28); {-15, i} for the first record gone or without a token, and
	// {-14, i} for one with another token (C74); {-3, batches} when the
	// first record holds fewer batches than the run wrote; {-17} when the
	// operator's requests for the run hold a cancel (C78); {0, i} for the
	// first temp key flagged populated that is
	// gone (C26); {-4, i} for one flagged populated with a TTL that has
	// none (re-created by a later write, C56); and, between the record and the
	// temp keys, {-6, i} for the first meta that is neither absent nor a
	// hash whose seq is a number. On every one of them nothing was
	// written: every key byte-identical, no receipt, so that what the
	// caller keeps for diagnosis (C29) is intact.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		for _, tt := range []struct {
			name  string
			setup func(call *publishCall) [][]string
			want  []any
		}{
			{"second lock stolen", func(c *publishCall) [][]string {
				return [][]string{{"SET", c.locks[1], thiefTok, "EX", "40"}}
			}, reply(-1, 2)},
			{"first lock stolen", func(c *publishCall) [][]string {
				return [][]string{{"SET", c.locks[0], thiefTok, "EX", "40"}}
			}, reply(-1, 1)},
			{"second lock expired", func(c *publishCall) [][]string {
				return [][]string{{"DEL", c.locks[1]}}
			}, reply(-1, 2)},
			{"first lock expired", func(c *publishCall) [][]string {
				return [][]string{{"DEL", c.locks[0]}}
			}, reply(-1, 1)},
			{"lock checked first", func(c *publishCall) [][]string {
				// C28: the record lost batches and a populated temp key
				// is gone, and still the fence answers.
				return [][]string{{"SET", c.locks[1], thiefTok, "EX", "40"}, {"HSET", c.records[0], "batches", "1"}, {"DEL", c.temps[0]}}
			}, reply(-1, 2)},
			{"writes lost", func(c *publishCall) [][]string {
				return [][]string{{"HSET", c.records[0], "batches", "3"}}
			}, reply(-3, 3)},
			{"record without batches", func(c *publishCall) [][]string {
				return [][]string{{"HDEL", c.records[0], "batches"}}
			}, reply(-3, 0)},
			{"record gone", func(c *publishCall) [][]string {
				return [][]string{{"DEL", c.records[0]}}
			}, reply(-15, 1)},
			{"second record gone", func(c *publishCall) [][]string {
				return [][]string{{"DEL", c.records[1]}}
			}, reply(-15, 2)},
			{"record without its token", func(c *publishCall) [][]string {
				return [][]string{{"HDEL", c.records[0], "token"}}
			}, reply(-15, 1)},
			{"record forged", func(c *publishCall) [][]string {
				return [][]string{{"HSET", c.records[0], "token", thiefTok}}
			}, reply(-14, 1)},
			{"second record forged", func(c *publishCall) [][]string {
				return [][]string{{"HSET", c.records[1], "token", thiefTok}}
			}, reply(-14, 2)},
			{"records checked before the batches", func(c *publishCall) [][]string {
				return [][]string{{"HSET", c.records[1], "token", thiefTok}, {"HSET", c.records[0], "batches", "3"}}
			}, reply(-14, 2)},
			{"cancelled", func(c *publishCall) [][]string {
				return [][]string{{"HSET", c.ctls[0], "cancel", "1"}}
			}, reply(-17)},
			{"batches checked before the cancel", func(c *publishCall) [][]string {
				return [][]string{{"HSET", c.ctls[0], "cancel", "1"}, {"HSET", c.records[0], "batches", "3"}}
			}, reply(-3, 3)},
			{"cancel checked before the metas", func(c *publishCall) [][]string {
				return [][]string{{"HSET", c.ctls[0], "cancel", "1"}, {"RPUSH", c.metas[1], "7"}}
			}, reply(-17)},
			{"record checked before the temp keys", func(c *publishCall) [][]string {
				return [][]string{{"HSET", c.records[0], "batches", "3"}, {"DEL", c.temps[0]}}
			}, reply(-3, 3)},
			{"temp lost, flag 2", func(c *publishCall) [][]string {
				return [][]string{{"DEL", c.temps[0]}}
			}, reply(0, 1)},
			{"temp lost, flag 1", func(c *publishCall) [][]string {
				return [][]string{{"DEL", c.temps[2]}}
			}, reply(0, 3)},
			{"temp re-created, flag 2", func(c *publishCall) [][]string {
				return [][]string{{"PERSIST", c.temps[0]}}
			}, reply(-4, 1)},
			{"first failing temp answers", func(c *publishCall) [][]string {
				c.flags = "2012"
				return [][]string{{"DEL", c.temps[2]}}
			}, reply(0, 3)},
			{"re-created before a lost one", func(c *publishCall) [][]string {
				c.flags = "2012"
				return [][]string{{"PERSIST", c.temps[0]}, {"DEL", c.temps[2]}}
			}, reply(-4, 1)},
			{"a later temp re-created", func(c *publishCall) [][]string {
				c.flags = "2012" // temp:4 has no TTL
				return nil
			}, reply(-4, 4)},
			// A meta that is not keyswap's hash would fail its HINCRBY
			// after every rename.
			{"meta a string", func(c *publishCall) [][]string {
				return [][]string{{"DEL", c.metas[0]}, {"SET", c.metas[0], "7"}}
			}, reply(-6, 1)},
			{"second meta a list", func(c *publishCall) [][]string {
				return [][]string{{"RPUSH", c.metas[1], "7"}}
			}, reply(-6, 2)},
			{"seq not a number", func(c *publishCall) [][]string {
				return [][]string{{"HSET", c.metas[0], "seq", "seven"}}
			}, reply(-6, 1)},
			{"seq not an integer", func(c *publishCall) [][]string {
				return [][]string{{"HSET", c.metas[0], "seq", "7.5"}}
			}, reply(-6, 1)},
			{"record checked before the metas", func(c *publishCall) [][]string {
				return [][]string{{"HSET", c.records[0], "batches", "3"}, {"RPUSH", c.metas[1], "7"}}
			}, reply(-3, 3)},
			{"metas checked before the temp keys", func(c *publishCall) [][]string {
				return [][]string{{"RPUSH", c.metas[1], "7"}, {"DEL", c.temps[0]}}
			}, reply(-6, 2)},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, d.Other, d.Prefix)
				call := seedPublish(t, d.Other, p)
				cmds(t, d.Other, tt.setup(&call)...)
				before := redistest.Snapshot(t, d.Other, p)
				wantReply(t, call.run(t, d.Client), tt.want...)
				wantUntouched(t, d.Other, p, before)
			})
		}
	})
}

// stealLock is a setup of TestScriptPublishRefused: another run takes the
// first lock.
func stealLock(c *publishCall) [][]string {
	return [][]string{{"SET", c.locks[0], thiefTok, "EX", "40"}}
}

// withoutKeep is a setup of TestScriptPublishRefused: a publish that keeps
// no old value, whose metas lose their prev fields (HDEL).
func withoutKeep(c *publishCall) [][]string {
	c.prevs, c.keep = nil, "0"
	return nil
}

func TestScriptPublishRefused(t *testing.T) {
	// publish.lua for a user that may not run one of the commands the
	// publish sends on one of its keys: {-2, cmd, key}, checked before
	// everything else (C22), the lock included, and nothing written. Each
	// case denies the command of one check of the script; a selector gives
	// the command back on the keys of the sections checked before, so that
	// the check of a later section answers. EVAL itself is allowed: the
	// root rules keep every key.
	forEachACLTarget(t, func(t *testing.T, a aclTarget) {
		for _, tt := range []struct {
			name    string
			deny    string                          // the command denied by the root rules
			allowOn []string                        // the key patterns of a selector that allows deny again
			setup   func(c *publishCall) [][]string // changes the call, and seeds more as the default user
			want    func(call publishCall) []any
		}{
			{"GET on a lock", "get", nil, nil, func(c publishCall) []any { return reply(-2, "GET", c.locks[0]) }},
			{"HGET on the record", "hget", nil, nil, func(c publishCall) []any { return reply(-2, "HGET", c.records[0]) }},
			{"HGET on the second record", "hget", []string{"lock:1:run"}, nil, func(c publishCall) []any { return reply(-2, "HGET", c.records[1]) }},
			{"HMGET on the record", "hmget", nil, nil, func(c publishCall) []any { return reply(-2, "HMGET", c.records[0]) }},
			{"HMGET on the requests", "hmget", []string{"lock:*:run"}, nil, func(c publishCall) []any { return reply(-2, "HMGET", c.ctls[0]) }},
			{"SET on the receipt", "set", nil, nil, func(c publishCall) []any { return reply(-2, "SET", c.receipts[0]) }},
			{"PTTL on a temp key", "pttl", nil, nil, func(c publishCall) []any { return reply(-2, "PTTL", c.temps[0]) }},
			{"UNLINK on a live key", "unlink", nil, nil, func(c publishCall) []any { return reply(-2, "UNLINK", c.lives[0]) }},
			{"PERSIST on a live key", "persist", nil, nil, func(c publishCall) []any { return reply(-2, "PERSIST", c.lives[0]) }},
			{"UNLINK on an orphan", "unlink", []string{"live:*"}, nil, func(c publishCall) []any { return reply(-2, "UNLINK", c.orphans[0]) }},
			{"UNLINK on a prev", "unlink", []string{"live:*", "orphan:*"}, nil, func(c publishCall) []any { return reply(-2, "UNLINK", c.prevs[0]) }},
			{"PEXPIRE on a prev", "pexpire", nil, nil, func(c publishCall) []any { return reply(-2, "PEXPIRE", c.prevs[0]) }},
			{"UNLINK on a drop", "unlink", []string{"live:*", "orphan:*", "prev:*"}, nil, func(c publishCall) []any { return reply(-2, "UNLINK", c.drops[0]) }},
			{"HINCRBY on a meta", "hincrby", nil, nil, func(c publishCall) []any { return reply(-2, "HINCRBY", c.metas[0]) }},
			{"HSET on a meta", "hset", nil, nil, func(c publishCall) []any { return reply(-2, "HSET", c.metas[0]) }},
			{"RENAME of a temp key", "rename", nil, nil, func(c publishCall) []any { return reply(-2, "RENAME", c.temps[0]) }},
			{"RENAME of a live key to its prev", "rename", []string{"temp:*", "live:*"}, nil, func(c publishCall) []any { return reply(-2, "RENAME", c.lives[0]) }},
			{"RENAME of an orphan to its prev", "rename", []string{"temp:*", "live:*", "prev:*"}, nil, func(c publishCall) []any { return reply(-2, "RENAME", c.orphans[0]) }},
			{"rights before the lock", "rename", nil, stealLock, func(c publishCall) []any { return reply(-2, "RENAME", c.temps[0]) }},
			// The commands the script sent before their rights were
			// checked. EXISTS, on every live key and orphan, is sent
			// only to keep their old values, after the prev's UNLINK.
			{"EXISTS on a live key", "exists", nil, nil, func(c publishCall) []any { return reply(-2, "EXISTS", c.lives[0]) }},
			{"EXISTS on an orphan", "exists", []string{"live:*"}, nil, func(c publishCall) []any { return reply(-2, "EXISTS", c.orphans[0]) }},
			{"EXISTS before the lock", "exists", nil, stealLock, func(c publishCall) []any { return reply(-2, "EXISTS", c.lives[0]) }},
			{"TYPE on a meta", "type", nil, nil, func(c publishCall) []any { return reply(-2, "TYPE", c.metas[0]) }},
			{"HGET on a meta", "hget", []string{"lock:*:run"}, nil, func(c publishCall) []any { return reply(-2, "HGET", c.metas[0]) }},
			{"HDEL on a meta", "hdel", nil, withoutKeep, func(c publishCall) []any { return reply(-2, "HDEL", c.metas[0]) }},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, a.admin, a.prefix)
				c := a.srv.ClientAs(t, "ks-"+t.Name(), deniedRules(p, tt.deny, tt.allowOn...)...)
				call := seedPublish(t, a.admin, p)
				if tt.setup != nil {
					cmds(t, a.admin, tt.setup(&call)...)
				}
				before := redistest.Snapshot(t, a.admin, p)
				wantReply(t, call.run(t, c), tt.want(call)...)
				wantUntouched(t, a.admin, p, before)
			})
		}
	})
}

func TestScriptUnknownCommand(t *testing.T) {
	// A command renamed or disabled with rename-command is unknown to
	// redis.acl_check_cmd: publish.lua answers {-5, cmd} for the first one
	// it would send, acquire.lua for the first of its ARGV pairs, and
	// nothing is written. A publish that sends no such command runs. On
	// servers of the test's own, started with --rename-command.
	for _, tt := range []struct {
		name    string
		args    []string
		command string
	}{
		{"RENAME disabled", []string{"--rename-command", "RENAME", ""}, "RENAME"},
		{"UNLINK renamed", []string{"--rename-command", "UNLINK", "ks-unlink"}, "UNLINK"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.OwnServer(t, tt.args...)
			c := srv.Client(t)
			p := casePrefix(t, c, "ks:")

			call := seedPublish(t, c, p)
			before := redistest.Snapshot(t, c, p)
			wantReply(t, call.run(t, c), -5, tt.command)
			wantUntouched(t, c, p, before)

			locks, records, logs := runKeys(p+"acquire:", 1)
			args := append([]string{scriptTok, "100", "1", "2", "false", "HINCRBY", records[0], tt.command, p + "temp:1"}, recordArgs(locks)...)
			wantReply(t, evalScript(t, c, "acquire", runKS(locks, records, logs), args), -5, tt.command)
			wantUntouched(t, c, p, before)

			// Only a meta: no RENAME, no UNLINK.
			only := publishCall{token: scriptTok, locks: call.locks, metas: call.metas[:1], batches: "0", keep: "0", receiptTTL: "30", now: scriptNow}
			wantReply(t, only.run(t, c), 1, 8, 0)
		})
	}
}

// withoutACLCheck is a prelude that hides redis.acl_check_cmd from the
// script that follows it, as on a server older than Redis 7, which has
// none: the script's own text is unchanged.
const withoutACLCheck = `local real = redis
local redis = setmetatable({}, {__index = function(_, k) if k ~= 'acl_check_cmd' then return real[k] end end})
`

func TestScriptsWithoutACLCheck(t *testing.T) {
	// Where the server has no redis.acl_check_cmd (before Redis 7), acquire
	// and publish skip the rights checks and run as they would for a user
	// with every right.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		p := casePrefix(t, d.Other, d.Prefix)
		call := seedPublish(t, d.Other, p+"publish:")
		got := evalSource(t, d.Client, withoutACLCheck+redistest.ScriptNamed("publish").Source, call.keys(), call.args())
		wantReply(t, got, 1, 1, 2, 1, 1, 8, 1, 0)
		wantPublished(t, d.Other, call)

		locks, records, logs := runKeys(p+"acquire:", 1)
		args := append([]string{scriptTok, "100", "1", "1", "false", "NOSUCHCOMMAND", "key"}, recordArgs(locks, "owner", "me")...)
		got = evalSource(t, d.Client, withoutACLCheck+redistest.ScriptNamed("acquire").Source, runKS(locks, records, logs), args)
		wantReply(t, got, 1)
		redistest.WantLock(t, d.Other, locks[0], scriptTok, 100*time.Second)
		wantFields(t, d.Other, records[0], map[string]string{"token": scriptTok, "owner": "me"})
	})
}

func TestScriptControl(t *testing.T) {
	// control.lua (C70, C74, C78): {1} writes the request into the run's
	// requests, next to its lock, with the run's token and the lock's PTTL,
	// replacing those of another token; the record is not written. {-1}
	// when the lock, or the record, does not hold the token the operator
	// read; {-16} when the run's receipt (read or not) holds it: the run
	// already published. Either refusal writes nothing.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		seed := func(t *testing.T, p string) (ks []string) {
			lock := p + "lock:1"
			ks = []string{lock, lock + ":run", lock + ":ctl", lock + ":done"}
			cmds(t, d.Other,
				[]string{"SET", lock, scriptTok, "EX", "50"},
				[]string{"HSET", ks[1], "token", scriptTok, "phase", "building"},
				[]string{"EXPIRE", ks[1], "50"},
			)
			return ks
		}
		t.Run("recorded", func(t *testing.T) {
			p := casePrefix(t, d.Other, d.Prefix)
			ks := seed(t, p)
			cmds(t, d.Other, []string{"HSET", ks[2], "token", thiefTok, "cancel", "1"})
			before := redistest.Snapshot(t, d.Other, p)
			wantReply(t, evalScript(t, d.Client, "control", ks, []string{scriptTok, "max_rate", "250", "paused", "1"}), 1)
			wantFields(t, d.Other, ks[2], map[string]string{"token": scriptTok, "max_rate": "250", "paused": "1"})
			redistest.WantPTTL(t, d.Other, ks[2], 40*time.Second, 50*time.Second)
			// A second request adds to the first.
			wantReply(t, evalScript(t, d.Client, "control", ks, []string{scriptTok, "cancel", "1"}), 1)
			wantFields(t, d.Other, ks[2], map[string]string{"token": scriptTok, "max_rate": "250", "paused": "1", "cancel": "1"})
			wantUntouched(t, d.Other, p, before, ks[2])
		})
		for _, tt := range []struct {
			name  string
			setup func(ks []string) [][]string
			want  []any
		}{
			{"another run's lock", func(ks []string) [][]string { return [][]string{{"SET", ks[0], thiefTok, "EX", "50"}} }, reply(-1)},
			{"no lock", func(ks []string) [][]string { return [][]string{{"DEL", ks[0]}} }, reply(-1)},
			{"a record of another token", func(ks []string) [][]string { return [][]string{{"HSET", ks[1], "token", thiefTok}} }, reply(-1)},
			{"no record", func(ks []string) [][]string { return [][]string{{"DEL", ks[1]}} }, reply(-1)},
			{"published", func(ks []string) [][]string { return [][]string{{"SET", ks[3], scriptTok, "EX", "30"}} }, reply(-16)},
			{"published, receipt read", func(ks []string) [][]string {
				return [][]string{{"SET", ks[3], "read:" + scriptTok, "EX", "30"}, {"DEL", ks[0]}}
			}, reply(-16)},
			{"another run's receipt", func(ks []string) [][]string {
				return [][]string{{"SET", ks[3], thiefTok, "EX", "30"}, {"DEL", ks[0]}}
			}, reply(-1)},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, d.Other, d.Prefix)
				ks := seed(t, p)
				cmds(t, d.Other, tt.setup(ks)...)
				before := redistest.Snapshot(t, d.Other, p)
				wantReply(t, evalScript(t, d.Client, "control", ks, []string{scriptTok, "cancel", "1"}), tt.want...)
				wantUntouched(t, d.Other, p, before)
			})
		}
	})
}

func TestScriptReplay(t *testing.T) {
	// replay.lua, which a catch-up sends with EVAL inside each of its
	// transactions (C76): the ops in order, each on its temp key; HDELIF
	// removes each field only while it holds the value named, ZREMIF each
	// member only while it has the score named (+Inf and -Inf as the Go
	// side writes them, the scores ZSCORE replies compared as numbers),
	// whatever the ops before them wrote. It replies the number of ops.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		p := casePrefix(t, d.Other, d.Prefix)
		h, z, s := p+"h", p+"z", p+"s"
		cmds(t, d.Other,
			[]string{"HSET", h, "a", "1", "b", "2", "c", ""},
			[]string{"ZADD", z, "1.5", "a", "+inf", "b", "-inf", "c", "1e+21", "d", "0.1", "e"},
		)
		ops := []protocol.Op{
			{Cmd: "HDELIF", Key: h, Args: []string{"a", "1", "b", "9", "c", "", "missing", "x"}},
			{Cmd: "HSET", Key: h, Args: []string{"x", "7"}},
			{Cmd: "HDELIF", Key: h, Args: []string{"x", "7"}}, // removes what the op before it wrote
			{Cmd: "ZREMIF", Key: z, Args: []string{"1.5", "a", "+Inf", "b", "1", "c", "1e+21", "d", "0.1", "e", "1", "missing"}},
			{Cmd: "SADD", Key: s, Args: []string{"m", "n"}},
			{Cmd: "SREM", Key: s, Args: []string{"m"}},
		}
		temps, at := []string{h, z, s}, []int{0, 0, 0, 1, 2, 2}
		n, err := redistest.Do(t, d.Client, protocol.ReplayCommand(d.Client.B(), temps, ops, at)).AsInt64()
		if err != nil || n != int64(len(ops)) {
			t.Fatalf("replay: %d, %v; want %d", n, err, len(ops))
		}
		wantFields(t, d.Other, h, map[string]string{"b": "2"})
		wantScores(t, d.Other, z, map[string]float64{"c": math.Inf(-1)})
		wantMembers(t, d.Other, s, "n")
		ops = []protocol.Op{{Cmd: "ZREMIF", Key: z, Args: []string{"-Inf", "c"}}}
		if n, err := redistest.Do(t, d.Client, protocol.ReplayCommand(d.Client.B(), []string{z}, ops, []int{0})).AsInt64(); err != nil || n != 1 {
			t.Fatalf("replay: %d, %v; want 1", n, err)
		}
		redistest.WantAbsent(t, d.Other, z) // emptied
	})
}

func TestScriptAcquireChecksEval(t *testing.T) {
	// acquire.lua checks EVAL with a script and the key it would be given:
	// redis-server 7.0.15 crashes (SIGSEGV in getKeysUsingKeySpecs) when
	// redis.acl_check_cmd is asked about EVAL without its arguments, for a
	// user with key patterns. Such a user with EVAL runs the acquire ({1});
	// one without it, or without the key, is refused ({-2, 'EVAL', key});
	// and the server is still up.
	forEachACLTarget(t, func(t *testing.T, a aclTarget) {
		for _, tt := range []struct {
			name  string
			rules func(p string) []string
			key   func(p string) string
			want  func(p string) []any
		}{
			{"allowed", func(p string) []string { return []string{"~" + p + "*", "+@all"} },
				func(p string) string { return p + "temp:1" }, func(string) []any { return reply(1) }},
			{"allowed, no key", func(p string) []string { return []string{"~" + p + "*", "+@all"} },
				func(p string) string { return "" }, func(string) []any { return reply(1) }},
			{"denied", func(p string) []string { return []string{"~" + p + "*", "+@all", "-eval"} },
				func(p string) string { return p + "temp:1" }, func(p string) []any { return reply(-2, "EVAL", p+"temp:1") }},
			{"a key outside the patterns", func(p string) []string { return []string{"~" + p + "lock:*", "+@all"} },
				func(p string) string { return p + "temp:1" }, func(p string) []any { return reply(-2, "EVAL", p+"temp:1") }},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, a.admin, a.prefix)
				c := a.srv.ClientAs(t, "ks-"+t.Name(), tt.rules(p)...)
				locks, records, logs := runKeys(p, 1)
				args := append([]string{scriptTok, "100", "1", "1", "false", "EVAL", tt.key(p)}, recordArgs(locks)...)
				wantReply(t, evalScript(t, c, "acquire", runKS(locks, records, logs), args), tt.want(p)...)
				if err := a.admin.Do(redistest.Ctx(t), a.admin.B().Ping().Build()).Error(); err != nil {
					t.Fatalf("PING after the acquire: %v", err)
				}
			})
		}
	})
}

func TestScriptReadLog(t *testing.T) {
	// readlog.lua, the catch-up's read (C73), and the LRANGE sent right
	// after it: the log's length, and the record's logged, work and token
	// (nil where absent), in one step, then the entries from one index to
	// another, of those below that length; nothing written.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		p := casePrefix(t, d.Other, d.Prefix)
		log, rec := p+"lock:1:log", p+"lock:1:run"
		cmds(t, d.Other, []string{"RPUSH", log, "a", "b", "c"}, []string{"HSET", rec, "token", scriptTok, "logged", "3", "work", "9"})
		before := redistest.Snapshot(t, d.Other, p)
		read := func(log, rec string, start, stop int64) rueidis.Commands {
			script, lrange := protocol.ReadLogCommands(d.Client.B(), log, rec, start, stop)
			return rueidis.Commands{script, lrange}
		}
		res := d.Client.DoMulti(redistest.Ctx(t), read(log, rec, 1, 5)...)
		entries, c, work, token, err := protocol.ReadLogReply(res[0], res[1], 1)
		if err != nil || !slices.Equal(entries, []string{"b", "c"}) || c != (protocol.LogCount{Len: 3, Logged: 3}) || work != 9 || token != scriptTok {
			t.Errorf("got %q, %+v, %d, %q, %v", entries, c, work, token, err)
		}
		wantUntouched(t, d.Other, p, before)
		res = d.Client.DoMulti(redistest.Ctx(t), read(p+"none:log", p+"none:run", 0, 9)...)
		entries, c, work, token, err = protocol.ReadLogReply(res[0], res[1], 0)
		if err != nil || len(entries) != 0 || c != (protocol.LogCount{}) || work != 0 || token != "" {
			t.Errorf("no log, no record: got %q, %+v, %d, %q, %v", entries, c, work, token, err)
		}
		// An entry appended after the script read the length waits for
		// the next read: the script's reply with a longer LRANGE's.
		res = d.Client.DoMulti(redistest.Ctx(t), read(log, rec, 0, 9)...)
		cmds(t, d.Other, []string{"RPUSH", log, "d"})
		late := d.Client.Do(redistest.Ctx(t), d.Client.B().Lrange().Key(log).Start(0).Stop(9).Build())
		if entries, c, _, _, err = protocol.ReadLogReply(res[0], late, 0); err != nil || !slices.Equal(entries, []string{"a", "b", "c"}) || c.Len != 3 {
			t.Errorf("an entry appended after the script: got %q, %+v, %v; want a, b, c of 3", entries, c, err)
		}
	})
}

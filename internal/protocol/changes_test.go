package protocol_test

import (
	"context"
	"errors"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// The raw tests of the online scripts: apply.lua, which applies a change to
// the live keys and logs it for the run in progress, and the tail of
// publish.lua, which replays what a run's catch-up left in its logs onto the
// live keys right after the renames. As in scripts_test.go, each case runs
// the script text as embedded in the library against a real redis-server,
// the standalone server and the 3-master cluster, and asserts its exact
// reply and the exact state of every key under the case's prefix
// afterwards; a refusal leaves every key byte-identical.

// lockOp is one op of an apply call and the lock (1-based) it is logged
// for.
type lockOp struct {
	lock int
	op   protocol.Op
}

// on returns op as an op of lock i.
func on(i int, cmd, key string, args ...string) lockOp {
	return lockOp{lock: i, op: protocol.Op{Cmd: cmd, Key: key, Args: args}}
}

// applyCall lays out one call of apply.lua as protocol.Changes.Apply does: KEYS the
// locks, their records, their logs, then every live key in the order of its
// first op, then a pointer per lock (none holds a claim); ARGV n, the
// bound, the number of ops, no owner stamp, then per op its lock's index,
// its key's index after the 3n, the command, the count of args and the
// args.
func applyCall(locks []string, bound int, ops ...lockOp) (ks, args []string) {
	n := len(locks)
	ks = append(ks, locks...)
	for _, l := range locks {
		ks = append(ks, keys.RecordKey(l))
	}
	for _, l := range locks {
		ks = append(ks, keys.LogKey(l))
	}
	args = []string{strconv.Itoa(n), strconv.Itoa(bound), strconv.Itoa(len(ops)), "0"}
	index := map[string]int{}
	for _, o := range ops {
		k, ok := index[o.op.Key]
		if !ok {
			ks = append(ks, o.op.Key)
			k = len(ks) - 3*n
			index[o.op.Key] = k
		}
		args = append(args, strconv.Itoa(o.lock), strconv.Itoa(k), o.op.Cmd, strconv.Itoa(len(o.op.Args)))
		args = append(args, o.op.Args...)
	}
	for _, l := range locks {
		ks = append(ks, keys.PointerKey(l, false))
	}
	return ks, args
}

// runApply runs apply.lua on c and returns its reply.
func runApply(t *testing.T, c rueidis.Client, locks []string, bound int, ops ...lockOp) []any {
	t.Helper()
	ks, args := applyCall(locks, bound, ops...)
	return evalScript(t, c, "apply", ks, args)
}

// opsOf returns the ops of lock i among ops, in order: what apply.lua logs
// for it.
func opsOf(i int, ops []lockOp) []protocol.Op {
	var out []protocol.Op
	for _, o := range ops {
		if o.lock == i {
			out = append(out, o.op)
		}
	}
	return out
}

// holdRun seeds, as the acquire script leaves them, a run in progress that
// holds lock ("<p>lock:<i>"): the lock with scriptTok for ttl, and its
// record with the token, the schema's version, the mode "rebuild", and as
// its key the family "<p>live", whose buckets are the live keys of the
// apply cases.
func holdRun(t *testing.T, c rueidis.Client, lock string, ttl time.Duration) {
	t.Helper()
	ms := strconv.FormatInt(ttl.Milliseconds(), 10)
	p := lock[:strings.LastIndex(lock, "lock:")]
	cmds(t, c,
		[]string{"SET", lock, scriptTok, "PX", ms},
		[]string{"HSET", keys.RecordKey(lock), "v", protocol.RecordVersion, "token", scriptTok, "mode", protocol.ModeRebuild,
			"keys", protocol.EncodeKeys([]string{p + "live"}), "families", "1", "batches", "0"},
		[]string{"PEXPIRE", keys.RecordKey(lock), ms},
	)
	// A record whose keys are longer than hash-max-listpack-value is a
	// hash table, which may still be rehashing: each lookup moves it one
	// step, and changes what DUMP writes. Finish it, so that a DUMP before
	// and after a script that only reads it compares equal.
	for range 32 {
		cmds(t, c, []string{"HGET", keys.RecordKey(lock), "token"})
	}
}

// wantCounts fails t unless lock's record counts logged entries of work.
func wantCounts(t *testing.T, c rueidis.Client, lock string, logged, work int) {
	t.Helper()
	got, err := redistest.Do(t, c, c.B().Hmget().Key(keys.RecordKey(lock)).Field("logged", "work").Build()).ToArray()
	if err != nil || len(got) != 2 {
		t.Fatalf("HMGET %s logged work: %v, %v", keys.RecordKey(lock), got, err)
	}
	want := []string{strconv.Itoa(logged), strconv.Itoa(work)}
	for i, m := range got {
		s, _ := m.ToString()
		if m.IsNil() {
			s = "0"
		}
		if s != want[i] {
			t.Errorf("%s: %s = %s, want %s", keys.RecordKey(lock), []string{"logged", "work"}[i], s, want[i])
		}
	}
}

// workOf returns the work of ops, as the apply script counts it.
func workOf(ops []protocol.Op) int {
	w := 0
	for _, o := range ops {
		w += int(o.Work())
	}
	return w
}

// logEntries returns the entries of the list key, in order.
func logEntries(t *testing.T, c rueidis.Client, key string) []string {
	t.Helper()
	es, err := redistest.Do(t, c, c.B().Lrange().Key(key).Start(0).Stop(-1).Build()).AsStrSlice()
	if err != nil {
		t.Fatalf("LRANGE %s: %v", key, err)
	}
	return es
}

// wantLog fails t unless the log key holds exactly one entry per change of
// want, each decoding (protocol.DecodeEntry) to that change's ops, or
// protocol.Overrun where a change is nil: the Lua encoder and the Go decoder
// agree.
func wantLog(t *testing.T, c rueidis.Client, key string, want ...[]protocol.Op) {
	t.Helper()
	got := logEntries(t, c, key)
	if len(got) != len(want) {
		t.Fatalf("%s: got %d entries %q, want %d", key, len(got), got, len(want))
	}
	for i, e := range got {
		if want[i] == nil {
			if e != protocol.Overrun {
				t.Errorf("%s entry %d: got %q, want %q", key, i, e, protocol.Overrun)
			}
			continue
		}
		ops, err := protocol.DecodeEntry(e)
		if err != nil {
			t.Errorf("%s entry %d %q: DecodeEntry: %v", key, i, e, err)
			continue
		}
		if diff := cmp.Diff(want[i], ops); diff != "" {
			t.Errorf("%s entry %d: decoded to other ops (-sent +logged):\n%s", key, i, diff)
		}
		if enc := protocol.EncodeEntry(want[i]); enc != e {
			t.Errorf("%s entry %d: got %q, want %q (protocol.EncodeEntry)", key, i, e, enc)
		}
	}
}

// wantMembers fails t unless the set key holds exactly want (none: absent).
func wantMembers(t *testing.T, c rueidis.Client, key string, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := redistest.SMembers(t, c, key); !slices.Equal(got, want) && len(got)+len(want) > 0 {
		t.Errorf("%s: got members %q, want %q", key, got, want)
	}
}

// wantScores fails t unless the sorted set key holds exactly want.
func wantScores(t *testing.T, c rueidis.Client, key string, want map[string]float64) {
	t.Helper()
	if diff := cmp.Diff(want, redistest.ZScores(t, c, key)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", key, diff)
	}
}

// seedLive seeds the live keys of the apply cases under p: a hash, a
// sorted set and two sets, "live:h" with a TTL of 1000 s (a change never
// touches it), and a string, "live:str".
func seedLive(t *testing.T, c rueidis.Client, p string) {
	t.Helper()
	cmds(t, c,
		[]string{"HSET", p + "live:h", "a", "1", "b", "2"},
		[]string{"EXPIRE", p + "live:h", "1000"},
		[]string{"ZADD", p + "live:z", "1", "u1", "2", "u2"},
		[]string{"SADD", p + "live:fr", "u1", "u2"},
		[]string{"SADD", p + "live:de", "u3"},
		[]string{"SET", p + "live:str", "x"},
	)
}

// change is the change of most apply cases: every command, on every type,
// the conditional removals (which remove c and u9 and u3, which hold what
// they name, and neither a nor u1, which no longer do), a bucket move that
// empties its old bucket (u3 from de to es), and arguments with the
// netstrings' own characters, an empty string and bytes that are not
// UTF-8.
func change(p string) []lockOp {
	return []lockOp{
		on(1, "HSET", p+"live:h", "c", "3", "a", "10"),
		on(1, "HDEL", p+"live:h", "b", "missing"),
		// A conditional removal removes only what holds its value.
		on(1, "HDELIF", p+"live:h", "a", "1", "c", "3", "missing", ""),
		on(1, "HSET", p+"live:h", "a", "10"),
		on(1, "HSET", p+"live:h", "3:x:", "", "", "1:\x00\xff"),
		on(1, "ZADD", p+"live:z", "7.5", "u1", "-Inf", "u9", "3", "u3"),
		on(1, "ZREM", p+"live:z", "u2"),
		on(1, "ZREMIF", p+"live:z", "1", "u1", "-Inf", "u9", "3", "u3", "1", "missing"),
		on(1, "ZADD", p+"live:z", "-Inf", "u9"),
		on(1, "SREM", p+"live:de", "u3"),
		on(1, "SADD", p+"live:es", "u3"),
		on(1, "SREM", p+"live:fr", "nobody"),
	}
}

// wantChanged fails t unless the live keys seeded by seedLive hold exactly
// what change(p) made of them.
func wantChanged(t *testing.T, c rueidis.Client, p string) {
	t.Helper()
	wantFields(t, c, p+"live:h", map[string]string{"a": "10", "3:x:": "", "": "1:\x00\xff"})
	redistest.WantPTTL(t, c, p+"live:h", 990*time.Second, 1000*time.Second)         // HSET keeps the TTL
	wantScores(t, c, p+"live:z", map[string]float64{"u1": 7.5, "u9": math.Inf(-1)}) // u3 removed by ZREMIF, u9 removed and added again
	redistest.WantAbsent(t, c, p+"live:de")                                         // emptied
	wantMembers(t, c, p+"live:es", "u3")
	wantMembers(t, c, p+"live:fr", "u1", "u2")
	for _, k := range []string{"live:z", "live:es", "live:fr"} {
		redistest.WantPTTL(t, c, p+k, -1, -1)
	}
}

// changedKeys are the keys change(p) writes.
func changedKeys(p string) []string {
	return []string{p + "live:h", p + "live:z", p + "live:de", p + "live:es", p + "live:fr"}
}

func TestScriptApply(t *testing.T) {
	// apply.lua: {1, l...}: every op applied to the live keys, in order,
	// in one step; and for each lock li = 1 when a run in progress holds
	// it (the lock, and its record carrying the lock's token, the mode
	// "rebuild" and the schema's version), the ops of that lock logged as
	// one entry and counted in its record (logged +1, work + the ops and
	// their arguments), and li = 0 when no one holds it, nothing logged.
	// A log the script creates gets the lock's PTTL; one at the bound gets
	// "!overrun" once (li = 2, counted) and nothing more, while the ops are
	// still applied. The refusals of a lock held by a run that would not
	// replay the change are in TestScriptApplyUnlogged.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		t.Run("no run", func(t *testing.T) {
			p := casePrefix(t, d.Other, d.Prefix)
			seedLive(t, d.Other, p)
			lock := p + "live:h:rebuild-lock"
			before := redistest.Snapshot(t, d.Other, p)
			wantReply(t, runApply(t, d.Client, []string{lock}, 10, change(p)...), 1, 0)
			wantChanged(t, d.Other, p)
			redistest.WantAbsent(t, d.Other, keys.LogKey(lock))
			wantUntouched(t, d.Other, p, before, changedKeys(p)...)
		})

		t.Run("run in progress", func(t *testing.T) {
			p := casePrefix(t, d.Other, d.Prefix)
			seedLive(t, d.Other, p)
			lock := p + "lock:1"
			holdRun(t, d.Other, lock, 50*time.Second)
			// The lock's TTL has run down to 30 s since the run renewed it:
			// the log gets what is left, not the lease.
			cmds(t, d.Other, []string{"PEXPIRE", lock, "30000"})
			before := redistest.Snapshot(t, d.Other, p)
			ops := change(p)
			wantReply(t, runApply(t, d.Client, []string{lock}, 10, ops...), 1, 1)
			wantChanged(t, d.Other, p)
			log := keys.LogKey(lock)
			wantLog(t, d.Other, log, opsOf(1, ops))
			wantCounts(t, d.Other, lock, 1, workOf(opsOf(1, ops)))
			lockTTL, logTTL := redistest.PTTL(t, d.Other, lock), redistest.PTTL(t, d.Other, log)
			if logTTL <= 0 || logTTL > lockTTL || lockTTL-logTTL > ttlSlack || logTTL > 30*time.Second {
				t.Errorf("%s: PTTL %v, want the lock's, %v (at most 30 s)", log, logTTL, lockTTL)
			}

			// A second change: appended and counted; the log's TTL is not
			// renewed (the heartbeat renews it with the lock).
			cmds(t, d.Other, []string{"PEXPIRE", lock, "45000"})
			second := []lockOp{on(1, "SADD", p+"live:fr", "u4"), on(1, "ZREM", p+"live:z", "u9")}
			wantReply(t, runApply(t, d.Client, []string{lock}, 10, second...), 1, 1)
			wantLog(t, d.Other, log, opsOf(1, ops), opsOf(1, second))
			wantCounts(t, d.Other, lock, 2, workOf(opsOf(1, ops))+workOf(opsOf(1, second)))
			if got := redistest.PTTL(t, d.Other, log); got > logTTL {
				t.Errorf("%s: PTTL %v after the second change, want at most %v: not renewed", log, got, logTTL)
			}
			wantMembers(t, d.Other, p+"live:fr", "u1", "u2", "u4")
			wantScores(t, d.Other, p+"live:z", map[string]float64{"u1": 7.5})
			wantUntouched(t, d.Other, p, before, append(changedKeys(p), log, lock, keys.RecordKey(lock))...)
			redistest.WantLock(t, d.Other, lock, scriptTok, 45*time.Second)
		})

		t.Run("a record without its lock", func(t *testing.T) {
			// A record whose lock expired: no run holds the lock, so the
			// change is applied, and not logged.
			p := casePrefix(t, d.Other, d.Prefix)
			seedLive(t, d.Other, p)
			lock := p + "lock:1"
			holdRun(t, d.Other, lock, 50*time.Second)
			cmds(t, d.Other, []string{"DEL", lock})
			before := redistest.Snapshot(t, d.Other, p)
			wantReply(t, runApply(t, d.Client, []string{lock}, 10, change(p)...), 1, 0)
			wantChanged(t, d.Other, p)
			redistest.WantAbsent(t, d.Other, keys.LogKey(lock))
			wantUntouched(t, d.Other, p, before, changedKeys(p)...)
		})

		for _, bound := range []int{1, 2} {
			t.Run("bound "+strconv.Itoa(bound), func(t *testing.T) {
				// The changes past the bound are applied, not logged; the
				// first of them pushes "!overrun", once, counted as an
				// entry of no work.
				p := casePrefix(t, d.Other, d.Prefix)
				lock := p + "lock:1"
				holdRun(t, d.Other, lock, 50*time.Second)
				var logged [][]protocol.Op
				work := 0
				for i := range 4 {
					ops := []lockOp{on(1, "SADD", p+"live:s", "m"+strconv.Itoa(i)), on(1, "HSET", p+"live:h", "n", strconv.Itoa(i))}
					want := 1
					switch {
					case i < bound:
						logged = append(logged, opsOf(1, ops))
						work += workOf(opsOf(1, ops))
					case i == bound:
						logged = append(logged, nil) // "!overrun"
						want = 2
					default:
						want = 2
					}
					wantReply(t, runApply(t, d.Client, []string{lock}, bound, ops...), 1, want)
				}
				wantLog(t, d.Other, keys.LogKey(lock), logged...)
				wantCounts(t, d.Other, lock, bound+1, work)
				redistest.WantTTL(t, d.Other, keys.LogKey(lock), 50*time.Second)
				wantMembers(t, d.Other, p+"live:s", "m0", "m1", "m2", "m3")
				redistest.WantHash(t, d.Other, p+"live:h", map[string]string{"n": "3"})
			})
		}

		t.Run("several locks", func(t *testing.T) {
			// Each lock's ops are logged in its own log, for the run that
			// holds it, and counted in its own record: lock 1 and 3 by
			// runs, lock 2 by none. A lock none of whose ops are in the
			// change gets no entry.
			p := casePrefix(t, d.Other, d.Prefix)
			locks, _, logs := runKeys(p, 3)
			holdRun(t, d.Other, locks[0], 50*time.Second)
			holdRun(t, d.Other, locks[2], 40*time.Second)
			first := []lockOp{
				on(1, "HSET", p+"live:h", "f", "1"),
				on(2, "ZADD", p+"live:z", "1", "m"),
				on(1, "HDEL", p+"live:h", "g"),
			}
			wantReply(t, runApply(t, d.Client, locks, 10, first...), 1, 1, 0, 0)
			second := []lockOp{
				on(3, "SADD", p+"live:s", "a"),
				on(2, "ZREM", p+"live:z", "m"),
				on(3, "SADD", p+"live:s", "b"),
			}
			wantReply(t, runApply(t, d.Client, locks, 10, second...), 1, 0, 0, 1)
			wantLog(t, d.Other, logs[0], opsOf(1, first))
			redistest.WantAbsent(t, d.Other, logs[1])
			wantLog(t, d.Other, logs[2], opsOf(3, second))
			wantCounts(t, d.Other, locks[0], 1, workOf(opsOf(1, first)))
			wantCounts(t, d.Other, locks[2], 1, workOf(opsOf(3, second)))
			redistest.WantAbsent(t, d.Other, keys.RecordKey(locks[1]))
			redistest.WantTTL(t, d.Other, logs[0], 50*time.Second)
			redistest.WantTTL(t, d.Other, logs[2], 40*time.Second)
			redistest.WantHash(t, d.Other, p+"live:h", map[string]string{"f": "1"})
			redistest.WantAbsent(t, d.Other, p+"live:z")
			wantMembers(t, d.Other, p+"live:s", "a", "b")
		})
	})
}

func TestScriptApplyUnlogged(t *testing.T) {
	// apply.lua, while a lock is held by a run that would not replay the
	// change (C75): {-12, i, why, detail} for the first such lock, and
	// nothing written, not even the ops of other locks. why is 'none' for
	// a lock without a record with a token (store.WithRebuild, a Familia
	// rebuild, a record lost, or re-created by a batch without its token),
	// 'token' for a record of another token (forged, or left by a run
	// whose lock another took over), 'version' for a record of another
	// schema version (or none: an older keyswap's), 'mode' for a run that
	// does not log (a rollback), 'keys' for a record that names no key.
	// {-13, i, key, owner} for an op whose key is not the run's (C72): not
	// the builder's key, or not a bucket of its family, or a key of
	// keyswap's own shapes under its prefix.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		for _, tt := range []struct {
			name  string
			setup func(p, lock, rec string) [][]string
			ops   func(p string) []lockOp // nil: change(p)
			want  func(p string) []any
		}{
			{"a lock without a record", func(p, lock, rec string) [][]string {
				return [][]string{{"DEL", rec}}
			}, nil, func(string) []any { return reply(-12, 1, "none", "") }},
			{"a record without a token", func(p, lock, rec string) [][]string {
				return [][]string{{"HDEL", rec, "token"}}
			}, nil, func(string) []any { return reply(-12, 1, "none", "") }},
			{"a record of another token", func(p, lock, rec string) [][]string {
				return [][]string{{"HSET", rec, "token", thiefTok}}
			}, nil, func(string) []any { return reply(-12, 1, "token", "") }},
			{"a lock of another token", func(p, lock, rec string) [][]string {
				return [][]string{{"SET", lock, thiefTok, "EX", "50"}}
			}, nil, func(string) []any { return reply(-12, 1, "token", "") }},
			{"an older keyswap's record", func(p, lock, rec string) [][]string {
				return [][]string{{"HDEL", rec, "v"}}
			}, nil, func(string) []any { return reply(-12, 1, "version", "") }},
			{"a newer keyswap's record", func(p, lock, rec string) [][]string {
				return [][]string{{"HSET", rec, "v", "3"}}
			}, nil, func(string) []any { return reply(-12, 1, "version", "3") }},
			{"a rollback", func(p, lock, rec string) [][]string {
				return [][]string{{"HSET", rec, "mode", "rollback"}}
			}, nil, func(string) []any { return reply(-12, 1, "mode", "rollback") }},
			{"a record without keys", func(p, lock, rec string) [][]string {
				return [][]string{{"HDEL", rec, "keys"}}
			}, nil, func(string) []any { return reply(-12, 1, "keys", "") }},
			{"a key outside the family", func(p, lock, rec string) [][]string { return nil },
				func(p string) []lockOp { return append(change(p), on(1, "SADD", p+"other", "m")) },
				func(p string) []any { return reply(-13, 1, p+"other", p+"live") }},
			{"the family's prefix itself", func(p, lock, rec string) [][]string { return nil },
				func(p string) []lockOp { return []lockOp{on(1, "SADD", p+"live:", "m")} },
				func(p string) []any { return reply(-13, 1, p+"live:", p+"live") }},
			{"a reserved shape in the family", func(p, lock, rec string) [][]string { return nil },
				func(p string) []lockOp { return []lockOp{on(1, "SADD", p+"live:x:rebuild-lock:ctl", "m")} },
				func(p string) []any { return reply(-13, 1, p+"live:x:rebuild-lock:ctl", p+"live") }},
			{"a key that is not the builder's", func(p, lock, rec string) [][]string {
				return [][]string{{"HSET", rec, "keys", protocol.EncodeKeys([]string{p + "live:h"}), "families", "0"}}
			}, nil, func(p string) []any { return reply(-13, 1, p+"live:z", p+"live:h") }},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, d.Other, d.Prefix)
				seedLive(t, d.Other, p)
				locks, _, _ := runKeys(p, 2)
				holdRun(t, d.Other, locks[0], 50*time.Second)
				cmds(t, d.Other, tt.setup(p, locks[0], keys.RecordKey(locks[0]))...)
				before := redistest.Snapshot(t, d.Other, p)
				ops := change(p)
				if tt.ops != nil {
					ops = tt.ops(p)
				}
				// The ops of the second lock, which no run holds, are not
				// applied either.
				ops = append([]lockOp{on(2, "SADD", p+"live:fr", "u8")}, ops...)
				wantReply(t, runApply(t, d.Client, locks, 10, ops...), tt.want(p)...)
				wantUntouched(t, d.Other, p, before)
			})
		}
	})
}

func TestScriptApplyWrongType(t *testing.T) {
	// apply.lua: {-8, key, type} for the first op that cannot write its
	// key's type, checked before any write: nothing applied (not even the
	// ops before it), nothing logged, though a run holds the lock. The
	// first op on a key decides its type for the ops after it in the same
	// change: before that was checked, HSET then SADD on a missing key
	// wrote the hash and then failed the script on the SADD (WRONGTYPE),
	// half applied and not logged.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		for _, tt := range []struct {
			name string
			ops  func(p string) []lockOp
			want func(p string) []any
		}{
			{"SADD on a string", func(p string) []lockOp {
				return append(change(p), on(1, "SADD", p+"live:str", "m"))
			}, func(p string) []any { return reply(-8, p+"live:str", "string") }},
			{"HSET on a sorted set", func(p string) []lockOp {
				return []lockOp{on(1, "SADD", p+"live:fr", "u5"), on(1, "HSET", p+"live:z", "f", "v")}
			}, func(p string) []any { return reply(-8, p+"live:z", "zset") }},
			{"ZREM on a set", func(p string) []lockOp {
				return []lockOp{on(1, "ZREM", p+"live:fr", "u1")}
			}, func(p string) []any { return reply(-8, p+"live:fr", "set") }},
			{"HDEL on a string", func(p string) []lockOp {
				return []lockOp{on(1, "HDEL", p+"live:str", "f")}
			}, func(p string) []any { return reply(-8, p+"live:str", "string") }},
			{"two types on a missing key", func(p string) []lockOp {
				return []lockOp{on(1, "HSET", p+"live:new", "f", "v"), on(1, "SADD", p+"live:new", "m")}
			}, func(p string) []any { return reply(-8, p+"live:new", "hash") }},
			{"two types on a key emptied by the change", func(p string) []lockOp {
				// SREM empties live:de, which is then a hash-shaped
				// op's, and then a set's again.
				return []lockOp{on(1, "SREM", p+"live:de", "u3"), on(1, "SADD", p+"live:de", "u4"), on(1, "ZADD", p+"live:de", "1", "m")}
			}, func(p string) []any { return reply(-8, p+"live:de", "set") }},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, d.Other, d.Prefix)
				seedLive(t, d.Other, p)
				lock := p + "lock:1"
				holdRun(t, d.Other, lock, 50*time.Second)
				before := redistest.Snapshot(t, d.Other, p)
				wantReply(t, runApply(t, d.Client, []string{lock}, 10, tt.ops(p)...), tt.want(p)...)
				wantUntouched(t, d.Other, p, before)
			})
		}
	})
}

func TestScriptApplyRefused(t *testing.T) {
	// apply.lua for a user that may not run one of the commands the script
	// sends: {-2, cmd, key}, its own commands on every lock, record and
	// log first, then each op's command and TYPE on its key; nothing
	// written, whatever was checked before, and nothing logged though a run
	// holds the lock.
	forEachACLTarget(t, func(t *testing.T, a aclTarget) {
		for _, tt := range []struct {
			name    string
			deny    string
			allowOn []string
			want    func(p string) []any
		}{
			{"GET on a lock", "get", nil, func(p string) []any { return reply(-2, "GET", p+"lock:1") }},
			{"HMGET on a record", "hmget", nil, func(p string) []any { return reply(-2, "HMGET", p+"lock:1:run") }},
			{"HINCRBY on a record", "hincrby", nil, func(p string) []any { return reply(-2, "HINCRBY", p+"lock:1:run") }},
			// A conditional removal runs HGET and HDEL, ZSCORE and ZREM.
			{"HGET of an HDELIF", "hget", nil, func(p string) []any { return reply(-2, "HGET", p+"live:h") }},
			{"ZSCORE of a ZREMIF", "zscore", nil, func(p string) []any { return reply(-2, "ZSCORE", p+"live:z") }},
			{"RPUSH on a log", "rpush", nil, func(p string) []any { return reply(-2, "RPUSH", p+"lock:1:log") }},
			{"RPUSH on the second log", "rpush", []string{"lock:1:log"}, func(p string) []any { return reply(-2, "RPUSH", p+"lock:2:log") }},
			{"PEXPIRE on a log", "pexpire", nil, func(p string) []any { return reply(-2, "PEXPIRE", p+"lock:1:log") }},
			{"LLEN on a log", "llen", nil, func(p string) []any { return reply(-2, "LLEN", p+"lock:1:log") }},
			{"PTTL on a lock", "pttl", nil, func(p string) []any { return reply(-2, "PTTL", p+"lock:1") }},
			{"HSET on a live key", "hset", []string{"lock:*"}, func(p string) []any { return reply(-2, "HSET", p+"live:h") }},
			// The ops before it would be allowed: nothing applied all the same.
			{"SREM on a live key", "srem", nil, func(p string) []any { return reply(-2, "SREM", p+"live:de") }},
			{"SREM on one live key", "srem", []string{"live:de"}, func(p string) []any { return reply(-2, "SREM", p+"live:fr") }},
			{"TYPE on a live key", "type", nil, func(p string) []any { return reply(-2, "TYPE", p+"live:h") }},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, a.admin, a.prefix)
				c := a.srv.ClientAs(t, "ks-"+t.Name(), deniedRules(p, tt.deny, tt.allowOn...)...)
				seedLive(t, a.admin, p)
				locks, _, _ := runKeys(p, 2)
				holdRun(t, a.admin, locks[0], 50*time.Second)
				holdRun(t, a.admin, locks[1], 50*time.Second)
				before := redistest.Snapshot(t, a.admin, p)
				ops := append(change(p), on(2, "ZADD", p+"live:z", "3", "u3"))
				wantReply(t, runApply(t, c, locks, 10, ops...), tt.want(p)...)
				wantUntouched(t, a.admin, p, before)
			})
		}
	})
}

func TestScriptApplyUnknownCommand(t *testing.T) {
	// A command disabled with rename-command is unknown to
	// redis.acl_check_cmd: apply.lua answers {-5, cmd} and writes nothing.
	t.Parallel()
	srv := redistest.OwnServer(t, "--rename-command", "SREM", "")
	c := srv.Client(t)
	p := casePrefix(t, c, "ks:")
	seedLive(t, c, p)
	lock := p + "lock:1"
	holdRun(t, c, lock, 50*time.Second)
	before := redistest.Snapshot(t, c, p)
	wantReply(t, runApply(t, c, []string{lock}, 10, change(p)...), -5, "SREM")
	wantUntouched(t, c, p, before)
}

func TestApply(t *testing.T) {
	// protocol.Changes.Apply lays out the script call, reads its reply into
	// Applied (per lock: LogNone, Logged or LogFull), and maps its
	// refusals to errors; bad input is refused before anything is sent.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		var sent atomic.Int64
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				sent.Add(1)
				return c.Do(ctx, cmd)
			},
			OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				sent.Add(int64(len(multi)))
				return c.DoMulti(ctx, multi...)
			},
		})
		core := protocol.New(hooked, nil)
		p := casePrefix(t, d.Other, d.Prefix)
		locks, _, logs := runKeys(p, 3)
		holdRun(t, d.Other, locks[0], 50*time.Second)
		holdRun(t, d.Other, locks[2], 50*time.Second)
		seedLive(t, d.Other, p)

		t.Run("applied and logged", func(t *testing.T) {
			opts := protocol.ApplyOptions{Op: "apply", Key: p + "idx", Locks: locks, MaxLog: 1, Ops: [][]protocol.Op{
				opsOf(1, change(p)), {{Cmd: "SADD", Key: p + "live:s2", Args: []string{"x"}}}, nil,
			}}
			got, err := core.Changes.Apply(ctx, opts)
			if err != nil || !slices.Equal(got.Logged, []int{protocol.Logged, protocol.LogNone, protocol.LogNone}) {
				t.Fatalf("Apply = %v, %v; want [Logged LogNone LogNone], nil", got.Logged, err)
			}
			wantChanged(t, d.Other, p)
			wantLog(t, d.Other, logs[0], opsOf(1, change(p)))
			redistest.WantAbsent(t, d.Other, logs[1])
			redistest.WantAbsent(t, d.Other, logs[2])
			// The log is at its bound of 1: the next change is LogFull.
			opts.Ops = [][]protocol.Op{{{Cmd: "SADD", Key: p + "live:fr", Args: []string{"u7"}}}, nil, {{Cmd: "SADD", Key: p + "live:s3", Args: []string{"y"}}}}
			got, err = core.Changes.Apply(ctx, opts)
			if err != nil || !slices.Equal(got.Logged, []int{protocol.LogFull, protocol.LogNone, protocol.Logged}) {
				t.Fatalf("Apply = %v, %v; want [LogFull LogNone Logged], nil", got.Logged, err)
			}
			wantLog(t, d.Other, logs[0], opsOf(1, change(p)), nil)
			wantMembers(t, d.Other, p+"live:fr", "u1", "u2", "u7")
		})

		t.Run("refused while a run that does not log holds a lock", func(t *testing.T) {
			// C75: a lock of the single-key API (no record), and a record
			// of a rollback: ErrInProgress, saying to apply it again, and
			// nothing written.
			for _, tt := range []struct {
				name, says string
				setup      [][]string
			}{
				{"a lock without a record", "store.WithRebuild", [][]string{{"SET", locks[1], scriptTok, "EX", "50"}}},
				{"a rollback", "a rollback", [][]string{{"SET", locks[1], scriptTok, "EX", "50"},
					{"HSET", keys.RecordKey(locks[1]), "v", protocol.RecordVersion, "token", scriptTok, "mode", protocol.ModeRollback}}},
			} {
				cmds(t, d.Other, tt.setup...)
				before := redistest.Snapshot(t, d.Other, p)
				_, err := core.Changes.Apply(ctx, protocol.ApplyOptions{Op: "apply", Key: p + "idx", Locks: locks, Lives: []string{p + "live", p + "other", p + "live"}, MaxLog: 10, Ops: [][]protocol.Op{
					{{Cmd: "SADD", Key: p + "live:fr", Args: []string{"u8"}}}, {{Cmd: "SADD", Key: p + "live:fr", Args: []string{"u9"}}}, nil,
				}})
				redistest.WantErr(t, err, protocol.ErrInProgress)
				if !strings.Contains(err.Error(), tt.says) || !strings.Contains(err.Error(), "apply the change again") || !strings.Contains(err.Error(), strconv.Quote(p+"other")) {
					t.Errorf("%s: Apply: %v, want it to name %s, say %q and to apply it again", tt.name, err, p+"other", tt.says)
				}
				wantUntouched(t, d.Other, p, before)
				cmds(t, d.Other, []string{"DEL", locks[1], keys.RecordKey(locks[1])})
			}
		})

		t.Run("refused for a key that is not the run's", func(t *testing.T) {
			// C72: a key outside the family of the run holding the lock.
			before := redistest.Snapshot(t, d.Other, p)
			_, err := core.Changes.Apply(ctx, protocol.ApplyOptions{Op: "apply", Key: p + "idx", Locks: locks[:1], MaxLog: 10, Ops: [][]protocol.Op{
				{{Cmd: "SADD", Key: p + "elsewhere", Args: []string{"u8"}}},
			}})
			redistest.WantErr(t, err, protocol.ErrInProgress)
			if !strings.Contains(err.Error(), strconv.Quote(p+"elsewhere")) || !strings.Contains(err.Error(), strconv.Quote(p+"live")) {
				t.Errorf("Apply: %v, want it to name the key and the run's", err)
			}
			wantUntouched(t, d.Other, p, before)
		})

		t.Run("nothing to apply", func(t *testing.T) {
			n := sent.Load()
			got, err := core.Changes.Apply(ctx, protocol.ApplyOptions{Op: "apply", Key: p + "idx", Locks: locks, Ops: make([][]protocol.Op, 3), MaxLog: 10})
			if err != nil || !slices.Equal(got.Logged, []int{0, 0, 0}) {
				t.Errorf("Apply = %v, %v; want [0 0 0], nil", got.Logged, err)
			}
			if s := sent.Load() - n; s != 0 {
				t.Errorf("sent %d commands, want none", s)
			}
		})

		t.Run("wrong type", func(t *testing.T) {
			before := redistest.Snapshot(t, d.Other, p)
			_, err := core.Changes.Apply(ctx, protocol.ApplyOptions{Op: "apply", Key: p + "idx", Locks: locks[:1], MaxLog: 10, Ops: [][]protocol.Op{{
				{Cmd: "HSET", Key: p + "live:h", Args: []string{"z", "1"}}, {Cmd: "SADD", Key: p + "live:str", Args: []string{"m"}},
			}}})
			var e *protocol.Error
			if !errors.As(err, &e) || e.Op != "apply" || !strings.Contains(err.Error(), `"`+p+`live:str" holds a string`) {
				t.Errorf("Apply: got %v, want an *Error of op apply naming %s and its type", err, p+"live:str")
			}
			wantUntouched(t, d.Other, p, before)
		})

		for _, tt := range []struct {
			name string
			opts func() protocol.ApplyOptions
			want string
		}{
			{"a command that is not a change's", func() protocol.ApplyOptions {
				return protocol.ApplyOptions{Locks: locks[:1], MaxLog: 10, Ops: [][]protocol.Op{{{Cmd: "DEL", Key: p + "live:h", Args: []string{"x"}}}}}
			}, `cannot run "DEL"`},
			{"an empty key", func() protocol.ApplyOptions {
				return protocol.ApplyOptions{Locks: locks[:1], MaxLog: 10, Ops: [][]protocol.Op{{{Cmd: "SADD", Args: []string{"x"}}}}}
			}, "empty key"},
			{"no args", func() protocol.ApplyOptions {
				return protocol.ApplyOptions{Locks: locks[:1], MaxLog: 10, Ops: [][]protocol.Op{{{Cmd: "SREM", Key: p + "live:fr"}}}}
			}, "0 arguments"},
			{"an odd HSET", func() protocol.ApplyOptions {
				return protocol.ApplyOptions{Locks: locks[:1], MaxLog: 10, Ops: [][]protocol.Op{{{Cmd: "HSET", Key: p + "live:h", Args: []string{"f"}}}}}
			}, "1 arguments"},
			{"more locks than lists of ops", func() protocol.ApplyOptions {
				return protocol.ApplyOptions{Locks: locks[:2], MaxLog: 10, Ops: [][]protocol.Op{{{Cmd: "SADD", Key: p + "live:fr", Args: []string{"x"}}}}}
			}, "2 locks for 1 lists"},
			{"no bound", func() protocol.ApplyOptions {
				return protocol.ApplyOptions{Locks: locks[:1], Ops: [][]protocol.Op{{{Cmd: "SADD", Key: p + "live:fr", Args: []string{"x"}}}}}
			}, "log bound 0"},
			{"a live key that is keyswap's", func() protocol.ApplyOptions {
				return protocol.ApplyOptions{Locks: locks[:1], MaxLog: 10, Ops: [][]protocol.Op{{{Cmd: "SADD", Key: logs[0], Args: []string{"x"}}}}}
			}, "one of keyswap's own"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				before := redistest.Snapshot(t, d.Other, p)
				n := sent.Load()
				opts := tt.opts()
				opts.Op, opts.Key = "apply", p+"idx"
				_, err := core.Changes.Apply(ctx, opts)
				var e *protocol.Error
				if !errors.As(err, &e) || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("Apply: got %v, want an *Error saying %q", err, tt.want)
				}
				if s := sent.Load() - n; s != 0 {
					t.Errorf("sent %d commands, want none", s)
				}
				wantUntouched(t, d.Other, p, before)
			})
		}

		if d.Cluster {
			t.Run("a key in another slot", func(t *testing.T) {
				// No builder can write outside its slot (rebuild.New and
				// Writes refuse it), but Apply checks the script's keys
				// itself: rueidis would panic on a cross-slot command.
				other := "{" + redistest.Prefix(t) + "elsewhere}:s"
				if keys.Slot(other) == keys.Slot(p) {
					t.Fatalf("%s and %s share slot %d", other, p, keys.Slot(p))
				}
				before := redistest.Snapshot(t, d.Other, p)
				n := sent.Load()
				_, err := core.Changes.Apply(ctx, protocol.ApplyOptions{Op: "apply", Key: p + "idx", Locks: locks[:1], MaxLog: 10, Ops: [][]protocol.Op{{
					{Cmd: "SADD", Key: p + "live:fr", Args: []string{"x"}}, {Cmd: "SADD", Key: other, Args: []string{"x"}},
				}}})
				if err == nil || !strings.Contains(err.Error(), "different hash slots") {
					t.Errorf("Apply: got %v, want an error naming the slots", err)
				}
				if s := sent.Load() - n; s != 0 {
					t.Errorf("sent %d commands, want none", s)
				}
				wantUntouched(t, d.Other, p, before)
				redistest.WantAbsent(t, d.Other, other)
			})
		}
	})
}

func TestApplyRefused(t *testing.T) {
	// protocol.Changes.Apply maps {-2, cmd, key} to an error matching
	// ErrNoPermission that names the command and the key.
	forEachACLTarget(t, func(t *testing.T, a aclTarget) {
		p := casePrefix(t, a.admin, a.prefix)
		c := a.srv.ClientAs(t, "ks-"+t.Name(), deniedRules(p, "srem")...)
		seedLive(t, a.admin, p)
		lock := p + "lock:1"
		holdRun(t, a.admin, lock, 50*time.Second)
		before := redistest.Snapshot(t, a.admin, p)
		_, err := protocol.New(c, nil).Changes.Apply(redistest.Ctx(t), protocol.ApplyOptions{Op: "apply", Key: p + "idx", Locks: []string{lock}, MaxLog: 10, Ops: [][]protocol.Op{opsOf(1, change(p))}})
		redistest.WantErr(t, err, protocol.ErrNoPermission)
		if !strings.Contains(err.Error(), "SREM") || !strings.Contains(err.Error(), p+"live:de") {
			t.Errorf("Apply: %v, want it to name SREM and %s", err, p+"live:de")
		}
		wantUntouched(t, a.admin, p, before)
	})
}

func TestEncodeEntry(t *testing.T) {
	// A log entry is netstrings: command, key, count of args, args. It
	// decodes to the ops it encodes; Overrun decodes to ErrFallingBehind;
	// anything else the apply script does not write is an error.
	for _, tt := range []struct {
		name string
		ops  []protocol.Op
		want string
	}{
		{"one op", []protocol.Op{{Cmd: "SADD", Key: "k", Args: []string{"m"}}}, "4:SADD1:k1:11:m"},
		{"two ops", []protocol.Op{{Cmd: "HSET", Key: "h", Args: []string{"f", "v"}}, {Cmd: "HDEL", Key: "h", Args: []string{"g"}}},
			"4:HSET1:h1:21:f1:v4:HDEL1:h1:11:g"},
		{"netstring characters", []protocol.Op{{Cmd: "ZADD", Key: "1:k:", Args: []string{"-1.5e+07", "10:x"}}}, "4:ZADD4:1:k:1:28:-1.5e+074:10:x"},
		{"empty and binary args", []protocol.Op{{Cmd: "HSET", Key: "\xff\x00", Args: []string{"", "é"}}}, "4:HSET2:\xff\x001:20:2:é"},
		{"many args", []protocol.Op{{Cmd: "SREM", Key: "s", Args: strings.Split("a b c d e f g h i j k", " ")}},
			"4:SREM1:s2:111:a1:b1:c1:d1:e1:f1:g1:h1:i1:j1:k"},
		{"no ops", nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := protocol.EncodeEntry(tt.ops)
			if got != tt.want {
				t.Errorf("EncodeEntry: got %q, want %q", got, tt.want)
			}
			ops, err := protocol.DecodeEntry(got)
			if err != nil || !reflect.DeepEqual(ops, tt.ops) {
				t.Errorf("DecodeEntry(%q) = %#v, %v; want %#v", got, ops, err, tt.ops)
			}
		})
	}
	if _, err := protocol.DecodeEntry(protocol.Overrun); !errors.Is(err, protocol.ErrFallingBehind) {
		t.Errorf("DecodeEntry(%q): got %v, want ErrFallingBehind", protocol.Overrun, err)
	}
	for _, e := range badEntries {
		if ops, err := protocol.DecodeEntry(e); err == nil {
			t.Errorf("DecodeEntry(%q) = %#v, want an error", e, ops)
		}
	}
}

// badEntries are log entries that apply.lua never writes: both decoders
// must refuse each.
var badEntries = []string{
	"garbage",
	":",
	"4:SADD",
	"4:SADD1:k",
	"4:SADD1:k1:1",
	"4:SADD1:k1:11:",
	"4:SADD1:k1:21:m",
	"4:SADD1:k1:x1:m",
	"9:SADD1:k1:11:m",
	"-1:x",
	"3:DEL1:k1:11:m",              // not a change's command
	"4:sadd1:k1:11:m",             // nor in lower case
	"4:SADD0:1:11:m",              // an empty key
	"4:SADD1:k1:0",                // no args
	"4:HSET1:h1:11:f",             // a field without a value
	"4:ZADD1:z1:31:11:m1:2",       // a score without a member
	"4:SADD1:k1:11:m4:SREM1:k1:0", // a valid op, then a bad one
	"4:SADD1:k1:11:m!",            // trailing bytes
	" 4:SADD1:k1:11:m",            // lengths are digits
	"4:SADD1:k+1:11:m",
	"04:SADD1:k1:11:m", // and have no leading zeros
	"0x4:SADD1:k1:11:m",
	"4:SADD1:k1.0:11:m",
	"6:HDELIF1:h1:11:f",      // a conditional removal takes pairs
	"6:ZREMIF1:z1:23:abc1:m", // and a score ZADD takes
	"6:ZREMIF1:z1:13:1.5",    // with its member
	"6:hdelif1:h1:21:f1:v",   // in upper case
	"5:ZREM?1:z1:11:m",       // no other command
}

// FuzzDecodeEntry: DecodeEntry never panics; what it decodes encodes back
// to the same entry (so an entry has one meaning, the Lua decoder's too);
// and ops built from the input (a ZADD with a score as Writes.ZAdd writes
// it) decode from their encoding to themselves, alone and after another
// op.
func FuzzDecodeEntry(f *testing.F) {
	for _, e := range append(slices.Clone(badEntries), protocol.Overrun, "4:SADD1:k1:11:m", "4:HSET1:h1:21:f1:v4:HDEL1:h1:11:g", "") {
		f.Add(e, uint8(0), "k", "a", "b", 1.5)
	}
	f.Add("", uint8(2), "1:k:", "10:x", "", -1e300)
	f.Add("", uint8(130), "\xff", "-inf", "m", math.Inf(-1))
	f.Fuzz(func(t *testing.T, entry string, sel uint8, key, a, b string, score float64) {
		if ops, err := protocol.DecodeEntry(entry); err == nil {
			if enc := protocol.EncodeEntry(ops); enc != entry {
				t.Errorf("DecodeEntry(%q) = %#v, which encodes to %q", entry, ops, enc)
			}
		} else if ops != nil {
			t.Errorf("DecodeEntry(%q) = %#v with error %v, want no ops", entry, ops, err)
		}
		if key == "" {
			return
		}
		cmds := []string{"HSET", "HDEL", "ZADD", "ZREM", "SADD", "SREM", "HDELIF", "ZREMIF"}
		op := protocol.Op{Cmd: cmds[int(sel)%len(cmds)], Key: key, Args: []string{a, b}}
		paired := op.Cmd == "HSET" || op.Cmd == "HDELIF" || op.Cmd == "ZADD" || op.Cmd == "ZREMIF"
		switch {
		case (op.Cmd == "ZADD" || op.Cmd == "ZREMIF") && math.IsNaN(score):
			return // Writes.ZAdd and ZRemIf refuse it
		case op.Cmd == "ZADD" || op.Cmd == "ZREMIF":
			op.Args[0] = strconv.FormatFloat(score, 'g', -1, 64)
		case sel >= 128 && !paired:
			op.Args = op.Args[:1]
		}
		for _, ops := range [][]protocol.Op{{op}, {{Cmd: "SREM", Key: b + key, Args: []string{a}}, op}} {
			e := protocol.EncodeEntry(ops)
			got, err := protocol.DecodeEntry(e)
			if err != nil || !reflect.DeepEqual(got, ops) {
				t.Errorf("DecodeEntry(EncodeEntry(%#v)) = %#v, %v", ops, got, err)
			}
		}
	})
}

// luaDecode is lib/changes.lua's decoder, run on the server: it returns
// false for an entry it refuses, else each op flattened to the command,
// the key, the count of args and the args.
var luaDecode = func() string {
	lib, err := protocol.Scripts.ReadFile("scripts/lib/changes.lua")
	if err != nil {
		panic(err)
	}
	return protocol.Expand(string(lib) + `
local ops = changes.decode(ARGV[1])
if not ops then return false end
local out = {}
for _, op in ipairs(ops) do
  out[#out + 1] = op[1]
  out[#out + 1] = op[2]
  out[#out + 1] = tostring(#op[3])
  for _, a in ipairs(op[3]) do out[#out + 1] = a end
end
return out
`)
}()

func TestDecodersAgree(t *testing.T) {
	// The publish script's decoder (lib/changes.lua) and protocol.DecodeEntry,
	// which the catch-up uses, accept the same entries and read the same
	// ops from them: what the catch-up would refuse, the publish refuses
	// too ({-9}), before any write. Every entry of the cases is tried, and
	// so is every prefix of the valid ones.
	c := env.Standalone.Client(t)
	ctx := redistest.Ctx(t)
	valid := []string{
		"4:SADD1:k1:11:m",
		"4:HSET1:h1:21:f1:v4:HDEL1:h1:11:g",
		protocol.EncodeEntry(opsOf(1, change("ks:agree:"))),
		"4:ZADD1:z1:24:+Inf1:m",
		"4:ZADD1:z1:22:-01:m",
		"4:ZADD1:z1:25:1e-071:m",
		"6:HDELIF1:h1:21:f1:v4:HSET1:h1:21:g1:v",
		"6:ZREMIF1:z1:43:-Inf1:m1:21:m",
	}
	entries := slices.Clone(badEntries)
	for _, e := range valid {
		for i := range len(e) + 1 {
			entries = append(entries, e[:i])
		}
	}
	// Scores ZADD refuses, which the publish would otherwise find only
	// after its renames.
	for _, score := range []string{"abc", "nan", "1e400", "1e-400", " 1", "1 ", "", "inf"} {
		entries = append(entries, protocol.EncodeEntry([]protocol.Op{{Cmd: "ZADD", Key: "z", Args: []string{score, "m"}}}),
			protocol.EncodeEntry([]protocol.Op{{Cmd: "ZREMIF", Key: "z", Args: []string{score, "m"}}}))
	}
	for _, e := range entries {
		goOps, goErr := protocol.DecodeEntry(e)
		res := c.Do(ctx, c.B().Eval().Script(luaDecode).Numkeys(0).Arg(e).Build())
		var luaOps []protocol.Op
		luaErr := res.Error()
		if rueidis.IsRedisNil(luaErr) {
			luaErr = errors.New("refused")
		} else if luaErr != nil {
			t.Fatalf("the Lua decoder on %q: %v", e, luaErr)
		} else {
			flat, err := res.AsStrSlice()
			if err != nil {
				t.Fatalf("the Lua decoder on %q: %v", e, err)
			}
			for len(flat) > 0 {
				n, _ := strconv.Atoi(flat[2])
				luaOps = append(luaOps, protocol.Op{Cmd: flat[0], Key: flat[1], Args: flat[3 : 3+n]})
				flat = flat[3+n:]
			}
		}
		switch {
		case (goErr == nil) != (luaErr == nil):
			t.Errorf("%q: Go decodes it with error %v, Lua with error %v", e, goErr, luaErr)
		case goErr == nil && !reflect.DeepEqual(goOps, luaOps):
			t.Errorf("%q: Go decodes %#v, Lua %#v", e, goOps, luaOps)
		}
	}
}

// tailCall is a publishCall with logs (section X), one per lock, each with
// the entries and the work the run replayed itself, the highest count of
// logged entries it saw, and its builder; and the bounds of the tail.
type tailCall struct {
	publishCall
	logs                                      []string
	offsets, highest, works, owners, families []string
	maxTail, maxWork                          string
}

func (c tailCall) keys() []string {
	return slices.Concat(c.locks, c.records, c.receipts, c.temps, c.lives, c.orphans, c.prevs, c.drops, c.metas, c.logs, c.ctls)
}

func (c tailCall) args() []string {
	a := c.publishCall.args()
	a = a[:len(a)-2]                 // publishCall's bounds of 0
	a[9] = strconv.Itoa(len(c.logs)) // X
	for i := range c.logs {
		a = append(a, c.offsets[i], c.highest[i], c.works[i], c.owners[i], c.families[i])
	}
	return append(a, c.maxTail, c.maxWork)
}

// run runs the publish on c and returns its reply.
func (c tailCall) run(t *testing.T, client rueidis.Client) []any {
	t.Helper()
	return evalScript(t, client, "publish", c.keys(), c.args())
}

// entry returns ops as one log entry.
func entry(ops ...protocol.Op) string { return protocol.EncodeEntry(ops) }

// op returns an op.
func op(cmd, key string, args ...string) protocol.Op {
	return protocol.Op{Cmd: cmd, Key: key, Args: args}
}

// seedTail seeds, under p, a fenced publish of a SetIndex family, a hash and
// a sorted set, one lock each, and their logs, each counted in its lock's
// record as Apply counts it, and returns its call, which succeeds with
// {1, 1, 1, 1, 1, 8, 5}:
//
//	lock:1..3          our locks, EX 50, and records; lock:1:run 2 batches
//	temp:idx:fr        -> idx:fr   {u1, u2}; idx:fr holds {old}
//	temp:idx:de        -> idx:de   {u3};     idx:de holds {old}
//	temp:h             -> h        {a: 1, b: 2}; h holds {old: 1}, EX 1000
//	temp:z             -> z        {u1: 1}; z holds {old: 5}
//	orphan idx:us      {u9}: a bucket the run did not produce; idx:it absent
//	idx:gb             {u7}: a live bucket that is neither (created after the
//	                   run's scan of the family)
//	meta:1             generation 7
//	lock:1:log         the family idx's: E0, replayed by the run (offset 1,
//	                   work 2): SADD idx:fr early; then the tail: E1 moves u3
//	                   from de (emptied) to es (a bucket the tail creates), E2
//	                   adds u10 to the orphan idx:us (re-created after its
//	                   UNLINK), E3 adds u8 to idx:gb; 4 logged, work 10
//	lock:2:log         h's: E4 sets c, and removes a (which holds 1) and b
//	                   only while it holds 9 (it holds 2: kept); 1 logged,
//	                   work 9
//	lock:3:log         z's: E5 adds u2, and removes u1 while its score is 1;
//	                   1 logged, work 6
//
// The tail holds 5 entries (E1-E5) of work 23; the bounds are 10 and 100.
func seedTail(t *testing.T, c rueidis.Client, p string) tailCall {
	t.Helper()
	k := func(names ...string) []string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = p + n
		}
		return out
	}
	call := tailCall{
		publishCall: publishCall{
			token:      scriptTok,
			locks:      k("lock:1", "lock:2", "lock:3"),
			records:    k("lock:1:run", "lock:2:run", "lock:3:run"),
			receipts:   k("lock:1:done"),
			ctls:       k("lock:1:ctl"),
			temps:      k("temp:idx:fr", "temp:idx:de", "temp:h", "temp:z"),
			lives:      k("idx:fr", "idx:de", "h", "z"),
			orphans:    k("idx:us", "idx:it"),
			metas:      k("meta:1"),
			flags:      "2222",
			batches:    "2",
			keep:       "0",
			receiptTTL: "30",
			now:        scriptNow,
		},
		logs:     k("lock:1:log", "lock:2:log", "lock:3:log"),
		offsets:  []string{"1", "0", "0"},
		highest:  []string{"3", "1", "0"},
		works:    []string{"2", "0", "0"},
		owners:   k("idx", "h", "z"),
		families: []string{"1", "0", "0"},
		maxTail:  "10",
		maxWork:  "100",
	}
	cmds(t, c,
		[]string{"SET", call.locks[0], scriptTok, "EX", "50"},
		[]string{"SET", call.locks[1], scriptTok, "EX", "50"},
		[]string{"SET", call.locks[2], scriptTok, "EX", "50"},
		[]string{"HSET", call.records[0], "token", scriptTok, "batches", "2", "logged", "4", "work", "10"},
		[]string{"HSET", call.records[1], "token", scriptTok, "logged", "1", "work", "9"},
		[]string{"HSET", call.records[2], "token", scriptTok, "logged", "1", "work", "6"},
		[]string{"SADD", call.temps[0], "u1", "u2"},
		[]string{"SADD", call.temps[1], "u3"},
		[]string{"HSET", call.temps[2], "a", "1", "b", "2"},
		[]string{"ZADD", call.temps[3], "1", "u1"},
		[]string{"SADD", p + "idx:fr", "old"},
		[]string{"SADD", p + "idx:de", "old"},
		[]string{"HSET", p + "h", "old", "1"},
		[]string{"EXPIRE", p + "h", "1000"},
		[]string{"ZADD", p + "z", "5", "old"},
		[]string{"SADD", p + "idx:us", "u9"},
		[]string{"SADD", p + "idx:gb", "u7"},
		[]string{"HSET", call.metas[0], "seq", "7", "gen", "7", "at", "1"},
		[]string{"RPUSH", call.logs[0],
			entry(op("SADD", p+"idx:fr", "early")),
			entry(op("SREM", p+"idx:de", "u3"), op("SADD", p+"idx:es", "u3")),
			entry(op("SADD", p+"idx:us", "u10")),
			entry(op("SADD", p+"idx:gb", "u8"))},
		[]string{"RPUSH", call.logs[1], entry(op("HSET", p+"h", "c", "3"), op("HDELIF", p+"h", "a", "1"), op("HDELIF", p+"h", "b", "9"))},
		[]string{"RPUSH", call.logs[2], entry(op("ZADD", p+"z", "2", "u2"), op("ZREMIF", p+"z", "1", "u1"))},
	)
	for _, k := range slices.Concat(call.temps, call.logs, call.records) {
		cmds(t, c, []string{"EXPIRE", k, "80"})
	}
	return call
}

// push appends entries to log i of call, and counts them in its record as
// Apply does.
func (c tailCall) push(i int, entries ...string) [][]string {
	work := 0
	for _, e := range entries {
		if ops, err := protocol.DecodeEntry(e); err == nil {
			work += workOf(ops)
		}
	}
	return [][]string{
		append([]string{"RPUSH", c.logs[i]}, entries...),
		{"HINCRBY", c.records[i], "logged", strconv.Itoa(len(entries))},
		{"HINCRBY", c.records[i], "work", strconv.Itoa(work)},
	}
}

// wantTailPublished checks the live keys after a seedTail call that
// succeeded: the temp keys renamed over them, then the tail replayed.
func wantTailPublished(t *testing.T, c rueidis.Client, p string) {
	t.Helper()
	wantMembers(t, c, p+"idx:fr", "u1", "u2") // E0 was replayed by the run: not again
	redistest.WantAbsent(t, c, p+"idx:de")    // emptied by the tail's SREM
	wantMembers(t, c, p+"idx:es", "u3")       // created by the tail
	wantMembers(t, c, p+"idx:us", "u10")      // the orphan, unlinked, then re-created
	redistest.WantAbsent(t, c, p+"idx:it")
	wantMembers(t, c, p+"idx:gb", "u7", "u8")
	redistest.WantHash(t, c, p+"h", map[string]string{"b": "2", "c": "3"})
	wantScores(t, c, p+"z", map[string]float64{"u2": 2})
	for _, k := range []string{"idx:fr", "idx:es", "idx:us", "idx:gb", "z"} {
		redistest.WantPTTL(t, c, p+k, -1, -1)
	}
	for _, k := range []string{"temp:idx:fr", "temp:idx:de", "temp:h", "temp:z"} {
		redistest.WantAbsent(t, c, p+k)
	}
}

func TestScriptPublishTail(t *testing.T) {
	// publish.lua's tail: the entries of each log past its offset are
	// replayed onto the live keys right after the renames and the orphans'
	// retirement, in the same atomic step: {1, o..., g..., c} with c the
	// number of entries replayed; the conditional removals remove only what
	// holds their value (C76). The logs themselves are left to the release.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		t.Run("replayed", func(t *testing.T) {
			p := casePrefix(t, d.Other, d.Prefix)
			call := seedTail(t, d.Other, p)
			before := redistest.Snapshot(t, d.Other, p)
			wantReply(t, call.run(t, d.Client), 1, 1, 1, 1, 1, 8, 5)
			wantTailPublished(t, d.Other, p)
			redistest.WantString(t, d.Other, call.receipts[0], scriptTok)
			written := slices.Concat(call.temps, call.lives, call.orphans, call.receipts, call.metas, []string{p + "idx:es", p + "idx:gb"})
			wantUntouched(t, d.Other, p, before, written...) // the logs, locks and records too
		})

		t.Run("keep previous", func(t *testing.T) {
			// The old values go to their prev keys before the tail, so
			// the tail's ops land on the new values only.
			p := casePrefix(t, d.Other, d.Prefix)
			call := seedTail(t, d.Other, p)
			call.keep = "600"
			for _, k := range slices.Concat(call.lives, call.orphans) {
				call.prevs = append(call.prevs, k+":prev")
			}
			wantReply(t, call.run(t, d.Client), 1, 1, 1, 1, 1, 8, 5)
			wantTailPublished(t, d.Other, p)
			wantMembers(t, d.Other, p+"idx:de:prev", "old")
			wantMembers(t, d.Other, p+"idx:us:prev", "u9")
			wantFields(t, d.Other, p+"h:prev", map[string]string{"old": "1"})
			redistest.WantAbsent(t, d.Other, p+"idx:it:prev")
		})

		t.Run("at the bounds", func(t *testing.T) {
			p := casePrefix(t, d.Other, d.Prefix)
			call := seedTail(t, d.Other, p)
			call.maxTail, call.maxWork = "5", "23"
			wantReply(t, call.run(t, d.Client), 1, 1, 1, 1, 1, 8, 5)
			wantTailPublished(t, d.Other, p)
		})

		t.Run("no tail", func(t *testing.T) {
			// Every entry replayed by the run, and bounds of 0: only the
			// renames, and c = 0.
			p := casePrefix(t, d.Other, d.Prefix)
			call := seedTail(t, d.Other, p)
			call.offsets, call.highest, call.works, call.maxTail, call.maxWork = []string{"4", "1", "1"}, []string{"4", "1", "1"}, []string{"10", "9", "6"}, "0", "0"
			wantReply(t, call.run(t, d.Client), 1, 1, 1, 1, 1, 8, 0)
			wantMembers(t, d.Other, p+"idx:de", "u3")
			redistest.WantAbsent(t, d.Other, p+"idx:es")
			redistest.WantAbsent(t, d.Other, p+"idx:us")
			wantMembers(t, d.Other, p+"idx:gb", "u7")
			redistest.WantHash(t, d.Other, p+"h", map[string]string{"a": "1", "b": "2"})
		})

		t.Run("an emptied target", func(t *testing.T) {
			// A temp key the run saw emptied (flag '0', absent): its live
			// key is deleted, then the tail re-creates it with its own
			// entries only.
			p := casePrefix(t, d.Other, d.Prefix)
			call := seedTail(t, d.Other, p)
			call.flags = "2022"
			cmds(t, d.Other, []string{"DEL", call.temps[1]})
			cmds(t, d.Other, call.push(0, entry(op("SADD", p+"idx:de", "u5")))...)
			wantReply(t, call.run(t, d.Client), 1, 1, 2, 1, 1, 8, 6)
			wantMembers(t, d.Other, p+"idx:de", "u5")
			redistest.WantPTTL(t, d.Other, p+"idx:de", -1, -1)
		})
	})
}

func TestScriptPublishTailFailsClosed(t *testing.T) {
	// publish.lua refuses a tail before any write, after the fence, the
	// records, the metas and the temp keys. First the counts (C73): {-18,
	// i, len, logged} when log i holds fewer entries than its record
	// counts, or its count is below the highest the run saw; {-19, i, len,
	// logged} when it holds more (entries nobody counted). Then the bounds
	// (C77): {-7, i, n, w} when the tails hold n entries of work w (from
	// the counters), over a bound, log i the first with one; and, as the
	// entries are read, when their work counted again goes over the bound
	// (a counter forged low). Then each entry: {-10, i} for "!overrun";
	// {-9, i, e, why} for entry e that is not a change; {-13, i, e, key}
	// for one that writes a key not its builder's (C72); {-8, key, type}
	// for an op on a key of another type, as the key will be after the
	// renames (a target has its temp key's type, an orphan none) and after
	// the tail's earlier ops. Each way every key is byte-identical and no
	// receipt is written.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		for _, tt := range []struct {
			name  string
			setup func(c *tailCall, p string) [][]string
			want  func(c tailCall, p string) []any
		}{
			{"a log deleted", func(c *tailCall, p string) [][]string {
				return [][]string{{"DEL", c.logs[1]}}
			}, func(c tailCall, p string) []any { return reply(-18, 2, 0, 1) }},
			{"a log shortened", func(c *tailCall, p string) [][]string {
				return [][]string{{"LPOP", c.logs[0]}}
			}, func(c tailCall, p string) []any { return reply(-18, 1, 3, 4) }},
			{"a log and its count rolled back", func(c *tailCall, p string) [][]string {
				c.highest[0] = "5"
				return nil
			}, func(c tailCall, p string) []any { return reply(-18, 1, 4, 4) }},
			{"a record without counts", func(c *tailCall, p string) [][]string {
				return [][]string{{"HDEL", c.records[2], "logged", "work"}}
			}, func(c tailCall, p string) []any { return reply(-19, 3, 1, 0) }},
			{"an entry nobody counted", func(c *tailCall, p string) [][]string {
				return [][]string{{"RPUSH", c.logs[2], entry(op("ZADD", p+"z", "1", "u5"))}}
			}, func(c tailCall, p string) []any { return reply(-19, 3, 2, 1) }},
			{"counts checked before the bounds", func(c *tailCall, p string) [][]string {
				c.maxTail = "0"
				return [][]string{{"RPUSH", c.logs[2], "garbage"}}
			}, func(c tailCall, p string) []any { return reply(-19, 3, 2, 1) }},
			{"tail over the bound", func(c *tailCall, p string) [][]string {
				c.maxTail = "4"
				return nil
			}, func(c tailCall, p string) []any { return reply(-7, 1, 5, 23) }},
			{"tail over a bound of 0", func(c *tailCall, p string) [][]string {
				c.maxTail = "0"
				return nil
			}, func(c tailCall, p string) []any { return reply(-7, 1, 5, 23) }},
			{"work over the bound", func(c *tailCall, p string) [][]string {
				c.maxWork = "22"
				return nil
			}, func(c tailCall, p string) []any { return reply(-7, 1, 5, 23) }},
			{"work counted low, counted again", func(c *tailCall, p string) [][]string {
				c.maxWork = "10"
				return [][]string{{"HSET", c.records[0], "work", "2"}, {"HSET", c.records[1], "work", "0"}, {"HSET", c.records[2], "work", "0"}}
			}, func(c tailCall, p string) []any { return reply(-7, 2, 5, 17) }},
			{"tail only in the second log", func(c *tailCall, p string) [][]string {
				c.offsets, c.works, c.maxTail = []string{"4", "0", "1"}, []string{"10", "0", "6"}, "0"
				return nil
			}, func(c tailCall, p string) []any { return reply(-7, 2, 1, 9) }},
			{"bound checked before the entries", func(c *tailCall, p string) [][]string {
				c.maxTail = "5"
				return c.push(1, "garbage")
			}, func(c tailCall, p string) []any { return reply(-7, 1, 6, 23) }},
			{"lock checked before the tail", func(c *tailCall, p string) [][]string {
				c.maxTail = "0"
				return [][]string{{"SET", c.locks[1], thiefTok, "EX", "40"}}
			}, func(c tailCall, p string) []any { return reply(-1, 2) }},
			{"temp keys checked before the tail", func(c *tailCall, p string) [][]string {
				return [][]string{{"DEL", c.temps[2]}, {"RPUSH", c.logs[0], "garbage"}}
			}, func(c tailCall, p string) []any { return reply(0, 3) }},
			{"overrun", func(c *tailCall, p string) [][]string {
				return c.push(1, protocol.Overrun)
			}, func(c tailCall, p string) []any { return reply(-10, 2) }},
			{"overrun after a bad op", func(c *tailCall, p string) [][]string {
				return c.push(1, entry(op("SADD", p+"h", "x")), protocol.Overrun)
			}, func(c tailCall, p string) []any { return reply(-8, p+"h", "hash") }},
			{"garbage", func(c *tailCall, p string) [][]string {
				return c.push(1, "garbage")
			}, func(c tailCall, p string) []any { return reply(-9, 2, 1, "it is not a change as keyswap encodes one") }},
			{"not a change's command", func(c *tailCall, p string) [][]string {
				return c.push(2, "3:DEL"+strconv.Itoa(len(p+"z"))+":"+p+"z1:11:x")
			}, func(c tailCall, p string) []any {
				return reply(-9, 3, 1, "its command DEL is not one a builder writes")
			}},
			// Ops Redis refuses, which redis.acl_check_cmd lets through:
			// before lib/changes.lua refused them, each failed the script
			// after the renames.
			{"no args", func(c *tailCall, p string) [][]string {
				return c.push(0, entry(op("SADD", p+"idx:fr")))
			}, func(c tailCall, p string) []any { return reply(-9, 1, 4, "its SADD has 0 arguments") }},
			{"an odd HSET", func(c *tailCall, p string) [][]string {
				return c.push(1, entry(op("HSET", p+"h", "f")))
			}, func(c tailCall, p string) []any { return reply(-9, 2, 1, "its HSET has 1 arguments") }},
			{"an odd HDELIF", func(c *tailCall, p string) [][]string {
				return c.push(1, entry(op("HDELIF", p+"h", "f")))
			}, func(c tailCall, p string) []any { return reply(-9, 2, 1, "its HDELIF has 1 arguments") }},
			{"a score ZADD refuses", func(c *tailCall, p string) [][]string {
				return c.push(2, entry(op("ZADD", p+"z", "abc", "m")))
			}, func(c tailCall, p string) []any { return reply(-9, 3, 1, "its ZADD has the score abc") }},
			{"a score out of range", func(c *tailCall, p string) [][]string {
				return c.push(2, entry(op("ZREMIF", p+"z", "1e400", "m")))
			}, func(c tailCall, p string) []any { return reply(-9, 3, 1, "its ZREMIF has the score 1e400") }},
			{"an empty key", func(c *tailCall, p string) [][]string {
				return c.push(0, "4:SADD0:1:11:m")
			}, func(c tailCall, p string) []any { return reply(-9, 1, 4, "its SADD has an empty key") }},
			// Keys that are not the log's builder's (C72).
			{"another builder's key", func(c *tailCall, p string) [][]string {
				return c.push(1, entry(op("ZADD", p+"z", "1", "m")))
			}, func(c tailCall, p string) []any { return reply(-13, 2, 1, p+"z") }},
			{"a key outside the run", func(c *tailCall, p string) [][]string {
				return c.push(0, entry(op("SADD", p+"admins", "mallory")))
			}, func(c tailCall, p string) []any { return reply(-13, 1, 4, p+"admins") }},
			{"a family's prefix", func(c *tailCall, p string) [][]string {
				return c.push(0, entry(op("SADD", p+"idx:", "m")))
			}, func(c tailCall, p string) []any { return reply(-13, 1, 4, p+"idx:") }},
			{"a family's lock", func(c *tailCall, p string) [][]string {
				return c.push(0, entry(op("SADD", p+"idx:rebuild-lock", "m")))
			}, func(c tailCall, p string) []any { return reply(-13, 1, 4, p+"idx:rebuild-lock") }},
			{"a bucket's temp key", func(c *tailCall, p string) [][]string {
				return c.push(0, entry(op("SADD", p+"idx:fr:rebuild:1700000000:0123456789abcdef", "m")))
			}, func(c tailCall, p string) []any {
				return reply(-13, 1, 4, p+"idx:fr:rebuild:1700000000:0123456789abcdef")
			}},
			{"a bucket's kept value", func(c *tailCall, p string) [][]string {
				return c.push(0, entry(op("SADD", p+"idx:fr:rebuild-prev", "m")))
			}, func(c tailCall, p string) []any { return reply(-13, 1, 4, p+"idx:fr:rebuild-prev") }},
			{"a foreign op after good ones in one entry", func(c *tailCall, p string) [][]string {
				return c.push(1, entry(op("HSET", p+"h", "d", "4"), op("SADD", p+"admins", "mallory")))
			}, func(c tailCall, p string) []any { return reply(-13, 2, 1, p+"admins") }},
			{"a key of another type in the family", func(c *tailCall, p string) [][]string {
				return append([][]string{{"SET", p + "idx:other", "x"}}, c.push(0, entry(op("SADD", p+"idx:other", "m")))...)
			}, func(c tailCall, p string) []any { return reply(-8, p+"idx:other", "string") }},
			{"a target's type after the rename", func(c *tailCall, p string) [][]string {
				// h holds a set now, but the hash temp:h will replace it.
				return append([][]string{{"DEL", p + "h"}, {"SADD", p + "h", "x"}}, c.push(1, entry(op("SADD", p+"h", "m")))...)
			}, func(c tailCall, p string) []any { return reply(-8, p+"h", "hash") }},
			{"an orphan's type after the tail's first op", func(c *tailCall, p string) [][]string {
				// The orphan is gone after the renames, re-created as a
				// set by E2.
				return c.push(0, entry(op("HSET", p+"idx:us", "f", "v")))
			}, func(c tailCall, p string) []any { return reply(-8, p+"idx:us", "set") }},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, d.Other, d.Prefix)
				call := seedTail(t, d.Other, p)
				cmds(t, d.Other, tt.setup(&call, p)...)
				before := redistest.Snapshot(t, d.Other, p)
				wantReply(t, call.run(t, d.Client), tt.want(call, p)...)
				wantUntouched(t, d.Other, p, before)
			})
		}
	})
}

func TestScriptPublishTailRefused(t *testing.T) {
	// publish.lua for a user that may not run what the tail needs: LLEN
	// or LRANGE on a log, HMGET of the counts on a record, checked with the
	// script's own commands; an op's command on its key (a conditional
	// removal's HGET and HDEL), or TYPE on a key outside the targets,
	// checked as the tail is read: {-2, cmd, key}, and nothing written.
	forEachACLTarget(t, func(t *testing.T, a aclTarget) {
		for _, tt := range []struct {
			name    string
			deny    string
			allowOn []string
			want    func(c tailCall, p string) []any
		}{
			{"LLEN on a log", "llen", nil, func(c tailCall, p string) []any { return reply(-2, "LLEN", c.logs[0]) }},
			{"LRANGE on the second log", "lrange", []string{"lock:1:log"}, func(c tailCall, p string) []any { return reply(-2, "LRANGE", c.logs[1]) }},
			{"HMGET on a record", "hmget", []string{"lock:*:ctl"}, func(c tailCall, p string) []any { return reply(-2, "HMGET", c.records[0]) }},
			{"SADD", "sadd", nil, func(c tailCall, p string) []any { return reply(-2, "SADD", p+"idx:es") }},
			{"SREM on a target", "srem", nil, func(c tailCall, p string) []any { return reply(-2, "SREM", p+"idx:de") }},
			{"HGET of an HDELIF", "hget", []string{"meta:*", "lock:*"}, func(c tailCall, p string) []any { return reply(-2, "HGET", p+"h") }},
			{"HDEL of an HDELIF", "hdel", []string{"meta:*"}, func(c tailCall, p string) []any { return reply(-2, "HDEL", p+"h") }},
			{"ZADD", "zadd", nil, func(c tailCall, p string) []any { return reply(-2, "ZADD", p+"z") }},
			{"ZREM of a ZREMIF", "zrem", nil, func(c tailCall, p string) []any { return reply(-2, "ZREM", p+"z") }},
			// Sent only for a tail: before it was checked, the TYPE of a
			// temp key failed the script with the server's own refusal.
			{"TYPE on a temp key", "type", []string{"meta:*"}, func(c tailCall, p string) []any { return reply(-2, "TYPE", c.temps[0]) }},
			{"TYPE outside the targets", "type", []string{"meta:*", "temp:*"}, func(c tailCall, p string) []any { return reply(-2, "TYPE", p+"idx:es") }},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, a.admin, a.prefix)
				c := a.srv.ClientAs(t, "ks-"+t.Name(), deniedRules(p, tt.deny, tt.allowOn...)...)
				call := seedTail(t, a.admin, p)
				before := redistest.Snapshot(t, a.admin, p)
				wantReply(t, call.run(t, c), tt.want(call, p)...)
				wantUntouched(t, a.admin, p, before)
			})
		}
	})
}

func TestPublishTail(t *testing.T) {
	// protocol.Publisher.Publish sends the logs with their offsets, counts and
	// builders, and reads what the tail did: Published.Replayed, or a
	// *BehindError, or an error matching ErrFallingBehind for an overrun,
	// ErrWritesLost for a log that lost entries, ErrTampered for one that
	// holds entries nobody counted or an entry that is not a change of its
	// builder's keys (naming the log, the entry and the key), or one
	// naming the key and its type; each one PublishRefused; after a
	// refusal every key is as it was.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		core := protocol.New(d.Client, nil)
		opts := func(c tailCall, maxTail int, maxWork int64) protocol.PublishOptions {
			o := protocol.PublishOptions{Op: "publish", Key: c.lives[0], Records: true, Batches: 2, MaxTail: maxTail, MaxWork: maxWork,
				Metas: c.metas, Orphans: c.orphans, PreserveFor: time.Minute, Now: time.UnixMilli(1700000000123)}
			for _, l := range c.locks {
				o.Locks = append(o.Locks, &protocol.Lock{Live: l, Key: l, Token: scriptTok, TTL: 50 * time.Second})
			}
			for i := range c.temps {
				o.Targets = append(o.Targets, protocol.Target{Temp: c.temps[i], Live: c.lives[i], Populated: true, HasTTL: true})
			}
			for i, l := range c.logs {
				n, _ := strconv.ParseInt(c.offsets[i], 10, 64)
				h, _ := strconv.ParseInt(c.highest[i], 10, 64)
				w, _ := strconv.ParseInt(c.works[i], 10, 64)
				o.Logs = append(o.Logs, protocol.LogOffset{Key: l, Offset: n, Logged: h, Work: w, Owner: c.owners[i], Family: c.families[i] == "1"})
			}
			return o
		}

		t.Run("replayed", func(t *testing.T) {
			p := casePrefix(t, d.Other, d.Prefix)
			call := seedTail(t, d.Other, p)
			got, err := core.Publisher.Publish(ctx, opts(call, 5, 23))
			if err != nil || got.Replayed != 5 || !slices.Equal(got.Generations, []int64{8}) {
				t.Fatalf("Publish = %+v, %v; want 5 replayed, generation 8", got, err)
			}
			wantTailPublished(t, d.Other, p)
		})

		for _, tt := range []struct {
			name    string
			maxTail int
			maxWork int64
			setup   func(c tailCall, p string) [][]string
			check   func(t *testing.T, c tailCall, p string, err error)
		}{
			{"behind", 4, 100, nil, func(t *testing.T, c tailCall, p string, err error) {
				var behind *protocol.BehindError
				if !errors.As(err, &behind) || behind.Log != c.logs[0] || behind.Tail != 5 || behind.Work != 23 {
					t.Errorf("Publish: got %v, want a *BehindError of %s with a tail of 5 of work 23", err, c.logs[0])
				}
				if errors.Is(err, protocol.ErrFallingBehind) {
					t.Errorf("Publish: %v matches ErrFallingBehind: the run catches up again first", err)
				}
			}},
			{"behind in work", 10, 20, nil, func(t *testing.T, c tailCall, p string, err error) {
				var behind *protocol.BehindError
				if !errors.As(err, &behind) || behind.Work != 23 {
					t.Errorf("Publish: got %v, want a *BehindError of work 23", err)
				}
			}},
			{"overrun", 10, 100, func(c tailCall, p string) [][]string {
				return c.push(1, protocol.Overrun)
			}, func(t *testing.T, c tailCall, p string, err error) {
				if !errors.Is(err, protocol.ErrFallingBehind) || !strings.Contains(err.Error(), c.logs[1]) {
					t.Errorf("Publish: got %v, want ErrFallingBehind naming %s", err, c.logs[1])
				}
			}},
			{"a log lost", 10, 100, func(c tailCall, p string) [][]string {
				return [][]string{{"DEL", c.logs[1]}}
			}, func(t *testing.T, c tailCall, p string, err error) {
				if !errors.Is(err, protocol.ErrWritesLost) || !strings.Contains(err.Error(), c.logs[1]+" holds 0 entries, where Apply counted 1") {
					t.Errorf("Publish: got %v, want ErrWritesLost naming %s and its counts", err, c.logs[1])
				}
			}},
			{"an entry nobody counted", 10, 100, func(c tailCall, p string) [][]string {
				return [][]string{{"RPUSH", c.logs[2], entry(op("ZADD", p+"z", "1", "m"))}}
			}, func(t *testing.T, c tailCall, p string, err error) {
				if !errors.Is(err, protocol.ErrTampered) || !strings.Contains(err.Error(), c.logs[2]+" holds 2 entries, but Apply counted 1") {
					t.Errorf("Publish: got %v, want ErrTampered naming %s and its counts", err, c.logs[2])
				}
			}},
			{"garbage", 10, 100, func(c tailCall, p string) [][]string {
				return c.push(1, "garbage")
			}, func(t *testing.T, c tailCall, p string, err error) {
				if !errors.Is(err, protocol.ErrTampered) || !strings.Contains(err.Error(), c.logs[1]+", entry 1 (LINDEX 1), is not a change") {
					t.Errorf("Publish: got %v, want ErrTampered naming %s and its entry", err, c.logs[1])
				}
			}},
			{"a foreign key", 10, 100, func(c tailCall, p string) [][]string {
				return c.push(0, entry(op("SADD", p+"admins", "mallory")))
			}, func(t *testing.T, c tailCall, p string, err error) {
				if !errors.Is(err, protocol.ErrTampered) || !strings.Contains(err.Error(), c.logs[0]+", entry 4 (LINDEX 4), writes "+strconv.Quote(p+"admins")) {
					t.Errorf("Publish: got %v, want ErrTampered naming %s, the entry and the key", err, c.logs[0])
				}
			}},
			{"a forged record", 10, 100, func(c tailCall, p string) [][]string {
				return [][]string{{"HSET", c.records[1], "token", thiefTok}}
			}, func(t *testing.T, c tailCall, p string, err error) {
				if !errors.Is(err, protocol.ErrTampered) || !strings.Contains(err.Error(), c.records[1]) {
					t.Errorf("Publish: got %v, want ErrTampered naming %s", err, c.records[1])
				}
			}},
			{"a cancel", 10, 100, func(c tailCall, p string) [][]string {
				return [][]string{{"HSET", c.ctls[0], "token", scriptTok, "cancel", "1"}}
			}, func(t *testing.T, c tailCall, p string, err error) {
				if !errors.Is(err, protocol.ErrAborted) {
					t.Errorf("Publish: got %v, want ErrAborted", err)
				}
			}},
			{"wrong type", 10, 100, func(c tailCall, p string) [][]string {
				return append([][]string{{"SET", p + "idx:other", "x"}}, c.push(0, entry(op("SADD", p+"idx:other", "m")))...)
			}, func(t *testing.T, c tailCall, p string, err error) {
				if err == nil || !strings.Contains(err.Error(), `"`+p+`idx:other" holds a string`) {
					t.Errorf("Publish: got %v, want an error naming the key and its type", err)
				}
			}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := casePrefix(t, d.Other, d.Prefix)
				call := seedTail(t, d.Other, p)
				if tt.setup != nil {
					cmds(t, d.Other, tt.setup(call, p)...)
				}
				before := redistest.Snapshot(t, d.Other, p)
				_, err := core.Publisher.Publish(ctx, opts(call, tt.maxTail, tt.maxWork))
				var e *protocol.Error
				if !errors.As(err, &e) || e.Op != "publish" {
					t.Errorf("Publish: got %v, want an *Error of op publish", err)
				}
				if !protocol.PublishRefused(err) {
					t.Errorf("PublishRefused(%v) = false, want true: the script refused before any write", err)
				}
				tt.check(t, call, p, err)
				wantUntouched(t, d.Other, p, before)
			})
		}
	})
}

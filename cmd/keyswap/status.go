package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
)

const statusUsage = `Usage: keyswap status [flags] [pattern | key]

Status lists what keyswap keeps in Redis right now, and changes nothing:

  - rebuilds in progress: their lock keys (<key>:rebuild-lock), each
    lock's remaining TTL and the first 8 characters of its token;
  - the runs of rebuild.Rebuilder among them (a lock whose record,
    <lock>:run, carries the lock's token), from what their heartbeats
    write every second: owner (host:pid), phase (building, catching up,
    held, publishing), age, items pulled, entries written, the current
    rate (RATE: items/s over about the last five seconds, so that a
    throttle or a pause shows within seconds; "-" for a run of an older
    keyswap), the average rate since the start (AVG), limit (items/s,
    "none"), ETA at the current rate (when the run was given
    Options.Expected; "-" while paused or nothing is pulled), time since the last
    heartbeat (BEAT) and since the last item (PROGRESS), changes applied
    meanwhile (logged/replayed), and the operator's requests pending
    (cancel, paused, max_rate=N, action=publish|discard); then each of
    their keys (a family's prefix for a family) with its generation;
  - the indexes published (a live key, or a family's prefix), from their
    meta (<key>:rebuild-gen), which every publish writes: the generation
    live and since when, the one kept for 'keyswap rollback' and until
    when, and whether a rollback would roll back now (ROLLBACK: yes, or no
    and why: none kept, expired, a rebuild in progress, never published,
    base is another index's),
    as the rollback itself decides it;
  - the indexes published in Generations mode (rebuild.Options.Publish =
    rebuild.Generations), which have a pointer (<key>:rebuild-ptr) naming
    their current generation and a registry of generations
    (<key>:rebuild-gens): a GENERATIONS table gives each one's mode
    ("generations", "rename" for an index whose registry outlived its
    pointer: switched back to rename-in-place, or "group" for an index
    whose pointer outside any group holds "group:<name>": the index is in
    that group, shown with its group beside it, and read with --group),
    its current generation,
    the previous one kept for 'keyswap rollback' (which flips back to it),
    the retired ones waiting for their removal, since when, and whether a
    sweep removes them now (retired more than --grace ago), the builds in
    progress (the start of their run's token, as in RUNS) and those
    abandoned by a run that is gone, and a note: "switching" for an index
    whose plain key from rename-in-place is still there beside its pointer
    (a family's plain buckets are not looked for: that takes a scan), or
    "unreadable" and why, for a registry or pointer that holds what no run
    writes, or that Redis refused to read (an ACL without EVALSHA: the
    registry is read with a script, in one step with the pointer). Their
    generations are the registry's, allocated one per run, while GEN in
    INDEXES counts the publishes and rollbacks of the index. ROLLBACK in INDEXES follows the rule of Generations mode for
    them: possible while a previous generation is kept and no rebuild
    holds the lock;
  - the indexes of a group (rebuild.Options.Group), whose meta, pointer,
    registry and lock are named "{<group>}:rebuild-group:<key>:...": a
    scan shows each under its key, followed by "(group <group>)"; with
    --index, give its group with --group;
  - on Redis Cluster, the keys X and {X} share one base, {X} (as do a}b
    and {rbN}a}b), after which a scan finds the index: it is named after
    the base's owner stamp (<base>:rebuild-owner), which every run in
    Generations mode writes; an index in Generations mode without a stamp
    naming one of the two (or any index with a stamp of another type or
    naming neither) is shown with "(ambiguous: {X} or X, ...)" and why
    beside its name, and one that only ever rebuilt in place, which keeps
    no stamp, is named X; 'status X' by key reads that stamp too (one
    GET): when it names {X}, X is shown as an index rebuilt in place,
    "(rebuilt in place: its base is that of {X}, ...)", without the
    base's meta, pointer or registry, which are {X}'s (even when {X} is in
    a group), and a stamp absent beside a pointer or registry, of another
    type, or naming neither marks it ambiguous as above;
  - temp keys (<key>:rebuild:<unix>:<16 hex>): their age, from the
    timestamp in the name; their TTL ("none" when they have none); their
    Redis type and size (entries, or bytes for a string); MEMORY USAGE;
    whether a held rebuild lock protects them; and whether 'keyswap sweep'
    with the same -older-than would delete them.

A temp key without a TTL that no lock protects was left behind by a
crashed process: once older than -older-than it is a sweep candidate. A
TTL-less temp key under a held lock is normal: a rebuild has written it and
not touched it yet. Sweep candidates are decided by the sweep's own rule,
so status and sweep agree. A generation retired more than --grace ago, or
abandoned by its run, is a sweep candidate too, by the same rule as the
sweep's. When there are some, status prints the sweep
command that lists them (and, with --delete, deletes them), limited to the
keys that the pattern selects, with the connection flags that reach the same
server (a password given on the command line becomes --askpass: a
suggested command never repeats a password). The tables start with the
server they read.

A pattern, or --pattern, is a Redis glob (as in SCAN MATCH: * ? [a-z] \x)
matched against the live key that a lock, meta or temp key belongs to:
'keyswap status "users:*"' shows the rebuilds and indexes of
users:by-email and of users:by-country. On Redis Cluster, keyswap may pin
a live key to its slot with a hash tag ({users:by-email}:rebuild-lock);
the pattern is matched with and without that tag. Without a pattern,
everything is listed. Every '[' must be closed by a ']', and a final '\'
must be escaped ('\\'). Status then scans the keyspace once with SCAN, on
every master of a cluster, never with KEYS, which takes longer the larger
the keyspace. Its MATCH leaves out the data keys of generations
(<key>:rebuild-g:<G>, <prefix>:rebuild-g:<G>:<bucket>), which status does
not read: however many buckets a family has, Redis sends status only
keyswap's other keys (and no temp key whose timestamp has one digit, a
time in 1970 that no rebuild writes).

An argument without a glob character (* ? [ \), or --index, is a live
key (a family's prefix for a family): 'keyswap status users:by-email'
reads that key's lock, the run holding it (whichever of the run's keys it
is), the run's other locks, its temp keys (but a family's buckets', which
only a scan finds) and the key's index, without a scan: a few commands,
whatever the size of the keyspace. Temp keys that crashed processes left
are not looked for then, and the summary gives the command that scans for
them (--pattern with the key, its glob characters escaped).

With --watch, status shows its snapshot again every --interval (1s) until
interrupted (Ctrl-C), each one under a line naming the query and the
time, on a cleared screen when stdout is a terminal; with -json, each
snapshot is one JSON object on one line. Every snapshot of a pattern scans
the keyspace again: on a large one, watch a key, or give a longer
--interval. An error of the first snapshot ends the watch; a later one (a
failover, a restart) is shown in its place, in JSON as the object that
-json errors print (see 'keyswap -h') with its "time", and the watch goes
on.

What status prints is a snapshot: rebuilds start and end while it runs.

Exit status: 0 when there is no sweep candidate, 3 when there are some (for
monitoring), 1 on an error, 2 on a usage error. Status of one key looks for
no orphaned temp key, but reads the key's registry of generations: it
exits 3 when a sweep would remove some of them, 0 otherwise. --watch exits 0 once interrupted, 1 when
its first snapshot fails.

JSON output (-json) is one object, whose fields are kept stable:

  {
    "server": {                       the Redis read
      "mode": "standalone",           standalone, cluster or sentinel
      "addrs": ["10.0.0.5:6379"],     the nodes (a cluster's), or the master
      "db": 0,
      "master_set": "mymaster"        Sentinel only
    },
    "time": "2025-01-02T15:04:05Z",   when the snapshot was taken
    "pattern": "users:*",             "" when none was given; absent for a key
    "key": "users:by-email",          status of one key only
    "scanned": true,                  false for a key: temp_keys holds its run's only
    "cluster": false,
    "older_than_seconds": 3600,
    "grace_ms": 10000,                --grace
    "locks": [{
      "key": "users:by-email:rebuild-lock",
      "base": "users:by-email",       the key the lock guards, as named
      "ttl_seconds": 298,             -1: no TTL
      "token_prefix": "3f9a1c2e"
    }],
    "temp_keys": [{
      "key": "users:by-email:rebuild:1735830245:0123456789abcdef",
      "base": "users:by-email",
      "timestamp": 1735830245,        Unix seconds, from the name
      "age_seconds": 12,
      "ttl_seconds": -1,              -1: no TTL
      "type": "hash",
      "size": 1000,                   null for types without a size
      "memory_bytes": 72088,          null when MEMORY USAGE is refused
      "locked": true,
      "lock_key": "users:by-email:rebuild-lock",   "" when unlocked
      "sweep_candidate": false
    }],
    "runs": [{
      "lock_key": "users:by-email:rebuild-lock",   the lock of its first key
      "token_prefix": "3f9a1c2e",
      "host": "app-1",
      "pid": 4242,
      "started": "2025-01-02T15:04:05.123Z",
      "lease_seconds": 300,
      "phase": "building",            building, catching up, held, publishing
      "items": 120000,                pulled from the source
      "entries": 240000,              written to the temp keys
      "acked": 60,                    batches Redis acknowledged
      "expected": 500000,             0: unknown
      "rate": 1998.3,                 items/s since the start
      "rate_now": 1000.5,             items/s over about the last 5 s; null: unknown
      "limit": 0,                     items/s; 0: none
      "latency_us": 0,                what the run's latency probes see, with a latency budget; 0: none
      "eta_seconds": 190,             at the current rate; null: unknown
      "beat_at": "2025-01-02T15:06:05.456Z",       null: none yet
      "progress_at": "2025-01-02T15:06:05.440Z",   the last item pulled
      "changes": 12,                  applied meanwhile, logged for the run
      "replayed": 0,                  of which replayed onto the temp keys
      "requests": {"cancel": false, "max_rate": 0, "paused": false, "action": ""},
      "temp_suffix": ":rebuild:1735830245:0123456789abcdef",
      "keys": [{
        "key": "users:by-email",      a family's prefix for a family
        "family": false,
        "generation": {               null: never published
          "gen": 7,
          "at": "2025-01-02T14:00:00Z",         since when it is live
          "prev": 6,                            kept for a rollback; null: none
          "prev_until": "2025-01-02T15:00:00Z", null when prev is
          "rolled_back": null                   the last rollback, if any
        }
      }]
    }],
    "indexes": [{
      "key": "users:by-email",        a family's prefix for a family
      "meta_key": "users:by-email:rebuild-gen",
      "family": false,
      "generation": {...},            as in "keys" above; null: never published
      "locked": false,                a rebuild (or a rollback) holds its lock
      "rollback": {
        "possible": true,             'keyswap rollback' would roll back now
        "until": "2025-01-02T15:00:00Z",  while possible; else null
        "why_not": ""                 "none_kept", "expired",
                                      "rebuild_in_progress", "never_published",
                                      "base_owned" (see "base_owner")
      },
      "mode": "generations",          "generations": it has a pointer; "group":
                                      its pointer holds a group's claim;
                                      else "rename"
      "generations": {                null: no registry and no pointer
        "current": 3,                 the pointer's; null: no pointer
        "previous": 2,                kept for a rollback; null: none
        "retired": [{"gen": 1, "since": "2025-01-02T15:04:05.123Z",
                     "removable": false}],     a sweep removes it now
        "building": [{"gen": 4, "token_prefix": "3f9a1c2e",
                      "abandoned": false}],    its run holds the lock no more
        "plain_keys_left": false,     the plain key is still there beside the
                                      pointer (switching); null: not looked for
        "error": "...",               only for a corrupt registry or pointer, or
                                      a read Redis refused
        "in_group": "g"               only for mode "group": the group whose
                                      claim the pointer holds; pass --group g
      },
      "ambiguous": "..."              only on a cluster, for a base that two
                                      keys share (X and {X}) whose owner stamp
                                      names neither: "key" is then a guess
      "base_owner": "{X}"             only from status by key, on a cluster:
                                      the other index whose base this one's
                                      is, as the base's owner stamp says;
                                      the index rebuilt in place, and the
                                      base's meta, pointer, registry and
                                      lock are not read as its
    }]
  }

Names are exact. Redis names are bytes: a name that is valid UTF-8 is a
JSON string, as above; any other name (a key holding the byte 0xff, say)
is given instead as the standard base64 of its bytes, in a field named
with "_base64" appended, and the plain field is left out: "key_base64",
"base_base64", "lock_key_base64", "meta_key_base64", "pattern_base64",
"base_owner_base64".

The table of runs and the "runs" field are read from the records, which
change every second: a run that ends between the scan and the read is left
out.`

// statusReport is the snapshot 'keyswap status' prints. statusJSON is its
// -json document.
type statusReport struct {
	// Server is the Redis read; SweepArgs the connection flags that reach
	// it again, for the sweep commands status suggests.
	Server    server
	SweepArgs []string
	Time      time.Time
	// Pattern is the glob of a scan. Key is the live key of a status of
	// one key (ByKey), which reads that key's lock, run and meta without
	// a scan.
	Pattern, Key     string
	ByKey            bool
	Cluster          bool
	OlderThanSeconds int64
	// Grace is the time past which a retired generation is a sweep
	// candidate.
	Grace    time.Duration
	Locks    []lockStatus
	TempKeys []tempStatus
	Runs     []runStatus
	// Indexes are the indexes published, from their metas: those the
	// pattern selects, or the key's.
	Indexes []indexStatus
}

// lockStatus is one rebuild lock: a rebuild in progress.
type lockStatus struct {
	Key         string
	Base        string
	TTLSeconds  int64
	TokenPrefix string
	token       string // the whole token, never printed
}

// runStatus is one run of rebuild.Rebuilder in progress, from its record.
type runStatus struct {
	runRecord
	// Generations are the run's keys, in order, with their generations.
	Generations []keyGeneration
}

// keyGeneration is one index and its generation: nil when none was ever
// published.
type keyGeneration struct {
	Key        string
	Family     bool
	Generation *generation
}

// tempStatus is one temp key.
type tempStatus struct {
	Key            string
	Base           string
	Timestamp      int64
	AgeSeconds     int64
	TTLSeconds     int64
	Type           string
	Size           *int64 // nil: unknown
	MemoryBytes    *int64 // nil: unknown
	Locked         bool
	LockKey        string // "" when unlocked
	SweepCandidate bool
}

// tokenPrefixLen is how much of a lock's token status shows: enough to tell
// two rebuilds apart, too little to forge a release.
const tokenPrefixLen = 8

// status is the 'keyswap status' command.
func (c *cli) status(ctx context.Context, args []string) error {
	fs := newFlagSet("status")
	conn := addConnFlags(fs)
	asJSON := fs.Bool("json", false, "print one JSON object (described above) instead of tables; with --watch, one per line")
	olderThan := fs.Duration("older-than", store.DefaultSweepOlderThan,
		"the `age` past which a TTL-less, unlocked temp key is a sweep candidate, as for 'keyswap sweep'")
	grace := fs.Duration("grace", gens.DefaultGrace,
		"the `time` after its retirement past which a retired generation is a sweep candidate, as for 'keyswap sweep'")
	legacy := fs.Bool("legacy", false, "count keys of the legacy shape <key>:rebuild:<digits> as sweep candidates too, as 'keyswap sweep --legacy' would")
	// Not --key: redis-cli's flag for the TLS client key, which is ours too.
	key := fs.String("index", "", "show this live `key` (a family's prefix) alone, without a scan, whatever bytes it holds")
	group := fs.String("group", "", "with --index (or a key), the `group` of the index, as rebuild.Options.Group names it (Generations mode)")
	glob := fs.String("pattern", "", "scan for the live keys this `glob` matches, even one without glob characters")
	watch := fs.Bool("watch", false, "show the status again every --interval until interrupted")
	every := fs.Duration("interval", time.Second, "the `time` between two snapshots of --watch")
	positional, err := c.parse(fs, args, statusUsage)
	if err != nil {
		return err
	}
	q, err := newStatusQuery(fs, positional, *key, *glob)
	if err != nil {
		return err
	}
	if *olderThan <= 0 {
		return usagef("-older-than %v: must be positive", *olderThan)
	}
	if *grace <= 0 {
		return usagef("--grace %v: must be positive", *grace)
	}
	if *every <= 0 {
		return usagef("--interval %v: must be positive", *every)
	}
	if *group != "" {
		if !q.byKey {
			return usagef("--group names the group of one index: give the index's key (--index); a scan finds the indexes of every group")
		}
		if err := keys.CheckGroup(*group); err != nil {
			return usagef("--group: %v", err)
		}
	}

	client, err := c.connect(ctx, conn)
	if err != nil {
		return err
	}
	defer client.Close()
	collect := func(ctx context.Context) (*statusReport, error) {
		var rep *statusReport
		var err error
		if q.byKey {
			rep, err = collectKeyStatus(ctx, client, q.key, *group, *olderThan, *grace, c.now())
		} else {
			rep, err = collectStatus(ctx, client, q.pattern, *olderThan, *grace, *legacy, c.now())
		}
		if err != nil {
			return nil, fmt.Errorf("status: %w", err)
		}
		rep.Server, rep.SweepArgs = serverOf(client, conn.used), conn.suggest()
		return rep, nil
	}
	if *watch {
		return c.watchStatus(ctx, collect, *every, *asJSON, q)
	}
	rep, err := collect(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		err = writeJSON(c.stdout, rep.json())
	} else {
		err = writeStatus(c.stdout, rep)
	}
	if err != nil {
		return err
	}
	if rep.candidates() > 0 {
		return errOrphansFound
	}
	return nil
}

// statusQuery is what status shows: the live keys a pattern selects, with a
// scan, or one live key, without.
type statusQuery struct {
	pattern string
	key     string
	byKey   bool
}

// newStatusQuery returns the query of status's arguments: --index, --pattern,
// or the one positional argument, a key when it has no glob character, a
// pattern otherwise. No argument is the pattern "", which selects every
// key. fs tells which flags were given.
func newStatusQuery(fs *flag.FlagSet, positional []string, key, pattern string) (statusQuery, error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	n := len(positional)
	if given["index"] {
		n++
	}
	if given["pattern"] {
		n++
	}
	switch {
	case n > 1:
		return statusQuery{}, usagef("want one key or pattern at most (an argument, --index or --pattern), got %d", n)
	case given["index"]:
		if key == "" {
			return statusQuery{}, usagef("--index: want a key, got an empty one")
		}
		return statusQuery{key: key, byKey: true}, nil
	case len(positional) == 1 && positional[0] != "" && !hasGlob(positional[0]):
		return statusQuery{key: positional[0], byKey: true}, nil
	case len(positional) == 1:
		pattern = positional[0]
	}
	if err := checkGlob(pattern); err != nil {
		return statusQuery{}, usagef("pattern %q: %v", pattern, err)
	}
	return statusQuery{pattern: pattern}, nil
}

// hasGlob reports whether s has a character that SCAN MATCH reads as a
// glob: '*', '?', '[' or '\'.
func hasGlob(s string) bool { return strings.ContainsAny(s, `*?[\`) }

// rebuildKeysPattern is the SCAN MATCH glob of the keys status reads: lock
// keys ("*:rebuild-lock"), metas ("*:rebuild-gen"), registries
// ("*:rebuild-gens"), pointers ("*:rebuild-ptr") and temp keys
// ("*:rebuild:<unix>:<nonce>"), so that one SCAN finds them all. It leaves
// out the data keys of generations ("*:rebuild-g:<G>" and
// "*:rebuild-g:<G>:<bucket>": a family of a million buckets has a million
// per generation), a run's counters ("*:rebuild-n:<G>") and a
// generation's manifest ("*:rebuild-m:<G>", "*:rebuild-l:<G>"), which status
// does not read, so that SCAN does not send them only to be dropped here:
// in their names the second character after ":rebuild-" is a ':'.
//
// A glob has no alternation, and one that keeps ":rebuild:<digit>:" keeps
// ":rebuild-g:" too: a temp key whose timestamp has a single digit (a time
// in the first ten seconds of 1970, which no run writes) is left out as
// well.
const rebuildKeysPattern = "*:rebuild[-:]?[^:]*"

// collectStatus takes the snapshot of locks and temp keys whose live key
// matches pattern ("" for all), at time now. It scans the keyspace once.
func collectStatus(ctx context.Context, client rueidis.Client, pattern string, olderThan, grace time.Duration, legacy bool, now time.Time) (*statusReport, error) {
	cluster := client.Mode() == rueidis.ClientModeCluster
	rep := &statusReport{
		Time:             now.UTC(),
		Pattern:          pattern,
		Cluster:          cluster,
		OlderThanSeconds: int64(olderThan / time.Second),
		Grace:            grace,
	}
	locks, temps, metas, genKeys, err := scanRebuildKeys(ctx, client, pattern, cluster, now)
	if err != nil {
		return nil, err
	}
	if rep.Locks, err = describeLocks(ctx, client, locks); err != nil {
		return nil, err
	}
	if rep.Indexes, err = describeIndexes(ctx, client, metas, genKeys, rep.held(), now, grace); err != nil {
		return nil, err
	}
	if rep.TempKeys, err = describeTemps(ctx, client, temps); err != nil {
		return nil, err
	}
	if rep.Runs, err = describeRuns(ctx, client, rep.Locks); err != nil {
		return nil, err
	}

	ks := make([]string, len(rep.TempKeys))
	for i, t := range rep.TempKeys {
		ks[i] = t.Key
	}
	candidates, err := sweepCandidates(ctx, client, ks, now, olderThan, legacy)
	if err != nil {
		return nil, err
	}
	isCandidate := map[string]bool{}
	for _, k := range candidates {
		isCandidate[k] = true
	}
	for i := range rep.TempKeys {
		rep.TempKeys[i].SweepCandidate = isCandidate[rep.TempKeys[i].Key]
	}
	return rep, nil
}

// scanRebuildKeys scans the keyspace once for the lock keys (lock key ->
// base), temp keys, metas (meta key -> base), and registries and pointers
// of Generations mode (their key -> base) whose live key matches pattern.
func scanRebuildKeys(ctx context.Context, client rueidis.Client, pattern string, cluster bool, now time.Time) (
	locks map[string]string, temps map[string]tempStatus, metas, genKeys map[string]string, err error) {
	locks, temps, metas, genKeys = map[string]string{}, map[string]tempStatus{}, map[string]string{}, map[string]string{}
	for page, err := range scan.Pages(ctx, client, scan.Options{Match: rebuildKeysPattern}) {
		if err != nil {
			return nil, nil, nil, nil, err
		}
		for _, k := range page {
			if base, ok := strings.CutSuffix(k, keys.LockSuffix); ok {
				if matchLiveKey(pattern, base, cluster) {
					locks[k] = base
				}
			} else if base, ok := strings.CutSuffix(k, keys.MetaSuffix); ok {
				if matchLiveKey(pattern, base, cluster) {
					metas[k] = base
				}
			} else if base, ok := cutGenSuffix(k); ok {
				if matchLiveKey(pattern, base, cluster) {
					genKeys[k] = base
				}
			} else if base, unix, ok := keys.ParseTempKey(k); ok && matchLiveKey(pattern, base, cluster) {
				temps[k] = tempStatus{Key: k, Base: base, Timestamp: unix, AgeSeconds: now.Unix() - unix}
			}
		}
	}
	return locks, temps, metas, genKeys, nil
}

// cutGenSuffix returns the base of k, a registry or a pointer of
// Generations mode, and whether it is one. A generation's data key is
// none, whatever its end: a bucket may be named "x:rebuild-gens".
func cutGenSuffix(k string) (string, bool) {
	if keys.IsGenKey(k) {
		return "", false
	}
	if base, ok := strings.CutSuffix(k, keys.RegistrySuffix); ok {
		return base, true
	}
	return strings.CutSuffix(k, keys.PointerSuffix)
}

// held returns the lock keys of rep's locks.
func (rep *statusReport) held() map[string]bool {
	out := map[string]bool{}
	for _, l := range rep.Locks {
		out[l.Key] = true
	}
	return out
}

// candidates returns the number of sweep candidates in rep: temp keys,
// and generations that a sweep would remove.
func (rep *statusReport) candidates() int { return rep.tempCandidates() + rep.genCandidates() }

// tempCandidates returns the number of temp keys in rep that are sweep
// candidates.
func (rep *statusReport) tempCandidates() int {
	n := 0
	for _, t := range rep.TempKeys {
		if t.SweepCandidate {
			n++
		}
	}
	return n
}

// genCandidates returns the number of generations in rep that a sweep would
// remove: retired longer than the grace ago, or abandoned by their run.
func (rep *statusReport) genCandidates() int {
	n := 0
	for _, ix := range rep.Indexes {
		n += ix.Gens.candidates()
	}
	return n
}

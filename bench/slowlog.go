package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	ksrun "github.com/keyswap/keyswap/internal/protocol" // not run: the bench's own run function
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

// Client names, which SLOWLOG entries carry: the bench tells its own
// commands from the run's by them.
const (
	benchClientName   = "keyswap-bench"         // the methods' writes: the Rebuilder's commands
	adminClientName   = "keyswap-bench-admin"   // INFO, SLOWLOG, cleanup, verification
	renewalClientName = "keyswap-bench-renewal" // the publish section's renewal of a whole family
)

const (
	// slowlogThreshold is the shortest command a slowlog watch records:
	// shorter ones block the server for too little to matter.
	slowlogThreshold = 20 * time.Microsecond
	// slowlogDrainEvery is how often a slowlog watch reads the slowlog.
	// With slowlogLen entries of room, it loses none below 5M logged
	// commands per second.
	slowlogDrainEvery = 20 * time.Millisecond
	// slowlogMaxArgs is how many arguments SLOWLOG keeps of a command; the
	// last of them then says how many more there were.
	slowlogMaxArgs = 32
	// slowlogMaxString is how many bytes of an argument SLOWLOG keeps.
	slowlogMaxString = 128
)

// slowEntry is one command as SLOWLOG logged it.
type slowEntry struct {
	ID       int64
	Duration time.Duration // execution time, I/O and parsing excluded
	Command  string        // "SADD", or "EVALSHA publish" for one of keyswap's scripts
	Args     int           // arguments of the command, its name included
	Client   string        // the client's name
	// Data is true for a write of an index's data: SADD, HSET or ZADD to
	// a key that is not one of keyswap's control keys (a generation's data
	// key, a temp key, or the user's own). A raw writer of the same data
	// sends the same commands.
	Data bool
}

// dataWrites are the commands that write an index's data.
var dataWrites = []string{"SADD", "HSET", "ZADD"}

// isDataWrite reports whether a command named name (upper case) with
// arguments args writes an index's data: one of dataWrites to a key that
// is not a control key of keyswap's (a manifest, a counter, a registry, a
// pointer: ":rebuild-" in its name, other than a generation's data key or
// a temp key).
func isDataWrite(name string, args []string) bool {
	if !slices.Contains(dataWrites, name) || len(args) < 2 {
		return false
	}
	key := args[1]
	if !strings.Contains(key, ":rebuild-") || keys.IsGenKey(key) {
		return true
	}
	_, _, temp := keys.ParseTempKey(key)
	return temp
}

// script is one of keyswap's Lua scripts, as SLOWLOG shows it.
type script struct {
	name, sha1, head string // head: what SLOWLOG keeps of the source
}

// keyswapScripts returns the scripts keyswap sends (internal/protocol's), and
// SCRIPT LOADs them unless load is false, so that they go as one EVALSHA,
// as in steady state, not NOSCRIPT followed by EVAL.
func keyswapScripts(ctx context.Context, c rueidis.Client, load bool) ([]script, error) {
	files, err := fs.Glob(ksrun.Scripts, "scripts/*.lua")
	if err != nil {
		return nil, err
	}
	var out []script
	for _, f := range files {
		s := redistest.ScriptNamed(strings.TrimSuffix(path.Base(f), ".lua"))
		out = append(out, script{name: s.Name, sha1: s.SHA1, head: s.Source[:min(len(s.Source), slowlogMaxString)]})
		if load {
			if err := c.Do(ctx, c.B().ScriptLoad().Script(s.Source).Build()).Error(); err != nil {
				return nil, fmt.Errorf("SCRIPT LOAD %s: %w", s.Name, err)
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no scripts embedded in internal/protocol")
	}
	return out, nil
}

// commandName names the command args for the report: its name in upper
// case, followed for EVALSHA and EVAL of one of scripts by the script's
// name ("EVALSHA publish"). args are as SLOWLOG keeps them.
func commandName(args []string, scripts []script) string {
	name := strings.ToUpper(args[0])
	if len(args) < 2 {
		return name
	}
	for _, s := range scripts {
		if (name == "EVALSHA" || name == "EVALSHA_RO") && strings.EqualFold(args[1], s.sha1) ||
			(name == "EVAL" || name == "EVAL_RO") && strings.HasPrefix(args[1], s.head) {
			return name + " " + s.name
		}
	}
	return name
}

// argCount returns how many arguments a command had, from what SLOWLOG
// kept of them: past slowlogMaxArgs, the last says "... (N more
// arguments)".
func argCount(args []string) int {
	if len(args) == slowlogMaxArgs {
		var more int
		if _, err := fmt.Sscanf(args[len(args)-1], "... (%d more arguments)", &more); err == nil {
			return len(args) - 1 + more
		}
	}
	return len(args)
}

// parseSlowlogEntry reads one SLOWLOG GET entry: [id, unix time, duration in
// µs, [args...], "ip:port", client name].
func parseSlowlogEntry(e rueidis.RedisMessage) (id int64, d time.Duration, args []string, addr, client string, err error) {
	fields, err := e.ToArray()
	if err != nil || len(fields) < 4 {
		return 0, 0, nil, "", "", fmt.Errorf("malformed SLOWLOG entry %v", e)
	}
	if id, err = fields[0].AsInt64(); err != nil {
		return 0, 0, nil, "", "", fmt.Errorf("malformed SLOWLOG id %v", fields[0])
	}
	us, err := fields[2].AsInt64()
	if err != nil {
		return 0, 0, nil, "", "", fmt.Errorf("malformed SLOWLOG duration %v", fields[2])
	}
	args, err = fields[3].AsStrSlice()
	if err != nil || len(args) == 0 {
		return 0, 0, nil, "", "", fmt.Errorf("malformed SLOWLOG arguments %v", fields[3])
	}
	if len(fields) >= 6 { // Redis 4 and later
		addr, _ = fields[4].ToString()
		client, _ = fields[5].ToString()
	}
	return id, time.Duration(us) * time.Microsecond, args, addr, client, nil
}

// slowlogWatch records the commands of some clients that ran for at least
// slowlogThreshold, from SLOWLOG, while it runs. It reads the slowlog every
// slowlogDrainEvery, the newest entries first, back to the last one it has
// seen, without SLOWLOG RESET: a MULTI around SLOWLOG GET and RESET would
// show among the run's transactions. The entries' IDs are consecutive, so
// a watch that finds an entry missing (the log full, or reset) fails.
//
// Logging a command costs the server about a microsecond, so the
// threshold: logging every command would slow the runs down, and the
// commands that scripts run (SLOWLOG logs them too, from a client at
// "?:0") would add to the scripts' own execution times.
type slowlogWatch struct {
	s       *server
	scripts []script
	clients []string // the client names whose commands are kept
	names   map[string]string
	last    int64 // the ID of the newest entry read, or -1
	fresh   int   // how many entries the last drain read
	entries []slowEntry
	err     error
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// watchSlowlog starts logging commands of slowlogThreshold or longer, and a
// watch of those of the clients named clients. The caller restores the
// slowlog settings (saveSlowlog).
func (r *runner) watchSlowlog(ctx context.Context, scripts []script, clients ...string) (*slowlogWatch, error) {
	return r.watchSlowlogOver(ctx, slowlogThreshold, scripts, clients...)
}

// watchSlowlogOver is watchSlowlog of the commands of threshold or longer.
func (r *runner) watchSlowlogOver(ctx context.Context, threshold time.Duration, scripts []script, clients ...string) (*slowlogWatch, error) {
	s := r.srv
	if err := s.configSet(ctx, "slowlog-max-len", slowlogLen); err != nil {
		return nil, err
	}
	if err := s.admin.Do(ctx, s.admin.B().SlowlogReset().Build()).Error(); err != nil {
		return nil, fmt.Errorf("SLOWLOG RESET: %w", err)
	}
	if err := s.configSet(ctx, "slowlog-log-slower-than", strconv.FormatInt(threshold.Microseconds(), 10)); err != nil {
		return nil, err
	}
	w := newSlowlogWatch(s, scripts, clients...)
	go w.loop(ctx)
	return w, nil
}

// newSlowlogWatch returns a watch of the slowlog of s that drains only when
// told to, for the clients named clients.
func newSlowlogWatch(s *server, scripts []script, clients ...string) *slowlogWatch {
	return &slowlogWatch{s: s, scripts: scripts, clients: clients, names: map[string]string{}, last: -1,
		quit: make(chan struct{}), done: make(chan struct{})}
}

func (w *slowlogWatch) loop(ctx context.Context) {
	defer close(w.done)
	t := time.NewTicker(slowlogDrainEvery)
	defer t.Stop()
	for {
		select {
		case <-w.quit:
			return
		case <-ctx.Done():
			w.err = context.Cause(ctx)
			return
		case <-t.C:
			if err := w.drain(ctx); err != nil {
				w.err = err
				return
			}
		}
	}
}

// drain appends the entries logged since the last drain to w.entries.
func (w *slowlogWatch) drain(ctx context.Context) error {
	c := w.s.admin
	room, _ := strconv.Atoi(slowlogLen)
	// Read as many as last time, and more: SLOWLOG GET's cost is in its
	// entries, and those that are not new are read again.
	for count := min(max(256, 2*w.fresh), room); ; count = min(4*count, room) {
		got, err := c.Do(ctx, c.B().SlowlogGet().Count(int64(count)).Build()).ToArray()
		if isBusy(err) {
			// A script has run longer than busy-reply-threshold: the
			// server answers nothing else until it ends. Its entries and
			// the script's own will be there at the next drain.
			return nil
		}
		if err != nil {
			return fmt.Errorf("SLOWLOG GET: %w", err)
		}
		// Newest first: the fresh entries are those before the last one
		// read.
		fresh := len(got)
		for i, e := range got {
			id, _, _, _, _, err := parseSlowlogEntry(e)
			if err != nil {
				return err
			}
			if id <= w.last {
				fresh = i
				break
			}
		}
		if fresh == count { // all new, and maybe more before them
			if count == room {
				return fmt.Errorf("the slowlog filled up with %d entries within %v: some commands were not recorded", room, slowlogDrainEvery)
			}
			continue
		}
		for i := fresh - 1; i >= 0; i-- {
			if err := w.add(got[i]); err != nil { // checks that none is missing
				return err
			}
		}
		w.fresh = fresh
		return nil
	}
}

// isBusy reports whether err is Redis's BUSY: a script runs.
func isBusy(err error) bool {
	rerr, ok := rueidis.IsRedisErr(err)
	return ok && strings.HasPrefix(rerr.Error(), "BUSY ")
}

// add records e, if it is a watched client's.
func (w *slowlogWatch) add(e rueidis.RedisMessage) error {
	id, d, args, _, client, err := parseSlowlogEntry(e)
	if err != nil {
		return err
	}
	if w.last >= 0 && id != w.last+1 {
		return fmt.Errorf("slowlog entry %d follows %d: entries are missing (another client reset the slowlog?)", id, w.last)
	}
	w.last = id
	if slices.Contains(w.clients, client) {
		name := commandName(args, w.scripts)
		w.entries = append(w.entries, slowEntry{ID: id, Duration: d, Command: w.intern(name),
			Args: argCount(args), Client: w.intern(client), Data: isDataWrite(name, args)})
	}
	return nil
}

// intern returns one copy of each string, for the thousands of entries of
// a run that share a few.
func (w *slowlogWatch) intern(s string) string {
	if v, ok := w.names[s]; ok {
		return v
	}
	w.names[s] = s
	return s
}

// stop ends the watch, reads what is left, and stops logging. It returns
// the entries in the order the server ran them.
func (w *slowlogWatch) stop(ctx context.Context) ([]slowEntry, error) {
	w.once.Do(func() { close(w.quit) })
	<-w.done
	if w.err != nil {
		return nil, w.err
	}
	if err := w.drain(ctx); err != nil {
		return nil, err
	}
	if err := w.s.configSet(ctx, "slowlog-log-slower-than", "-1"); err != nil {
		return nil, err
	}
	return w.entries, nil
}

// commandTime is the longest call of one command.
type commandTime struct {
	Command string        `json:"command"`
	Longest time.Duration `json:"longest_ns"`
	Calls   int           `json:"calls"`
	// Args is the argument count of the longest call.
	Args int `json:"args"`
	// Max is, over rounds, the longest of the rounds' longest calls, when
	// Longest is their median.
	Max time.Duration `json:"max_ns,omitempty"`
}

// longestByCommand returns the longest call of each command among es,
// longest first.
func longestByCommand(es []slowEntry) []commandTime {
	byName := map[string]*commandTime{}
	var out []*commandTime
	for _, e := range es {
		ct := byName[e.Command]
		if ct == nil {
			ct = &commandTime{Command: e.Command}
			byName[e.Command] = ct
			out = append(out, ct)
		}
		ct.Calls++
		if e.Duration > ct.Longest || ct.Calls == 1 {
			ct.Longest, ct.Args = e.Duration, e.Args
		}
	}
	res := make([]commandTime, len(out))
	for i, ct := range out {
		res[i] = *ct
	}
	sortCommandTimes(res)
	return res
}

// sortCommandTimes sorts longest first, then by name.
func sortCommandTimes(cts []commandTime) {
	slices.SortStableFunc(cts, func(a, b commandTime) int {
		if a.Longest != b.Longest {
			return int(b.Longest - a.Longest)
		}
		return strings.Compare(a.Command, b.Command)
	})
}

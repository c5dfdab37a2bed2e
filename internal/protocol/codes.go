package protocol

import (
	"regexp"
	"strconv"
	"strings"
)

// Reply codes: the first element of a script's array reply, and the status
// of each temp key or target in the replies of touch, refresh and publish.
// The scripts name them as replyCodes does; Go decodes them with these
// constants. Two codes may share a number when no script returns both.
const (
	codeOK          = 1   // every script: done
	codeLockLost    = -1  // touch, heartbeat, refresh, control, rollback, publish, genalloc, flip, genback: {-1, i}: lock i is not ours
	codeHeld        = 0   // acquire: {0, i}: lock i is held
	codeTempLost    = 0   // publish: {0, i}: populated temp key i is gone
	codeNoRight     = -2  // acquire, apply, genapply, genlog, genwrite, rollback, publish: {-2, cmd, key}: this user may not run cmd on key
	codeWritesLost  = -3  // heartbeat, publish: {-3, batches}
	codeRecreated   = -4  // publish: {-4, i}: populated temp key i has no TTL
	codeUnknownCmd  = -5  // acquire, apply, genapply, genlog, genwrite, rollback, publish: {-5, cmd}
	codeNotMeta     = -6  // publish, flip, genback: {-6, i}: meta i is another key
	codeBehind      = -7  // publish, flip: {-7, i, n, w}: the logs' tails hold n entries of work w, over a bound
	codeWrongType   = -8  // apply, genapply, genwrite, publish: {-8, key, type}: an op cannot write key's type
	codeBadLog      = -9  // publish: {-9, i, e, why}: log i holds an entry that is not a change
	codeOverrun     = -10 // publish: {-10, i}: log i reached its bound: changes were not logged
	codeNoPrevious  = -11 // rollback, genback: {-11, i}: index i keeps no previous generation
	codeUnlogged    = -12 // apply, genapply, genlog: {-12, i, why, detail}: lock i is held by a run that does not log the change
	codeNotTheRuns  = -13 // apply, genapply, genlog: {-13, i, key, owner}; publish: {-13, i, index, key}: key is not the run's
	codeTampered    = -14 // heartbeat, publish: {-14, i}: record i carries another token
	codeNoRecord    = -15 // heartbeat, publish: {-15, i}: record i is gone (or has no token)
	codeTooLate     = -16 // control: {-16}: the run already published
	codeAborted     = -17 // publish: {-17}: the operator cancelled the run
	codeLogLost     = -18 // publish: {-18, i, llen, logged}: log i lost entries
	codeUncounted   = -19 // publish: {-19, i, llen, logged}: log i holds entries nobody counted
	codeBadRegistry = -21 // genalloc, genback, genapply, genlog, flip: {-21, i, why}: index i's registry or pointer is in a state no run leaves
	codeGenLost     = -20 // flip: {-20, i}: index i's registry no longer marks the run's generation as its; genapply: pointer i moved
	codeWait        = -22 // genapply, genlog: {-22, i, pttl}: the run holding lock i is cutting over (its mark lasts pttl ms more)
	codeInGroup     = -23 // claim, genalloc, genback, flip, publish, genlog: {-23, i, group}: index i's pointer without a group names group (SPEC C102)
	codeUngrouped   = -24 // claim: {-24, key, what}: the index has generations of runs without a group, or keys no run writes
	codeMovedPast   = -25 // genalloc (mode exact): {-25, i, why}: index i's registry moved past the generation the claim reserved
	codeOwned       = -26 // acquire, claim: {-26, i, kind, value}: the owner stamp of base i is another live key's (kind 'string', value its name) or of type kind (SPEC C104)
	codeRenamed     = 1   // publish, per target: renamed
	codeEmptied     = 2   // publish, per target: live key deleted
	tempAbsent      = 0   // touch, refresh, per temp key: it does not exist
	tempAlive       = 1   // touch, refresh, per temp key: it had a TTL, now renewed
	tempCreated     = 2   // touch, refresh, per temp key: it had no TTL (created since), now has one
	// apply, per lock: LogNone, Logged and LogFull (see Applied).
)

// replyCodes is the one table of reply codes: the name each script uses
// for a code (a Lua local that Expand defines at the top of a script that
// names it), and its Go constant. A script writes a code by its name,
// never as a number.
var replyCodes = []struct {
	name  string
	value int64
}{
	{"OK", codeOK},
	{"LOCK_LOST", codeLockLost},
	{"HELD", codeHeld},
	{"TEMP_LOST", codeTempLost},
	{"NO_RIGHT", codeNoRight},
	{"WRITES_LOST", codeWritesLost},
	{"RECREATED", codeRecreated},
	{"UNKNOWN_CMD", codeUnknownCmd},
	{"NOT_META", codeNotMeta},
	{"BEHIND", codeBehind},
	{"WRONG_TYPE", codeWrongType},
	{"BAD_LOG", codeBadLog},
	{"OVERRUN", codeOverrun},
	{"NO_PREVIOUS", codeNoPrevious},
	{"UNLOGGED", codeUnlogged},
	{"NOT_THE_RUNS", codeNotTheRuns},
	{"TAMPERED", codeTampered},
	{"NO_RECORD", codeNoRecord},
	{"TOO_LATE", codeTooLate},
	{"ABORTED", codeAborted},
	{"LOG_LOST", codeLogLost},
	{"UNCOUNTED", codeUncounted},
	{"GEN_LOST", codeGenLost},
	{"BAD_REGISTRY", codeBadRegistry},
	{"WAIT", codeWait},
	{"IN_GROUP", codeInGroup},
	{"UNGROUPED", codeUngrouped},
	{"MOVED_PAST", codeMovedPast},
	{"OWNED", codeOwned},
	{"RENAMED", codeRenamed},
	{"EMPTIED", codeEmptied},
	{"TEMP_ABSENT", tempAbsent},
	{"TEMP_ALIVE", tempAlive},
	{"TEMP_CREATED", tempCreated},
	{"LOG_NONE", LogNone},
	{"LOGGED", Logged},
	{"LOG_FULL", LogFull},
}

// Code returns the value of the reply code that the scripts name name. It
// panics on a name the table lacks. Tests outside this package that run a
// script themselves use it, so that no test spells a code as a number.
func Code(name string) int64 {
	for _, c := range replyCodes {
		if c.name == name {
			return c.value
		}
	}
	panic("keyswap: no reply code " + name)
}

// luaNoise matches what cannot name a code in Lua source: a comment to the
// end of its line, or a quoted string.
var luaNoise = regexp.MustCompile(`--[^\n]*|'[^'\n]*'|"[^"\n]*"`)

// luaNames returns the upper-case identifiers of the Lua src, comments and
// strings left out: the names of codes it uses, and KEYS, ARGV and the
// one-letter counts of publish.
func luaNames(src string) map[string]bool {
	names := map[string]bool{}
	for _, n := range upperName.FindAllString(luaNoise.ReplaceAllString(src, ""), -1) {
		names[n] = true
	}
	return names
}

var upperName = regexp.MustCompile(`\b[A-Z][A-Z0-9_]*\b`)

// preamble returns the line that defines, as Lua locals, the reply codes
// src names, in the order of replyCodes, or "" when it names none.
func preamble(src string) string {
	used := luaNames(src)
	var names, values []string
	for _, c := range replyCodes {
		if used[c.name] {
			names = append(names, c.name)
			values = append(values, strconv.FormatInt(c.value, 10))
		}
	}
	if len(names) == 0 {
		return ""
	}
	return "local " + strings.Join(names, ", ") + " = " + strings.Join(values, ", ") + "\n"
}

package run

import (
	"crypto/fips140"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"strings"

	"github.com/redis/rueidis"
)

// Scripts holds the Lua scripts, one file each: scripts/<name>.lua, and the
// code they share: scripts/lib/<name>.lua.
//
//go:embed scripts/*.lua scripts/lib/*.lua
var Scripts embed.FS

// Source returns the source of scripts/<name>.lua as it is sent to Redis:
// each line "-- #include <lib>" replaced by scripts/lib/<lib>.lua.
func Source(name string) string {
	return include(read("scripts/" + name + ".lua"))
}

// include expands src's include lines.
func include(src string) string {
	var b strings.Builder
	for line := range strings.Lines(src) {
		if lib, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "-- #include "); ok {
			b.WriteString(read("scripts/lib/" + lib + ".lua"))
			continue
		}
		b.WriteString(line)
	}
	return b.String()
}

// read returns an embedded file.
func read(path string) string {
	b, err := Scripts.ReadFile(path)
	if err != nil {
		panic("keyswap: missing embedded script " + path + ": " + err.Error())
	}
	return string(b)
}

// script is one Lua script: rueidis's runner, and the source and SHA1 for a
// caller that sends it inside its own DoMulti.
type script struct {
	*rueidis.Lua
	src  string
	sha1 string // "" in FIPS mode: the script then goes as EVAL
}

// newScript returns the script name. retryable scripts are idempotent, so
// rueidis may resend them on a fresh connection after a lost reply.
//
// In FIPS 140 mode SHA-1 is not an approved algorithm (with
// GODEBUG=fips140=only, calling it panics), so the SHA1 is not computed
// here: rueidis asks the server for it with SCRIPT LOAD on first use, and a
// script sent inside a DoMulti goes as EVAL.
func newScript(name string, retryable bool) script {
	s := script{src: Source(name)}
	var opts []rueidis.LuaOption
	if fips140.Enabled() {
		opts = append(opts, rueidis.WithLoadSHA1(true))
	} else {
		sum := sha1.Sum([]byte(s.src))
		s.sha1 = hex.EncodeToString(sum[:])
	}
	if retryable {
		s.Lua = rueidis.NewLuaScriptRetryable(s.src, opts...)
	} else {
		s.Lua = rueidis.NewLuaScript(s.src, opts...)
	}
	return s
}

// command returns s as one command for a DoMulti: EVALSHA, or EVAL when no
// SHA1 is known. rueidis falls back from EVALSHA to EVAL only for a script
// sent alone, so a caller of command handles NOSCRIPT itself.
func (s script) command(cb rueidis.Builder, keys, args []string) rueidis.Completed {
	if s.sha1 == "" {
		return cb.Eval().Script(s.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	return cb.Evalsha().Sha1(s.sha1).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// The scripts are immutable package-level values, as in rueidis's own
// lock.
//
// touch, heartbeat, refresh and release are idempotent (compare-and-extend,
// compare-and-delete), so rueidis may retry them after a dropped
// connection, even one that lost the reply of a script that ran: a rerun
// replies the same, and release tells a lock already gone from one held by
// another. acquire is not retried: a rerun would find its own locks taken.
// publish must never be retried: a retried RENAME would find its own temp
// key gone and report a loss that did not happen.
var (
	touchScript     = newScript("touch", true)
	acquireScript   = newScript("acquire", false)
	heartbeatScript = newScript("heartbeat", true)
	refreshScript   = newScript("refresh", true)
	releaseScript   = newScript("release", true)
	publishScript   = newScript("publish", false)
	// apply is not retried: a rerun would log the change twice. (Twice is
	// harmless to the index, as every op sets or removes entries outright,
	// but the caller must learn that the outcome is unknown.)
	applyScript = newScript("apply", false)
	// rollback is not retried: a rerun would swap back again.
	rollbackScript = newScript("rollback", false)
	// control only sets fields: a rerun sets them again.
	controlScript = newScript("control", true)
)

// Return codes: the first element of the scripts' array replies.
const (
	codeLockLost   = -1  // touch, heartbeat, refresh, publish: lock i is not ours
	codeHeld       = 0   // acquire: lock i is held
	codeTempLost   = 0   // publish: populated temp key i is gone
	codeOK         = 1   // every script: done
	codeNoRight    = -2  // acquire, publish: {-2, cmd, key}
	codeWritesLost = -3  // heartbeat, publish: {-3, batches}
	codeRecreated  = -4  // publish: {-4, i}: populated temp key i has no TTL
	codeUnknownCmd = -5  // acquire, publish: {-5, cmd}
	codeNotMeta    = -6  // publish: {-6, i}: meta i is another key
	codeBehind     = -7  // publish: {-7, i, n}: log i has n entries past its offset, over the bound
	codeWrongType  = -8  // apply, publish: {-8, key, type}: an op cannot write key's type
	codeBadLog     = -9  // publish: {-9, i}: log i holds an entry that is not a change
	codeOverrun    = -10 // publish: {-10, i}: log i reached its bound: changes were not logged
	codeNoPrevious = -11 // rollback: {-11, i}: index i keeps no previous generation
	codeUnlogged   = -12 // apply: {-12, i, why, detail}: lock i is held by a run that does not log the change
	codeNotTheRuns = -13 // apply: {-13, i, key, owner}; publish: {-13, i, index, key}: key is not the run's
	codeTampered   = -14 // heartbeat, publish: {-14, i}: record i carries another token
	codeNoRecord   = -15 // heartbeat, publish: {-15, i}: record i is gone (or has no token)
	codeTooLate    = -16 // control: {-16}: the run already published
	codeAborted    = -17 // publish: {-17}: the operator cancelled the run
	codeLogLost    = -18 // publish: {-18, i, llen, logged}: log i lost entries
	codeUncounted  = -19 // publish: {-19, i, llen, logged}: log i holds entries nobody counted
	codeRenamed    = 1   // publish, per target: renamed
	codeEmptied    = 2   // publish, per target: live key deleted
	tempAbsent     = 0   // touch, refresh, per temp key
	tempAlive      = 1
	tempCreated    = 2
)

package protocol

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

// Source returns the source of scripts/<name>.lua as it is sent to Redis
// (see [Expand]). Its SHA1 is that of this text, preamble included.
func Source(name string) string {
	return Expand(read("scripts/" + name + ".lua"))
}

// Expand returns the Lua src as it is sent to Redis: each line
// "-- #include <lib>" replaced by scripts/lib/<lib>.lua, and a first line
// that defines, as Lua locals, the reply codes (see replyCodes) that the
// expanded text names.
func Expand(src string) string {
	src = include(src)
	return preamble(src) + src
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

// newScript returns the script name. retryable scripts are safe to rerun,
// so rueidis may resend them on a fresh connection after a lost reply: a
// rerun leaves a state the run accepts, though not always the same one
// (claim.lua raises the registry's next again, skipping a number, and
// shares none).
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
	touchScript   = newScript("touch", true)
	acquireScript = newScript("acquire", false)
	// lock is not retried, as acquire is not.
	lockScript      = newScript("lock", false)
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

package run

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"

	"github.com/redis/rueidis"
)

// Scripts holds the Lua scripts, one file each: scripts/<name>.lua.
//
//go:embed scripts/*.lua
var Scripts embed.FS

// script returns the source of scripts/<name>.lua.
func script(name string) string {
	b, err := Scripts.ReadFile("scripts/" + name + ".lua")
	if err != nil {
		panic("keyswap: missing embedded script " + name + ": " + err.Error())
	}
	return string(b)
}

// The scripts are immutable package-level values, as in rueidis's own
// lock: rueidis computes each SHA1 once, sends EVALSHA, and falls back to
// EVAL on NOSCRIPT.
//
// lease and release are idempotent (compare-and-extend, compare-and-delete),
// so rueidis may retry them after a dropped connection, even one that lost
// the reply of a script that ran: a rerun of the lease replies the same, and
// release tells a lock already gone from one held by another. publish must
// never be retried: a retried RENAME would find its own temp key gone and
// report a loss that did not happen.
var (
	leaseSource   = script("lease")
	leaseScript   = rueidis.NewLuaScriptRetryable(leaseSource)
	releaseScript = rueidis.NewLuaScriptRetryable(script("release"))
	publishScript = rueidis.NewLuaScript(script("publish"))
)

// leaseSHA1 is the SHA1 rueidis uses for EVALSHA of the lease script.
var leaseSHA1 = func() string {
	sum := sha1.Sum([]byte(leaseSource))
	return hex.EncodeToString(sum[:])
}()

// Return codes: the first element of the scripts' array replies.
const (
	codeLockLost = -1 // lease, publish: {-1, i}: lock i is not ours
	codeTempLost = 0  // publish: {0, i}: populated temp key i is gone
	codeOK       = 1  // lease: {1, expire...}; publish: {1, outcome...}
)

// Per-target outcomes in publish's {1, o1, ..., oT} reply.
const (
	codeRenamed = 1
	codeEmptied = 2
)

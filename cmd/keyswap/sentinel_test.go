package main

import (
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

// TestSentinel reaches a master through a Redis Sentinel, with the URL
// parameter master_set, and fails clearly for a master set the sentinel
// does not monitor.
func TestSentinel(t *testing.T) {
	t.Parallel()
	master := redistest.OwnServer(t)
	p := redistest.Prefix(t)
	do(t, master.Client(t), "SET", p+"x:rebuild-lock", "0123456789abcdef", "EX", "600")
	sentinel := redistest.OwnSentinel(t, "keyswap-test", master.Addr).Addr

	r := keyswap(t, "status", "-json", "-u", "redis://"+sentinel+"?master_set=keyswap-test", p+"*")
	r.wantCode(t, exitOK)
	if rep := decodeStatus(t, r.stdout); len(rep.Locks) != 1 || rep.Locks[0].Key != p+"x:rebuild-lock" {
		t.Errorf("got locks %+v, want %sx:rebuild-lock, on the master", rep.Locks, p)
	}

	r = keyswap(t, "status", "-u", "redis://"+sentinel+"?master_set=nobody")
	r.wantCode(t, exitError)
	if want := `keyswap: cannot reach the master "nobody" through the sentinels at ` + sentinel + ": "; !strings.HasPrefix(r.stderr, want) {
		t.Errorf("got stderr %q, want %q...", r.stderr, want)
	}
}

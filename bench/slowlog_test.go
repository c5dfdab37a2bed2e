package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
)

func TestCommandName(t *testing.T) {
	scripts, err := keyswapScripts(t.Context(), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	publish, refresh := redistest.ScriptNamed("publish"), redistest.ScriptNamed("refresh")
	truncated := refresh.Source[:slowlogMaxString] + fmt.Sprintf("... (%d more bytes)", len(refresh.Source)-slowlogMaxString)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"EVALSHA", publish.SHA1, "3"}, "EVALSHA publish"},
		{[]string{"evalsha", strings.ToUpper(publish.SHA1), "3"}, "EVALSHA publish"},
		{[]string{"EVAL", truncated, "1"}, "EVAL refresh"},
		{[]string{"EVALSHA", strings.Repeat("0", 40), "0"}, "EVALSHA"},
		{[]string{"sadd", "k", "m"}, "SADD"},
		{[]string{"PING"}, "PING"},
	} {
		if got := commandName(tt.args, scripts); got != tt.want {
			t.Errorf("commandName(%.40q): got %q, want %q", tt.args, got, tt.want)
		}
	}
	var names []string
	for _, s := range scripts {
		names = append(names, s.name)
	}
	if !slices.Contains(names, "publish") || !slices.Contains(names, "heartbeat") || !slices.Contains(names, "refresh") {
		t.Errorf("keyswapScripts: got %v, want publish, heartbeat and refresh among them", names)
	}
}

func TestArgCount(t *testing.T) {
	full := make([]string, slowlogMaxArgs)
	full[len(full)-1] = "... (10 more arguments)"
	for _, tt := range []struct {
		args []string
		want int
	}{
		{[]string{"SADD", "k", "m"}, 3},
		{full, 41},
		{make([]string, slowlogMaxArgs), slowlogMaxArgs},
	} {
		if got := argCount(tt.args); got != tt.want {
			t.Errorf("argCount(%d args ending %q): got %d, want %d", len(tt.args), tt.args[len(tt.args)-1], got, tt.want)
		}
	}
}

func TestLongestByCommand(t *testing.T) {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	got := longestByCommand([]slowEntry{
		{ID: 1, Duration: us(30), Command: "SADD", Args: 3},
		{ID: 2, Duration: us(90), Command: "SCAN", Args: 8},
		{ID: 3, Duration: us(50), Command: "SADD", Args: 12},
		{ID: 4, Duration: us(40), Command: "SADD", Args: 5},
		{ID: 5, Duration: us(50), Command: "EXPIRE", Args: 4},
	})
	want := []commandTime{
		{Command: "SCAN", Longest: us(90), Calls: 1, Args: 8},
		{Command: "EXPIRE", Longest: us(50), Calls: 1, Args: 4}, // ties by name
		{Command: "SADD", Longest: us(50), Calls: 3, Args: 12},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// TestSlowlogWatch drains a real server's slowlog: it keeps the watched
// client's commands, in order, named and with their argument counts, and
// fails when an entry is missing.
func TestSlowlogWatch(t *testing.T) {
	ctx := t.Context()
	srv, err := openServer(ctx, redistest.OwnServer(t).Addr, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	scripts, err := keyswapScripts(ctx, srv.admin, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"slowlog-max-len", slowlogLen}, {"slowlog-log-slower-than", "0"}} {
		if err := srv.configSet(ctx, kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	w := newSlowlogWatch(srv, scripts, benchClientName)
	c := srv.client
	do := func(args ...string) {
		t.Helper()
		if err := c.Do(ctx, c.B().Arbitrary(args[0]).Args(args[1:]...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	drain := func() {
		t.Helper()
		if err := w.drain(ctx); err != nil {
			t.Fatal(err)
		}
	}
	drain()
	members := make([]string, 40)
	for i := range members {
		members[i] = fmt.Sprint("m", i)
	}
	do(append([]string{"SADD", keyPrefix + "watched"}, members...)...)
	drain()
	// More than one drain's first read, to read further back.
	for range 300 {
		do("PING")
	}
	do("EVALSHA", redistest.ScriptNamed("refresh").SHA1, "1", keyPrefix+"no-lock", "token", "10")
	drain()
	var got []string
	for _, e := range w.entries {
		got = append(got, fmt.Sprintf("%s/%d", e.Command, e.Args))
		if e.Client != benchClientName {
			t.Errorf("entry %+v: got client %q, want %q", e, e.Client, benchClientName)
		}
	}
	want := append(append([]string{"SADD/42"}, slices.Repeat([]string{"PING/1"}, 300)...), "EVALSHA refresh/6")
	if !slices.Equal(got, want) {
		t.Errorf("entries: got %d %v..., want %d %v...", len(got), got[:min(len(got), 3)], len(want), want[:3])
	}
	for i := 1; i < len(w.entries); i++ {
		if w.entries[i].ID <= w.entries[i-1].ID {
			t.Fatalf("entries out of order: %d after %d", w.entries[i].ID, w.entries[i-1].ID)
		}
	}

	do("PING")
	if err := srv.admin.Do(ctx, srv.admin.B().SlowlogReset().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	do("PING")
	if err := w.drain(ctx); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("drain after another client's SLOWLOG RESET: got %v, want entries missing", err)
	}
}

// TestSlowlogWatchBusy drains while a script runs past
// busy-reply-threshold, when the server answers BUSY to everything else:
// the drain waits for the next one, and the script is recorded then.
func TestSlowlogWatchBusy(t *testing.T) {
	ctx := t.Context()
	srv, err := openServer(ctx, redistest.OwnServer(t, "--busy-reply-threshold", "10").Addr, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	for _, kv := range [][2]string{{"slowlog-max-len", slowlogLen}, {"slowlog-log-slower-than", "0"}} {
		if err := srv.configSet(ctx, kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	w := newSlowlogWatch(srv, nil, benchClientName)
	if err := w.drain(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		c := srv.client
		done <- c.Do(ctx, c.B().Eval().Script("local i = 0 while i < 3e7 do i = i + 1 end return i").Numkeys(0).Build()).Error()
	}()
	busy := false
	for deadline := time.Now().Add(30 * time.Second); !busy && time.Now().Before(deadline); {
		select {
		case err := <-done:
			t.Fatalf("the script ended (%v) before the server answered BUSY", err)
		default:
		}
		if err := w.drain(ctx); err != nil {
			t.Fatalf("drain while a script runs: %v", err)
		}
		busy = isBusy(srv.admin.Do(ctx, srv.admin.B().Ping().Build()).Error())
	}
	if !busy {
		t.Fatal("the server never answered BUSY")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := w.drain(ctx); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(w.entries, func(e slowEntry) bool { return e.Command == "EVAL" })
	if i < 0 || w.entries[i].Duration < 10*time.Millisecond {
		t.Errorf("entries: got %+v, want the script's EVAL, of 10 ms or more", w.entries)
	}
}

package rebuild_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

// TestFIPSOnly (11.8): under GODEBUG=fips140=only, where SHA-1 panics,
// importing the packages does not panic and a rebuild runs: the scripts'
// SHA1s come from the server (SCRIPT LOAD) and a script inside a DoMulti
// goes as EVAL. The rebuild runs in a child process of this test binary.
func TestFIPSOnly(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFIPSChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "GODEBUG=fips140=only", "KEYSWAP_FIPS_CHILD="+env.Standalone.Addr, "KEYSWAP_FIPS_PREFIX="+redistest.Prefix(t))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestFIPSChild") {
		t.Fatalf("the rebuild under GODEBUG=fips140=only failed: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "no tests to run") {
		t.Fatalf("the child ran no test:\n%s", out)
	}
	redistest.WantClean(t, env.Standalone.Client(t), redistest.Prefix(t))
}

// TestFIPSChild is TestFIPSOnly's child process: it does nothing unless
// started by it, with the server's address in $KEYSWAP_FIPS_CHILD.
func TestFIPSChild(t *testing.T) {
	addr := os.Getenv("KEYSWAP_FIPS_CHILD")
	if addr == "" {
		return // not the child: TestFIPSOnly runs it
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	p := os.Getenv("KEYSWAP_FIPS_PREFIX")
	us := users(5000) // several batches, so that heartbeats ride in DoMultis
	r, err := rebuild.New(client, rebuild.Options{BatchSize: 100, TTL: 3 * time.Second},
		builders.Hash(p+"by-email", func(u user) (string, string, bool) { return u.Email, u.ID, true }),
		builders.SetIndex(p+"by-country", func(u user) (string, string, bool) { return u.Country, u.ID, true }))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second run publishes over the first
		if _, err := r.Run(t.Context(), sources.Slice(us)); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	n, err := client.Do(t.Context(), client.B().Hlen().Key(p+"by-email").Build()).AsInt64()
	if err != nil || n != int64(len(us)) {
		t.Fatalf("HLEN = %d, %v; want %d", n, err, len(us))
	}
}

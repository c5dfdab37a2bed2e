//go:build soak

package reliability

import (
	"testing"
	"time"
)

// TestSoakLong is the long soak (issue item 4), behind -tags soak: TestSoak's
// load (two groups of three rebuilders and two readers per deployment, on
// the standalone server and the cluster at once) for 10 minutes, or as long
// as -soak says, with the figures printed at the end (run with -v):
//
//	go test -tags soak -run SoakLong -v -timeout 30m ./reliability
//
// Without the tag, `go test -run Soak -soak 10m -v ./reliability` runs
// TestSoak for as long.
func TestSoakLong(t *testing.T) {
	raceSoak(t, *soakFor, 10*time.Minute)
}

package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// poolFullFor is how long WantPoolFull waits for a connection that must not
// come: far longer than a dial, which is what a pool that lost count of a
// connection does at once.
const poolFullFor = 2 * time.Second

// WantPoolFull checks that the blocking pool of c (rueidis
// ClientOption.BlockingPoolSize; on a cluster, the pool of the master of
// key) counts every connection the caller holds: while they are held, a
// connection asked for does not come within two seconds. It then calls free,
// which must give the caller's connections back, and fails tb unless the
// connection asked for comes within a minute (a run that kept one would
// keep it from coming).
//
// rueidis (v1.0.79) counts a wait for its blocking pool that is cut short
// by its context as a connection given back that was never taken: after it,
// the pool hands out one connection more than its size.
func WantPoolFull(tb testing.TB, c rueidis.Client, key string, free func()) {
	tb.Helper()
	got := make(chan error, 1)
	go func() {
		// A cluster client takes the connection on its first command, from
		// the pool of its key's master. Never cancelled, for the reason
		// above.
		dc, release := c.Dedicate()
		defer release()
		err := dc.Do(context.Background(), dc.B().Exists().Key(key).Build()).Error()
		got <- err
	}()
	select {
	case err := <-got:
		free()
		tb.Fatalf("a connection came out of the blocking pool while the caller held all of it (EXISTS: %v): the pool lost count of one", err)
	case <-time.After(poolFullFor):
	}
	free()
	select {
	case err := <-got:
		if err != nil {
			tb.Fatalf("EXISTS %s on the connection that came back: %v", key, err)
		}
	case <-time.After(time.Minute):
		tb.Fatal("no connection came back to the pool within a minute of the caller's giving back its own")
	}
}

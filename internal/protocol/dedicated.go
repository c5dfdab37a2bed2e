package protocol

import (
	"context"

	"github.com/redis/rueidis"
)

// Dedicated is a connection of a client's blocking pool, the function that
// gives it back, closed (as a [Bulk] gives back its own, for the same
// reason), and the error of its first command.
type Dedicated struct {
	Client  rueidis.DedicatedClient
	Release func()
	Err     error
}

// TakeConnection asks c for a dedicated connection, runs first on it, and returns
// the channel on which the connection comes once first has returned.
//
// rueidis takes the connection from the client's blocking pool
// (ClientOption.BlockingPoolSize), which an application's blocking commands
// can keep in use: a standalone or Sentinel client waits for one in
// Dedicate, without a context; a cluster client in the first command, under
// that command's context. Either way the wait happens here, in a goroutine
// of its own, so that a run can give up on it rather than hang, and not
// take the wait for a slow server. The caller either receives from the
// channel, or calls Abandon on it.
//
// first gets a context that is never done, with ctx's values (a trace's
// span, say), and must send under it (or one derived from it without a
// cancel or a deadline): a cluster client whose
// wait for its pool is cut short hands out a dead connection that the pool
// does not count, and counts it as given back when it is, so that the pool
// then holds one more connection than its size. A command that the server
// does not answer is ended by rueidis's own timeouts (ConnWriteTimeout).
func TakeConnection(ctx context.Context, c rueidis.Client, first func(ctx context.Context, dc rueidis.DedicatedClient) error) <-chan Dedicated {
	never := context.WithoutCancel(ctx)
	got := make(chan Dedicated, 1)
	go func() {
		dc, release := c.Dedicate()
		got <- Dedicated{dc, closing(dc, release, false), first(never, dc)}
	}()
	return got
}

// Abandon gives back the connection that comes on got, once it comes.
func Abandon(got <-chan Dedicated) {
	go func() { (<-got).Release() }()
}

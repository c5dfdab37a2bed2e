package run

import "github.com/redis/rueidis"

// Dedicated is a connection of a client's blocking pool, and the function
// that gives it back.
type Dedicated struct {
	Client  rueidis.DedicatedClient
	Release func()
}

// Acquire asks c for a dedicated connection, and returns the channel on
// which it comes. rueidis waits for one without a context when the
// client's blocking pool (ClientOption.BlockingPoolSize) is in use, as an
// application's blocking commands can keep it; a run must not hang on it.
// The caller either receives from the channel or calls Abandon on it.
func Acquire(c rueidis.Client) <-chan Dedicated {
	got := make(chan Dedicated, 1)
	go func() {
		dc, release := c.Dedicate()
		got <- Dedicated{dc, release}
	}()
	return got
}

// Abandon gives back the connection that comes on got, once it comes.
func Abandon(got <-chan Dedicated) {
	go func() { (<-got).Release() }()
}

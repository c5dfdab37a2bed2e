// Package hook connects package index, whose Commands and Writes builders
// receive, to the runner that implements them (package rebuild): index
// wraps what the runner passes here, so that builders see documented types
// that only the runner can make.
package hook

import "github.com/redis/rueidis"

// Commands is what the runner implements behind index.Commands: one
// batch's commands.
type Commands interface {
	B() rueidis.Builder
	Temp(live string) (string, error)
	Entry(entry string)
	Merge(live, name string, entries ...string) error
	MergeBucket(bucket, name string, entries ...string) error
	Add(cmd rueidis.Completed, entries int)
}

// Writes is what the runner implements behind index.Writes: the writes of
// one change. Add records the command cmd on key with args, after checking
// that the builder owns key; no args writes nothing.
type Writes interface {
	Add(cmd, key string, args ...string) error
}

// NewCommands and NewWrites are set by package index (in its init): they
// return an *index.Commands or an *index.Writes wrapping their argument.
var (
	NewCommands func(Commands) any
	NewWrites   func(Writes) any
)

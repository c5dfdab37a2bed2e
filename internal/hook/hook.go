// Package hook connects the public packages index and sources to the
// runner (package rebuild), which imports them. Package index wraps the
// Commands and Writes the runner implements here, so that builders see
// documented types that only the runner can make; package sources reads
// from a source's context the keys of the run that pulls it.
package hook

import (
	"context"

	"github.com/redis/rueidis"
)

// Commands is what the runner implements behind index.Commands: one
// batch's commands. Merge and MergeBucket copy their entries and keep no
// reference to the slice, which index.Commands reuses.
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

// ownKeysKey is the context key of the keys a run rebuilds, which its SCAN
// sources (package sources) skip.
type ownKeysKey struct{}

// WithOwnKeys returns ctx carrying owns, which reports whether a key is one
// the run rebuilds: the runner passes it to the source it pulls.
func WithOwnKeys(ctx context.Context, owns func(string) bool) context.Context {
	return context.WithValue(ctx, ownKeysKey{}, owns)
}

// OwnKey reports whether key is one the run pulling ctx rebuilds.
func OwnKey(ctx context.Context, key string) bool {
	owns, _ := ctx.Value(ownKeysKey{}).(func(string) bool)
	return owns != nil && owns(key)
}

package main

import (
	"time"

	"github.com/keyswap/keyswap/rebuild"
)

// genMode is how a run of the generations section publishes.
type genMode string

const (
	// modeRename is rebuild.RenameInPlace: temp keys renamed over the live
	// keys by one script.
	modeRename genMode = "rename"
	// modeGenerations is rebuild.Generations: the data written under a new
	// generation, and a pointer flipped to it.
	modeGenerations genMode = "generations"
)

// genModes is both modes, in the order of a round.
var genModes = []genMode{modeRename, modeGenerations}

// options returns opts for a run that publishes in mode m; grace is the
// grace period of the generation flipped away from.
func (m genMode) options(opts rebuild.Options, grace time.Duration) rebuild.Options {
	if m == modeGenerations {
		opts.Publish, opts.Grace = rebuild.Generations, grace
	}
	return opts
}

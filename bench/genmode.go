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
	// modeGenNoSize is rebuild.Generations with Options.SkipSizeCheck: no
	// count of the writes' additions, no SCARD per key before the flip.
	modeGenNoSize genMode = "generations, no size check"
)

// genModes is both modes, in the order of a round.
var genModes = []genMode{modeRename, modeGenerations}

// genCPUModes are the runs of the CPU part, in the order of a round: both
// modes, and Generations mode without its size check.
var genCPUModes = []genMode{modeRename, modeGenerations, modeGenNoSize}

// options returns opts for a run that publishes in mode m; grace is the
// grace period of the generation flipped away from.
func (m genMode) options(opts rebuild.Options, grace time.Duration) rebuild.Options {
	if m == modeGenerations || m == modeGenNoSize {
		opts.Publish, opts.Grace = rebuild.Generations, grace
		opts.SkipSizeCheck = m == modeGenNoSize
	}
	return opts
}

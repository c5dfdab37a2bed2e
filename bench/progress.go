package main

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress is the progress bar on stderr: one step per measured run. A nil
// bar (-progress=false) does nothing.
type progress struct {
	bar *progressbar.ProgressBar
}

func newProgress(cfg config, total int, w io.Writer) *progress {
	if !cfg.progress {
		return &progress{}
	}
	return &progress{bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionSetDescription("starting"),
	)}
}

// describe says what runs now.
func (p *progress) describe(format string, a ...any) {
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf(format, a...))
	}
}

// step records one finished run.
func (p *progress) step() {
	if p.bar != nil {
		p.bar.Add(1)
	}
}

// finish completes the bar after a successful run, and ends its line.
func (p *progress) finish(w io.Writer) {
	if p.bar != nil && !p.bar.IsFinished() {
		p.bar.Finish()
		fmt.Fprintln(w)
	}
}

// exit stops the bar where it is, after a failed run.
func (p *progress) exit(w io.Writer) {
	if p.bar != nil && !p.bar.IsFinished() {
		p.bar.Exit()
		fmt.Fprintln(w)
	}
}

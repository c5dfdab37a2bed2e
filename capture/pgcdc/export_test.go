package pgcdc

import "time"

// SetOnApplied makes r call f after each Apply with the commit times of
// the transactions it completed, and the time it returned.
func SetOnApplied[T any](r *Relay[T], f func(commits []time.Time, at time.Time)) { r.onApplied = f }

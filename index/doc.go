// Package index is the interface between the runner (package rebuild) and
// the builders that turn items into the commands of an index: what a
// builder author implements and what the runner gives a builder.
//
// A [Builder] owns one key, or a [Family] of keys under a prefix, and turns
// each batch of items into commands on the run's temp keys through
// [Commands]. A builder tells the runner, through [Ordered], in what order
// its batches may reach Redis; one that is also [Incremental] turns a
// [Change] into [Writes] on the live keys, which keeps the index right
// between rebuilds and while one runs.
//
// Package builders implements Builder for hashes, sorted sets, sets and one
// set per value; implement it yourself for any other shape. Builders never
// do I/O: the runner sends what they add.
package index

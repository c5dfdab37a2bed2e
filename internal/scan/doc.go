// Package scan iterates over the keys of a Redis deployment with SCAN,
// on the one node of a standalone server or on every master of a cluster.
// The sweep, the family-orphan scan and the SCAN source all use it.
package scan

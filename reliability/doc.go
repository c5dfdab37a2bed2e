// Package reliability holds keyswap's fault-injection, race and soak
// suites. It has no code of its own: its tests run whole rebuilds against
// real redis-server processes while connections are cut and stalled,
// servers are stopped, killed and starved of memory, scripts are flushed
// and processes race, and they assert afterwards that nothing was lost,
// gapped or published stale, and that no key leaked. RELIABILITY.md at
// the repository root reports what they measure.
package reliability

package rebuild_test

import (
	"fmt"

	"github.com/keyswap/keyswap/rebuild"
)

// Defaults tells what a zero field of Options means: here, to size a
// run's batches from the defaults, and to report them.
func ExampleDefaults() {
	d := rebuild.Defaults()
	opts := rebuild.Options{BatchSize: d.BatchSize / 2} // half the default batch, every other default
	fmt.Println("batch:", opts.BatchSize, "of", d.BatchSize)
	fmt.Println("writers:", d.Writers, "lease:", d.TTL, "grace:", d.Grace)
	fmt.Println("durability wait at most:", d.Durability.Timeout)
	// Output:
	// batch: 1000 of 2000
	// writers: 8 lease: 5m0s grace: 10s
	// durability wait at most: 10s
}

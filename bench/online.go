package main

// onlineWorkload is the workload of the online section: the multi
// workload, three indexes of one source, as applications keep them.
func onlineWorkload(buckets int) workload {
	for _, w := range allWorkloads(buckets) {
		if w.name == "multi" {
			return w
		}
	}
	panic("keyswap: bench: no multi workload") // allWorkloads has it
}

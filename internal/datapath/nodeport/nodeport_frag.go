package nodeport

// IP fragments through the north-south LB (bpf/lib/frag.h): the first
// fragment's ports are recorded per datagram in axon_np_frag so the later
// fragments, which carry no L4 header, get the same translation. Counters:
// "frag_tracked", "frag_not_found" and "fragment" (other protocols) in
// LB.Metrics.

import "fmt"

const (
	// MapFrag is the fragment map, pinned by name under the pin dir:
	// {source, destination, IP id, protocol} -> L4 ports of the first fragment.
	MapFrag = "axon_np_frag"
	// DefaultFragMax is its default size (Options.FragMax).
	DefaultFragMax = 8192
)

// FragEntries counts the datagrams in axon_np_frag (recorded first fragments
// not yet evicted; entries live until the LRU evicts them).
func (n *LB) FragEntries() (int, error) {
	var k, v []byte
	count := 0
	it := n.tc.AxonNpFrag.Iterate()
	for it.Next(&k, &v) {
		count++
	}
	if err := it.Err(); err != nil {
		return count, fmt.Errorf("read %s: %w", MapFrag, err)
	}
	return count, nil
}

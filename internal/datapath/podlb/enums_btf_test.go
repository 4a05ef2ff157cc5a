package podlb

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

// TestEnumsMatchBTF holds the counter names to enum axon_podlb_counter in the
// object's BTF.
func TestEnumsMatchBTF(t *testing.T) {
	dptest.CheckEnums(t, map[string]func() (*ebpf.CollectionSpec, error){
		"pod_lb": loadPodLB,
	}, []dptest.EnumCase{
		{Enum: "axon_podlb_counter", Prefix: "AXON_PODLB_", Max: "AXON_PODLB_MAX", Names: counterNames},
	})
}

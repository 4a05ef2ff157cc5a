package bandwidth

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

// TestEnumsMatchBTF holds the Bandwidth Manager's Go copies of C enums
// (counter names, directions) to the BTF of its object.
func TestEnumsMatchBTF(t *testing.T) {
	dptest.CheckEnums(t, map[string]func() (*ebpf.CollectionSpec, error){
		"uplink_egress": loadUplinkEgress,
	}, []dptest.EnumCase{
		{Enum: "axon_bw_stat", Prefix: "AXON_BW_", Max: "AXON_BW_STAT_MAX", Names: bwStatNames},
		{Enum: "axon_bw_dir", Values: map[string]uint64{"AXON_BW_EGRESS": uint64(Egress), "AXON_BW_INGRESS": uint64(Ingress)}},
	})
}

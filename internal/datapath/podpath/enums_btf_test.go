package podpath

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

// TestEnumsMatchBTF holds the pod programs' Go copies of C enums (metric
// directions and reasons) to the BTF of their objects.
func TestEnumsMatchBTF(t *testing.T) {
	dptest.CheckEnums(t, map[string]func() (*ebpf.CollectionSpec, error){
		"pod_egress":     loadPodEgress,
		"uplink_ingress": loadUplinkIngress,
	}, []dptest.EnumCase{
		{Enum: "axon_dir", Prefix: "AXON_DIR_", Max: "AXON_DIR_MAX", Names: directionNames},
		{Enum: "axon_reason", Prefix: "AXON_", Max: "AXON_REASON_MAX", Names: reasonNames},
	})
}

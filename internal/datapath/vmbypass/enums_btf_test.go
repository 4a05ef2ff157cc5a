package vmbypass

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

// TestEnumsMatchBTF holds the counter names to enum axon_vmb_counter in the
// object's BTF.
func TestEnumsMatchBTF(t *testing.T) {
	dptest.CheckEnums(t, map[string]func() (*ebpf.CollectionSpec, error){
		"vm_bypass": loadVmBypass,
	}, []dptest.EnumCase{
		{Enum: "axon_vmb_counter", Prefix: "AXON_VMB_", Max: "AXON_VMB_MAX", Names: counterNames},
	})
}

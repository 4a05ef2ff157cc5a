package nodeport

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

// TestEnumsMatchBTF holds the north-south LB's Go copies of C enums (hooks,
// reasons, Service, backend, conntrack and NAT flags) to the BTF of its
// objects.
func TestEnumsMatchBTF(t *testing.T) {
	dptest.CheckEnums(t, map[string]func() (*ebpf.CollectionSpec, error){
		"lb_tc":  loadLbTC,
		"lb_xdp": loadLbXDP,
	}, []dptest.EnumCase{
		{Enum: "np_hook", Prefix: "NP_HOOK_", Max: "NP_HOOK_MAX", Names: npHookNames},
		{Enum: "np_reason", Prefix: "NP_", Max: "NP_REASON_MAX", Names: npReasonNames},
		{Enum: "np_svc_flag", Values: map[string]uint64{
			"NP_F_AFFINITY": npFlagAffinity, "NP_F_MAGLEV": npFlagMaglev, "NP_F_SRC_RANGES": npFlagSrcRanges,
			"NP_F_DSR": npFlagDSR, "NP_F_LOCAL_ONLY": npFlagLocalOnly,
		}},
		{Enum: "np_be_flag", Values: map[string]uint64{"NP_BE_F_LOCAL": npBackendLocal}},
		{Enum: "np_ct_flag", Values: map[string]uint64{
			"NP_CT_LOCAL": npCTLocal, "NP_CT_SNAT": npCTSNAT, "NP_CT_DSR": npCTDSR, "NP_CT_CLOSING": npCTClosing, "NP_CT_REPLIED": npCTReplied, "NP_CT_XDP": npCTXDP,
		}},
		{Enum: "np_nat_flag", Values: map[string]uint64{"NP_NAT_SNAT": npNATSNAT, "NP_NAT_LOCAL": npNATLocal, "NP_NAT_DSR": npNATDSR, "NP_NAT_UNREPLIED": npNATUnreplied}},
	})
}

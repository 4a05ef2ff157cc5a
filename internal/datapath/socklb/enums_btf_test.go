package socklb

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

// TestEnumsMatchBTF holds the socket LB's Go copies of C enums (LB scopes,
// backend states and flags, socket-destroy protocols) to the BTF of its
// objects.
func TestEnumsMatchBTF(t *testing.T) {
	dptest.CheckEnums(t, map[string]func() (*ebpf.CollectionSpec, error){
		"sock_lb":      loadSockLB,
		"sock_destroy": loadSockDestroy,
	}, []dptest.EnumCase{
		{Enum: "axon_lb_scope", Values: map[string]uint64{
			"AXON_LB_SCOPE_CLUSTER": uint64(lb.ScopeCluster), "AXON_LB_SCOPE_NODEPORT": uint64(lb.ScopeNodePort),
			"AXON_LB_SCOPE_HOSTPORT": uint64(lb.ScopeHostPort),
		}},
		{Enum: "axon_lb_state", Values: map[string]uint64{
			"AXON_LB_ACTIVE": uint64(lb.Active), "AXON_LB_TERMINATING": uint64(lb.Terminating),
			"AXON_LB_QUARANTINED": uint64(lb.Quarantined),
		}},
		{Enum: "axon_lb_flag", Values: map[string]uint64{"AXON_LB_F_AFFINITY": lbmap.FlagAffinity}},
		{Enum: "axon_gone", Values: map[string]uint64{"AXON_GONE_UDP": goneUDP, "AXON_GONE_TCP": goneTCP}},
	})
}

package sockmap

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

// TestEnumsMatchBTF holds the bypass's Go copies of C enums (counter names,
// socket modes) to the BTF of both objects.
func TestEnumsMatchBTF(t *testing.T) {
	dptest.CheckEnums(t, map[string]func() (*ebpf.CollectionSpec, error){
		"sockops": loadSockOps,
		"sk_msg":  loadSkMsg,
		"iter":    loadSockmapIter,
	}, []dptest.EnumCase{
		{Enum: "axon_sockmap_counter", Prefix: "AXON_SM_", Max: "AXON_SM_MAX", Names: metricNames},
		{Enum: "axon_sockmap_mode", Values: map[string]uint64{
			"AXON_SM_MODE_UNDECIDED": modeUndecided, "AXON_SM_MODE_BYPASS": modeBypass, "AXON_SM_MODE_STACK": modeStack,
			"AXON_SM_MODE_UNKNOWN": modeUnknown,
		}},
		{Enum: "axon_sockmap_flag", Values: map[string]uint64{
			"AXON_SM_F_CLIENT": flagClient, "AXON_SM_F_SERVER": flagServer, "AXON_SM_F_PEER_ALIAS": flagPeerAlias,
			"AXON_SM_F_QUIET": flagQuiet, "AXON_SM_F_LEFT": flagLeft, "AXON_SM_F_VOUCH": flagVouch,
			"AXON_SM_F_PUBLISHED": flagPublished, "AXON_SM_F_HOLD": flagHold,
			"AXON_SM_F_STREAK": flagStreak,
		}},
	})
}

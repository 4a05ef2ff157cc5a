package datapath

// Maps that several objects share, pinned by name under the node's pin dir:
// the Bandwidth Manager (package bandwidth) is the only writer of the limit
// maps, the ingress policer in pod_egress / uplink_ingress and the nodeport
// LB's pod delivery read them.

// The Bandwidth Manager's maps (bpf/lib/edt.h).
const (
	MapBWAddr  = "axon_bw_addr"
	MapBWState = "axon_bw_state"
	MapBWStats = "axon_bw_stats"
	// MapBWGate: [0] = 1 while some pod has an ingress limit (the
	// policer skips its lookup otherwise).
	MapBWGate = "axon_bw_gate"
)

// Package bandwidth is axon's Bandwidth Manager: Earliest Departure Time
// (EDT) rate limiting of pods' egress on the node uplink, and the limits
// the ingress policer enforces.
//
// Program (bpf/uplink_egress.c, maps in bpf/lib/edt.h): axon_uplink_egress on
// the uplink's tc egress, where it stamps each limited pod's packets with a
// departure time that the uplink's fq qdisc (package bwm sets it up) holds
// them to. Manager loads it, attaches it through the base's one attach API
// (datapath.TCHook(datapath.RoleBandwidth, ...)) and is the only writer of
// the limit maps. The ingress policer runs inside axon_pod_egress and
// axon_uplink_ingress (package datapath) and reads the same pinned maps.
//
// Maps, pinned by name under the node's pin dir (names in package datapath,
// since several objects share them): axon_bw_addr (datapath.MapBWAddr: pod
// address -> limit id), axon_bw_state (MapBWState: limit and EDT/bucket state
// per id and direction), axon_bw_stats (MapBWStats: per-CPU counters, see
// Stats), axon_bw_gate (MapBWGate: 1 while some pod has an ingress limit).
//
// Pins of the attachment: <pinDir>/links/tcx-bwm-<uplink> (tcx link), or in
// legacy mode links/tc-bwm-<uplink> (the program of the cls_bpf filter
// "axon_bwm", handle 0xa16 on clsact egress). A restarted agent adopts them.
package bandwidth

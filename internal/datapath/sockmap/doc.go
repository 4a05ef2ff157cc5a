// Package sockmap loads the same-node TCP bypass ("sockmap"): TCP between two
// sockets of this node skips the TCP/IP stack.
//
// What. bpf/sockops.c (cgroup sock_ops, on the agent's cgroup root) puts an
// established TCP socket into the SOCKHASH axon_sock_hash when the admission
// rule of bpf/lib/sockmap.h lets it:
//   - pod <-> pod: the local address is an admitted pod's (SetPod) and the
//     socket lives in the netns that owns it (its netns cookie), and the
//     remote address is an admitted pod's; or
//   - loopback (127/8, ::1, ::ffff:127/8) inside an admitted pod netns
//     (SetNetns).
//
// The rule is symmetric: a connection is bypassed only when both ends enter.
// bpf/sk_msg.c, the map's verdict program, then moves each write of such a
// socket into the peer socket's receive queue (bpf_msg_redirect_hash with
// BPF_F_INGRESS). Connections translated by the socket LB carry the
// backend's addresses when established, so they qualify like any other.
//
// How. sockops writes each admitted socket's state (the peer's key, a sticky
// mode) into socket storage before inserting it; sk_msg redirects while the
// peer is in the map and otherwise passes the write to TCP, and a socket that
// passed once never redirects again (redirected bytes are read before the TCP
// receive queue: going back would reorder the stream). A write never fails
// because of the bypass. Maps and the cgroup link are pinned under the pin
// dir: Close leaves the bypass working, Load adopts it, Uninstall removes it.
// Conns lists the sockets in the map with their mode and byte counters (an
// iter/sockmap iterator, bpf/sockmap_iter.c), Metrics the counters of
// admission and redirects.
//
// Limits. Only TCP, only sockets of processes under the cgroup the program is
// attached to, only connections established after their pods were admitted
// (DeletePod stops new ones, bypassed ones continue until they close: keys
// of live sockets are never deleted, that would drop queued data). A socket
// whose first write comes before its peer entered the map stays on TCP. A
// full map (Config.MaxEntries) leaves new sockets on TCP, counted as
// insert_failed. Traffic in the bypass skips everything on the stack path:
// tc programs, bandwidth limits, netfilter, packet counters; the agent does
// not admit pods with a bandwidth limit. Uninstall while bytes are queued in
// a socket loses them.
package sockmap

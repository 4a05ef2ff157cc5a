// Package socklb is axon's socket load balancer: cgroup v2 socket hooks that
// translate service addresses when a socket connects or sends (and back
// when it receives or asks for its peer), and the socket iterators that
// abort sockets still connected to a removed backend.
//
// Programs (bpf/sock_lb.c, attached to one cgroup, the agent's cgroup root):
//   - axon_sock_connect4, axon_sock_connect6: cgroup/connect4, connect6;
//   - axon_sock_sendmsg4, axon_sock_sendmsg6: cgroup/sendmsg4, sendmsg6;
//   - axon_sock_recvmsg4, axon_sock_recvmsg6: cgroup/recvmsg4, recvmsg6;
//   - axon_sock_getpeername4, axon_sock_getpeername6: cgroup/getpeername4, getpeername6;
//   - axon_sock_bind4, axon_sock_bind6: cgroup/bind4, bind6 (HostPort);
//   - axon_sock_release: cgroup/sock_release (drops a socket's reverse entry).
//
// Programs (bpf/sock_destroy.c, loaded by EnableSockDestroy where the kernel
// has bpf_sock_destroy, not pinned): axon_sock_destroy_tcp and
// axon_sock_destroy_udp, tcp and udp socket iterators.
//
// Maps, pinned by name under the node's pin dir (bpf/lib/lb.h):
// axon_lb_svc (MapLBService), axon_lb_be (MapLBBackend), axon_lb_rev
// (MapLBReverse), axon_lb_sock (MapLBSock), axon_lb_aff (MapLBAffinity),
// axon_lb_local (MapLBLocal), axon_lb_skip (MapLBSkip); axon_lb_gone is the
// iterators' own, unpinned.
//
// Pins of the links: <pinDir>/links/cgroup-<hook> (connect4, connect6,
// sendmsg4, sendmsg6, recvmsg4, recvmsg6, getpeername4, getpeername6, bind4,
// bind6, release). A restarted agent adopts them (program update in place).
package socklb

// Package sockmap loads the same-node TCP bypass: bpf/sockops.c puts
// established TCP sockets that pass the admission rule (bpf/lib/sockmap.h:
// pod <-> pod on this node, the socket in the netns that owns its address;
// or loopback inside an enabled pod netns) into a SOCKHASH, and bpf/sk_msg.c
// moves each of their writes straight into the peer socket's receive queue,
// skipping the TCP/IP stack. Bypass is the only writer of the admission maps
// (SetPod, SetNetns); the kernel removes a socket from the map when it
// closes.
package sockmap

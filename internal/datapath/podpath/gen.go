package podpath

// The BPF objects are compiled from ../../../bpf by bpf2go (a tool directive in
// go.mod); the generated *_bpfel.go / *_bpfel.o files are not committed.
// Requires clang-19 and libbpf-dev (bpf/bpf_helpers.h).

//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel -type endpoint_info podEgress ../../../bpf/pod_egress.c
//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel uplinkIngress ../../../bpf/uplink_ingress.c

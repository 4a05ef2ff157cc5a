package podlb

// The pod LB's object, bpf/pod_lb.c, compiled by bpf2go (a tool directive in
// go.mod); the generated podlb_bpfel.{go,o} are not committed.

//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel podLB ../../../bpf/pod_lb.c

package bandwidth

// The Bandwidth Manager's object, bpf/uplink_egress.c, compiled by bpf2go (a
// tool directive in go.mod); the generated uplinkegress_bpfel.{go,o} are not
// committed.

//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel -type bw_state -type bw_state_key uplinkEgress ../../../bpf/uplink_egress.c

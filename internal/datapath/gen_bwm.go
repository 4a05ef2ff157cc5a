package datapath

// Issue 6 (Bandwidth Manager): the uplink egress EDT program. Generated
// files (uplinkegress_bpfel.{go,o}) are not committed.

//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../bpf" -target bpfel -type bw_state -type bw_state_key uplinkEgress ../../bpf/uplink_egress.c

package vmbypass

// The VM-pod bridge bypass's object, bpf/vm_bypass.c, compiled by bpf2go (a
// tool directive in go.mod); the generated vmbypass_bpfel.{go,o} are not
// committed.

//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel vmBypass ../../../bpf/vm_bypass.c

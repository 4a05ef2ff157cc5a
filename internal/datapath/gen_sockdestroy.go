package datapath

// bpf/sock_destroy.c: socket iterators that abort sockets pinned to a removed
// backend (bpf_sock_destroy, kernel >= 6.5). See sockdestroy.go.

//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../bpf" -target bpfel -type lb_gone_key sockDestroy ../../bpf/sock_destroy.c

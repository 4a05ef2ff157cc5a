package socklb

// The socket LB's objects are compiled from ../../../bpf by bpf2go (a tool
// directive in go.mod); the generated *_bpfel.go / *_bpfel.o files are not
// committed. bpf/sock_lb.c: the cgroup socket hooks; bpf/sock_destroy.c:
// socket iterators that abort sockets pinned to a removed backend
// (bpf_sock_destroy, kernel >= 6.5, see sockdestroy.go).

//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel -type lb_svc_key -type lb_svc_val -type lb_backend -type lb_rev_key -type lb_rev_val -type lb_aff_key -type lb_aff_val sockLB ../../../bpf/sock_lb.c
//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel -type lb_gone_key sockDestroy ../../../bpf/sock_destroy.c

package sockmap

// The bypass's objects are compiled from ../../../bpf by bpf2go (a tool
// directive in go.mod); the generated *_bpfel.go / *_bpfel.o files are not
// committed. bpf/sockops.c: admission into axon_sock_hash (cgroup sock_ops);
// bpf/sk_msg.c: the redirect of each write (sk_msg verdict on the map). Both
// include bpf/lib/sockmap.h; the sk_msg object uses the sockops object's maps.
// bpf/sockmap_iter.c: the connection list (iter/sockmap over the map).
// bpf/sock_splice.c: the splice guard (fmod_ret on security_file_permission,
// see splice.go), also on the sockops object's maps.

//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel -type sockmap_key -type sockmap_pod -type sockmap_state -type sockmap_quiet sockOps ../../../bpf/sockops.c
//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel skMsg ../../../bpf/sk_msg.c
//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel -type sockmap_conn_rec sockmapIter ../../../bpf/sockmap_iter.c
//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel sockSplice ../../../bpf/sock_splice.c

package nodeport

// North-south load balancer (bpf/lb_tc.c, bpf/lb_xdp.c; shared code in
// bpf/lib/nodeport.h): one object per hook, same maps.

//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel -type np_tuple -type np_ct -type np_nat -type np_svc_key -type np_svc_val -type np_backend -type np_srcrange_key -type np_aff_key -type np_aff_val -type np_explain -type np_dsr_key -type np_cluster_key -type np_pod_cidr lbTC ../../../bpf/lb_tc.c
//go:generate go tool bpf2go -cc clang-19 -cflags "-g -Wall -I/usr/include/x86_64-linux-gnu -I../../../bpf" -target bpfel lbXDP ../../../bpf/lb_xdp.c

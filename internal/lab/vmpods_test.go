package lab

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/agent"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/lab/probe"
	"github.com/axonhq/axon/internal/vmguest"
)

// The names the lab shares with the agent and the guest.
func TestVMPodSharedNames(t *testing.T) {
	if vmBypassAnnotation != agent.AnnotationVMBypass {
		t.Errorf("the lab annotates VM pods %q, the agent reads %q", vmBypassAnnotation, agent.AnnotationVMBypass)
	}
	if vmguest.EchoPort != probe.EchoPort {
		t.Errorf("the guest echoes on %d, the lab's probes use %d", vmguest.EchoPort, probe.EchoPort)
	}
}

func TestValidateVMPods(t *testing.T) {
	for _, tc := range []struct {
		name    string
		o       UpOptions
		wantErr string
	}{
		{"none", UpOptions{Nodes: 2, Datapath: DatapathBaseline}, ""},
		{"one per node", UpOptions{Nodes: 2, VMPods: 1, Datapath: DatapathAxon}, ""},
		{"the most", UpOptions{Nodes: 2, VMPods: MaxVMPodsPerNode, Datapath: DatapathAxon}, ""},
		{"negative", UpOptions{Nodes: 2, VMPods: -1, Datapath: DatapathAxon}, "--vm-pods -1: want 0..4 per node"},
		{"too many", UpOptions{Nodes: 2, VMPods: MaxVMPodsPerNode + 1, Datapath: DatapathAxon}, "--vm-pods 5: want 0..4 per node"},
		{"baseline has no agent", UpOptions{Nodes: 2, VMPods: 1, Datapath: DatapathBaseline}, "--vm-pods needs --datapath axon"},
		{"kubelet", UpOptions{Nodes: 2, VMPods: 1, Datapath: DatapathAxon, Kubelet: true}, "--kubelet runs real kubelets"},
		{"with kube-proxy", UpOptions{Nodes: 2, VMPods: 1, Datapath: DatapathAxon, KubeProxy: kubeproxy.NFTables}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.BinDir = "/bin"
			err := o.validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("validate = %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

func vmTestState() *State {
	st := testState(DatapathAxon, "")
	st.Pods = st.Pods[:2] // node1-pod1, node2-pod1
	st.DemoServices = true
	st.VMPods = []VMPod{
		{Pod: Pod{Name: "node1-vm1", Namespace: "default", Node: "node1", IP: netip.MustParseAddr("10.244.1.3"),
			IPs: []netip.Addr{netip.MustParseAddr("10.244.1.3"), netip.MustParseAddr("fd00:10:244:1::3")}}},
		{Pod: Pod{Name: "node2-vm1", Namespace: "default", Node: "node2", IP: netip.MustParseAddr("10.244.2.3"),
			IPs: []netip.Addr{netip.MustParseAddr("10.244.2.3")}}}, // a guest without IPv6: IPv4 probes only
	}
	return st
}

func TestPlanVMProbes(t *testing.T) {
	st := vmTestState()
	plan := planVMProbes(st)
	var got []string
	for _, p := range plan {
		if p.vm == "node1-vm1" {
			got = append(got, p.what()+" "+p.na)
		}
	}
	want := []string{
		"icmp from node1-pod1 ", "tcp from node1-pod1 ",
		"icmp from node2-pod1 ", "tcp from node2-pod1 ",
		"icmp from node1 ", "tcp from node1 ",
		"icmp6 from node1-pod1 ", "tcp6 from node1-pod1 ",
		"icmp6 from node2-pod1 ", "tcp6 from node2-pod1 ",
		"icmp6 from node1 ", "tcp6 from node1 ",
		"service tcp/10.96.101.1:80 from node1-pod1 ",
		"service tcp/10.96.101.1:80 from node2-pod1 ",
		"service tcp/10.96.101.1:80 from node1 ",
		"service tcp/198.18.0.11:30101 from external ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("node1-vm1's probes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, p := range plan {
		if p.pod != nil && !slices.Contains(st.vmPod(p.vm).IPs, p.pod.Addr) {
			t.Errorf("%s: probes %s, not its guest", p.vm, p.pod)
		}
	}

	// No pods: the pod sources are n/a with the reason; no demo Services: the Service too.
	// node1-vm1's guest has IPv6 (its icmp and tcp probes twice), node2-vm1's not.
	st.Pods, st.DemoServices = nil, false
	na := map[string]int{}
	for _, p := range planVMProbes(st) {
		na[p.na]++
	}
	for reason, n := range map[string]int{
		"no pod on node1 (--pods-per-node 0)":                     2*2 + 1, // icmp, tcp per family, service
		"no pod on node2 (--pods-per-node 0)":                     2 + 1,
		"no pod on another node (--nodes 1 or --pods-per-node 0)": 2*2 + 1 + 2 + 1,
		"no demo Services (--no-demo)":                            2 * 2,   // from the node, from external
		"":                                                        2*2 + 2, // icmp and tcp from the node
	} {
		if na[reason] != n {
			t.Errorf("%d probes n/a %q, want %d (all: %v)", na[reason], reason, n, na)
		}
	}
}

func TestDemoVMObjects(t *testing.T) {
	st := vmTestState()
	seen := map[string]bool{}
	for i, v := range st.VMPods {
		svc, s := demoVMService(i+1, v), demoVMSlice(i+1, v)
		name, ip, nodePort := DemoVMService(i+1, v.Name)
		if svc.Name != name || svc.Spec.ClusterIP != ip.String() || svc.Spec.Ports[0].NodePort != nodePort ||
			svc.Spec.Ports[0].TargetPort.IntVal != int32(vmguest.EchoPort) || len(svc.Spec.IPFamilies) != 1 ||
			svc.Spec.Selector[vmPodLabel] != v.Name {
			t.Errorf("%s: %s %+v", v.Name, svc.Name, svc.Spec)
		}
		// One Service per VM pod, with that guest as its only backend.
		if got := strings.Join(endpointAddrs(s), ","); got != v.IP.String() || s.Labels["kubernetes.io/service-name"] != name {
			t.Errorf("%s's slice %s: endpoints %s, want its guest %s", v.Name, s.Name, got, v.IP)
		}
		if *s.Endpoints[0].NodeName != v.Node || s.Endpoints[0].TargetRef.Name != v.Name {
			t.Errorf("endpoint %+v: want %s on %s", s.Endpoints[0], v.Name, v.Node)
		}
		for _, k := range []string{name, ip.String(), fmt.Sprint(nodePort)} {
			if seen[k] {
				t.Errorf("%s shared by two VM pods", k)
			}
			seen[k] = true
		}
	}
	if _, ip, np := DemoVMService(MaxVMPodsPerNode*50, "x"); ip != netip.MustParseAddr("10.96.101.200") || np != 30300 {
		t.Errorf("the 200th VM pod's Service: %s, %d", ip, np)
	}
	// The VM pods are no demo backends (their guests run no UDP echo).
	for _, p := range demoBackends(st) {
		if strings.Contains(p.Name, "-vm") {
			t.Errorf("VM pod %s backs the demo Services", p.Name)
		}
	}
}

func TestVMCheckResultPrint(t *testing.T) {
	r := &VMCheckResult{Checks: []VMCheck{
		{VMPod: "node1-vm1", What: "bypass", OK: true, Detail: "agent: bypassed"},
		{VMPod: "node2-vm1", What: "bypass", Detail: "agent: not bypassed: no_tap"},
		{VMPod: "node2-vm1", What: "icmp from node1-pod1", NA: "no pod on node1"},
	}}
	var b bytes.Buffer
	r.Print(&b)
	out := b.String()
	for _, want := range []string{"FAIL node2-vm1 bypass: agent: not bypassed: no_tap", "1/2 VM pod checks passed, 1 n/a"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if ok, ran, na := r.Counts(); ok != 1 || ran != 2 || na != 1 {
		t.Errorf("Counts = %d, %d, %d", ok, ran, na)
	}
}

func TestPlanGuestProbes(t *testing.T) {
	st := vmTestState()
	st.Pods[0].IP, st.Pods[1].IP = netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2")
	var got []string
	for _, p := range planGuestProbes(st, 3, nil) {
		if p.vm == "node1-vm1" {
			got = append(got, p.what+" | "+p.cmd+" | "+p.want+" | "+p.na)
		}
	}
	want := []string{
		"from the guest: tcp to node1-pod1 | echo axon-guest-node1-vm1 | nc -w 3 10.244.1.2 5657 | axon-guest-node1-vm1 | ",
		"from the guest: icmp to node1-pod1 | ping -c 1 -W 3 10.244.1.2 |  0% packet loss | ",
		"from the guest: tcp to node2-pod1 | echo axon-guest-node1-vm1 | nc -w 3 10.244.2.2 5657 | axon-guest-node1-vm1 | ",
		"from the guest: icmp to node2-pod1 | ping -c 1 -W 3 10.244.2.2 |  0% packet loss | ",
		"from the guest: tcp to node1 | echo axon-guest-node1-vm1 | nc -w 3 198.18.0.11 5657 | axon-guest-node1-vm1 | ",
		"from the guest: icmp to node1 | ping -c 1 -W 3 198.18.0.11 |  0% packet loss | ",
		"from the guest: service tcp/10.96.100.10:80 (demo-clusterip) | echo axon-guest-node1-vm1 | nc -w 3 10.96.100.10 80 | axon-guest-node1-vm1 | ",
		"from the guest: tcp6 to node1-pod1 | echo axon-guest-node1-vm1 | nc -w 3 fd00:10:244:1::2 5657 | axon-guest-node1-vm1 | ",
		"from the guest: icmp6 to node1-pod1 | ping6 -c 1 -W 3 fd00:10:244:1::2 |  0% packet loss | ",
		"from the guest: tcp6 to node2-pod1 | echo axon-guest-node1-vm1 | nc -w 3 fd00:10:244:2::2 5657 | axon-guest-node1-vm1 | ",
		"from the guest: icmp6 to node2-pod1 | ping6 -c 1 -W 3 fd00:10:244:2::2 |  0% packet loss | ",
		"from the guest: tcp6 to node1 | echo axon-guest-node1-vm1 | nc -w 3 fd00:198:18::11 5657 | axon-guest-node1-vm1 | ",
		"from the guest: icmp6 to node1 | ping6 -c 1 -W 3 fd00:198:18::11 |  0% packet loss | ",
		"from the guest: service tcp/[fd00:10:96::10]:80 (demo-clusterip) | echo axon-guest-node1-vm1 | nc -w 3 fd00:10:96::10 80 | axon-guest-node1-vm1 | ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("node1-vm1's guest probes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// No pods, no demo Services: n/a with the reasons; the node is still probed (node1-vm1's
	// guest in both families, node2-vm1's, without IPv6, in IPv4).
	st.Pods, st.DemoServices = nil, false
	na := map[string]int{}
	for _, p := range planGuestProbes(st, 3, nil) {
		na[p.na]++
	}
	// a VM pod the agent gives no pod LB: its guest's ClusterIP probe is n/a with the agent's why
	st = vmTestState()
	for _, p := range planGuestProbes(st, 3, map[string]string{"node2-vm1": "no pod LB here"}) {
		if want := map[bool]string{true: "no pod LB here", false: ""}[p.vm == "node2-vm1"]; p.service && p.na != want {
			t.Errorf("%s: %s n/a %q, want %q", p.vm, p.what, p.na, want)
		}
	}
	for reason, n := range map[string]int{
		"no pod on node1 (--pods-per-node 0)":                     2 * 2,
		"no pod on node2 (--pods-per-node 0)":                     2,
		"no pod on another node (--nodes 1 or --pods-per-node 0)": 2*2 + 2,
		"no demo Services (--no-demo)":                            2 + 1,
		"":                                                        2*2 + 2, // tcp and icmp to the node
	} {
		if na[reason] != n {
			t.Errorf("%d guest probes n/a %q, want %d (all: %v)", na[reason], reason, n, na)
		}
	}
}

package lab

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

func extTestState(nodes int) *State {
	st := &State{Datapath: DatapathAxon, External: newExternal(), DemoServices: true}
	for i := 1; i <= nodes; i++ {
		st.Nodes = append(st.Nodes, newNode("/tmp/x", "/sys/fs/cgroup/x", i))
		st.Pods = append(st.Pods, Pod{Name: st.Nodes[i-1].Name + "-pod1", Node: st.Nodes[i-1].Name, Datapath: DatapathAxon})
	}
	return st
}

func TestPlanExternalProbes(t *testing.T) {
	st := extTestState(2)
	plan := planExternalProbes(st, "")
	count := map[string]int{}
	for _, p := range plan {
		count[p.Expect]++
		if p.Expect == ExpectBlocked && !strings.Contains(p.Case, "node2") {
			t.Errorf("blocked probe on a node with local backends: %+v", p)
		}
		if strings.HasPrefix(p.Case, "HostPort") && p.NA != "" {
			t.Errorf("HostPort probe n/a in an axon lab with %s: %+v", DemoHostPortPod, p)
		}
		if strings.HasPrefix(p.Col, "http") != (p.Probe.Proto == "http") {
			t.Errorf("column %s for %s", p.Col, p.Probe)
		}
	}
	// Per node: 4 NodePort + 4 pinned NodePort + 4 ETP Local NodePort + 2 health = 14;
	// HostPort: 8 on node1 (the pod's node: client IP + echo), 4 blocked on node2;
	// plus 4 LB + 4 externalIP + 4 ETP Local LB.
	if len(plan) != 2*14+12+12 {
		t.Errorf("planned %d probes, want %d", len(plan), 2*14+12+12)
	}
	want := map[string]int{ExpectBlocked: 4 + 4, ExpectClientIP: 4 + 4 + 4, ExpectHealthy: 2, ExpectNoLocal: 2}
	for k, v := range want {
		if count[k] != v {
			t.Errorf("%d probes expect %s, want %d (all: %v)", count[k], k, v, count)
		}
	}
	for _, p := range planExternalProbes(st, "nothing serves") {
		if p.NA != "nothing serves" {
			t.Fatalf("probe %s not n/a with the lab's reason: %q", p.Probe, p.NA)
		}
	}
}

func TestExternalImpl(t *testing.T) {
	st := extTestState(2)
	for _, tc := range []struct {
		name     string
		mut      func(*State)
		np       map[string]string
		wantImpl string
		wantNA   string
	}{
		{"tc", nil, map[string]string{"node1": "tc on eth0 (tc ingress tcx)", "node2": "tc on eth0"}, "axon north-south LB (tc)", ""},
		{"mixed", nil, map[string]string{"node1": "xdp-native on eth0", "node2": "tc on eth0"}, "axon north-south LB (tc,xdp-native)", ""},
		{"disabled", nil, map[string]string{"node1": "disabled", "node2": "tc on eth0"}, "", "node1: nodeport_lb disabled"},
		{"unreachable", nil, map[string]string{"node1": "tc"}, "", "node2: agent status unavailable"},
		{"kube-proxy", func(s *State) { s.KubeProxy = KubeProxyNFTables }, nil, "kube-proxy nftables", ""},
		{"baseline", func(s *State) { s.Datapath = DatapathBaseline }, nil, "", "no Service implementation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := *st
			if tc.mut != nil {
				tc.mut(&s)
			}
			impl, na := externalImpl(&s, tc.np)
			if impl != tc.wantImpl || !strings.Contains(na, tc.wantNA) || (tc.wantNA == "") != (na == "") {
				t.Errorf("externalImpl = %q, %q; want %q, ~%q", impl, na, tc.wantImpl, tc.wantNA)
			}
		})
	}
}

func TestEvalExternal(t *testing.T) {
	client := []netip.Addr{netip.MustParseAddr("198.18.0.250"), netip.MustParseAddr("fd00:198:18::250")}
	for _, tc := range []struct {
		name   string
		expect string
		r      XProbeResult
		pass   bool
	}{
		{"ok", ExpectOK, XProbeResult{OK: true}, true},
		{"ok failed", ExpectOK, XProbeResult{Err: "timeout"}, false},
		{"client ip kept", ExpectClientIP, XProbeResult{OK: true, Seen: "198.18.0.250:40000"}, true},
		{"client ip v6", ExpectClientIP, XProbeResult{OK: true, Seen: "[fd00:198:18::250]:40000"}, true},
		{"client ip snat", ExpectClientIP, XProbeResult{OK: true, Seen: "198.18.0.11:61000"}, false},
		{"client ip plain echo", ExpectClientIP, XProbeResult{OK: true}, false},
		{"blocked", ExpectBlocked, XProbeResult{Err: "i/o timeout"}, true},
		{"not blocked", ExpectBlocked, XProbeResult{OK: true}, false},
		{"health 200", ExpectHealthy, XProbeResult{OK: true, Status: 200, Body: `{"localEndpoints":2,"serviceProxyHealthy":true}`}, true},
		{"health 200 no eps", ExpectHealthy, XProbeResult{OK: true, Status: 200, Body: `{"localEndpoints":0}`}, false},
		{"health 503", ExpectNoLocal, XProbeResult{OK: true, Status: 503, Body: `{"localEndpoints":0}`}, true},
		{"health wrong status", ExpectNoLocal, XProbeResult{OK: true, Status: 200, Body: `{"localEndpoints":1}`}, false},
		{"health garbage", ExpectHealthy, XProbeResult{OK: true, Status: 200, Body: `ok`}, false},
		{"health refused", ExpectHealthy, XProbeResult{Err: "connection refused"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := evalExternal(ExtPlanned{Expect: tc.expect}, tc.r, client)
			if (why == "") != tc.pass {
				t.Errorf("evalExternal = %q, want pass=%v", why, tc.pass)
			}
		})
	}
}

func TestParseXProbe(t *testing.T) {
	for _, good := range []string{"tcp/198.18.0.11:30080", "udp/[fd00:198:18::200]:80", "http/198.18.0.11:30082"} {
		p, err := ParseXProbe(good)
		if err != nil || p.String() != good {
			t.Errorf("ParseXProbe(%q) = %v, %v", good, p, err)
		}
	}
	for _, bad := range []string{"", "icmp/1.2.3.4:1", "tcp/1.2.3.4", "tcp:1.2.3.4:80", "udp/[::1]"} {
		if _, err := ParseXProbe(bad); err == nil {
			t.Errorf("ParseXProbe(%q) accepted", bad)
		}
	}
}

func TestNorthSouthOptions(t *testing.T) {
	for _, tc := range []struct {
		accel, mode string
		ok          bool
	}{{"", "", true}, {"native", "dsr", true}, {"best-effort", "snat", true}, {"xdp", "", false}, {"", "ipip", false}} {
		if err := validateNorthSouth(tc.accel, tc.mode); (err == nil) != tc.ok {
			t.Errorf("validateNorthSouth(%q, %q) = %v", tc.accel, tc.mode, err)
		}
	}
	st := &State{LBAcceleration: "native", NodePortMode: "dsr"}
	if got := northSouthAgentArgs(st); !slices.Equal(got, []string{"--lb-acceleration=native", "--nodeport-mode=dsr"}) {
		t.Errorf("agent args %v", got)
	}
	st.KubeProxy = KubeProxyIPTables
	if got := northSouthAgentArgs(st); len(got) != 0 {
		t.Errorf("agent args with kube-proxy: %v (the agents run --nodeport=false)", got)
	}
	o := UpOptions{Nodes: 1, Datapath: DatapathAxon, LBAcceleration: "sometimes"}
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "--lb-acceleration") {
		t.Errorf("validate accepted a bad --lb-acceleration: %v", err)
	}
}

func TestExternalDemoObjects(t *testing.T) {
	objs := externalDemoObjects()
	if len(objs) != 2 || objs[0].Name != DemoPinned || objs[1].Name != DemoLocal {
		t.Fatalf("objects %v", objs)
	}
	local := objs[1]
	if local.Spec.ExternalTrafficPolicy != "Local" || local.Spec.HealthCheckNodePort != DemoLocalHealthPort {
		t.Errorf("demo-local spec %+v", local.Spec)
	}
	for _, o := range objs {
		for _, p := range o.Spec.Ports {
			if p.TargetPort.IntValue() != PeerEchoPort || p.NodePort == 0 {
				t.Errorf("%s port %+v", o.Name, p)
			}
		}
	}
	st := extTestState(3)
	b := externalDemoBackends(st)
	if len(b) != 1 || b[0].Node != "node1" {
		t.Errorf("backends %v, want node1's pods only", b)
	}
}

// TestPeerEchoAndXProbe runs the peer-echo server and the prober over real
// sockets in a private network namespace.
func TestPeerEchoAndXProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a private network namespace")
	}
	tns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tns.Close(); _ = testutils.UnmountNS(tns) })
	if err := tns.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	readyR, readyW, _ := os.Pipe()
	defer readyR.Close()
	done := make(chan error, 1)
	go func() {
		done <- tns.Do(func(ns.NetNS) error { return ServePeerEcho(ctx, PeerEchoPort, readyW, nil) })
	}()
	if err := readReady(readyR); err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{"tcp/127.0.0.1:5658", "tcp/[::1]:5658", "udp/127.0.0.1:5658", "udp/[::1]:5658"} {
		p, _ := ParseXProbe(spec)
		var r XProbeResult
		_ = tns.Do(func(ns.NetNS) error {
			pctx, c := context.WithTimeout(ctx, 2*time.Second)
			defer c()
			r = xprobe(pctx, p)
			return nil
		})
		seen, err := netip.ParseAddrPort(r.Seen)
		if !r.OK || err != nil || seen.Addr() != p.Addr.Addr() {
			t.Errorf("%s: %+v (want the server to see %s)", spec, r, p.Addr.Addr())
		}
		if p.Proto == "tcp" && r.Server != p.Addr.String() {
			t.Errorf("%s: server address %q", spec, r.Server)
		}
	}
	// Nothing listens on 5659: a fast failure, not a pass.
	p, _ := ParseXProbe("tcp/127.0.0.1:5659")
	_ = tns.Do(func(ns.NetNS) error {
		if r := xprobe(ctx, p); r.OK {
			t.Errorf("probe to a closed port passed: %+v", r)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("ServePeerEcho: %v", err)
	}
}

func TestExternalCheckResultPrint(t *testing.T) {
	st := extTestState(2)
	r := &ExternalCheckResult{Impl: "axon north-south LB (tc)", Client: st.External.IPs, Announcer: "node1",
		Cols: []string{"tcp/v4", "tcp/v6", "udp/v4", "udp/v6", "http/v4", "http/v6"}, Cells: map[[2]string][]ExtCell{}}
	for _, p := range planExternalProbes(st, "") {
		if !slices.Contains(r.Cases, p.Case) {
			r.Cases = append(r.Cases, p.Case)
		}
		c := ExtCell{ExtPlanned: p}
		if p.NA == "" && p.Case == r.Cases[0] && p.Col == "udp/v6" {
			c.Fail = "no UDP answer before the deadline"
		}
		key := [2]string{p.Case, p.Col}
		r.Cells[key] = append(r.Cells[key], c)
	}
	var b bytes.Buffer
	r.Print(&b)
	out := b.String()
	for _, want := range []string{"FAIL 0/1", "ok (blocked)", "ok (503)", "ok (client IP)", "HostPort node1 :30901 (pod node1-pod1, client IP kept)", "51/52 external probes passed, 0 n/a"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if len(r.Failed()) != 1 {
		t.Errorf("Failed() = %v", r.Failed())
	}
}

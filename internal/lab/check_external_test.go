package lab

import (
	"bytes"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/lab/probe"
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
		{"kube-proxy", func(s *State) { s.KubeProxy = kubeproxy.NFTables }, nil, "kube-proxy nftables", ""},
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
		r      probe.ExternalResult
		pass   bool
	}{
		{"ok", ExpectOK, probe.ExternalResult{OK: true}, true},
		{"ok failed", ExpectOK, probe.ExternalResult{Err: "timeout"}, false},
		{"client ip kept", ExpectClientIP, probe.ExternalResult{OK: true, Seen: "198.18.0.250:40000"}, true},
		{"client ip v6", ExpectClientIP, probe.ExternalResult{OK: true, Seen: "[fd00:198:18::250]:40000"}, true},
		{"client ip snat", ExpectClientIP, probe.ExternalResult{OK: true, Seen: "198.18.0.11:61000"}, false},
		{"client ip plain echo", ExpectClientIP, probe.ExternalResult{OK: true}, false},
		{"blocked", ExpectBlocked, probe.ExternalResult{Err: "i/o timeout"}, true},
		{"not blocked", ExpectBlocked, probe.ExternalResult{OK: true}, false},
		{"health 200", ExpectHealthy, probe.ExternalResult{OK: true, Status: 200, Body: `{"localEndpoints":2,"serviceProxyHealthy":true}`}, true},
		{"health 200 no eps", ExpectHealthy, probe.ExternalResult{OK: true, Status: 200, Body: `{"localEndpoints":0}`}, false},
		{"health 503", ExpectNoLocal, probe.ExternalResult{OK: true, Status: 503, Body: `{"localEndpoints":0}`}, true},
		{"health wrong status", ExpectNoLocal, probe.ExternalResult{OK: true, Status: 200, Body: `{"localEndpoints":1}`}, false},
		{"health garbage", ExpectHealthy, probe.ExternalResult{OK: true, Status: 200, Body: `ok`}, false},
		{"health refused", ExpectHealthy, probe.ExternalResult{Err: "connection refused"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := evalExternal(ExtPlanned{Expect: tc.expect}, tc.r, client)
			if (why == "") != tc.pass {
				t.Errorf("evalExternal = %q, want pass=%v", why, tc.pass)
			}
		})
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
	st.KubeProxy = kubeproxy.IPTables
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
			if p.TargetPort.IntValue() != probe.PeerEchoPort || p.NodePort == 0 {
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

// TestNotLocalDrops: an ETP Local "not served" cell passes only when its
// node's LB counted a drop (drop_no_backend/drop_not_local) per such probe; other cells and
// baseline labs are left alone.
func TestNotLocalDrops(t *testing.T) {
	st := extTestState(2)
	plan := planExternalProbes(st, "")
	cells := func() map[[2]string][]ExtCell {
		out := map[[2]string][]ExtCell{}
		for _, p := range plan {
			key := [2]string{p.Case, p.Col}
			out[key] = append(out[key], ExtCell{ExtPlanned: p})
		}
		return out
	}
	failed := func(cs map[[2]string][]ExtCell) (etp, other int) {
		for _, c := range cs {
			for _, x := range c {
				if x.Fail == "" {
					continue
				}
				if x.Probe.Addr.Port() == DemoLocalNodePort && x.Expect == ExpectBlocked {
					etp++
				} else {
					other++
				}
			}
		}
		return etp, other
	}
	d := notLocalCounter(st)
	before := map[string]uint64{"node1": 5, "node2": 7}
	for _, tc := range []struct {
		desc      string
		node2     uint64
		wantFails int
	}{
		{"each probe dropped by node2's LB", 7 + 4, 0},
		{"more drops (SYN retransmits)", 7 + 9, 0},
		{"fewer drops than probes", 7 + 3, 4},
		{"no drop: the LB never saw them", 7, 4},
	} {
		cs := cells()
		d.judge(cs, before, map[string]uint64{"node1": 5, "node2": tc.node2}, nil)
		etp, other := failed(cs)
		if etp != tc.wantFails || other != 0 {
			t.Errorf("%s: %d ETP Local cells failed (want %d), %d others", tc.desc, etp, tc.wantFails, other)
		}
	}
	base := extTestState(2)
	base.Datapath = DatapathBaseline
	cs := cells()
	notLocalCounter(base).judge(cs, nil, nil, nil)
	if etp, other := failed(cs); etp+other != 0 {
		t.Errorf("baseline lab: %d cells failed, want none judged", etp+other)
	}
}

package lab

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/lab/probe"
)

func TestDemoHostPorts(t *testing.T) {
	ports := demoHostPorts(Pod{Name: DemoHostPortPod})
	got := map[string]bool{}
	for _, p := range ports {
		got[string(p.Protocol)+" "+netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(p.HostPort)).String()+"->"+p.Name] = true
		if (p.HostPort == DemoHostPort) != (p.ContainerPort == probe.EchoPort) || (p.HostPort == DemoHostPortPeer) != (p.ContainerPort == probe.PeerEchoPort) {
			t.Errorf("port %+v", p)
		}
	}
	if len(ports) != 4 || !got["TCP 0.0.0.0:30900->echo"] || !got["UDP 0.0.0.0:30901->peer-udp"] {
		t.Errorf("demo hostPorts %v", got)
	}
	if len(demoHostPorts(Pod{Name: "node2-pod1"})) != 0 {
		t.Error("a second pod declares hostPorts")
	}
	for _, tc := range []struct {
		name string
		mut  func(*State)
		na   string
	}{
		{"axon", nil, ""},
		{"kube-proxy", func(s *State) { s.KubeProxy = kubeproxy.IPTables }, "kube-proxy does not implement hostPort"},
		{"baseline", func(s *State) { s.Datapath = DatapathBaseline; s.KubeProxy = kubeproxy.None }, "kube-proxy does not implement hostPort"},
		{"no pod", func(s *State) { s.Pods = s.Pods[1:] }, "no pod declares a hostPort"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := extTestState(2)
			if tc.mut != nil {
				tc.mut(st)
			}
			if tc.name == "baseline" {
				// baseline pods are of the lab's datapath too
				for i := range st.Pods {
					st.Pods[i].Datapath = DatapathBaseline
				}
				tc.na = "nothing serves hostPorts"
			}
			na := hostPortNA(st)
			if (na == "") != (tc.na == "") || !strings.Contains(na, tc.na) {
				t.Errorf("hostPortNA = %q, want ~%q", na, tc.na)
			}
			for _, src := range []struct {
				name   string
				isNode bool
				want   int
			}{{"node1", true, 4}, {"node2", true, 2}, {"node2-pod1", false, 2}} {
				ts := hostPortServiceTargets(st, src.name, src.isNode)
				if tc.name == "no pod" {
					src.want = 2
				}
				if len(ts) != src.want {
					t.Errorf("from %s: %d targets, want %d: %v", src.name, len(ts), src.want, ts)
				}
				for _, x := range ts {
					if x.na != na {
						t.Errorf("target %v n/a %q, want %q", x.addr, x.na, na)
					}
				}
			}
		})
	}
}

// In DSR mode the remote-backend NodePort rows also require the client's
// own address at the backend; in SNAT mode they do not.
func TestPlanExternalProbesDSR(t *testing.T) {
	for _, mode := range []string{"snat", "dsr"} {
		st := extTestState(2)
		st.NodePortMode = mode
		n := 0
		for _, p := range planExternalProbes(st, "") {
			if p.Probe.Addr.Port() == DemoPinnedNodePort && p.Expect == ExpectClientIP {
				n++
				if !strings.Contains(p.Case, "node2") || !strings.Contains(p.Case, "DSR") {
					t.Errorf("%s: client-IP row %q", mode, p.Case)
				}
			}
		}
		if want := map[string]int{"snat": 0, "dsr": 4}[mode]; n != want {
			t.Errorf("%s: %d pinned NodePort probes expect the client IP, want %d", mode, n, want)
		}
	}
}

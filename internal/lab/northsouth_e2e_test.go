package lab_test

// North-south end-to-end tests: a lab with the axon north-south
// LB, probed from the external namespace: `axon lab check` (with its
// external part), loadBalancerSourceRanges, session affinity, and backend
// churn under a connect loop with zero failed connections. XDP: the same
// check with --lb-acceleration best-effort, recording where it attached.

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/bench/connrate"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/probe"
)

// waitLabSlot waits, when AXON_LAB_WAIT is set (a duration such as 10m),
// until no lab is up, so that a run on a shared machine takes the lab slot
// as soon as it frees instead of skipping; need() then decides as usual.
func waitLabSlot(t *testing.T) {
	t.Helper()
	d, err := time.ParseDuration(os.Getenv("AXON_LAB_WAIT"))
	if err != nil || d <= 0 {
		return
	}
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		_, err := os.Stat(filepath.Join(lab.DefaultStateDir, "lab.json"))
		ents, _ := filepath.Glob("/run/netns/" + lab.NetnsPrefix + "*")
		if err != nil && len(ents) == 0 {
			return
		}
	}
}

// nodePortLBStatus returns the nodeport_lb decision of every node's agent.
func nodePortLBStatus(t *testing.T, l *lab.Lab) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range l.Nodes() {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		s, err := api.NewClient(n.Socket).Status(ctx)
		cancel()
		if err != nil {
			t.Fatalf("status of %s: %v", n.Name, err)
		}
		for _, d := range s.Datapath {
			if d.Name == "nodeport_lb" {
				out[n.Name] = d.Value + " — " + d.Reason
			}
		}
	}
	return out
}

// externalCheck runs `axon lab check` and requires the external part to pass.
func externalCheck(t *testing.T) string {
	t.Helper()
	out := checkMatrix(t)
	if !strings.Contains(out, "external probes passed") || strings.Contains(out, "FAIL") {
		t.Fatalf("external check did not run or failed")
	}
	return out
}

// testService creates a Service and its IPv4+IPv6 EndpointSlices (the lab
// runs no controller-manager) with backends on port.
type testService struct {
	svc      *corev1.Service
	port     int32
	backends []lab.Pod
	states   map[string]string // pod → ready (default) | terminating
}

func (ts *testService) slices() []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: ts.svc.Name + "-" + strings.ToLower(string(fam)), Namespace: "default",
				Labels: map[string]string{discoveryv1.LabelServiceName: ts.svc.Name, discoveryv1.LabelManagedBy: "axon-test"}},
			AddressType: fam,
		}
		for _, p := range ts.svc.Spec.Ports {
			name, proto, port := p.Name, p.Protocol, ts.port
			s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
		}
		for _, b := range ts.backends {
			for _, ip := range b.IPs {
				if ip.Is4() != (fam == discoveryv1.AddressTypeIPv4) {
					continue
				}
				ready, serving, term := true, true, false
				if ts.states[b.Name] == "terminating" {
					ready, term = false, true
				}
				node := b.Node
				s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip.String()}, NodeName: &node,
					Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &term},
					TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: b.Namespace, Name: b.Name}})
			}
		}
		out = append(out, s)
	}
	return out
}

func (ts *testService) apply(t *testing.T, kube kubernetes.Interface) {
	t.Helper()
	ctx := t.Context()
	for _, s := range ts.slices() {
		cur, err := kube.DiscoveryV1().EndpointSlices("default").Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			if _, err := kube.DiscoveryV1().EndpointSlices("default").Create(ctx, s, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create EndpointSlice %s: %v", s.Name, err)
			}
			continue
		}
		s.ResourceVersion = cur.ResourceVersion
		if _, err := kube.DiscoveryV1().EndpointSlices("default").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update EndpointSlice %s: %v", s.Name, err)
		}
	}
}

func newTestService(name string, typ corev1.ServiceType, nodePort int32, protos ...corev1.Protocol) *corev1.Service {
	dual := corev1.IPFamilyPolicyRequireDualStack
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: typ, IPFamilyPolicy: &dual, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}}}
	for _, p := range protos {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: strings.ToLower(string(p)), Protocol: p, Port: 80,
			TargetPort: intstr.FromInt32(probe.PeerEchoPort), NodePort: nodePort})
	}
	return s
}

// xprobeUntil probes from the external namespace until pass(result) or timeout.
func xprobeUntil(t *testing.T, l *lab.Lab, spec string, probeTimeout, timeout time.Duration, pass func(probe.ExternalResult) bool) (probe.ExternalResult, bool) {
	t.Helper()
	p, err := probe.ParseExternal(spec)
	if err != nil {
		t.Fatal(err)
	}
	var last probe.ExternalResult
	for deadline := time.Now().Add(timeout); ; {
		rs, err := l.RunXProbesFromExternal(t.Context(), []probe.External{p}, probeTimeout)
		if err == nil && len(rs) == 1 {
			last = rs[0]
			if pass(last) {
				return last, true
			}
		}
		if time.Now().After(deadline) {
			return last, false
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func TestLabNorthSouth(t *testing.T) {
	waitLabSlot(t)
	need(t, "axon", "axon-agent", "axon-cni")
	l := up(t, "--nodes", "2", "--pods-per-node", "2")
	np := nodePortLBStatus(t, l)
	t.Logf("nodeport_lb: %v", np)
	for n, v := range np {
		if !strings.HasPrefix(v, "tc") && !strings.HasPrefix(v, "xdp") {
			t.Fatalf("north-south LB not attached on %s: %s", n, v)
		}
	}
	externalCheck(t)

	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var pods []string
	for _, p := range l.Pods() {
		pods = append(pods, p.Name)
	}
	stop, err := l.StartPeerEcho(ctx, pods)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	node1, node2 := l.Nodes()[0], l.Nodes()[1]

	// sourceRanges: a LoadBalancer IP routed via node1 whose source ranges
	// exclude the external client: no answer; then the client's address is
	// added: served.
	sourceRanges := func(t *testing.T, name string, lbIP netip.Addr, families []corev1.IPFamily, ranges []string, allow string) {
		if out, err := l.Command(ctx, lab.ExternalName, "ip", "route", "replace", lbIP.String()+"/32", "via", node1.IP.String()).CombinedOutput(); err != nil {
			t.Fatalf("route in external: %v: %s", err, out)
		}
		svc := newTestService(name, corev1.ServiceTypeLoadBalancer, 0, corev1.ProtocolTCP, corev1.ProtocolUDP)
		svc.Spec.IPFamilies = families
		if len(families) == 1 {
			single := corev1.IPFamilyPolicySingleStack
			svc.Spec.IPFamilyPolicy = &single
		}
		no := false
		svc.Spec.AllocateLoadBalancerNodePorts = &no
		svc.Spec.LoadBalancerSourceRanges = ranges
		created, err := kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP.String()}}
		if created, err = kube.CoreV1().Services("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		ts := &testService{svc: created, port: probe.PeerEchoPort, backends: l.Pods()}
		ts.apply(t, kube)
		// the agent's acknowledgement that the north-south LB holds this
		// version of the Service, ranges included; then silence must come
		// with the LB's own source-range drop, not from an LB not yet written
		waitProgrammed(t, l, node1.Name, name)
		for _, proto := range []string{"tcp", "udp"} {
			before := npPinnedCounters(t, node1.PinDir)
			r, _ := xprobeUntil(t, l, proto+"/"+lbIP.String()+":80", time.Second, 0, func(r probe.ExternalResult) bool { return !r.OK })
			if r.OK {
				t.Errorf("%s: a client outside loadBalancerSourceRanges %v was served: %+v", proto, ranges, r)
			}
			after := npPinnedCounters(t, node1.PinDir)
			drops := npMoved(before, after, "tc")["drop_src_range"] + npMoved(before, after, "xdp")["drop_src_range"]
			if drops == 0 {
				t.Errorf("%s: the client outside %v got no answer, but %s's LB dropped nothing for its source range (tc %v, xdp %v): the silence is not the LB's", proto, ranges, node1.Name, npMoved(before, after, "tc"), npMoved(before, after, "xdp"))
			} else {
				t.Logf("%s: not served (%s); drop_src_range +%d on %s", proto, r.Err, drops, node1.Name)
			}
		}
		created.Spec.LoadBalancerSourceRanges = append(created.Spec.LoadBalancerSourceRanges, allow)
		if _, err := kube.CoreV1().Services("default").Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitProgrammed(t, l, node1.Name, name)
		for _, proto := range []string{"tcp", "udp"} {
			if r, ok := xprobeUntil(t, l, proto+"/"+lbIP.String()+":80", 2*time.Second, 20*time.Second, func(r probe.ExternalResult) bool { return r.OK }); !ok {
				t.Errorf("%s: the client inside loadBalancerSourceRanges is not served: %+v", proto, r)
			}
		}
	}
	t.Run("SourceRanges", func(t *testing.T) {
		sourceRanges(t, "ns-ranges", netip.MustParseAddr("198.18.0.202"), []corev1.IPFamily{corev1.IPv4Protocol},
			[]string{"203.0.113.0/24"}, "198.18.0.250/32")
	})
	t.Run("SourceRangesDualStack", func(t *testing.T) {
		// Kubernetes keeps both families' ranges in one list; each family's
		// frontends must get the ranges of their family.
		sourceRanges(t, "ns-ranges-dual", netip.MustParseAddr("198.18.0.203"), []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			[]string{"203.0.113.0/24", "2001:db8::/32"}, "198.18.0.250/32")
	})

	t.Run("SessionAffinity", func(t *testing.T) {
		svc := newTestService("ns-affinity", corev1.ServiceTypeNodePort, 30084, corev1.ProtocolTCP)
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		created, err := kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ts := &testService{svc: created, port: probe.PeerEchoPort, backends: l.Pods()}
		ts.apply(t, kube)
		for _, entry := range []lab.Node{node1, node2} {
			spec := "tcp/" + netip.AddrPortFrom(entry.IP, 30084).String()
			if r, ok := xprobeUntil(t, l, spec, 2*time.Second, 20*time.Second, func(r probe.ExternalResult) bool { return r.OK }); !ok {
				t.Fatalf("%s never answered: %+v", spec, r)
			}
			p, _ := probe.ParseExternal(spec)
			var probes []probe.External
			for range 20 {
				probes = append(probes, p)
			}
			seen := map[string]int{}
			for range 2 { // two rounds of 20 concurrent connections from one client address
				rs, err := l.RunXProbesFromExternal(ctx, probes, 3*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rs {
					if !r.OK {
						t.Errorf("%s: %s", spec, r.Err)
						continue
					}
					host, _, _ := strings.Cut(r.Server, "]:")
					seen[strings.TrimPrefix(host, "[")]++
				}
			}
			if len(seen) != 1 {
				t.Errorf("sessionAffinity ClientIP via %s: 40 connections reached %d backends: %v", entry.Name, len(seen), seen)
			} else {
				t.Logf("affinity via %s: all 40 connections on %v", entry.Name, seen)
			}
		}
	})

	t.Run("ChurnUnderLoad", func(t *testing.T) {
		// Connect loop from outside to node2's NodePort while the backends
		// change: a new ready one, an old one terminating, then removed.
		all := l.Pods()
		byName := map[string]lab.Pod{}
		for _, p := range all {
			byName[p.Name] = p
		}
		self := filepath.Join(binDir, "axon")
		const port = 7001
		for _, p := range all {
			cmd := l.Command(ctx, p.Name, self, "lab", "bench", "_connrate", "serve", "--listen", netip.AddrPortFrom(p.IP, port).String())
			// No async preemption signals in the server either: its
			// read(2) of the request, interrupted (EINTR), made it close
			// the socket with the request unread, which the kernel
			// answers with a reset (TcpExt TCPAbortOnData on the
			// backend): 2 of 56 621 connections, a server artefact.
			cmd.Env = append(os.Environ(), "GODEBUG=asyncpreemptoff=1")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		}
		svc := newTestService("ns-churn", corev1.ServiceTypeNodePort, 30085, corev1.ProtocolTCP)
		created, err := kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ts := &testService{svc: created, port: port, states: map[string]string{},
			backends: []lab.Pod{byName["node1-pod1"], byName["node2-pod1"]}}
		ts.apply(t, kube)
		target := netip.AddrPortFrom(node2.IP, 30085).String()
		deadline := time.Now().Add(30 * time.Second)
		for {
			out, _ := l.Command(ctx, lab.ExternalName, self, "lab", "bench", "_connrate", "client", "--target", target, "--duration", "300ms").Output()
			if r, err := connrate.Parse(out); err == nil && r.Conns > 0 && r.Errors == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("NodePort %s never answered", target)
			}
			time.Sleep(300 * time.Millisecond)
		}
		// evidence around each loop: TcpExt counters of the backend pods
		// (resets on close with unread data, TIME_WAIT handling, listen
		// overflows) and node2's LB counters
		nstat := func() map[string]int64 {
			sum := map[string]int64{}
			for _, p := range all {
				out, err := l.Command(ctx, p.Name, "cat", "/proc/net/netstat").Output()
				if err != nil {
					continue
				}
				for k, v := range parseTcpExt(string(out)) {
					sum[k] += v
				}
			}
			return sum
		}
		evidence := func(what string, before map[string]int64) {
			after := nstat()
			var parts []string
			for _, k := range []string{"TCPAbortOnData", "TCPAbortOnClose", "TWRecycled", "PAWSEstabRejected", "TCPChallengeACK", "ListenOverflows", "ListenDrops", "SyncookiesSent", "SyncookiesFailed"} {
				parts = append(parts, fmt.Sprintf("%s +%d", k, after[k]-before[k]))
			}
			t.Logf("%s: backend pods TcpExt: %s", what, strings.Join(parts, ", "))
			if out, err := l.Command(ctx, node2.Name, self, "bpf", "nat", "list", "--node", node2.Name).Output(); err == nil {
				t.Logf("%s: node2 axon_np_nat holds %d entries", what, strings.Count(string(out), "\n")-1)
			}
		}
		// The same loop without changes first: failures here are not churn's.
		nst0 := nstat()
		steady := l.Command(ctx, lab.ExternalName, self, "lab", "bench", "_connrate", "client", "--target", target, "--duration", "12s")
		steady.Env = append(os.Environ(), "GODEBUG=asyncpreemptoff=1")
		if sout, err := steady.Output(); err != nil {
			t.Fatalf("steady connect loop: %v", err)
		} else if r, err := connrate.Parse(sout); err != nil {
			t.Fatal(err)
		} else {
			t.Logf("connect loop through %s, backends unchanged: %d connections (%.0f/s), %d failed (first: %s)", target, r.Conns, r.Rate, r.Errors, r.FirstError)
			if r.Errors != 0 {
				t.Errorf("connect loop without churn: %d of %d connections failed (first: %s)", r.Errors, r.Conns+r.Errors, r.FirstError)
			}
		}
		evidence("steady loop", nst0)
		nst1 := nstat()
		loop := l.Command(ctx, lab.ExternalName, self, "lab", "bench", "_connrate", "client", "--target", target, "--duration", "12s")
		// No async preemption signals: a signal landing in a blocking
		// connect(2) makes it fail with EINTR, a client artefact.
		loop.Env = append(os.Environ(), "GODEBUG=asyncpreemptoff=1")
		var out strings.Builder
		loop.Stdout = &out
		if err := loop.Start(); err != nil {
			t.Fatal(err)
		}
		steps := []struct {
			at   time.Duration
			what string
			do   func()
		}{
			{2 * time.Second, "node2-pod2 added (ready)", func() { ts.backends = append(ts.backends, byName["node2-pod2"]) }},
			{4 * time.Second, "node1-pod1 terminating", func() { ts.states["node1-pod1"] = "terminating" }},
			{7 * time.Second, "node1-pod1 removed", func() { ts.backends = []lab.Pod{byName["node2-pod1"], byName["node2-pod2"]} }},
			{9 * time.Second, "node1-pod2 added, node2-pod1 terminating", func() {
				ts.backends = append(ts.backends, byName["node1-pod2"])
				ts.states["node2-pod1"] = "terminating"
			}},
		}
		t0 := time.Now()
		for _, s := range steps {
			time.Sleep(time.Until(t0.Add(s.at)))
			s.do()
			ts.apply(t, kube)
			t.Logf("%5.1fs %s", time.Since(t0).Seconds(), s.what)
		}
		if err := loop.Wait(); err != nil {
			t.Fatalf("connect loop: %v", err)
		}
		r, err := connrate.Parse([]byte(out.String()))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("connect loop through %s during churn: %d connections (%.0f/s), %d failed (first: %s)", target, r.Conns, r.Rate, r.Errors, r.FirstError)
		evidence("churn loop", nst1)
		if r.Conns == 0 || r.Errors != 0 {
			t.Errorf("backend churn under load: %d connections, %d failed (first: %s); want zero failures", r.Conns, r.Errors, r.FirstError)
		}
	})
}

// waitProgrammed waits until node's agent acknowledges (GET /v1/services,
// Programmed) that the writer including the north-south LB holds the
// current versions of Service default/name and of its EndpointSlices, as
// the apiserver has them now.
func waitProgrammed(t *testing.T, l *lab.Lab, node, name string) {
	t.Helper()
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	svc, err := kube.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get service %s: %v", name, err)
	}
	sl, err := kube.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		t.Fatalf("list EndpointSlices of %s: %v", name, err)
	}
	want := api.ServiceVersions{Service: svc.ResourceVersion, Slices: map[string]string{}}
	for _, s := range sl.Items {
		want.Slices[s.Name] = s.ResourceVersion
	}
	c, err := l.Agent(node)
	if err != nil {
		t.Fatal(err)
	}
	var last api.ServicesReply
	t0 := time.Now()
	for deadline := t0.Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if last, err = c.Services(ctx); err == nil && last.NorthSouth && reflect.DeepEqual(last.Programmed["default/"+name], want) {
			t.Logf("%s acknowledged default/%s %+v as programmed %s after the last change", node, name, want, time.Since(t0).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent of %s never acknowledged default/%s at %+v (north-south writer %v, acknowledged %+v, write errors %v, error %v)",
				node, name, want, last.NorthSouth, last.Programmed["default/"+name], last.WriteErrors, err)
		}
	}
}

// waitFrontend waits until node's agent has a frontend in its BPF maps.
func waitFrontend(t *testing.T, l *lab.Lab, node, frontend string) {
	t.Helper()
	c, err := l.Agent(node)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		mr, err := c.LBMaps(t.Context())
		if err == nil && strings.Contains(mr.Text, frontend) {
			time.Sleep(300 * time.Millisecond) // the north-south LB is written right after
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent of %s never programmed %s (last error %v)", node, frontend, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestLabNorthSouthXDP brings the lab up with --lb-acceleration best-effort
// and runs the external check. Where the kernel's veth driver runs XDP
// natively (probed; the only reason to skip), every node must have attached
// axon_lb_xdp in driver mode (netlink says so, not only the agent) and the
// XDP program itself must have translated the check's connections (its
// counters moved): a fallback to tc fails the test instead of passing there.
func TestLabNorthSouthXDP(t *testing.T) {
	waitLabSlot(t)
	need(t, "axon", "axon-agent", "axon-cni")
	l := up(t, "--nodes", "2", "--pods-per-node", "2", "--lb-acceleration", "best-effort")
	for n, v := range nodePortLBStatus(t, l) {
		t.Logf("%s nodeport_lb: %s", n, v)
	}
	requireNativeXDP(t, l)
	before := npCounters(t, l)
	out := externalCheck(t)
	requireXDPTranslated(t, l, before)
	t.Logf("%s", lastLine(out))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// parseTcpExt returns the TcpExt counters of a /proc/net/netstat text.
func parseTcpExt(text string) map[string]int64 {
	out := map[string]int64{}
	lines := strings.Split(text, "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		h, v := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(h) != len(v) || len(h) == 0 || h[0] != "TcpExt:" {
			continue
		}
		for j := 1; j < len(h); j++ {
			n, err := strconv.ParseInt(v[j], 10, 64)
			if err == nil {
				out[h[j]] = n
			}
		}
	}
	return out
}

package agent

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/sockmap"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// Ports of the sockmap tests' control plane.
const (
	smTestAPIPort  = 16733
	smTestEtcdPort = 12669
)

// TestSockmapAgainstKernelAndAPIServer: two pods of one node (network
// namespaces joined by a veth pair, their processes in a scratch cgroup the
// real programs are attached to) are admitted from their Pod objects (real
// kube-apiserver); their connection is bypassed (both ends in the SOCKHASH,
// the bytes echoed intact, the redirected bytes counted). Annotating one
// pod "disabled" takes it out: its next connection takes the stack (counted
// not admitted, absent from the SOCKHASH) while the open one keeps flowing
// through the bypass. A pod with a bandwidth limit is never admitted; an
// invalid value gets an Event and changes nothing.
func TestSockmapAgainstKernelAndAPIServer(t *testing.T) {
	// pods a and b talk; c has an egress limit
	f := newSockmapPodPair(t, "axt-sm-", smTestAPIPort, smTestEtcdPort, "10.244.1.0/24", "10.244.1.10", "10.244.1.11")
	cgroup, cgroupFD, pinDir, cp, cs, ctx := f.cgroup, f.cgroupFD, f.pinDir, f.cp, f.cs, t.Context()
	nsA, nsB, nsC := f.nsA, f.nsB, testutil.NewNetns(t, "axt-sm-c-")
	ipA, ipB, ipC := f.ipA, f.ipB, netip.MustParseAddr("10.244.1.12")

	log := testLogger(t)
	reg, err := openRegistry(t.TempDir(), log)
	must(t, err)
	for i, p := range []struct {
		name, netns string
		ip          netip.Addr
		ann         map[string]string
	}{
		{"a", nsA, ipA, nil},
		{"b", nsB, ipB, nil},
		{"c", nsC, ipC, map[string]string{"kubernetes.io/egress-bandwidth": "10M"}},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: p.name, Annotations: p.ann},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		_, err := cs.CoreV1().Pods("apps").Create(ctx, pod, metav1.CreateOptions{})
		must(t, err)
		must(t, reg.Put(api.Endpoint{ContainerID: fmt.Sprintf("ctr%d", i), IfName: "eth0", Netns: netnsutil.Path(p.netns),
			PodName: p.name, PodNamespace: "apps", IPs: []netip.Addr{p.ip}, HostIfName: fmt.Sprintf("lxc%d", i),
			PodMAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(i)}}))
	}

	k, svc := runKubeAndServices(t, cp, log)

	cfg := Config{NodeName: "node1", BPFRoot: pinDir, CgroupRoot: cgroup, Sockmap: SockmapEnabled}
	s := newSockBypass(cfg, log, reg, func() *kube { return k })
	s.load = loadSockmapFunc(cfg, unguardedWhereNeeded(t), log)
	s.svc = svc
	// The kernel self-test has its own tests (internal/datapath/sockmap).
	// Here its verdict is the real one except for the splice check: on a
	// kernel without BPF trampolines (this host) the splice guard cannot
	// load and the self-test's splice check fails, which keeps the bypass
	// off in the product; the agent's wiring is still tested here, with the
	// verdict the self-test found for FIONREAD (the stream verdict).
	s.selfTest = func(ctx context.Context) sockmap.Result {
		res := sockmap.SelfTest(ctx)
		for _, c := range res.Checks {
			if !c.OK && c.Name != "splice" {
				t.Fatalf("the kernel self-test failed %s: %s", c.Name, c.Detail)
			}
		}
		res.OK, res.Reason = true, ""
		return res
	}
	t.Cleanup(s.close)

	admitted := func(what string, want ...netip.Addr) {
		t.Helper()
		slices.SortFunc(want, netip.Addr.Compare)
		eventually(t, what, 20*time.Second, func() error {
			s.ensure(ctx)
			st := s.status()
			if !st.Enabled {
				return fmt.Errorf("bypass off: %s", st.Reason)
			}
			pods, err := s.bp.Pods()
			if err != nil {
				return err
			}
			var got []netip.Addr
			for ip := range pods {
				got = append(got, ip)
			}
			slices.SortFunc(got, netip.Addr.Compare)
			if !slices.Equal(got, want) {
				return fmt.Errorf("admitted pod addresses %v, want %v", got, want)
			}
			return nil
		})
	}
	admitted("pods a and b admitted, c (egress limit) not", ipA, ipB)
	st := s.status()
	if st.PodsAdmitted != 2 || len(st.NotAdmitted) != 1 || !strings.Contains(st.NotAdmitted[0], "apps/c: bandwidth limit (kubernetes.io/egress-bandwidth)") {
		t.Errorf("status %+v: want 2 pods admitted and apps/c not, for its bandwidth limit", st)
	}
	netns, err := s.bp.Netns()
	must(t, err)
	if len(netns) != 2 {
		t.Errorf("admitted netns %v, want the two of pods a and b", netns)
	}

	peers := startPeers(t, peersConfig{ServerNetns: netnsutil.Path(nsB), Listen: "10.244.1.11:7000",
		ClientNetns: netnsutil.Path(nsA), Loopback: "127.0.0.1:7001"}, cgroupFD)
	m0 := sockmapCounters(t, s)
	c1, local1, remote1 := peers.dial("pod")
	peers.echo(c1, 256<<10)
	conn1 := connKeys(local1, remote1)
	requireConns(t, s, conn1, true)
	m1 := sockmapCounters(t, s)
	if d := m1[counterRedirectedBytes] - m0[counterRedirectedBytes]; d < 2*(256<<10) {
		t.Errorf("redirected bytes moved by %d, want at least %d (the 256 KiB both ways)", d, 2*(256<<10))
	}
	if d := m1["backpressure"] - m0["backpressure"]; d != 0 {
		t.Errorf("back-pressure moved %d sockets to the stack: the echo checks are meant to stay under it", d)
	}
	if d := m1[counterAdmittedPod] - m0[counterAdmittedPod]; d != 2 {
		t.Errorf("admitted pod-to-pod sockets moved by %d, want 2 (both ends)", d)
	}
	requireSockmapMetrics(t, s, m1, 2)
	if d := s.decision(s.status()); d.Value != "enabled" || !strings.Contains(d.Reason, "2 pods admitted, 2 sockets bypassed") ||
		!strings.Contains(d.Reason, "not admitted: apps/c: bandwidth limit") {
		t.Errorf("status line %+v: want enabled, 2 pods, 2 sockets, and apps/c not admitted for its bandwidth limit", d)
	}
	rep, err := s.conns()
	must(t, err)
	if !hasConnRow(rep, local1, remote1, "apps/a", "apps/b") || !hasConnRow(rep, remote1, local1, "apps/b", "apps/a") {
		t.Errorf("axon bpf sockmap list rows %+v: want both ends of %s -> %s with their pods", rep.Conns, local1, remote1)
	}
	// each end wrote the 256 KiB once, all of it into its peer
	ends := 0
	for _, c := range rep.Conns {
		if c.Local.String() != local1 && c.Local.String() != remote1 {
			continue
		}
		ends++
		if c.Mode != "bypass" || c.RedirectedBytes != 256<<10 || c.PassedBytes != 0 {
			t.Errorf("row %+v: want mode bypass, %d bytes redirected, none through TCP", c, 256<<10)
		}
	}
	if ends != 2 {
		t.Errorf("%d rows for the ends of %s -> %s, want 2: %+v", ends, local1, remote1, rep.Conns)
	}

	// loopback inside pod a (app <-> sidecar): admitted by its netns
	cookieA, err := netnsutil.Cookie(netnsutil.Path(nsA))
	must(t, err)
	cl, localL, remoteL := peers.dial("loop")
	peers.echo(cl, 64<<10)
	requireConns(t, s, connKeys(localL, remoteL), true)
	ml := sockmapCounters(t, s)
	if d := ml[counterAdmittedLoopback] - m1[counterAdmittedLoopback]; d != 2 {
		t.Errorf("admitted loopback sockets moved by %d, want 2 (both ends)", d)
	}
	if d := ml[counterRedirectedBytes] - m1[counterRedirectedBytes]; d < 2*(64<<10) {
		t.Errorf("loopback: redirected bytes moved by %d, want at least %d", d, 2*(64<<10))
	}
	rep, err = s.conns()
	must(t, err)
	if i := slices.IndexFunc(rep.Conns, func(c api.SockmapConn) bool { return c.Local.String() == localL }); !hasConnRow(rep, localL, remoteL, "apps/a", "apps/a") || rep.Conns[i].Netns != cookieA {
		t.Errorf("axon bpf sockmap list rows %+v: want %s -> %s in pod a's netns %d", rep.Conns, localL, remoteL, cookieA)
	}
	m1 = ml

	// take pod a out: the next connection takes the stack, the open one flows
	patchAnnotation(t, cs, k, "apps", "a", AnnotationSockmap, SockmapDisabled)
	admitted("pod a opted out", ipB)
	c2, local2, remote2 := peers.dial("pod")
	peers.echo(c2, 256<<10)
	requireConns(t, s, connKeys(local2, remote2), false)
	cl2, localL2, remoteL2 := peers.dial("loop")
	peers.echo(cl2, 64<<10)
	requireConns(t, s, connKeys(localL2, remoteL2), false)
	m2 := sockmapCounters(t, s)
	if d := m2[counterNotAdmitted] - m1[counterNotAdmitted]; d < 2 {
		t.Errorf("not-admitted sockets moved by %d, want at least 2 (both ends of the new connection)", d)
	}
	if d := m2[counterLoopbackNotEnabled] - m1[counterLoopbackNotEnabled]; d != 2 {
		t.Errorf("loopback sockets of a netns not admitted moved by %d, want 2 (both ends of the new loopback connection)", d)
	}
	if d := m2[counterRedirectedBytes] - m1[counterRedirectedBytes]; d != 0 {
		t.Errorf("redirected bytes moved by %d while only the stack connection carried data", d)
	}
	peers.echo(c1, 256<<10)
	peers.echo(cl, 64<<10)
	requireConns(t, s, conn1, true)
	requireConns(t, s, connKeys(localL, remoteL), true)
	m3 := sockmapCounters(t, s)
	if d := m3[counterRedirectedBytes] - m2[counterRedirectedBytes]; d < 2*(256<<10)+2*(64<<10) {
		t.Errorf("the connections opened before the opt-out: redirected bytes moved by %d, want at least %d (they stay bypassed)", d, 2*(256<<10)+2*(64<<10))
	}
	if st := s.status(); !strings.Contains(strings.Join(st.NotAdmitted, "\n"), "apps/a: pod annotation axon.io/sockmap=disabled") {
		t.Errorf("status does not say why apps/a is out: %v", st.NotAdmitted)
	}

	// an invalid value on pod b: an Event, b stays admitted
	patchAnnotation(t, cs, k, "apps", "b", AnnotationSockmap, "sometimes")
	s.ensure(ctx)
	if msg := waitEvent(t, cs, "apps", "Pod", "b", ReasonInvalidAnnotation); !strings.Contains(msg, `"sometimes"`) || !strings.Contains(msg, "changes nothing") {
		t.Errorf("event %q does not name the bad value and what happens", msg)
	}
	admitted("pod b keeps its decision", ipB)
}

// Counter names of the bypass programs (the C enum, read through BTF).
const (
	counterAdmittedPod        = "admit_pod"
	counterAdmittedLoopback   = "admit_loopback"
	counterNotAdmitted        = "skip_not_pod"
	counterLoopbackNotEnabled = "skip_not_enabled"
	counterRedirectedBytes    = "redirect_bytes"
)

func sockmapCounters(t *testing.T, s *sockBypass) map[string]uint64 {
	t.Helper()
	m, err := s.bp.Metrics()
	must(t, err)
	for _, n := range []string{counterAdmittedPod, counterAdmittedLoopback, counterNotAdmitted, counterLoopbackNotEnabled, counterRedirectedBytes} {
		if _, ok := m[n]; !ok {
			t.Fatalf("the bypass has no counter %q: %v", n, m)
		}
	}
	return m
}

// connKeys are the two SOCKHASH entries of a connection (one per end).
func connKeys(local, remote string) [2][2]netip.AddrPort {
	l, r := netip.MustParseAddrPort(local), netip.MustParseAddrPort(remote)
	return [2][2]netip.AddrPort{{l, r}, {r, l}}
}

// requireConns checks that both ends of a connection are (or are not) in
// the SOCKHASH.
func requireConns(t *testing.T, s *sockBypass, keys [2][2]netip.AddrPort, in bool) {
	t.Helper()
	conns, err := s.bp.Conns()
	must(t, err)
	for _, k := range keys {
		found := false
		for _, c := range conns {
			if unmapAddrPort(c.Local) == k[0] && unmapAddrPort(c.Remote) == k[1] {
				found = true
			}
		}
		if found != in {
			t.Errorf("socket %s -> %s in the SOCKHASH: %v, want %v (entries: %v)", k[0], k[1], found, in, conns)
		}
	}
}

func hasConnRow(rep api.SockmapReply, local, remote, localPod, remotePod string) bool {
	for _, c := range rep.Conns {
		if c.Local.String() == local && c.Remote.String() == remote && c.LocalPod == localPod && c.RemotePod == remotePod {
			return true
		}
	}
	return false
}

// patchAnnotation sets (value != "") or removes an annotation on a Pod and
// waits until the agent's cache has it (a step whose expected state equals
// the previous one must not pass on stale data).
func patchAnnotation(t *testing.T, cs kubernetes.Interface, k *kube, ns, name, key, value string) {
	t.Helper()
	v := "null"
	if value != "" {
		v = `"` + value + `"`
	}
	body := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, key, v))
	_, err := cs.CoreV1().Pods(ns).Patch(t.Context(), name, types.MergePatchType, body, metav1.PatchOptions{})
	must(t, err)
	eventually(t, "pod "+name+" in the agent's cache", 10*time.Second, func() error {
		p, err := k.pods.Pods(ns).Get(name)
		if err != nil {
			return err
		}
		if got := p.Annotations[key]; got != value {
			return fmt.Errorf("annotation %q, want %q", got, value)
		}
		return nil
	})
}

// requireSockmapMetrics checks /metrics against the counters read
// directly: every counter exported as axon_sockmap_<name>_total with its
// own HELP, and the gauges.
func requireSockmapMetrics(t *testing.T, s *sockBypass, want map[string]uint64, sockets int) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(sockmapCollector{s: s})
	fams, err := reg.Gather()
	must(t, err)
	got := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		got[f.GetName()] = f
	}
	for name, v := range want {
		f := got["axon_sockmap_"+name+"_total"]
		if f == nil {
			t.Errorf("no metric axon_sockmap_%s_total (have %v)", name, slices.Collect(maps.Keys(got)))
			continue
		}
		if strings.HasPrefix(f.GetHelp(), "Counter ") {
			t.Errorf("axon_sockmap_%s_total has the generic HELP %q", name, f.GetHelp())
		}
		// counters only grow: the scrape is at least what was read before it
		if g := f.GetMetric()[0].GetCounter().GetValue(); g < float64(v) {
			t.Errorf("axon_sockmap_%s_total = %v, below the %d read before", name, g, v)
		}
	}
	for name, v := range map[string]float64{"axon_sockmap_enabled": 1, "axon_sockmap_pods_admitted": 2, "axon_sockmap_sockets": float64(sockets), "axon_sockmap_metrics_read_errors": 0} {
		if f := got[name]; f == nil || f.GetMetric()[0].GetGauge().GetValue() != v {
			t.Errorf("%s = %v, want %v", name, f, v)
		}
	}
}

// TestSockmapOffWithdrawsPreviousRun: an agent that starts with the bypass
// off (--sockmap=disabled, or a kernel that does not pass the self-test)
// where a previous run left it pinned withdraws the admitted pods and netns,
// so new connections take the stack, and keeps the SOCKHASH pinned (its
// sockets' queued bytes are not dropped).
func TestSockmapOffWithdrawsPreviousRun(t *testing.T) {
	testutil.RequireRoot(t, "loads BPF programs and creates cgroups")
	for _, tt := range []struct {
		name     string
		flag     string
		selfTest string // "" = passes
		want     string // in the status reason
	}{
		{"flag disabled", SockmapDisabled, "", "--sockmap=disabled; 1 pod addresses of a previous run withdrawn"},
		{"self-test does not pass", SockmapEnabled, "no splice guard", "did not pass, every connection takes the TCP/IP stack: no splice guard; 1 pod addresses of a previous run withdrawn"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cgroup, _ := testutil.NewCgroup(t, "axt-sockmap-")
			pinDir := dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, sockmap.Uninstall)
			log := testLogger(t)
			cfg := Config{BPFRoot: pinDir, CgroupRoot: cgroup, Sockmap: tt.flag}
			prev, _, err := loadSockmapFunc(cfg, unguardedWhereNeeded(t), log)(false)
			must(t, err)
			must(t, prev.SetPod(netip.MustParseAddr("10.244.1.10"), 4242))
			must(t, prev.SetNetns(4242))
			must(t, prev.Close())

			s := newSockBypass(cfg, log, nil, func() *kube { return nil })
			s.load = loadSockmapFunc(cfg, unguardedWhereNeeded(t), log)
			loads := 0
			load := s.load
			s.load = func(v bool) (bypassMaps, string, error) { loads++; return load(v) }
			s.selfTest = func(context.Context) sockmap.Result {
				return sockmap.Result{OK: tt.selfTest == "", Reason: tt.selfTest}
			}
			s.ensure(t.Context())
			s.ensure(t.Context()) // once is enough
			if loads != 1 {
				t.Errorf("the previous run's bypass was opened %d times, want once", loads)
			}
			if st := s.status(); st.Enabled || !strings.Contains(st.Reason, tt.want) {
				t.Errorf("status %+v, want off with %q", st, tt.want)
			}
			check, err := sockmap.Load(pinDir, cgroup, unguardedWhereNeeded(t), log)
			must(t, err)
			defer check.Close()
			pods, err := check.Pods()
			must(t, err)
			netns, err := check.Netns()
			must(t, err)
			if len(pods) != 0 || len(netns) != 0 {
				t.Errorf("after the start with the bypass off: pods %v, netns %v; want none admitted", pods, netns)
			}
			if _, err := os.Stat(filepath.Join(pinDir, sockmap.MapSockHash)); err != nil {
				t.Errorf("the SOCKHASH pin is gone (its sockets' queued bytes would be dropped): %v", err)
			}
		})
	}
}

// unguardedWhereNeeded is the load configuration of these tests of the
// agent's wiring: the product's (the splice guard on) where the kernel can
// run the guard, and without the guard where it cannot (no BPF trampolines,
// as on a Firecracker kernel), saying so in the log. The guard itself is
// tested in internal/datapath/sockmap (in the Debian VMs of the kernel
// matrix); the agent refusing to turn on without it in
// TestSockmapOffWithoutSpliceGuard.
func unguardedWhereNeeded(t *testing.T) sockmap.Config {
	t.Helper()
	if c := datapath.ProbeFeature("splice_guard"); !c.Available {
		t.Logf("loading without the splice guard: %s", c.Reason)
		return sockmap.Config{NoSpliceGuard: true}
	}
	return sockmap.Config{}
}

// The agent's own loader never turns the bypass on without the splice
// guard: where the kernel can run the guard, the bypass loads with its link
// pinned; where it cannot, the feature stays off and says why. The self-test
// is let through here so that the load decides.
func TestSockmapSpliceGuardGate(t *testing.T) {
	dptest.RequireRoot(t)
	cgroup, _ := testutil.NewCgroup(t, "axt-sockmap-")
	pinDir := dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, sockmap.Uninstall)
	cfg := Config{BPFRoot: pinDir, CgroupRoot: cgroup, Sockmap: SockmapEnabled}
	s := newSockBypass(cfg, testLogger(t), nil, func() *kube { return nil })
	s.selfTest = func(context.Context) sockmap.Result { return sockmap.Result{OK: true} }
	t.Cleanup(s.close)
	s.ensure(t.Context())
	bp, off, _, _, _, _ := s.state()
	guardPin := filepath.Join(datapath.LinksDir(pinDir), sockmap.SplicePin)
	if c := datapath.ProbeFeature("splice_guard"); c.Available {
		if bp == nil || off != "" {
			t.Fatalf("the kernel can run the splice guard, but the bypass is off: %s", off)
		}
		if _, err := os.Stat(guardPin); err != nil {
			t.Errorf("the bypass is on without its splice guard pin: %v", err)
		}
		return
	} else {
		t.Logf("splice_guard probe: %s", c.Reason)
	}
	if bp != nil {
		t.Fatal("the bypass turned on where the kernel cannot run the splice guard")
	}
	if !strings.Contains(off, "splice guard") {
		t.Errorf("off reason %q does not name the splice guard", off)
	}
	if _, err := os.Stat(filepath.Join(pinDir, sockmap.MapSockHash)); err == nil {
		t.Errorf("the SOCKHASH was pinned although the bypass did not load")
	}
	if _, err := os.Stat(guardPin); err == nil {
		t.Errorf("a splice guard pin exists on a kernel that cannot run it")
	}
}

// sockmapPodPair is the setup of the agent's bypass tests: a scratch cgroup
// and pin dir, a control plane with node1 and Namespace apps, and two pod
// network namespaces joined by a veth pair (eth0 in both) with addresses
// ipA and ipB of cidr.
type sockmapPodPair struct {
	cgroup   string
	cgroupFD int
	pinDir   string
	cp       *controlplane.ControlPlane
	cs       kubernetes.Interface
	nsA, nsB string
	ipA, ipB netip.Addr
}

func newSockmapPodPair(t *testing.T, prefix string, apiPort, etcdPort int, cidr, ipA, ipB string) sockmapPodPair {
	t.Helper()
	testutil.RequireRoot(t, "loads BPF programs, creates network namespaces and cgroups")
	f := sockmapPodPair{ipA: netip.MustParseAddr(ipA), ipB: netip.MustParseAddr(ipB)}
	f.cgroup, f.cgroupFD = testutil.NewCgroup(t, prefix)
	f.pinDir = dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, sockmap.Uninstall)
	f.cp = startControlPlaneOn(t, apiPort, etcdPort)
	cs, err := f.cp.Client()
	must(t, err)
	f.cs = cs
	createNode(t, cs, node("node1", []string{"198.18.0.11"}, cidr))
	_, err = cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}}, metav1.CreateOptions{})
	must(t, err)
	f.nsA, f.nsB = testutil.NewNetns(t, prefix+"a-"), testutil.NewNetns(t, prefix+"b-")
	a := dptest.NSConf(t, f.nsA)
	a.Veth("eth0", "", "eth0b", "", f.nsB)
	b := dptest.NSConf(t, f.nsB)
	if err := b.H.LinkSetName(b.Link("eth0b"), "eth0"); err != nil {
		t.Fatal(err)
	}
	bits := netip.MustParsePrefix(cidr).Bits()
	a.Addr("eth0", netip.PrefixFrom(f.ipA, bits).String())
	b.Addr("eth0", netip.PrefixFrom(f.ipB, bits).String())
	a.Up("eth0")
	b.Up("eth0")
	return f
}

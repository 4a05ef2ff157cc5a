package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/sockmap"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// Ports of the bypass-only test's control plane.
const (
	smOnlyTestAPIPort  = 16753
	smOnlyTestEtcdPort = 12689
)

// TestSockmapBypassOnly: --mode=bypass-only on a node whose pods axon does
// not network. Two pods' network namespaces are joined by a plain veth pair
// (no axon-cni: the endpoint registry stays empty); the agent learns the
// pods from their Pod objects' status.podIPs (real kube-apiserver) and
// finds each pod's netns by walking the node's namespaces (/proc and
// /run/netns) for the one that holds the address. Their connection is
// bypassed (both ends in the SOCKHASH, bytes echoed intact, redirected
// bytes counted). A third namespace that configures pod a's address (an
// impostor) takes pod a out (status, Event, and the next connection takes
// the stack: counted not admitted, absent from the SOCKHASH); when the
// impostor's address goes, pod a is admitted again.
func TestSockmapBypassOnly(t *testing.T) {
	// addresses no other test or lab of this host uses: the walk sees
	// every namespace of the node
	f := newSockmapPodPair(t, "axt-smo-", smOnlyTestAPIPort, smOnlyTestEtcdPort, "10.213.177.0/24", "10.213.177.10", "10.213.177.11")
	cgroup, cgroupFD, pinDir, cp, cs, ctx := f.cgroup, f.cgroupFD, f.pinDir, f.cp, f.cs, t.Context()
	nsA, nsB, nsX := f.nsA, f.nsB, testutil.NewNetns(t, "axt-smo-x-")
	ipA, ipB := f.ipA, f.ipB
	for _, p := range []struct {
		name string
		ip   netip.Addr
	}{{"a", ipA}, {"b", ipB}} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: p.name},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		created, err := cs.CoreV1().Pods("apps").Create(ctx, pod, metav1.CreateOptions{})
		must(t, err)
		created.Status.Phase = corev1.PodRunning
		created.Status.PodIPs = []corev1.PodIP{{IP: p.ip.String()}}
		created.Status.PodIP = p.ip.String()
		_, err = cs.CoreV1().Pods("apps").UpdateStatus(ctx, created, metav1.UpdateOptions{})
		must(t, err)
	}

	log := testLogger(t)
	reg, err := openRegistry(t.TempDir(), log) // empty: no axon-cni on this node
	must(t, err)
	k, svc := runKubeAndServices(t, cp, log)

	cfg := Config{NodeName: "node1", BPFRoot: pinDir, CgroupRoot: cgroup, Sockmap: SockmapEnabled, Mode: ModeBypassOnly}
	must(t, cfg.validateMode())
	s := newSockBypass(cfg, log, reg, func() *kube { return k })
	s.load = loadSockmapFunc(cfg, unguardedWhereNeeded(t), log)
	s.svc = svc
	// the real self-test, its splice check let through where the kernel
	// cannot load the splice guard (see TestSockmapAgainstKernelAndAPIServer)
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

	cookieA, err := netnsutil.Cookie(netnsutil.Path(nsA))
	must(t, err)
	cookieB, err := netnsutil.Cookie(netnsutil.Path(nsB))
	must(t, err)
	admitted := func(what string, want map[netip.Addr]uint64) {
		t.Helper()
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
			// other pods of this node: none; the maps hold exactly ours
			if len(pods) != len(want) {
				return fmt.Errorf("admitted %v, want %v (not admitted: %v)", pods, want, st.NotAdmitted)
			}
			for ip, c := range want {
				if pods[ip] != c {
					return fmt.Errorf("admitted %v, want %v (not admitted: %v)", pods, want, st.NotAdmitted)
				}
			}
			return nil
		})
	}
	admitted("pods a and b admitted with the netns that holds their address", map[netip.Addr]uint64{ipA: cookieA, ipB: cookieB})
	if n := len(reg.List()); n != 0 {
		t.Fatalf("the endpoint registry has %d entries: this test is about a node without axon-cni", n)
	}
	netns, err := s.bp.Netns()
	must(t, err)
	slices.Sort(netns)
	wantNetns := []uint64{cookieA, cookieB}
	slices.Sort(wantNetns)
	if !slices.Equal(netns, wantNetns) {
		t.Errorf("admitted netns %v, want pod a's and b's %v", netns, wantNetns)
	}

	peers := startPeers(t, peersConfig{ServerNetns: netnsutil.Path(nsB), Listen: "10.213.177.11:7000",
		ClientNetns: netnsutil.Path(nsA), Loopback: "127.0.0.1:7001"}, cgroupFD)
	m0 := sockmapCounters(t, s)
	c1, local1, remote1 := peers.dial("pod")
	peers.echo(c1, 64<<10)
	conn1 := connKeys(local1, remote1)
	requireConns(t, s, conn1, true)
	m1 := sockmapCounters(t, s)
	if d := m1[counterAdmittedPod] - m0[counterAdmittedPod]; d != 2 {
		t.Errorf("admitted pod-to-pod sockets moved by %d, want 2 (both ends)", d)
	}
	if d := m1[counterRedirectedBytes] - m0[counterRedirectedBytes]; d < 2*(64<<10) {
		t.Errorf("redirected bytes moved by %d, want at least %d (the 64 KiB both ways)", d, 2*(64<<10))
	}
	if d := s.decision(s.status()); d.Value != "enabled" || !strings.Contains(d.Reason, "2 pods admitted, 2 sockets bypassed") {
		t.Errorf("status line %+v: want enabled, 2 pods, 2 sockets", d)
	}
	rep, err := s.conns()
	must(t, err)
	if !hasConnRow(rep, local1, remote1, "apps/a", "apps/b") || !hasConnRow(rep, remote1, local1, "apps/b", "apps/a") {
		t.Errorf("axon bpf sockmap list rows %+v: want both ends of %s -> %s with their pods", rep.Conns, local1, remote1)
	}

	// an impostor: another netns configures pod a's address
	x := dptest.NSConf(t, nsX)
	x.Addr("lo", "10.213.177.10/32")
	admitted("pod a out while its address is held by two netns", map[netip.Addr]uint64{ipB: cookieB})
	if st := s.status(); !strings.Contains(strings.Join(st.NotAdmitted, "\n"), "apps/a: address 10.213.177.10 is held by 2 network namespaces") {
		t.Errorf("status does not say why apps/a is out: %v", st.NotAdmitted)
	}
	if msg := waitEvent(t, cs, "apps", "Pod", "a", ReasonPodAddressConflict); !strings.Contains(msg, "10.213.177.10") || !strings.Contains(msg, "TCP/IP stack") {
		t.Errorf("event %q does not name the address and what happens", msg)
	}
	c2, local2, remote2 := peers.dial("pod")
	peers.echo(c2, 64<<10)
	requireConns(t, s, connKeys(local2, remote2), false)
	m2 := sockmapCounters(t, s)
	if d := m2[counterNotAdmitted] - m1[counterNotAdmitted]; d < 2 {
		t.Errorf("not-admitted sockets moved by %d, want at least 2 (both ends of the new connection)", d)
	}
	if d := m2[counterRedirectedBytes] - m1[counterRedirectedBytes]; d != 0 {
		t.Errorf("redirected bytes moved by %d while only the stack connection carried data", d)
	}
	peers.echo(c1, 64<<10) // the connection opened before keeps its bypass
	m3 := sockmapCounters(t, s)
	if d := m3[counterRedirectedBytes] - m2[counterRedirectedBytes]; d < 2*(64<<10) {
		t.Errorf("the connection opened before the impostor: redirected bytes moved by %d, want at least %d", d, 2*(64<<10))
	}

	// the impostor's address goes: pod a is admitted again
	lo := x.Link("lo")
	if err := x.H.AddrDel(lo, &netlink.Addr{IPNet: netlink.NewIPNet(ipA.AsSlice())}); err != nil {
		t.Fatal(err)
	}
	admitted("pod a admitted again", map[netip.Addr]uint64{ipA: cookieA, ipB: cookieB})
	c3, local3, remote3 := peers.dial("pod")
	peers.echo(c3, 64<<10)
	requireConns(t, s, connKeys(local3, remote3), true)
}

// TestValidateMode: --mode takes full or bypass-only, and bypass-only needs
// the bypass.
func TestValidateMode(t *testing.T) {
	for _, tt := range []struct {
		mode, sockmap string
		want          string // in the error; "" = valid
	}{
		{"", "", ""},
		{ModeFull, SockmapDisabled, ""},
		{ModeFull, SockmapEnabled, ""},
		{ModeBypassOnly, SockmapEnabled, ""},
		{ModeBypassOnly, SockmapDisabled, "runs only the same-node TCP bypass, but --sockmap=disabled"},
		{"accelerate-only", SockmapEnabled, `--mode "accelerate-only" is invalid: use full`},
	} {
		err := Config{Mode: tt.mode, Sockmap: tt.sockmap}.validateMode()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("mode %q sockmap %q: %v, want valid", tt.mode, tt.sockmap, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("mode %q sockmap %q: %v, want an error with %q", tt.mode, tt.sockmap, err, tt.want)
		}
	}
}

// TestBypassOnlyRefusesCNI: in bypass-only mode another CNI plugin owns the
// pods: every CNI call of the local API is refused (409, saying what to do)
// before it reaches IPAM, the registry or the datapath (none is built here:
// a call that went further would panic on the nil fields).
func TestBypassOnlyRefusesCNI(t *testing.T) {
	a := &Agent{cfg: Config{Mode: ModeBypassOnly, Sockmap: SockmapEnabled}}
	ctx := t.Context()
	ep := api.Endpoint{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/x", PodName: "p", PodNamespace: "default",
		IPs: []netip.Addr{netip.MustParseAddr("10.213.177.20")}}
	for name, call := range map[string]func() error{
		"Allocate": func() error {
			_, err := a.Allocate(ctx, api.AllocateRequest{ContainerID: "c1", IfName: "eth0"})
			return err
		},
		"Release":        func() error { return a.Release(ctx, api.ReleaseRequest{ContainerID: "c1", IfName: "eth0"}) },
		"PutEndpoint":    func() error { return a.PutEndpoint(ctx, ep) },
		"DeleteEndpoint": func() error { return a.DeleteEndpoint(ctx, api.Attachment{ContainerID: "c1", IfName: "eth0"}) },
		"GC":             func() error { _, err := a.GC(ctx, api.GCRequest{}); return err },
	} {
		err := call()
		var se *api.StatusError
		if !errors.As(err, &se) || se.Code != http.StatusConflict || !strings.Contains(se.Message, "--mode=bypass-only") || !strings.Contains(se.Message, "remove axon-cni") {
			t.Errorf("%s: %v, want 409 naming the mode and what to do", name, err)
		}
	}
}

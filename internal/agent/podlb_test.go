package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/podlb"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// TestPodLBFollowsOptOut: with the real socket LB and pod LB (private pin dir
// and cgroup) and a real apiserver, the pods whose sockets the socket LB
// skips get the per-packet pod LB on their interface, tcx programs in their
// netns: the opted-out pod only; in hostns-only mode every pod. Opting back
// in removes it (pins gone, the interface's tcx hooks empty), and a restarted
// agent removes the pod LB of an endpoint that went away meanwhile.
func TestPodLBFollowsOptOut(t *testing.T) {
	testutil.RequireRoot(t, "loads BPF programs, creates network namespaces")
	cp := startServiceControlPlane(t)
	cs, err := cp.Client()
	must(t, err)
	ctx := t.Context()
	createNode(t, cs, node("node1", []string{"198.18.0.11"}, "10.244.1.0/24"))
	log := testLogger(t)
	reg, err := openRegistry(t.TempDir(), log)
	must(t, err)

	cg, _ := testutil.NewCgroup(t, "axt-podlb-agent-")
	pin := filepath.Join(datapath.BPFFSRoot, "axt-podlb-agent-"+testutil.RandSuffix(t))
	t.Cleanup(func() {
		if err := podlb.Uninstall(pin, nil); err != nil {
			t.Errorf("uninstall pod LB: %v", err)
		}
		os.RemoveAll(pin)
	})
	sock, err := socklb.Load(pin, cg, log)
	must(t, err)
	t.Cleanup(func() {
		sock.Close()
		if err := socklb.Uninstall(pin, cg); err != nil {
			t.Errorf("uninstall socket LB: %v", err)
		}
	})

	eps := map[string]api.Endpoint{}
	for i, name := range []string{"a", "b", "gone"} {
		_, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{})
		must(t, err)
		ns := testutil.NewNetns(t, "axt-plb-agent-")
		testutil.InNetns(t, ns, func() error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0p"})
		})
		eps[name] = api.Endpoint{ContainerID: fmt.Sprintf("ctr-plb-%d", i), IfName: "eth0", Netns: netnsutil.Path(ns), PodName: name,
			PodNamespace: "default", IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 1, byte(20 + i)})},
			HostIfName: fmt.Sprintf("lxcplb%d", i), PodMAC: net.HardwareAddr{2, 0, 0, 0, 1, byte(i)}}
		must(t, reg.Put(eps[name]))
	}
	annotate := func(name, value string) {
		t.Helper()
		body := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, AnnotationSocketLB, value)
		_, err := cs.CoreV1().Pods("default").Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{})
		must(t, err)
	}
	annotate("a", SocketLBDisabled)

	k, s := runKubeAndServices(t, cp, log)
	newSL := func(mode string) *socketLB {
		sl := newSocketLB(Config{NodeName: "node1", SocketLB: true, SocketLBMode: mode, BPFRoot: pin, AttachMode: "auto"}, log, nil, reg,
			func() *kube { return k }, func() {})
		sl.svc, sl.lb = s, sock
		return sl
	}
	// tcxOn lists the tcx programs on eth0 of pod name's netns, both hooks.
	tcxOn := func(name string) int {
		t.Helper()
		n := 0
		err := netnsutil.DoAt(eps[name].Netns, func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at})
				if err != nil {
					return err
				}
				n += len(res.Programs)
			}
			return nil
		})
		must(t, err)
		return n
	}
	expect := func(sl *socketLB, what string, names ...string) {
		t.Helper()
		var wantIDs, wantPods []string
		for _, n := range names {
			wantIDs = append(wantIDs, podLBID(eps[n]))
			wantPods = append(wantPods, "default/"+n)
		}
		slices.Sort(wantIDs)
		eventually(t, what, 20*time.Second, func() error {
			sl.syncOptOut()
			ids, err := podlb.Attached(pin)
			if err != nil {
				return err
			}
			slices.Sort(ids)
			if !slices.Equal(ids, wantIDs) || !slices.Equal(sl.podLBPods(), wantPods) {
				return fmt.Errorf("pod LB pins %v for pods %v, want %v (%v)", ids, sl.podLBPods(), wantIDs, wantPods)
			}
			return nil
		})
		for _, n := range []string{"a", "b"} {
			want := 0
			if slices.Contains(names, n) {
				want = 2
			}
			if got := tcxOn(n); got != want {
				t.Errorf("%s: pod %s has %d tcx programs on eth0, want %d", what, n, got, want)
			}
		}
		if r := sl.podLBReason(); !strings.Contains(r, fmt.Sprintf("on %d pod", len(names))) {
			t.Errorf("%s: status %q", what, r)
		}
	}

	sl := newSL(SocketLBModeAll)
	expect(sl, "the opted-out pod", "a")
	annotate("a", SocketLBEnabled)
	expect(sl, "a opted back in")
	hostns := newSL(SocketLBModeHostNS)
	expect(hostns, "hostns-only: every pod", "a", "b", "gone")

	// The endpoint "gone" leaves while no agent runs; the next agent removes
	// its pod LB and keeps the others'.
	must(t, reg.Delete(api.Attachment{ContainerID: eps["gone"].ContainerID, IfName: eps["gone"].IfName}))
	restarted := newSL(SocketLBModeHostNS)
	expect(restarted, "restarted agent, gone's endpoint removed", "a", "b")
	if _, err := os.Stat(podlb.PodPinDir(pin, podLBID(eps["gone"]))); !os.IsNotExist(err) {
		t.Errorf("gone's pod LB pins: %v, want removed", err)
	}
}

// plbRecorder records what the agent asks of the pod LB (pure logic).
type plbRecorder struct {
	calls []string
}

func (r *plbRecorder) Attach(id, netns string, tg podlb.Target) error {
	r.calls = append(r.calls, fmt.Sprintf("attach %s %s tap=%q", id, tg.Ifname, tg.Tap))
	return nil
}

func (r *plbRecorder) Detach(id, netns string) error {
	r.calls = append(r.calls, "detach "+id)
	return nil
}

// TestSyncPodLBTargets: which endpoints get the pod LB and where its replies
// are translated: an untranslated pod on its interface, a VM pod with the
// bypass at its tap; nothing is attached again while unchanged; a VM pod whose
// bypass went loses its pod LB unless it is also untranslated, and its
// replies move back to the tap when the bypass returns.
func TestSyncPodLBTargets(t *testing.T) {
	ep := func(name string) api.Endpoint {
		return api.Endpoint{ContainerID: "c" + name, IfName: "eth0", Netns: "/run/netns/" + name, PodName: name, PodNamespace: "default"}
	}
	a, vm, plain := ep("a"), ep("vm"), ep("plain")
	eps := []api.Endpoint{a, vm, plain}
	rec := &plbRecorder{}
	s := &socketLB{log: testLogger(t), plb: podLBState{lb: rec, swept: true}}
	step := func(what string, want []api.Endpoint, taps map[string]string, calls ...string) {
		t.Helper()
		rec.calls = nil
		s.syncPodLBLocked(eps, want, taps)
		slices.Sort(rec.calls)
		slices.Sort(calls)
		if !slices.Equal(rec.calls, calls) {
			t.Errorf("%s: calls %q, want %q", what, rec.calls, calls)
		}
	}
	vmTap := map[string]string{cookieKey(vm): "tap0"}
	step("first", []api.Endpoint{a}, vmTap,
		fmt.Sprintf("attach %s eth0 tap=%q", podLBID(a), ""), fmt.Sprintf("attach %s eth0 tap=%q", podLBID(vm), "tap0"))
	step("unchanged", []api.Endpoint{a}, vmTap)
	step("the VM bypass went", []api.Endpoint{a}, nil, "detach "+podLBID(vm))
	step("the VM pod also opted out, no bypass", []api.Endpoint{a, vm}, nil, fmt.Sprintf("attach %s eth0 tap=%q", podLBID(vm), ""))
	step("its bypass is back: replies move to the tap", []api.Endpoint{a, vm}, vmTap, fmt.Sprintf("attach %s eth0 tap=%q", podLBID(vm), "tap0"))
	if got := s.podLBPods(); !slices.Equal(got, []string{"default/a", "default/vm"}) {
		t.Errorf("pods %v", got)
	}
	for ep, want := range map[*api.Endpoint]string{&a: "attached", &vm: "attached, replies at tap0", &plain: ""} {
		if got := s.podLBState(*ep); got != want {
			t.Errorf("endpoint list state of %s: %q, want %q", ep.PodName, got, want)
		}
	}
	// the pod LB cannot load: the endpoints that want it say why
	broken := &socketLB{log: testLogger(t), newPodLB: func() (podLBer, error) { return nil, errors.New("no socket LB maps") }}
	broken.syncPodLBLocked(eps, []api.Endpoint{a}, vmTap)
	for ep, want := range map[*api.Endpoint]string{&a: "not attached: the pod LB is unavailable: no socket LB maps",
		&vm: "not attached: the pod LB is unavailable: no socket LB maps", &plain: ""} {
		if got := broken.podLBState(*ep); got != want {
			t.Errorf("unavailable: state of %s: %q, want %q", ep.PodName, got, want)
		}
	}
	if r := broken.podLBReason(); !strings.Contains(r, "unavailable (no socket LB maps)") {
		t.Errorf("status %q", r)
	}
}

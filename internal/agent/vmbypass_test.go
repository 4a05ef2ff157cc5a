package agent

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/vmbypass"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

const (
	vmbTestAPIPort  = 16913
	vmbTestEtcdPort = 12849
)

func TestParseVMBypass(t *testing.T) {
	for _, c := range []struct {
		v       string
		set, on bool
		bad     bool
	}{
		{set: false}, {v: "enabled", set: true, on: true}, {v: " enabled ", set: true, on: true},
		{v: "disabled", set: true}, {v: "yes", set: true, bad: true}, {v: "", set: true, bad: true},
	} {
		ann := map[string]string{}
		if c.set {
			ann[AnnotationVMBypass] = c.v
		}
		set, on, err := parseVMBypass(ann)
		if on != c.on || set != (c.set && !c.bad) || (err != nil) != c.bad {
			t.Errorf("%q: set %v, on %v, %v", c.v, set, on, err)
		}
	}
}

func TestVMBypassWanted(t *testing.T) {
	// annotation: absent (or invalid), enabled, disabled
	for _, c := range []struct {
		mode                  string
		absent, enabled, disa bool
	}{
		{VMBypassAnnotated, false, true, false},
		{"", false, true, false}, // a Config built by hand: annotated
		{VMBypassAll, true, true, false},
		{VMBypassOff, false, false, false},
	} {
		got := [3]bool{vmBypassWanted(c.mode, false, false), vmBypassWanted(c.mode, true, true), vmBypassWanted(c.mode, true, false)}
		if want := [3]bool{c.absent, c.enabled, c.disa}; got != want {
			t.Errorf("--vm-bypass=%q: wanted (absent, enabled, disabled) = %v, want %v", c.mode, got, want)
		}
		if err := (Config{VMBypass: c.mode}).validateVMBypass(); err != nil {
			t.Errorf("--vm-bypass=%q: %v", c.mode, err)
		}
	}
	if err := (Config{VMBypass: "on"}).validateVMBypass(); err == nil || !strings.Contains(err.Error(), "annotated") {
		t.Errorf("--vm-bypass=on: %v, want an error naming the values", err)
	}
}

// vmPodNetns makes a pod netns with KubeVirt's bridge-binding layout (bridge
// k6t-eth0 enslaving eth0 and a tap whose fd the test holds), or with eth0
// alone. It returns the netns path and the tap (nil without).
func vmPodNetns(t *testing.T, withLayout bool) (string, *os.File) {
	t.Helper()
	ns := testutil.NewNetns(t, "axt-agent-vm-")
	peer := testutil.NewNetns(t, "axt-agent-vmn-")
	pc := dptest.NSConf(t, ns)
	pc.Veth("eth0", "", "peer", "", peer)
	if !withLayout {
		return netnsutil.Path(ns), nil
	}
	must(t, pc.H.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "k6t-eth0"}}))
	tap := openTestTap(t, ns)
	for _, p := range []string{"eth0", "tap0"} {
		must(t, pc.H.LinkSetMaster(pc.Link(p), pc.Link("k6t-eth0")))
	}
	pc.Up("eth0", "tap0", "k6t-eth0")
	return netnsutil.Path(ns), tap
}

func openTestTap(t *testing.T, ns string) *os.File {
	t.Helper()
	var f *os.File
	testutil.InNetns(t, ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq("tap0")
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), "tap0")
		return nil
	})
	t.Cleanup(func() { f.Close() })
	return f
}

// waitPodEvent waits for a Warning Event of reason on pod whose message
// contains msg.
func waitPodEvent(t *testing.T, cs kubernetes.Interface, pod, reason, msg string) {
	t.Helper()
	var seen []string
	waitUntil(t, 15*time.Second, reason+" event on pod "+pod, func() bool {
		seen = seen[:0]
		for _, e := range podEvents(t, cs, pod) {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Type == corev1.EventTypeWarning && e.Reason == reason && strings.Contains(e.Message, msg) && e.Source.Component == "axon-agent" {
				return true
			}
		}
		return false
	})
}

// TestVMBypassAgainstAPIServer: the agent applies the VM bypass to an
// annotated pod with the bridge-binding layout, gives an annotated pod
// without it an Event with the reason (and attaches nothing), reports a
// malformed annotation, removes the bypass when the tap goes (counted) and
// re-applies it to a new tap, and removes it when the annotation goes.
func TestVMBypassAgainstAPIServer(t *testing.T) {
	dptest.RequireRoot(t)
	cp := startControlPlaneOn(t, vmbTestAPIPort, vmbTestEtcdPort)
	cs, err := cp.Client()
	must(t, err)
	ctx := t.Context()
	createNode(t, cs, node("node1", []string{"198.18.0.11"}, "10.244.1.0/24"))

	pin := "/sys/fs/bpf/axt-agent-vmb-" + testutil.RandSuffix(t)
	t.Cleanup(func() { _ = os.RemoveAll(pin) })
	log := testLogger(t)
	cfg, reg := node1Config(t, pin, log)
	k := runKube(t, cp, log)
	v := newVMBypass(cfg, log, reg, func() *kube { return k })
	t.Cleanup(v.close)

	vmNS, tap := vmPodNetns(t, true)
	plainNS, _ := vmPodNetns(t, false)
	pods := []struct {
		name, netns string
		ann         map[string]string
	}{
		{"vm", vmNS, map[string]string{AnnotationVMBypass: "enabled"}},
		{"plain", plainNS, map[string]string{AnnotationVMBypass: "enabled"}},
		{"typo", plainNS, map[string]string{AnnotationVMBypass: "yes"}},
		{"other", plainNS, nil},
	}
	uids := map[string]string{}
	for i, p := range pods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "default", Annotations: p.ann},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		created, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		must(t, err)
		uids[p.name] = string(created.UID)
		must(t, reg.Put(api.Endpoint{ContainerID: "c" + p.name, IfName: "eth0", Netns: p.netns, PodName: p.name,
			PodNamespace: "default", IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)})}, HostIfName: "lxcvm" + p.name,
			HostIfIndex: 200 + i, HostMAC: net.HardwareAddr{2, 0, 0, 0, 1, byte(i)}, PodMAC: net.HardwareAddr{2, 0, 0, 0, 2, byte(i)}}))
	}
	waitUntil(t, 30*time.Second, "pod cache synced", func() bool {
		if !k.isSynced() {
			return false
		}
		l, _ := k.pods.List(labels.Everything())
		return len(l) == len(pods)
	})
	probe, err := vmbypass.New(vmbypass.Config{PinDir: pin, Logger: log})
	must(t, err)
	tapAttached := func() bool {
		st, err := probe.Stats(uids["vm"], vmNS)
		return err == nil && st.TapAttached && st.PodAttached
	}

	v.reconcile()
	d := v.decision()
	t.Logf("status: %+v", d)
	if d.Value != "1 pod(s)" || !strings.Contains(d.Reason, "bypassed: default/vm") ||
		!strings.Contains(d.Reason, "default/plain (pod_interface_not_bridged)") {
		t.Errorf("decision %+v", d)
	}
	if !tapAttached() {
		t.Errorf("the vm pod's bypass is not attached")
	}
	for pod, want := range map[string]string{"default/vm": "bypassed", "default/plain": "not bypassed: pod_interface_not_bridged", "default/typo": "", "default/other": ""} {
		if got := v.podState(pod); got != want {
			t.Errorf("endpoint list state of %s: %q, want %q", pod, got, want)
		}
	}
	if _, err := os.Stat(vmbypass.PodPinDir(pin, uids["plain"])); err == nil {
		t.Errorf("the pod without the layout got a pin dir")
	}
	// what the pod LB learns: the bypassed pod's endpoint and its tap
	if got := v.taps(); len(got) != 1 || got["cvm/eth0@"+vmNS] != "tap0" {
		t.Errorf("taps() = %v, want the vm pod's endpoint with tap0", got)
	}
	waitPodEvent(t, cs, "plain", ReasonVMBypassNotApplied, "pod_interface_not_bridged")
	waitPodEvent(t, cs, "typo", ReasonInvalidAnnotation, AnnotationVMBypass)

	parent := t
	t.Run("the tap goes and comes back", func(t *testing.T) {
		tap.Close()
		v.reconcile()
		d := v.decision()
		if d.Value != "0 pod(s)" || !strings.Contains(d.Reason, "default/vm (no_tap)") || !strings.Contains(d.Reason, "1 bypass(es) removed after their tap went away") {
			t.Errorf("after the tap went: %+v", d)
		}
		if _, err := os.Stat(vmbypass.PodPinDir(pin, uids["vm"])); err == nil {
			t.Errorf("pins of the tapless bypass left")
		}
		pc := dptest.NSConf(t, filepath.Base(vmNS))
		openTestTap(parent, filepath.Base(vmNS)) // kept open for the next subtest
		must(t, pc.H.LinkSetMaster(pc.Link("tap0"), pc.Link("k6t-eth0")))
		v.reconcile()
		if d := v.decision(); d.Value != "1 pod(s)" || !tapAttached() {
			t.Errorf("with a new tap: %+v, attached %v", d, tapAttached())
		}
	})

	t.Run("the annotation goes", func(t *testing.T) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "vm", metav1.GetOptions{})
		must(t, err)
		p.Annotations = nil
		_, err = cs.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{})
		must(t, err)
		waitUntil(t, 10*time.Second, "the annotation's removal in the agent's pod cache", func() bool {
			p, err := k.pods.Pods("default").Get("vm")
			return err == nil && p.Annotations[AnnotationVMBypass] == ""
		})
		if !tapAttached() {
			t.Fatal("the bypass is not attached before the annotation's removal is reconciled: the check below would prove nothing")
		}
		v.reconcile()
		if _, err := os.Stat(vmbypass.PodPinDir(pin, uids["vm"])); !os.IsNotExist(err) {
			t.Errorf("pins of the bypass left after the annotation went: %v", err)
		}
		if d := v.decision(); d.Value != "0 pod(s)" || strings.Contains(d.Reason, "default/vm") {
			t.Errorf("after the annotation went: %+v", d)
		}
	})

	// setVMAnn sets the vm pod's annotations and waits for the agent's pod cache to see them.
	setVMAnn := func(t *testing.T, ann map[string]string) {
		t.Helper()
		p, err := cs.CoreV1().Pods("default").Get(ctx, "vm", metav1.GetOptions{})
		must(t, err)
		p.Annotations = ann
		_, err = cs.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{})
		must(t, err)
		waitUntil(t, 10*time.Second, "the annotation in the agent's pod cache", func() bool {
			p, err := k.pods.Pods("default").Get("vm")
			return err == nil && p.Annotations[AnnotationVMBypass] == ann[AnnotationVMBypass]
		})
	}

	t.Run("a restarted agent removes what the last one attached, legacy filters too", func(t *testing.T) {
		legacy := cfg
		legacy.AttachMode = "legacy"
		setVMAnn(t, map[string]string{AnnotationVMBypass: "enabled"})
		first := newVMBypass(legacy, log, reg, func() *kube { return k })
		first.reconcile()
		first.close()
		filters := func() int {
			n := 0
			pc := dptest.NSConf(t, filepath.Base(vmNS))
			for _, dev := range []string{"eth0", "tap0"} {
				fs, err := pc.H.FilterList(pc.Link(dev), netlink.HANDLE_MIN_INGRESS)
				must(t, err)
				n += len(fs)
			}
			return n
		}
		if n := filters(); n != 2 || !tapAttached() {
			t.Fatalf("legacy attach: %d cls_bpf filters on eth0 and tap0, want 2 (attached %v)", n, tapAttached())
		}
		setVMAnn(t, nil)
		restarted := newVMBypass(legacy, log, reg, func() *kube { return k }) // knows nothing of the first
		t.Cleanup(restarted.close)
		restarted.reconcile()
		if n := filters(); n != 0 {
			t.Errorf("%d cls_bpf filters left in the pod after the restarted agent removed the bypass", n)
		}
		if _, err := os.Stat(vmbypass.PodPinDir(pin, uids["vm"])); !os.IsNotExist(err) {
			t.Errorf("pins left: %v", err)
		}
	})

	t.Run("node-wide: --vm-bypass=all, an opt-out, then off", func(t *testing.T) {
		all := cfg
		all.VMBypass = VMBypassAll
		va := newVMBypass(all, log, reg, func() *kube { return k })
		t.Cleanup(va.close)
		if tapAttached() {
			t.Fatal("a bypass is attached before --vm-bypass=all reconciles: the check below would prove nothing")
		}
		va.reconcile() // vm: no annotation, the layout; plain: asked, no layout; typo, other: no layout, did not ask
		d := va.decision()
		t.Logf("status: %+v", d)
		if d.Value != "1 pod(s)" || !strings.HasPrefix(d.Reason, "--vm-bypass=all") || !strings.Contains(d.Reason, "bypassed: default/vm") ||
			!strings.Contains(d.Reason, "default/plain (pod_interface_not_bridged)") || strings.Contains(d.Reason, "default/other") || strings.Contains(d.Reason, "default/typo") {
			t.Errorf("decision %+v: want default/vm bypassed without its annotation, default/plain reported, the pods that did not ask not named", d)
		}
		if !tapAttached() {
			t.Errorf("--vm-bypass=all: the unannotated vm pod's bypass is not attached")
		}
		for pod, want := range map[string]string{"default/vm": "bypassed", "default/plain": "not bypassed: pod_interface_not_bridged", "default/typo": "", "default/other": ""} {
			if got := va.podState(pod); got != want {
				t.Errorf("endpoint list state of %s: %q, want %q", pod, got, want)
			}
		}
		for _, pod := range []string{"other", "typo"} {
			if _, err := os.Stat(vmbypass.PodPinDir(pin, uids[pod])); err == nil {
				t.Errorf("pod %s without the layout got a pin dir", pod)
			}
		}

		setVMAnn(t, map[string]string{AnnotationVMBypass: "disabled"}) // the pod opts out
		va.reconcile()
		if _, err := os.Stat(vmbypass.PodPinDir(pin, uids["vm"])); !os.IsNotExist(err) || tapAttached() {
			t.Errorf("--vm-bypass=all, pod annotated disabled: pins %v, attached %v; want none", err, tapAttached())
		}

		setVMAnn(t, map[string]string{AnnotationVMBypass: "enabled"})
		va.reconcile()
		if !tapAttached() {
			t.Fatal("--vm-bypass=all, annotated enabled: not attached, so the off check below would prove nothing")
		}
		off := cfg
		off.VMBypass = VMBypassOff
		vo := newVMBypass(off, log, reg, func() *kube { return k }) // an agent restarted with --vm-bypass=off
		t.Cleanup(vo.close)
		vo.reconcile()
		if _, err := os.Stat(vmbypass.PodPinDir(pin, uids["vm"])); !os.IsNotExist(err) || tapAttached() {
			t.Errorf("--vm-bypass=off: pins %v, attached %v; want the annotated pod's bypass removed", err, tapAttached())
		}
		if d := vo.decision(); d.Value != "0 pod(s)" || !strings.HasPrefix(d.Reason, "--vm-bypass=off") {
			t.Errorf("--vm-bypass=off: decision %+v", d)
		}
	})
}

package lab_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/vmtest"
)

// TestLabVMPods brings a lab with one VM pod per node up (`--vm-pods 1`: real QEMU
// guests behind KubeVirt's bridge binding), requires `axon lab check` to pass with
// them (bypass reported and its counters moved, the guests answer ICMP and TCP from
// pods on both nodes and from their node, each VM pod's Service answers with its
// guest as the backend, and from inside each guest the same pods and node answer and
// the demo ClusterIP echoes through the VM pod's pod LB), runs commands in a guest
// with `axon lab exec --guest`, then switches one pod's bypass off: the check must
// fail for it with the agent's reason while the bridge still carries its traffic,
// both ways. Down leaves no
// QEMU, no DHCP responder and nothing under the state dir. Boots are TCG here:
// AXON_VMGUEST=1 runs it (about 2-4 minutes on a quiet 2-core host).
func TestLabVMPods(t *testing.T) {
	if os.Getenv("AXON_VMGUEST") != "1" && !vmtest.HardwareKVM() {
		t.Skip("boots two QEMU guests under TCG (no hardware KVM here): AXON_VMGUEST=1 runs it")
	}
	need(t, "axon", "axon-agent", "axon-cni")
	spec, err := vmtest.LookupKernel(lab.VMGuestKernel)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&vmtest.Fetcher{CacheRoot: lab.DepsDir()}).Cached(spec); err != nil {
		t.Skipf("no guest kernel: `make vm-kernels`: %v", err)
	}
	if _, err := exec.LookPath(vmtest.QEMUPath); err != nil {
		t.Skipf("no QEMU: `make vm-packages`: %v", err)
	}
	t0 := time.Now()
	l := up(t, "--nodes", "2", "--pods-per-node", "1", "--vm-pods", "1", "--ready-timeout", "4m")
	upTime := time.Since(t0)
	vms := l.State().VMPods
	if len(vms) != 2 {
		t.Fatalf("want 2 VM pods (one per node), have %d", len(vms))
	}
	for _, v := range vms {
		if !v.QEMU.Alive() || !v.DHCP.Alive() {
			t.Fatalf("VM pod %s: QEMU or its DHCP responder is not running", v.Name)
		}
		t.Logf("VM pod %s on %s: guest %s, MAC %s, booted to its lease in %s", v.Name, v.Node, v.IP, v.GuestMAC, v.Boot)
	}
	t.Logf("lab up with the VM pods in %s", upTime.Round(time.Millisecond))

	out := checkMatrix(t)
	if !strings.Contains(out, "VM pod checks passed, 0 n/a") || strings.Count(out, "agent: bypassed") != 2 {
		t.Fatalf("the check does not show both VM pods bypassed with every check run:\n%s", out)
	}
	// 7 per family from inside each guest (IPv4 and IPv6): tcp and icmp to a pod on its node, one
	// on the other node and its node, tcp to the demo ClusterIP (the check fails on any FAIL: these
	// passed); and to each guest over IPv6 as over IPv4
	if n := strings.Count(out, "from the guest: "); n != 2*2*7 {
		t.Errorf("%d probes from inside the guests, want 28:\n%s", n, out)
	}
	if n := strings.Count(out, "tcp6 from "); n != 2*3 {
		t.Errorf("%d IPv6 TCP probes to the guests, want 6:\n%s", n, out)
	}
	// axon lab exec --guest: the guest's own view, and its exit code.
	if got := axon(t, "exec", "--guest", vms[0].Name, "--", "ip", "-4", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(got, " "+vms[0].IP.String()+"/") {
		t.Errorf("axon lab exec --guest %s -- ip addr: %q, want the guest's %s", vms[0].Name, got, vms[0].IP)
	}
	if got, err := axonErr(t, "exec", "--guest", vms[0].Name, "--", "exit", "7"); err == nil || !strings.Contains(err.Error(), "exit status 7") {
		t.Errorf("axon lab exec --guest %s -- exit 7: %v (%q), want exit status 7", vms[0].Name, err, got)
	}
	if got, err := axonErr(t, "exec", "--guest", "node1-pod1", "--", "true"); err == nil || !strings.Contains(got, `no VM pod "node1-pod1" (have `+vms[0].Name) {
		t.Errorf("axon lab exec --guest on a plain pod: %v, %q; want an error naming the VM pods", err, got)
	}

	// Negative: the annotation off on node2's VM pod. The agent removes the bypass; the
	// check fails for that pod with the agent's reason and its counters are gone, while
	// the guest still answers through the in-pod bridge.
	ctx := t.Context()
	v := vms[1] // sorted by node: node2's
	if vms[0].Node != "node1" || v.Node != "node2" {
		t.Fatalf("VM pods %s on %s, %s on %s: want node1's first", vms[0].Name, vms[0].Node, v.Name, v.Node)
	}
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"metadata":{"annotations":{"axon.io/vm-bypass":"disabled"}}}`)
	if _, err := kube.CoreV1().Pods(v.Namespace).Patch(ctx, v.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	pins := filepath.Join(l.State().Nodes[1].PinDir, "vmbypass")
	deadline := time.Now().Add(60 * time.Second)
	for {
		ents, _ := os.ReadDir(pins)
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent of %s kept the bypass pinned (%d under %s) 60 s after the annotation went", v.Node, len(ents), pins)
		}
		time.Sleep(200 * time.Millisecond)
	}
	res, err := l.CheckVMPods(ctx, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	failed := strings.Join(res.Failed(), "\n")
	t.Logf("check with %s's bypass off:\n%s", v.Name, failed)
	if !strings.Contains(failed, v.Name+" bypass: agent: the agent does not count the pod as annotated axon.io/vm-bypass=enabled") ||
		!strings.Contains(failed, v.Name+" frames through the bypass: bypass counters:") {
		t.Errorf("the check does not fail %s's bypass with the reason", v.Name)
	}
	for _, c := range res.Checks {
		if c.VMPod == vms[0].Name && !c.OK {
			t.Errorf("%s (bypass still on) failed %s: %s", c.VMPod, c.What, c.Detail)
		}
		// without the bypass (and not opted out of the socket LB) the agent gives the VM pod no
		// pod LB: its guest reaches no ClusterIP, and the check says so instead of failing
		if c.VMPod == v.Name && strings.HasPrefix(c.What, "from the guest: service ") && !strings.Contains(c.NA, "no pod LB") {
			t.Errorf("%s without the bypass: %s: n/a %q, %v %s; want n/a: no pod LB", v.Name, c.What, c.NA, c.OK, c.Detail)
		}
		if c.VMPod == v.Name && (strings.HasPrefix(c.What, "tcp from") || strings.HasPrefix(c.What, "tcp6 from") || strings.HasPrefix(c.What, "from the guest: ")) && !c.OK && c.NA == "" {
			t.Errorf("%s's guest does not answer through the bridge: %s: %s", v.Name, c.What, c.Detail)
		}
	}
	if n := len(res.Failed()); n != 2 {
		t.Errorf("%d checks failed, want 2 (%s's bypass and its counters)", n, v.Name)
	}
}

package lab

// VM pods (`axon lab up --vm-pods N`, docs/vm-bypass.md "Lab"): on every node,
// N pods whose workload is a real QEMU guest (internal/vmguest), wired the way
// KubeVirt's bridge binding wires a virt-launcher pod. The lab plays kubelet
// (pod netns, cgroup, CNI ADD through axon-cni) and then virt-launcher: the
// pod interface's IPv4 address and MAC move to the guest, eth0 gets a MAC of
// its own and becomes a port of the bridge k6t-eth0 beside the guest's tap,
// a DHCP responder on the bridge hands the guest the pod's address, and QEMU
// boots. The Pod carries axon.io/vm-bypass: enabled, so the node's agent
// attaches the bridge bypass. QEMU and the DHCP responder run detached in the
// pod's netns and cgroup; `down` stops them by PID.
//
// VM pods are kept apart from the lab's pods (State.VMPods): they answer
// IPv4 ICMP and TCP (the guest's echo on probe.EchoPort) but run no lab
// prober, so the pod, Service and external checks leave them out and
// CheckVMPods covers them.

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/brnf"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/proc"
	"github.com/axonhq/axon/internal/vmguest"
	"github.com/axonhq/axon/internal/vmtest"
)

// VM pods of `axon lab up --vm-pods`.
const (
	// MaxVMPodsPerNode bounds --vm-pods: each is a QEMU guest (1 vCPU, 256 MiB),
	// under TCG a whole host CPU while it boots.
	MaxVMPodsPerNode = 4
	// VMGuestKernel is the cached kernel the guests boot (`make vm-kernels`).
	VMGuestKernel = "debian-6.12"
	// KubeVirt's bridge binding: the in-pod bridge, its address (the DHCP
	// responder's) and the guest's tap.
	VMBridge     = "k6t-eth0"
	VMTap        = "tap0"
	vmBridgeAddr = "169.254.75.10/32"
	vmDir        = "vm" // under the state dir: the guests' initramfs and one dir per VM pod
)

// vmBypassAnnotation switches the bypass on for a pod (agent.AnnotationVMBypass;
// the lab cannot import the agent, whose tests import the lab: a test checks).
const vmBypassAnnotation = "axon.io/vm-bypass"

// DemoVMService is the Service of the k-th VM pod (1-based, in the order of
// State.VMPods), demo-<pod>, whose only backend is that pod's guest: ClusterIP
// 10.96.101.<k> port DemoPort and NodePort 30100+k (clear of the external
// demo's 30080-30083), TCP, IPv4, to the guest's echo (vmguest.EchoPort). One
// Service per VM pod, so that its check says which guest answered.
func DemoVMService(k int, pod string) (name string, clusterIP netip.Addr, nodePort int32) {
	return "demo-" + pod, netip.AddrFrom4([4]byte{10, 96, 101, byte(k)}), int32(30100 + k)
}

// VMPod is a VM pod: the virt-launcher pod (netns, cgroup, CNI ADD) and its
// guest. IP and IPs are the guest's: the pod's IPv4 address, which the
// bridge binding hands the guest by DHCP, and its IPv6 address, which the lab
// configures in the guest (configureGuestIPv6).
type VMPod struct {
	Pod
	GuestMAC string `json:"guestMAC"` // the pod interface's MAC from CNI ADD, moved to the guest
	Dir      string `json:"dir"`      // console.log, command.sock, qemu.log, udhcpd.{conf,log,leases}
	QEMU     *Proc  `json:"qemu,omitempty"`
	DHCP     *Proc  `json:"dhcp,omitempty"`
	// Boot is QEMU's start to the guest's lease and READY marker.
	Boot time.Duration `json:"boot,omitempty"`
}

// CommandSocket is where QEMU serves the guest's command port
// (vmguest.Dial): commands run inside the guest, as the check's guest-side
// probes and `axon lab exec --guest` do.
func (v VMPod) CommandSocket() string { return filepath.Join(v.Dir, "command.sock") }

func (s *State) vmPod(name string) *VMPod {
	for i := range s.VMPods {
		if s.VMPods[i].Name == name {
			return &s.VMPods[i]
		}
	}
	return nil
}

// vmPodName is the i-th VM pod of a node.
func vmPodName(node string, i int) string { return fmt.Sprintf("%s-vm%d", node, i) }

// validateVMPods checks --vm-pods against the rest of the options.
func validateVMPods(o *UpOptions) error {
	switch {
	case o.VMPods < 0 || o.VMPods > MaxVMPodsPerNode:
		return fmt.Errorf("--vm-pods %d: want 0..%d per node (each is a QEMU guest with 1 vCPU and 256 MiB)", o.VMPods, MaxVMPodsPerNode)
	case o.VMPods == 0:
		return nil
	case o.Kubelet:
		return errors.New("--vm-pods: the lab plays kubelet and virt-launcher for its VM pods; --kubelet runs real kubelets and no lab pods")
	case o.Datapath != DatapathAxon:
		return fmt.Errorf("--vm-pods needs --datapath %s: the VM pods are wired by axon-cni and bypassed by the node's axon-agent", DatapathAxon)
	}
	return nil
}

// guestKernel is the cached kernel of the VM pods' guests.
func guestKernel() (*vmtest.Kernel, error) {
	spec, err := vmtest.LookupKernel(VMGuestKernel)
	if err != nil {
		return nil, err
	}
	k, err := (&vmtest.Fetcher{CacheRoot: DepsDir()}).Cached(spec)
	if err != nil {
		cause := errors.Unwrap(err) // vmtest's own hint names its kernel matrix target
		if cause == nil {
			cause = err
		}
		return nil, fmt.Errorf("the VM pods' guest kernel %s is not in %s: run `make vm-kernels` (%v)", VMGuestKernel, filepath.Join(DepsDir(), "kernels"), cause)
	}
	return k, nil
}

// preflightVMPods says what --vm-pods lacks on this machine.
func preflightVMPods(o UpOptions) []error {
	if o.VMPods == 0 {
		return nil
	}
	var errs []error
	if _, err := guestKernel(); err != nil {
		errs = append(errs, err)
	}
	if _, err := exec.LookPath(vmtest.QEMUPath); err != nil {
		errs = append(errs, fmt.Errorf("--vm-pods: %s not found: `make vm-packages` (hack/install-packages.sh vm)", vmtest.QEMUPath))
	}
	for _, f := range []string{vmtest.QbootPath, vmtest.BusyboxPath, vmguest.QperfPath, "/dev/net/tun"} {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("--vm-pods: %s missing: `make vm-packages` (hack/install-packages.sh vm; qperf: `make packages`)", f))
		}
	}
	return errs
}

// upVMPods creates every node's VM pods (the nodes in parallel), boots their
// guests, waits for every lease and for every agent to report the bypass.
func upVMPods(ctx context.Context, st *State, kube kubernetes.Interface, o UpOptions) error {
	if o.VMPods == 0 {
		return nil
	}
	log := o.Logger
	k, err := guestKernel()
	if err != nil {
		return err
	}
	dir := filepath.Join(st.StateDir, vmDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	img := filepath.Join(dir, "guest-initramfs.img")
	if err := (vmguest.Initramfs{Kernel: k}).Build(ctx, img); err != nil {
		return err
	}
	g := vmguest.Guest{Kernel: k, Initramfs: img}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	for _, n := range st.Nodes { // the guests' ARP for their gateway: the agent answers it (pod_egress)
		wg.Go(func() {
			for i := 1; i <= o.VMPods; i++ {
				mu.Lock()
				snap := *st
				snap.Pods = append([]Pod(nil), st.Pods...)
				snap.VMPods = append([]VMPod(nil), st.VMPods...)
				mu.Unlock()
				v, err := addVMPod(ctx, &snap, kube, n.Name, vmPodName(n.Name, i), g)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					st.VMPods = append(st.VMPods, v)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	idx := map[string]int{}
	for _, n := range st.Nodes {
		idx[n.Name] = n.Index
	}
	slices.SortStableFunc(st.VMPods, func(a, b VMPod) int { // by node, then name (the nodes ran in parallel)
		return cmp.Or(cmp.Compare(idx[a.Node], idx[b.Node]), cmp.Compare(a.Name, b.Name))
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	log.Info("VM pods started, guests booting", "pods", len(st.VMPods), "accel", vmguest.Accel())
	errs = make([]error, len(st.VMPods))
	bootCtx, cancel := context.WithTimeout(ctx, max(o.readyTimeout(), 3*time.Minute)) // TCG on a loaded host: 30-80 s per boot
	defer cancel()
	for i := range st.VMPods {
		wg.Go(func() {
			v := &st.VMPods[i]
			addr, err := vmguest.WaitReadyFile(bootCtx, filepath.Join(v.Dir, "console.log"), v.QEMU.Alive)
			if err != nil {
				errs[i] = fmt.Errorf("VM pod %s: %w", v.Name, err)
				return
			}
			if p, err := netip.ParsePrefix(addr); err != nil || p.Addr() != v.IP {
				errs[i] = fmt.Errorf("VM pod %s: the guest leased %q, want the pod's %s", v.Name, addr, v.IP)
				return
			}
			if err := configureGuestIPv6(bootCtx, *v); err != nil {
				errs[i] = fmt.Errorf("VM pod %s: %w", v.Name, err)
				return
			}
			start, err := proc.StartTime(v.QEMU.PID)
			if err == nil {
				v.Boot = time.Since(start).Round(10 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, v := range st.VMPods {
		log.Info("VM pod guest up", "pod", v.Name, "ip", v.IP, "boot", v.Boot)
	}
	return waitVMBypassed(ctx, st, o.readyTimeout())
}

// configureGuestIPv6 gives the guest the pod's IPv6 address, as a KubeVirt
// user's cloud-init does (the bridge binding's DHCP hands out IPv4 only):
// the address as a /128 on eth0 and the default route via fe80::1, the
// pod's IPv6 gateway (an address of the node's side of every pod link), set
// through the guest's command port. A pod without IPv6 is left alone.
func configureGuestIPv6(ctx context.Context, v VMPod) error {
	v6 := guestIPv6(v)
	if !v6.IsValid() {
		return nil
	}
	s, err := vmguest.Dial(ctx, v.CommandSocket())
	if err != nil {
		return err
	}
	defer s.Close()
	cmd := fmt.Sprintf("ip -6 addr add %s/128 dev eth0 && ip -6 route replace default via %s dev eth0", v6, podIPv6Gateway)
	out, rc, err := s.Run(cmd, time.Minute)
	if err == nil && rc != 0 {
		err = fmt.Errorf("exit %d: %s", rc, strings.TrimSpace(out))
	}
	if err != nil {
		return fmt.Errorf("the guest's IPv6 (%s): %w", cmd, err)
	}
	return nil
}

// podIPv6Gateway is every pod's IPv6 default gateway (axon-cni).
const podIPv6Gateway = "fe80::1"

// guestIPv6 is the VM pod's IPv6 address, the guest's once up configured
// it (invalid: the pod has none).
func guestIPv6(v VMPod) netip.Addr {
	for _, a := range v.IPs {
		if a.Is6() {
			return a
		}
	}
	return netip.Addr{}
}

// addVMPod is addPod with virt-launcher's part: the Pod annotated for the
// bypass, then (after CNI ADD) the bridge binding, DHCP and QEMU.
func addVMPod(ctx context.Context, st *State, kube kubernetes.Interface, node, name string, g vmguest.Guest) (VMPod, error) {
	v := VMPod{Dir: filepath.Join(st.StateDir, vmDir, name)}
	x := podExtras{
		annotations: map[string]string{vmBypassAnnotation: "enabled"},
		afterADD: func(p *Pod) (func(), error) {
			if err := os.MkdirAll(v.Dir, 0o755); err != nil {
				return nil, err
			}
			undo := func() {
				_ = v.QEMU.Stop(5 * time.Second)
				_ = v.DHCP.Stop(5 * time.Second)
			}
			err := startVMLauncher(p, &v, g)
			return undo, err
		},
	}
	p, err := addPodWith(ctx, st, kube, node, name, DatapathAxon, x)
	if err != nil {
		return VMPod{}, err
	}
	v.Pod = p
	return v, nil
}

// startVMLauncher wires the pod's netns as KubeVirt's bridge binding does,
// starts the DHCP responder and QEMU (detached, in the pod's netns and
// cgroup) and leaves p.IP/IPs as the guest's IPv4 address.
func startVMLauncher(p *Pod, v *VMPod, g vmguest.Guest) error {
	v6 := netip.Addr{}
	for _, a := range p.IPs {
		if a.Is6() {
			v6 = a // the guest takes it too (configureGuestIPv6, once it is up)
		}
	}
	tap, lease, err := wireLauncher(*p)
	if err != nil {
		return err
	}
	defer tap.Close() // QEMU holds its own copy: the tap goes when QEMU does
	v.GuestMAC = lease.MAC.String()
	p.IP, p.IPs = lease.Addr.Addr(), []netip.Addr{lease.Addr.Addr()}
	if v6.IsValid() {
		p.IPs = append(p.IPs, v6)
	}
	nsPath := netnsutil.Path(p.Netns)
	argv, err := vmguest.DHCPArgv(nsPath, VMBridge, v.Dir, lease)
	if err != nil {
		return err
	}
	if v.DHCP, err = startInPod(p, proc.Spec{Argv: argv, Log: filepath.Join(v.Dir, "udhcpd.log")}); err != nil {
		return fmt.Errorf("start the DHCP responder: %w", err)
	}
	g.MAC = v.GuestMAC
	qemu, err := g.QEMUArgv(filepath.Join(v.Dir, "console.log"), v.CommandSocket())
	if err != nil {
		return err
	}
	argv = append([]string{"nsenter", "--net=" + nsPath, "--"}, qemu...)
	if v.QEMU, err = startInPod(p, proc.Spec{Argv: argv, Log: filepath.Join(v.Dir, "qemu.log"), ExtraFiles: []*os.File{tap}}); err != nil {
		return fmt.Errorf("start the guest: %w", err)
	}
	return nil
}

// startInPod starts s detached and moves it into the pod's cgroup, as
// virt-launcher's processes are the pod's.
func startInPod(p *Pod, s proc.Spec) (*Proc, error) {
	nsenter, err := exec.LookPath(s.Argv[0])
	if err != nil {
		return nil, err
	}
	s.Argv[0] = nsenter
	r, _, err := proc.Start(s)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(p.Cgroup, "cgroup.procs"), []byte(strconv.Itoa(r.PID)), 0o644); err != nil {
		_ = r.Stop(5 * time.Second)
		return nil, fmt.Errorf("move pid %d into the pod's cgroup: %w", r.PID, err)
	}
	return &r, nil
}

// wireLauncher does in the pod's netns what virt-launcher does for the bridge
// binding: it takes the pod interface's IPv4 address, MAC and gateway for the
// guest's lease, removes the addresses from eth0 and gives it a new MAC, and
// enslaves eth0 and a new tap (returned: QEMU's NIC) to the bridge k6t-eth0
// (169.254.75.10/32, the DHCP responder's), bridge netfilter off.
func wireLauncher(p Pod) (tap *os.File, lease vmguest.Lease, err error) {
	nl, h, err := netlinkAt(p.Netns)
	if err != nil {
		return nil, lease, err
	}
	defer h.Close()
	defer nl.Close()
	fail := func(format string, a ...any) (*os.File, vmguest.Lease, error) {
		if tap != nil {
			tap.Close()
		}
		return nil, lease, fmt.Errorf("VM pod %s: "+format, append([]any{p.Name}, a...)...)
	}
	eth, err := nl.LinkByName(p.IfName)
	if err != nil {
		return fail("find %s: %w", p.IfName, err)
	}
	lease.MAC = append(net.HardwareAddr(nil), eth.Attrs().HardwareAddr...)
	addrs, err := nl.AddrList(eth, netlink.FAMILY_ALL)
	if err != nil {
		return fail("addresses of %s: %w", p.IfName, err)
	}
	for _, a := range addrs {
		if a.IP.To4() != nil {
			pfx, ok := netip.AddrFromSlice(a.IP.To4())
			ones, _ := a.Mask.Size()
			if ok {
				lease.Addr = netip.PrefixFrom(pfx, ones)
			}
		}
	}
	if !lease.Addr.IsValid() {
		return fail("%s has no IPv4 address to hand to the guest (the bridge binding is IPv4)", p.IfName)
	}
	routes, err := nl.RouteList(eth, netlink.FAMILY_V4)
	if err != nil {
		return fail("routes of %s: %w", p.IfName, err)
	}
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw != nil {
			lease.Router, _ = netip.AddrFromSlice(r.Gw.To4())
		}
	}
	if !lease.Router.IsValid() {
		return fail("no IPv4 default route on %s", p.IfName)
	}
	lease.RouterOnLink = !lease.Addr.Contains(lease.Router)
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		if err := nl.AddrDel(eth, &a); err != nil {
			return fail("remove %s from %s: %w", a.IPNet, p.IfName, err)
		}
	}
	mac, err := randomMAC()
	if err != nil {
		return fail("%w", err)
	}
	if err := nl.LinkSetDown(eth); err != nil {
		return fail("set %s down: %w", p.IfName, err)
	}
	if err := nl.LinkSetHardwareAddr(eth, mac); err != nil {
		return fail("new MAC for %s: %w", p.IfName, err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: VMBridge, MTU: eth.Attrs().MTU}}
	if err := nl.LinkAdd(br); err != nil {
		return fail("add bridge %s: %w", VMBridge, err)
	}
	nsPath := netnsutil.Path(p.Netns)
	if err := brnf.Disable(nsPath); err != nil {
		return fail("%w", err)
	}
	if tap, err = vmguest.OpenTap(nsPath, VMTap); err != nil {
		return fail("%w", err)
	}
	for _, name := range []string{p.IfName, VMTap} {
		l, err := nl.LinkByName(name)
		if err != nil {
			return fail("find %s: %w", name, err)
		}
		if name == VMTap {
			if err := nl.LinkSetMTU(l, eth.Attrs().MTU); err != nil {
				return fail("MTU of %s: %w", name, err)
			}
		}
		if err := nl.LinkSetMasterByIndex(l, mustIndex(nl, VMBridge)); err != nil {
			return fail("enslave %s to %s: %w", name, VMBridge, err)
		}
		if err := nl.LinkSetUp(l); err != nil {
			return fail("set %s up: %w", name, err)
		}
	}
	brl, err := nl.LinkByName(VMBridge)
	if err != nil {
		return fail("find %s: %w", VMBridge, err)
	}
	ba, _ := netlink.ParseAddr(vmBridgeAddr)
	if err := nl.AddrAdd(brl, ba); err != nil {
		return fail("add %s to %s: %w", vmBridgeAddr, VMBridge, err)
	}
	if err := nl.LinkSetUp(brl); err != nil {
		return fail("set %s up: %w", VMBridge, err)
	}
	return tap, lease, nil
}

func mustIndex(nl *netlink.Handle, name string) int {
	l, err := nl.LinkByName(name)
	if err != nil {
		return 0 // LinkSetMasterByIndex then fails with the kernel's reason
	}
	return l.Attrs().Index
}

// randomMAC is a locally administered unicast MAC: eth0's new one once the
// guest has the pod's.
func randomMAC() (net.HardwareAddr, error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("random MAC: %w", err)
	}
	b[0] = b[0]&^1 | 2
	return b, nil
}

// waitVMBypassed waits until every VM pod's agent reports it bypassed.
func waitVMBypassed(ctx context.Context, st *State, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		var why []string
		for _, v := range st.VMPods {
			if s := vmBypassState(ctx, st, v); s != "bypassed" {
				why = append(why, fmt.Sprintf("%s: %s", v.Name, s))
			}
		}
		if len(why) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("VM pods not bypassed after %s: %s", timeout, strings.Join(why, "; "))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// vmPodEndpoint is v's endpoint as its node's agent lists it (`axon
// endpoint list`); why says why there is none.
func vmPodEndpoint(ctx context.Context, st *State, v VMPod) (ep api.Endpoint, why string) {
	n, ok := st.Node(v.Node)
	if !ok {
		return ep, "its node is not in the lab"
	}
	eps, err := api.NewClient(n.Socket).Endpoints(ctx)
	if err != nil {
		return ep, "the agent's endpoint list: " + err.Error()
	}
	for _, ep := range eps {
		if ep.PodName == v.Name && ep.PodNamespace == v.Namespace {
			return ep, ""
		}
	}
	return ep, "no endpoint of the pod in the agent"
}

// vmBypassState is what v's agent says of its bypass (`axon endpoint list`'s
// VM BYPASS column): "bypassed", "not bypassed: <reason>", or why it cannot tell.
func vmBypassState(ctx context.Context, st *State, v VMPod) string {
	ep, why := vmPodEndpoint(ctx, st, v)
	switch {
	case why != "":
		return why
	case ep.VMBypass == "":
		return "the agent does not count the pod as annotated " + vmBypassAnnotation + "=enabled"
	}
	return ep.VMBypass
}

// vmPodLBMissing says why v has no per-packet pod LB as its agent reports
// it ("" = attached): without it the guest's ClusterIP traffic leaves the
// pod untranslated (its sockets are not the node's: the socket LB never
// sees them).
func vmPodLBMissing(ctx context.Context, st *State, v VMPod) string {
	ep, why := vmPodEndpoint(ctx, st, v)
	switch {
	case why != "":
		return why
	case strings.HasPrefix(ep.PodLB, "attached"):
		return ""
	case ep.PodLB == "":
		return "the agent gives this VM pod no pod LB (neither the bypass nor axon.io/socket-lb: disabled), so its guest reaches no ClusterIP"
	}
	return "pod LB " + ep.PodLB
}

// stopVMPods stops every VM pod's QEMU and DHCP responder by PID.
func stopVMPods(st *State) []error {
	var errs []error
	for _, v := range st.VMPods {
		if err := v.QEMU.Stop(5 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stop the guest of %s: %w", v.Name, err))
		}
		if err := v.DHCP.Stop(5 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stop the DHCP responder of %s: %w", v.Name, err))
		}
	}
	return errs
}

// demoVMService is the k-th VM pod's Service (DemoVMService).
func demoVMService(k int, v VMPod) *corev1.Service {
	name, ip, nodePort := DemoVMService(k, v.Name)
	single := corev1.IPFamilyPolicySingleStack
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: DemoNamespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": demoManagedBy, "axon.dev/demo": "true"}},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeNodePort,
			Selector:       map[string]string{vmPodLabel: v.Name},
			IPFamilyPolicy: &single,
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol},
			ClusterIP:      ip.String(),
			ClusterIPs:     []string{ip.String()},
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: DemoPort,
				TargetPort: intstr.FromInt32(vmguest.EchoPort), NodePort: nodePort}},
		},
	}
}

// vmPodLabel selects a VM pod for its Service.
const vmPodLabel = "axon.dev/vm-pod"

// demoVMSlice is the EndpointSlice of the k-th VM pod's Service: its guest.
func demoVMSlice(k int, v VMPod) *discoveryv1.EndpointSlice {
	svc, _, _ := DemoVMService(k, v.Name)
	name, proto, port := "tcp", corev1.ProtocolTCP, int32(vmguest.EchoPort)
	yes, node := true, v.Node
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc + "-v4", Namespace: DemoNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: demoManagedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{v.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: new(bool)},
			NodeName:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: v.Namespace, Name: v.Name},
		}},
	}
}

// upDemoVMServices creates every VM pod's Service and waits until every
// agent's socket-LB maps hold them.
func upDemoVMServices(ctx context.Context, st *State, kube kubernetes.Interface) error {
	svcs := kube.CoreV1().Services(DemoNamespace)
	for i, v := range st.VMPods {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, vmPodLabel, v.Name)
		if _, err := kube.CoreV1().Pods(v.Namespace).Patch(ctx, v.Name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("label VM pod %s for its Service: %w", v.Name, err)
		}
		svc := demoVMService(i+1, v)
		if _, err := svcs.Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create service %s: %w", svc.Name, err)
		}
		if err := ensureEndpointSlice(ctx, kube, demoVMSlice(i+1, v)); err != nil {
			return err
		}
	}
	if len(st.VMPods) == 0 || serviceImpl(st) != "axon socket LB" {
		return nil // kube-proxy: its rules follow (the check retries per probe)
	}
	for i, v := range st.VMPods {
		_, ip, _ := DemoVMService(i+1, v.Name)
		if err := waitFrontend(ctx, st.Nodes, netip.AddrPortFrom(ip, DemoPort).String()+"/TCP", 20*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// waitFrontend waits until every agent's socket-LB maps hold frontend (as
// `axon bpf lb list` prints it).
func waitFrontend(ctx context.Context, nodes []Node, frontend string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, n := range nodes {
		c := api.NewClient(n.Socket)
		for {
			mr, err := c.LBMaps(ctx)
			if err == nil && mr.Enabled && strings.Contains(mr.Text, frontend) {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("agent of %s: %s not in its socket-LB maps after %s (%v)", n.Name, frontend, timeout, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

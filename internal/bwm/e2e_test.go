package bwm

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/bandwidth"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/testutil"
)

// The end-to-end topology (all namespaces created here, prefix axt-bw-):
//
//	pod netns ── veth (lxc… / eth0) ── node netns ── uplink eth0 ── peer netns
//	10.244.1.2/32                      axon datapath  198.18.0.11    198.18.0.250
//	                                   + EDT on eth0 egress + fq
//
// The uplink is the VM's back-to-back virtio-net pair when the test runs in
// the kernel-matrix VM ($AXON_VM_NIC_MACS), a veth pair otherwise. Pod
// traffic leaves through the axon pod program (bpf_redirect_neigh keeps
// skb->sk), returns through the uplink program (bpf_redirect_peer).

const (
	podIP   = "10.244.1.2"
	nodeIP  = "198.18.0.11"
	peerIP  = "198.18.0.250"
	pinRoot = "/sys/fs/bpf"
)

type topo struct {
	t               *testing.T
	node, pod, peer string // netns names
	hostIf          string // host side of the pod veth
	pin             string
	dp              *podpath.Datapath
	bwm             *bandwidth.Manager
	nodeNL          *netlink.Handle
	virtio          bool
	hostIfIndex     int
	podMAC, hostMAC string
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func inNS(ns string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + ns, "--"}, args...)...)
}

func nsRun(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := inNS(ns, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("[%s] %s: %v\n%s", ns, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func requireE2E(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t, "network namespaces, BPF, qdiscs")
	for _, tool := range []string{"ip", "nsenter", "iperf3", "sockperf", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (hack/install-packages.sh)", tool)
		}
	}
}

func fqAvailable() bool {
	for _, f := range datapath.Probe().List() {
		if f.Name == "sch_fq" {
			return f.Available
		}
	}
	return false
}

// requireFQ skips where the kernel has no sch_fq (the 6.18 dev host): EDT
// stamps need fq's timing wheel to mean anything.
func requireFQ(t *testing.T) {
	t.Helper()
	for _, f := range datapath.Probe().List() {
		if f.Name == "sch_fq" && !f.Available {
			t.Skipf("no sch_fq on this kernel (%s): run in the 6.12 VM: make test-vm KERNEL=debian-6.12 VM_PKGS=./internal/bwm VM_RUN=TestEDT VM_LAB=0", f.Reason)
		}
	}
}

// vmNICs returns the VM's back-to-back virtio-net pair when the test runs
// in the kernel-matrix VM and AXON_BW_UPLINK=virtio; the default uplink is
// a veth pair (TX completion is immediate, so a CPU-starved TCG guest does
// not hold TCP small queues back on late virtio TX interrupts).
func vmNICs() []string {
	macs := os.Getenv("AXON_VM_NIC_MACS")
	if macs == "" || os.Getenv("AXON_BW_UPLINK") != "virtio" {
		return nil
	}
	var names []string
	links, err := netlink.LinkList()
	if err != nil {
		return nil
	}
	for _, m := range strings.Split(macs, ",") {
		for _, l := range links {
			if strings.EqualFold(l.Attrs().HardwareAddr.String(), m) {
				names = append(names, l.Attrs().Name)
			}
		}
	}
	if len(names) != 2 {
		return nil
	}
	return names
}

func newTopo(t *testing.T) *topo {
	t.Helper()
	id := testutil.RandSuffix(t)
	tp := &topo{t: t, node: testutil.NewNetns(t, "axt-bw-node-"), pod: testutil.NewNetns(t, "axt-bw-pod-"), peer: testutil.NewNetns(t, "axt-bw-peer-"),
		hostIf: "lxcbw" + id, pin: filepath.Join(pinRoot, "axt-bw-"+id)}
	t.Cleanup(func() {
		testutil.InNetns(t, tp.node, func() error { return podpath.Uninstall(tp.pin) })
	})
	// uplink
	if nics := vmNICs(); nics != nil {
		tp.virtio = true
		run(t, "ip", "link", "set", nics[0], "netns", tp.node, "name", "eth0")
		run(t, "ip", "link", "set", nics[1], "netns", tp.peer, "name", "eth0")
	} else {
		run(t, "ip", "link", "add", "axtbw"+id, "netns", tp.node, "type", "veth", "peer", "name", "axtbwp"+id, "netns", tp.peer)
		nsRun(t, tp.node, "ip", "link", "set", "axtbw"+id, "name", "eth0")
		nsRun(t, tp.peer, "ip", "link", "set", "axtbwp"+id, "name", "eth0")
	}
	nsRun(t, tp.node, "ip", "addr", "add", nodeIP+"/24", "dev", "eth0")
	nsRun(t, tp.node, "ip", "link", "set", "eth0", "up")
	nsRun(t, tp.peer, "ip", "addr", "add", peerIP+"/24", "dev", "eth0")
	nsRun(t, tp.peer, "ip", "link", "set", "eth0", "up")
	nsRun(t, tp.peer, "ip", "route", "add", "10.244.0.0/16", "via", nodeIP)
	nsRun(t, tp.node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	// pod veth, wired like axon-cni does
	nsRun(t, tp.node, "ip", "link", "add", tp.hostIf, "type", "veth", "peer", "name", "eth0", "netns", tp.pod)
	nsRun(t, tp.node, "ip", "link", "set", tp.hostIf, "up")
	nsRun(t, tp.pod, "ip", "addr", "add", podIP+"/32", "dev", "eth0")
	nsRun(t, tp.pod, "ip", "link", "set", "eth0", "up")
	testutil.InNetns(t, tp.node, func() error {
		l, err := netlink.LinkByName(tp.hostIf)
		if err != nil {
			return err
		}
		tp.hostIfIndex, tp.hostMAC = l.Attrs().Index, l.Attrs().HardwareAddr.String()
		return nil
	})
	testutil.InNetns(t, tp.pod, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		tp.podMAC = l.Attrs().HardwareAddr.String()
		return nil
	})
	nsRun(t, tp.pod, "ip", "neigh", "add", "169.254.1.1", "lladdr", tp.hostMAC, "dev", "eth0", "nud", "permanent")
	nsRun(t, tp.pod, "ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
	nsRun(t, tp.pod, "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
	nsRun(t, tp.node, "ip", "route", "add", podIP+"/32", "dev", tp.hostIf)

	testutil.InNetns(t, tp.node, func() error {
		var err error
		tp.dp, err = podpath.Load(podpath.Config{PinDir: tp.pin, Uplink: "eth0"})
		if err != nil {
			return err
		}
		if err := tp.dp.AttachPod(tp.hostIf); err != nil {
			return err
		}
		podMAC, _ := parseMAC(tp.podMAC)
		hostMAC, _ := parseMAC(tp.hostMAC)
		if err := tp.dp.UpsertEndpoint(podpath.Endpoint{IP: netip.MustParseAddr(podIP), IfIndex: tp.hostIfIndex, PodMAC: podMAC, HostMAC: hostMAC}); err != nil {
			return err
		}
		tp.bwm, err = bandwidth.Load(bandwidth.Config{PinDir: tp.pin, Uplink: "eth0"})
		if err != nil {
			return err
		}
		ns, err := netns.GetFromName(tp.node)
		if err != nil {
			return err
		}
		defer ns.Close()
		tp.nodeNL, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE) // xfrm/netfilter sockets fail in the minimal VM
		return err
	})
	t.Cleanup(func() { tp.bwm.Close(); tp.dp.Close(); tp.nodeNL.Close() })
	if fqAvailable() {
		st, err := EnsureFQ(tp.nodeNL, "eth0", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("uplink qdisc: %+v", st)
	}
	// warm up ARP both ways
	nsRun(t, tp.pod, "ping", "-c1", "-W2", peerIP)
	return tp
}

func parseMAC(s string) ([]byte, error) {
	var b [6]byte
	_, err := fmt.Sscanf(s, "%02x:%02x:%02x:%02x:%02x:%02x", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5])
	return b[:], err
}

// setLimit programs the pod's limits (bits/s, 0 = none) with the agent's
// policy (pod GSO cap, egress catch-up credit).
func (tp *topo) setLimit(egress, ingress uint64) {
	tp.t.Helper()
	tp.setLimitWith(egress, ingress, agentPolicy)
}

// edtPolicy is what the agent does around an egress limit: the pod's GSO
// cap (time of the rate per GSO packet, floor) and the EDT catch-up credit.
type edtPolicy struct {
	name      string
	capTime   time.Duration // 0: no cap (64 KiB)
	capMin    uint32
	slack     time.Duration
	ignorePod bool // AXON_BW_F_IGNORE_POD_TSTAMP: the pod's own TCP delivery time is not honoured
	noBypass  bool // AXON_BW_F_NO_SMALL_BYPASS: small packets wait behind the pod's backlog
}

// agentPolicy is what internal/agent applies (bwm.PodGSOMaxSize, bwm.EgressSlack).
var agentPolicy = edtPolicy{name: "agent", capTime: PodGSOCapTime, capMin: PodGSOMin, slack: EgressSlack}

func (p edtPolicy) gso(bits uint64) uint32 {
	if p.capTime == 0 || bits == 0 {
		return 64 << 10
	}
	return GSOCap(bits, p.capTime, p.capMin)
}

// setLimitWith programs the pod's limits under policy p.
func (tp *topo) setLimitWith(egress, ingress uint64, p edtPolicy) {
	tp.t.Helper()
	var want []bandwidth.Limit
	if egress > 0 || ingress > 0 {
		want = append(want, bandwidth.Limit{Addrs: []netip.Addr{netip.MustParseAddr(podIP)}, EgressBits: egress, IngressBits: ingress})
	}
	tp.bwm.SetEgressSlack(p.slack)
	if err := tp.bwm.Apply(want, 2*time.Second); err != nil {
		tp.t.Fatal(err)
	}
	if egress > 0 {
		var f uint64
		if p.ignorePod {
			f |= flagIgnorePodTstamp
		}
		if p.noBypass {
			f |= flagNoSmallBypass
		}
		if err := setEgressFlags(tp.pin, netip.MustParseAddr(podIP), f); err != nil {
			tp.t.Fatal(err)
		}
	}
	// what the agent does for a pod with an egress limit (ensurePodGSOLocked)
	gso := uint32(64 << 10)
	if egress > 0 && os.Getenv("AXON_BW_POD_GSO") != "off" {
		gso = p.gso(egress)
	}
	if _, err := SetPodGSOMaxSize("/run/netns/"+tp.pod, "eth0", gso); err != nil {
		tp.t.Fatal(err)
	}
}

// server starts a background server in the peer netns, killed at cleanup.
func (tp *topo) server(args ...string) {
	tp.t.Helper()
	cmd := inNS(tp.peer, args...)
	if err := cmd.Start(); err != nil {
		tp.t.Fatal(err)
	}
	tp.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	time.Sleep(300 * time.Millisecond)
}

type iperfResult struct {
	bits    float64 // receiver goodput
	retrans int
}

// iperf runs one TCP flow from the pod (reverse: toward it) for d.
func (tp *topo) iperf(d time.Duration, port int, reverse bool) (iperfResult, error) {
	args := []string{"iperf3", "-c", peerIP, "-p", fmt.Sprint(port), "-t", fmt.Sprint(int(d.Seconds())), "-O", "1", "-J"}
	if reverse {
		args = append(args, "-R")
	}
	var out []byte
	var err error
	for try := 0; ; try++ { // the server may still be starting (TCG is slow)
		out, err = inNS(tp.pod, args...).Output()
		if err == nil || try == 20 || !strings.Contains(string(out), "unable to connect") {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		return iperfResult{}, fmt.Errorf("iperf3: %v: %s", err, out)
	}
	var r struct {
		End struct {
			SumSent     struct{ Retransmits int } `json:"sum_sent"`
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return iperfResult{}, fmt.Errorf("iperf3 JSON: %v", err)
	}
	if r.Error != "" {
		return iperfResult{}, fmt.Errorf("iperf3: %s", r.Error)
	}
	return iperfResult{bits: r.End.SumReceived.BitsPerSecond, retrans: r.End.SumSent.Retransmits}, nil
}

func pressure() string {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return "n/a"
	}
	return strings.SplitN(string(b), "\n", 2)[0]
}

func cpuCount() int { return runtime.NumCPU() }

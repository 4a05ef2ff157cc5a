package agent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
	"github.com/axonhq/axon/internal/testutil/controlplanetest"
)

// Ports of the test control plane: away from the lab's 6443/2379.
const (
	testAPIPort  = 16543
	testEtcdPort = 12479
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startControlPlane runs etcd + kube-apiserver in a temp dir on the agent
// tests' ports, stopped at cleanup.
func startControlPlane(t *testing.T) *controlplane.ControlPlane {
	return startControlPlaneOn(t, testAPIPort, testEtcdPort)
}

// startControlPlaneOn runs etcd + kube-apiserver in a temp dir on the given
// ports (each test file has its own, so packages tested in parallel never
// collide), stopped at cleanup. It skips only when the binaries are not built.
func startControlPlaneOn(t *testing.T, apiPort, etcdPort int) *controlplane.ControlPlane {
	t.Helper()
	return startControlPlaneWith(t, controlplane.Config{APIPort: apiPort, EtcdPort: etcdPort})
}

// startControlPlaneWith is startControlPlaneOn with more of the control
// plane's configuration (ports, service CIDR); the directory, the binaries
// and the logger are filled in.
func startControlPlaneWith(t *testing.T, cfg controlplane.Config) *controlplane.ControlPlane {
	t.Helper()
	cfg.Logger = testLogger(t)
	return controlplanetest.Start(t, cfg)
}

// agentRESTConfig is the client configuration the agent of node gets from
// cp (restConfig of its kubeconfig).
func agentRESTConfig(t *testing.T, cp *controlplane.ControlPlane, node string) *rest.Config {
	t.Helper()
	kubeconfig, err := cp.AgentKubeconfig(node)
	must(t, err)
	rc, err := restConfig(kubeconfig)
	must(t, err)
	return rc
}

// scratchNode is a node network namespace with an uplink eth0.
type scratchNode struct {
	name, path string
	nl         *netlink.Handle
	ns         netns.NsHandle
}

func newScratchNode(t *testing.T) *scratchNode {
	t.Helper()
	name := testutil.NewNetns(t, "axt-agent-")
	n := &scratchNode{name: name, path: netnsutil.Path(name)}
	var err error
	if n.ns, err = netns.GetFromPath(n.path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.ns.Close() })
	if n.nl, err = netlink.NewHandleAt(n.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.nl.Close)
	// the kernel here has no dummy driver: the uplink is a veth whose peer stays in the netns
	must(t, n.nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0peer"}))
	peer, err := n.nl.LinkByName("eth0peer")
	if err != nil {
		t.Fatal(err)
	}
	must(t, n.nl.LinkSetUp(peer))
	eth0, err := n.nl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"198.18.0.11/24", "fd00:198:18::11/64"} {
		addr, _ := netlink.ParseAddr(a)
		addr.Flags = unix.IFA_F_NODAD
		must(t, n.nl.AddrAdd(eth0, addr))
	}
	must(t, n.nl.LinkSetUp(eth0))
	return n
}

// addPod does what axon-cni's ADD does to the devices: a new pod netns, a
// veth host (marked "axon-cni:<containerID>/<ifName>") in the node netns
// whose peer is ifName in the pod netns. It returns (host index, host MAC,
// pod MAC, pod netns path).
func (n *scratchNode) addPod(t *testing.T, host, containerID, ifName string) (int, net.HardwareAddr, net.HardwareAddr, string) {
	t.Helper()
	podPath := netnsutil.Path(testutil.NewNetns(t, "axt-pod-"))
	podNS, err := netns.GetFromPath(podPath)
	if err != nil {
		t.Fatal(err)
	}
	defer podNS.Close()
	must(t, n.nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host, Alias: "axon-cni:" + containerID + "/" + ifName},
		PeerName: ifName, PeerNamespace: netlink.NsFd(int(podNS))}))
	h, err := n.nl.LinkByName(host)
	if err != nil {
		t.Fatal(err)
	}
	if h.Attrs().Alias == "" { // kernels that ignore IFLA_IFALIAS on create
		must(t, n.nl.LinkSetAlias(h, "axon-cni:"+containerID+"/"+ifName))
	}
	ph, err := netlink.NewHandleAt(podNS)
	if err != nil {
		t.Fatal(err)
	}
	defer ph.Close()
	p, err := ph.LinkByName(ifName)
	if err != nil {
		t.Fatal(err)
	}
	must(t, n.nl.LinkSetUp(h))
	must(t, ph.LinkSetUp(p))
	return h.Attrs().Index, h.Attrs().HardwareAddr, p.Attrs().HardwareAddr, podPath
}

// refusedCounts reads axon_api_refused_total by reason from /metrics.
func (n *scratchNode) refusedCounts(t *testing.T) map[string]int {
	t.Helper()
	code, body, err := n.httpGet("http://127.0.0.1:19876/metrics")
	if err != nil || code != 200 {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(body, "\n") {
		var reason string
		var v int
		if _, err := fmt.Sscanf(line, "axon_api_refused_total{reason=%q} %d", &reason, &v); err == nil {
			out[reason] = v
		}
	}
	if len(out) == 0 {
		t.Fatalf("no axon_api_refused_total in /metrics:\n%.2000s", body)
	}
	return out
}

// axonRoutes lists the routes with the agent's protocol in the node netns.
func (n *scratchNode) axonRoutes(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := n.nl.RouteListFiltered(fam, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			dev := "?"
			if l, err := n.nl.LinkByIndex(r.LinkIndex); err == nil {
				dev = l.Attrs().Name
			}
			out[r.Dst.String()] = fmt.Sprintf("via %s dev %s proto %#x", r.Gw, dev, int(r.Protocol))
		}
	}
	return out
}

// httpGet fetches url with a TCP connection made inside the node netns (a
// socket keeps the netns it was created in).
func (n *scratchNode) httpGet(url string) (int, string, error) {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := netnsutil.Do(n.name, func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
	resp, err := hc.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// agentCapsEnv, when set to a list such as "bpf,perfmon,net_admin,sys_admin",
// starts every test agent with exactly these capabilities (setpriv: the
// bounding set, nothing inherited or ambient), as a Kubernetes container
// with `capabilities: {drop: [ALL], add: [...]}` runs it. docs/operate.md
// lists the set the tests pass with and why each is needed.
const agentCapsEnv = "AXON_TEST_AGENT_CAPS"

// capsBoundingArgs is setpriv's command line for the capability list caps.
func capsBoundingArgs(caps string) []string {
	set := "-all"
	for _, c := range strings.Split(caps, ",") {
		if c = strings.TrimSpace(c); c != "" {
			set += ",+" + strings.TrimPrefix(strings.ToLower(c), "cap_")
		}
	}
	return []string{"setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=" + set}
}

// agentProc is an agent started with nsenter in a scratch netns.
type agentProc struct {
	cmd  *exec.Cmd
	done chan error
	log  string
}

// startAgent starts the agent; it is stopped at owner's cleanup (the
// top-level test, so that a restart inside a subtest outlives the subtest).
func startAgent(t, owner *testing.T, n *scratchNode, cfg Config, logFile string) *agentProc {
	t.Helper()
	return startAgentEnv(t, owner, n, cfg, logFile)
}

// startAgentEnv is startAgent with more environment variables (NAME=value).
func startAgentEnv(t, owner *testing.T, n *scratchNode, cfg Config, logFile string, env ...string) *agentProc {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "---- agent start %s\n", time.Now().Format(time.RFC3339Nano))
	argv := []string{"--net=" + n.path}
	if caps := os.Getenv(agentCapsEnv); caps != "" {
		argv = append(argv, capsBoundingArgs(caps)...)
	}
	cmd := exec.Command("nsenter", append(argv, os.Args[0], "-test.run=^$")...)
	cmd.Env = append(append(os.Environ(), env...), helperEnv+"="+string(raw))
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &agentProc{cmd: cmd, done: make(chan error, 1), log: logFile}
	go func() { p.done <- cmd.Wait() }()
	owner.Cleanup(func() { p.stop(owner) })
	return p
}

// stop sends SIGTERM and waits (SIGKILL after 15 s). Safe to call twice.
func (p *agentProc) stop(t *testing.T) {
	t.Helper()
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("agent exited with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("agent did not stop on SIGTERM within 15s; killing pid %d", p.cmd.Process.Pid)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func eventually(t *testing.T, what string, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pinnedEndpoints reads the endpoint maps pinned by the datapath (read-only;
// layout of struct endpoint_info: u32 ifindex, u8 pod_mac[6], u8 host_mac[6], u32 flags).
func pinnedEndpoints(t *testing.T, pinDir string) map[netip.Addr]MapEntry {
	t.Helper()
	out := map[netip.Addr]MapEntry{}
	for _, name := range []string{"axon_ep_v4", "axon_ep_v6"} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			t.Fatalf("open pinned map %s: %v", name, err)
		}
		key := make([]byte, m.KeySize())
		val := make([]byte, m.ValueSize())
		it := m.Iterate()
		for it.Next(&key, &val) {
			a, _ := netip.AddrFromSlice(key)
			out[a] = MapEntry{IP: a, IfIndex: int(binary.NativeEndian.Uint32(val[0:4])),
				PodMAC: slices.Clone(net.HardwareAddr(val[4:10])), HostMAC: slices.Clone(net.HardwareAddr(val[10:16]))}
		}
		if err := it.Err(); err != nil {
			t.Fatalf("iterate %s: %v", name, err)
		}
		m.Close()
	}
	return out
}

// pinnedLinkID returns the kernel ID of a pinned tcx link, 0 when absent.
func pinnedLinkID(t *testing.T, pin string) link.ID {
	t.Helper()
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatalf("load pinned link %s: %v", pin, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

func node(name string, ips []string, cidrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: cidrs}}
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
	}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	return n
}

func createNode(t *testing.T, cs kubernetes.Interface, n *corev1.Node) {
	t.Helper()
	ctx := context.Background()
	st := n.Status
	created, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", n.Name, err)
	}
	created.Status = st
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node %s status: %v", n.Name, err)
	}
}

// TestAgentAgainstAPIServer runs the agent in a scratch node netns against a
// real etcd + kube-apiserver, with the agent's least-privilege kubeconfig.
func TestAgentAgainstAPIServer(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces, loads BPF programs, pins under /sys/fs/bpf")
	cp := startControlPlane(t)
	cs, err := cp.Client()
	must(t, err)
	ctx := context.Background()
	n := newScratchNode(t)

	// The apiserver listens on root-netns loopback: forward it into the node netns.
	fwd, err := controlplane.ListenForwarder([]string{n.path}, fmt.Sprintf("127.0.0.1:%d", testAPIPort),
		fmt.Sprintf("127.0.0.1:%d", testAPIPort), testLogger(t))
	must(t, err)
	fwdCtx, stopFwd := context.WithCancel(ctx)
	fwdDone := make(chan struct{})
	go func() { defer close(fwdDone); _ = fwd.Serve(fwdCtx) }()
	closeFwd := func() { stopFwd(); fwd.Close(); <-fwdDone }
	t.Cleanup(closeFwd)

	kubeconfig, err := cp.AgentKubeconfig("node1")
	must(t, err)
	dir := t.TempDir()
	pinDir := filepath.Join("/sys/fs/bpf", "axt-agent-"+testutil.RandSuffix(t))
	// Registered before the agent starts, so it runs after the agent stopped
	// and the netns is gone (tcx links die with their devices).
	t.Cleanup(func() { _ = os.RemoveAll(pinDir) })
	// Never the machine's cgroup2 root: a private cgroup, removed at the end
	// (registered before the pin cleanup, so it runs after it).
	cgRoot := testCgroup(t)
	cfg := Defaults()
	cfg.CgroupRoot = cgRoot
	cfg.NodeName = "node1"
	cfg.Kubeconfig = kubeconfig
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Socket = filepath.Join(dir, "axon.sock")
	cfg.BPFRoot = pinDir
	cfg.HealthAddr = "127.0.0.1:19876" // inside the node netns
	// the "unreachable apiserver" step waits for the /version probe to fail: every
	// second, not the product's 10 s (the probe and what follows a failure are the same)
	cfg.APIServerProbeInterval = time.Second
	// no --uplink: the netns has no default route, so the agent must find
	// the device holding node1's InternalIP (eth0)
	logFile := filepath.Join(dir, "agent.log")
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("AXON_TEST_AGENT_LOG") != "" {
			b, _ := os.ReadFile(logFile)
			t.Logf("agent log:\n%s", b)
		}
	})

	createNode(t, cs, node("node1", []string{"198.18.0.11", "fd00:198:18::11"})) // no podCIDR yet
	createNode(t, cs, node("node2", []string{"198.18.0.12", "fd00:198:18::12"}, "10.244.2.0/24", "fd00:10:244:2::/64"))
	createNode(t, cs, node("node3", []string{"198.18.0.13"}, "10.244.3.0/24"))

	top := t
	agent := startAgent(t, top, n, cfg, logFile)
	c := api.NewClient(cfg.Socket)

	t.Run("node without podCIDR is not ready", func(t *testing.T) {
		want := "node node1 has no spec.podCIDRs: assign one (kube-controller-manager --allocate-node-cidrs) or set it on the Node"
		eventually(t, "status explains the missing podCIDR", 60*time.Second, func() error {
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			if st.Ready || !st.APIServer.Synced || !strings.Contains(st.Message, want) {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
		_, err := c.Allocate(ctx, api.AllocateRequest{ContainerID: "c0", IfName: "eth0"})
		if !api.IsStatus(err, 503) || !strings.Contains(err.Error(), want) {
			t.Fatalf("Allocate without podCIDR: err = %v, want 503 %q", err, want)
		}
		if err := c.Healthy(ctx); err == nil || !strings.Contains(err.Error(), "no spec.podCIDRs") {
			t.Fatalf("healthz: %v", err)
		}
	})

	t.Run("routes to other nodes", func(t *testing.T) {
		want := map[string]string{
			"10.244.2.0/24":      "via 198.18.0.12 dev eth0 proto 0xa0",
			"fd00:10:244:2::/64": "via fd00:198:18::12 dev eth0 proto 0xa0",
			"10.244.3.0/24":      "via 198.18.0.13 dev eth0 proto 0xa0",
		}
		eventually(t, "routes programmed", 20*time.Second, func() error {
			if got := n.axonRoutes(t); !mapsEqual(got, want) {
				return fmt.Errorf("routes %v, want %v", got, want)
			}
			return nil
		})
	})

	t.Run("podCIDR assigned makes it ready", func(t *testing.T) {
		patch := `{"spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24","fd00:10:244:1::/64"]}}`
		_, err := cs.CoreV1().Nodes().Patch(ctx, "node1", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		must(t, err)
		eventually(t, "agent ready", 30*time.Second, func() error {
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			if !st.Ready {
				return fmt.Errorf("not ready: %s", st.Message)
			}
			want := []netip.Prefix{pfx("10.244.1.0/24"), pfx("fd00:10:244:1::/64")}
			if !slices.Equal(st.PodCIDRs, want) || st.Uplink != "eth0" || st.Routes != 3 || len(st.Datapath) < 2 {
				return fmt.Errorf("status %+v", st)
			}
			if d := findDecision(st.Datapath, DecisionSocketLB); d.Value != "enabled" || !strings.HasPrefix(d.Reason, "cgroup "+cgRoot+",") {
				return fmt.Errorf("socket_lb decision %+v, want enabled on cgroup %s", d, cgRoot)
			}
			return nil
		})
		must(t, c.Healthy(ctx))
		code, body, err := n.httpGet("http://127.0.0.1:19876/healthz")
		if err != nil || code != 200 || strings.TrimSpace(body) != "ok" {
			t.Fatalf("GET /healthz: %d %q %v", code, body, err)
		}
		code, body, err = n.httpGet("http://127.0.0.1:19876/metrics")
		for _, want := range []string{"axon_agent_ready 1", "axon_agent_routes 3", `axon_datapath_packets_total{direction="pod_egress"`, "go_goroutines",
			"axon_services_last_write_timestamp_seconds ", "axon_services_writes_total ", "axon_services_full_sync_seconds ",
			// client-go's hooks (internal/kubemetrics): the agent's GETs and watches, its Service workqueue.
			`rest_client_requests_total{code="200",host="127.0.0.1:`, `rest_client_request_duration_seconds_bucket{host="127.0.0.1:`,
			`rest_client_rate_limiter_duration_seconds_count{host="127.0.0.1:`, `workqueue_depth{name="services"}`, `workqueue_adds_total{name="services"}`,

			`axon_drop_count_total{direction="ingress",reason="drop_spoof_src"}`, `axon_drop_events_total{result="emitted"} 0`,
			`axon_socklb_map_max_entries{map="axon_lb_svc"}`} {
			if err != nil || code != 200 || !strings.Contains(body, want) {
				t.Errorf("GET /metrics: %d %v: no %q in\n%.2000s", code, err, want, body)
			}
		}
	})

	t.Run("sysdump", func(t *testing.T) { checkSysdump(t, n, cfg, logFile) })

	t.Run("node deletion removes its route", func(t *testing.T) {
		must(t, cs.CoreV1().Nodes().Delete(ctx, "node3", metav1.DeleteOptions{}))
		eventually(t, "node3 route gone", 20*time.Second, func() error {
			got := n.axonRoutes(t)
			if _, ok := got["10.244.3.0/24"]; ok || len(got) != 2 {
				return fmt.Errorf("routes %v", got)
			}
			return nil
		})
	})

	var addrs []api.Address
	t.Run("allocate from the podCIDR", func(t *testing.T) {
		resp, err := c.Allocate(ctx, api.AllocateRequest{ContainerID: "c1", IfName: "eth0", PodName: "pod1", PodNamespace: "default"})
		must(t, err)
		if len(resp.Addresses) != 2 || !pfx("10.244.1.0/24").Contains(resp.Addresses[0].IP) || !pfx("fd00:10:244:1::/64").Contains(resp.Addresses[1].IP) {
			t.Fatalf("addresses %+v", resp.Addresses)
		}
		again, err := c.Allocate(ctx, api.AllocateRequest{ContainerID: "c1", IfName: "eth0"})
		must(t, err)
		if !slices.Equal(again.Addresses, resp.Addresses) {
			t.Fatalf("second allocate %+v, first %+v", again.Addresses, resp.Addresses)
		}
		addrs = resp.Addresses
	})
	if len(addrs) != 2 {
		t.FailNow()
	}

	hostIdx, hostMAC, podMAC, pod1NS := n.addPod(t, "lxcaxt1", "c1", "eth0")
	ep := api.Endpoint{ContainerID: "c1", IfName: "eth0", Netns: pod1NS, PodName: "pod1", PodNamespace: "default",
		IPs: []netip.Addr{addrs[0].IP, addrs[1].IP}, HostIfName: "lxcaxt1", HostIfIndex: hostIdx, HostMAC: hostMAC, PodMAC: podMAC}
	wantEntries := map[netip.Addr]MapEntry{
		addrs[0].IP: {IP: addrs[0].IP, IfIndex: hostIdx, PodMAC: podMAC, HostMAC: hostMAC},
		addrs[1].IP: {IP: addrs[1].IP, IfIndex: hostIdx, PodMAC: podMAC, HostMAC: hostMAC},
	}
	podPin := filepath.Join(pinDir, "links", "tcx-pod-lxcaxt1")
	uplinkPin := filepath.Join(pinDir, "links", "tcx-uplink-eth0")

	t.Run("put endpoint writes the map", func(t *testing.T) {
		must(t, c.PutEndpoint(ctx, ep))
		if got := pinnedEndpoints(t, pinDir); !entriesEqual(got, wantEntries) {
			t.Fatalf("endpoint map %+v, want %+v", got, wantEntries)
		}
		if pinnedLinkID(t, podPin) == 0 {
			t.Fatalf("no pinned pod link at %s", podPin)
		}
		eps, err := c.Endpoints(ctx)
		must(t, err)
		if len(eps) != 1 || eps[0].State != "orphan" {
			t.Fatalf("endpoints %+v, want one orphan (no Pod object yet)", eps)
		}
		// another endpoint claiming the same IP is refused and changes nothing
		dup := ep
		dup.ContainerID = "c9"
		if err := c.PutEndpoint(ctx, dup); !api.IsStatus(err, 409) {
			t.Fatalf("duplicate IP: err = %v, want 409", err)
		}
		if got := pinnedEndpoints(t, pinDir); !entriesEqual(got, wantEntries) {
			t.Fatalf("endpoint map changed by a refused PUT: %+v", got)
		}
	})

	t.Run("put endpoint accepts only what the attachment owns", func(t *testing.T) {
		// c5/eth0 has a real allocation and a real pod device; each case
		// changes one field of its correct PUT
		resp, err := c.Allocate(ctx, api.AllocateRequest{ContainerID: "c5", IfName: "eth0"})
		must(t, err)
		ips5 := []netip.Addr{resp.Addresses[0].IP, resp.Addresses[1].IP}
		idx5, hmac5, pmac5, pod5NS := n.addPod(t, "lxcaxt5", "c5", "eth0")
		good := api.Endpoint{ContainerID: "c5", IfName: "eth0", Netns: pod5NS, PodName: "pod5", PodNamespace: "default",
			IPs: ips5, HostIfName: "lxcaxt5", HostIfIndex: idx5, HostMAC: hmac5, PodMAC: pmac5}
		// a device axon-cni made for another attachment, and one whose peer stayed in the node netns
		n.addPod(t, "lxcaxt6", "c6", "eth0")
		must(t, n.nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lxcaxt7", Alias: "axon-cni:c5/eth0"}, PeerName: "lxcaxt7p"}))
		if l, err := n.nl.LinkByName("lxcaxt7"); err == nil && l.Attrs().Alias == "" {
			must(t, n.nl.LinkSetAlias(l, "axon-cni:c5/eth0"))
		}
		for _, tt := range []struct {
			name   string
			change func(*api.Endpoint)
			code   int
			reason string
			msg    string
		}{
			{"address never allocated", func(e *api.Endpoint) { e.IPs = []netip.Addr{netip.MustParseAddr("10.244.1.200")} },
				403, "address_not_allocated", "is not allocated to c5/eth0"},
			{"address of another attachment's allocation", func(e *api.Endpoint) { e.ContainerID = "c4x" },
				403, "address_not_allocated", "is not allocated to c4x/eth0"},
			{"the uplink", func(e *api.Endpoint) { e.HostIfName = "eth0" }, 403, "device_not_pod", "it is the node's uplink"},
			{"lo", func(e *api.Endpoint) { e.HostIfName = "lo" }, 403, "device_not_pod", "not a veth or netkit"},
			{"another endpoint's device", func(e *api.Endpoint) { e.HostIfName = "lxcaxt1" }, 409, "device_in_use", "already belongs to endpoint c1/eth0"},
			{"a device made for another attachment", func(e *api.Endpoint) { e.HostIfName = "lxcaxt6" }, 403, "device_not_pod", `not "axon-cni:c5/eth0"`},
			{"peer in the node netns", func(e *api.Endpoint) { e.HostIfName = "lxcaxt7" }, 403, "device_not_pod", "is not the peer of eth0"},
			{"another pod's netns", func(e *api.Endpoint) { e.Netns = pod1NS }, 403, "device_not_pod", "not"},
			{"the node's netns", func(e *api.Endpoint) { e.Netns = n.path }, 403, "device_not_pod", "the node's own network namespace"},
			{"no netns", func(e *api.Endpoint) { e.Netns = "" }, 403, "device_not_pod", "netns is empty"},
			{"a netns path that is not one", func(e *api.Endpoint) { e.Netns = "/etc/hostname" }, 403, "device_not_pod", "is not a network namespace"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				before := n.refusedCounts(t)
				e := good
				e.IPs = slices.Clone(good.IPs)
				tt.change(&e)
				err := c.PutEndpoint(ctx, e)
				if !api.IsStatus(err, tt.code) || !strings.Contains(err.Error(), tt.msg) {
					t.Fatalf("PUT: %v, want %d with %q", err, tt.code, tt.msg)
				}
				if got := pinnedEndpoints(t, pinDir); !entriesEqual(got, wantEntries) {
					t.Errorf("endpoint map changed by a refused PUT: %+v", got)
				}
				for _, dev := range []string{"lxcaxt5", "lxcaxt6", "lxcaxt7", "lo", "eth0"} {
					if id := pinnedLinkID(t, filepath.Join(pinDir, "links", "tcx-pod-"+dev)); id != 0 {
						t.Errorf("a refused PUT attached the pod program to %s (link %d)", dev, id)
					}
				}
				if eps, err := c.Endpoints(ctx); err != nil || len(eps) != 1 {
					t.Errorf("endpoints after a refused PUT: %+v %v", eps, err)
				}
				if after := n.refusedCounts(t); after[tt.reason] != before[tt.reason]+1 {
					t.Errorf("axon_api_refused_total{reason=%q} %d -> %d, want +1", tt.reason, before[tt.reason], after[tt.reason])
				}
			})
		}
		// the correct PUT goes through, then leaves again
		must(t, c.PutEndpoint(ctx, good))
		if got := pinnedEndpoints(t, pinDir); len(got) != len(wantEntries)+2 {
			t.Errorf("endpoint map after the correct PUT: %+v", got)
		}
		must(t, c.DeleteEndpoint(ctx, api.Attachment{ContainerID: "c5", IfName: "eth0"}))
		if got := pinnedEndpoints(t, pinDir); !entriesEqual(got, wantEntries) {
			t.Errorf("endpoint map after deleting c5: %+v", got)
		}
	})

	t.Run("pod object marks the endpoint ready", func(t *testing.T) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod1", Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		_, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		must(t, err)
		eventually(t, "endpoint ready", 20*time.Second, func() error {
			eps, err := c.Endpoints(ctx)
			if err != nil {
				return err
			}
			if len(eps) != 1 || eps[0].State != "ready" {
				return fmt.Errorf("endpoints %+v", eps)
			}
			return nil
		})
	})

	t.Run("restart keeps map entries and pinned links", func(t *testing.T) {
		podLink, upLink := pinnedLinkID(t, podPin), pinnedLinkID(t, uplinkPin)
		if podLink == 0 || upLink == 0 {
			t.Fatalf("pinned links: pod %d uplink %d", podLink, upLink)
		}
		agent.stop(t)
		if got := pinnedEndpoints(t, pinDir); !entriesEqual(got, wantEntries) {
			t.Fatalf("endpoint map while the agent is down %+v", got)
		}
		agent = startAgent(t, top, n, cfg, logFile)
		eventually(t, "ready after restart", 60*time.Second, func() error {
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			if !st.Ready || st.Endpoints != 1 {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
		if got := pinnedLinkID(t, podPin); got != podLink {
			t.Errorf("pod link ID %d after restart, want %d (same link)", got, podLink)
		}
		if got := pinnedLinkID(t, uplinkPin); got != upLink {
			t.Errorf("uplink link ID %d after restart, want %d (same link)", got, upLink)
		}
		if got := pinnedEndpoints(t, pinDir); !entriesEqual(got, wantEntries) {
			t.Errorf("endpoint map after restart %+v", got)
		}
	})

	t.Run("stale map entry is reconciled away", func(t *testing.T) {
		// a map entry nobody registered (e.g. left by a crash) goes; registered ones stay
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "axon_ep_v4"), nil)
		must(t, err)
		defer m.Close()
		stale := netip.MustParseAddr("10.244.1.250").As4()
		val := make([]byte, m.ValueSize())
		binary.NativeEndian.PutUint32(val, uint32(hostIdx))
		must(t, m.Put(stale, val))
		// the periodic reconcile is 30 s; a Node event triggers one sooner
		_, err = cs.CoreV1().Nodes().Patch(ctx, "node2", types.StrategicMergePatchType, []byte(`{"metadata":{"labels":{"poke":"1"}}}`), metav1.PatchOptions{})
		must(t, err)
		eventually(t, "stale entry deleted", 20*time.Second, func() error {
			if got := pinnedEndpoints(t, pinDir); !entriesEqual(got, wantEntries) {
				return fmt.Errorf("map %+v", got)
			}
			return nil
		})
	})

	t.Run("unreachable apiserver: status says so, socket keeps serving", func(t *testing.T) {
		closeFwd()
		eventually(t, "status reports unreachable", 30*time.Second, func() error {
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			if st.APIServer.Connected || !strings.Contains(st.APIServer.Message, "unreachable") || !strings.Contains(st.APIServer.Message, "retrying") {
				return fmt.Errorf("apiServer %+v", st.APIServer)
			}
			return nil
		})
		// a restart without apiserver comes up, serves, keeps the datapath
		agent.stop(t)
		agent = startAgent(t, top, n, cfg, logFile)
		eventually(t, "restarted agent serves without apiserver", 30*time.Second, func() error {
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			if st.Ready || !strings.Contains(st.APIServer.Message, "https://127.0.0.1") || !strings.Contains(st.APIServer.Message, "unreachable") ||
				len(st.Datapath) < 2 || st.Uplink != "eth0" {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
		if got := pinnedEndpoints(t, pinDir); !entriesEqual(got, wantEntries) {
			t.Errorf("endpoint map without apiserver %+v", got)
		}
		// CNI ADD still works from the saved podCIDRs
		resp, err := c.Allocate(ctx, api.AllocateRequest{ContainerID: "c2", IfName: "eth0"})
		must(t, err)
		must(t, c.Release(ctx, api.ReleaseRequest{ContainerID: "c2", IfName: "eth0"}))
		if len(resp.Addresses) != 2 {
			t.Errorf("allocate without apiserver: %+v", resp)
		}
	})

	t.Run("apiserver back: agent syncs and becomes ready", func(t *testing.T) {
		fwd2, err := controlplane.ListenForwarder([]string{n.path}, fmt.Sprintf("127.0.0.1:%d", testAPIPort),
			fmt.Sprintf("127.0.0.1:%d", testAPIPort), testLogger(t))
		must(t, err)
		fctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = fwd2.Serve(fctx) }()
		top.Cleanup(func() { stop(); fwd2.Close(); <-done })
		eventually(t, "ready again", 90*time.Second, func() error {
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			if !st.Ready || !st.APIServer.Connected || !st.APIServer.Synced {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
	})

	t.Run("gc removes what is not valid", func(t *testing.T) {
		resp, err := c.Allocate(ctx, api.AllocateRequest{ContainerID: "c3", IfName: "eth0"})
		must(t, err)
		idx, hmac, pmac, podNS := n.addPod(t, "lxcaxt3", "c3", "eth0")
		must(t, c.PutEndpoint(ctx, api.Endpoint{ContainerID: "c3", IfName: "eth0", Netns: podNS, IPs: []netip.Addr{resp.Addresses[0].IP},
			HostIfName: "lxcaxt3", HostIfIndex: idx, HostMAC: hmac, PodMAC: pmac}))
		// an allocation without endpoint (ADD failed half-way) is also garbage
		_, err = c.Allocate(ctx, api.AllocateRequest{ContainerID: "c4", IfName: "eth0"})
		must(t, err)
		// an empty keep-list without "all" (and "all" with a list) removes nothing
		before := n.refusedCounts(t)
		for _, bad := range []api.GCRequest{{}, {Valid: []api.Attachment{}}, {All: true, Valid: []api.Attachment{{ContainerID: "c1", IfName: "eth0"}}}} {
			if _, err := c.GC(ctx, bad); !api.IsStatus(err, 400) || !strings.Contains(err.Error(), `"all"`) {
				t.Errorf("GC %+v: %v, want 400 naming \"all\"", bad, err)
			}
		}
		if eps, err := c.Endpoints(ctx); err != nil || len(eps) != 2 {
			t.Errorf("endpoints after refused GCs: %+v %v, want c1 and c3", eps, err)
		}
		if after := n.refusedCounts(t); after["gc_empty_list"] != before["gc_empty_list"]+2 {
			t.Errorf("axon_api_refused_total{reason=\"gc_empty_list\"} %d -> %d, want +2", before["gc_empty_list"], after["gc_empty_list"])
		}
		gc, err := c.GC(ctx, api.GCRequest{Valid: []api.Attachment{{ContainerID: "c1", IfName: "eth0"}}})
		must(t, err)
		want := []api.Attachment{{ContainerID: "c3", IfName: "eth0"}, {ContainerID: "c4", IfName: "eth0"}}
		if !slices.Equal(gc.Removed, want) {
			t.Errorf("gc removed %+v, want %+v", gc.Removed, want)
		}
		if got := pinnedEndpoints(t, pinDir); !entriesEqual(got, wantEntries) {
			t.Errorf("endpoint map after gc %+v, want %+v", got, wantEntries)
		}
		if id := pinnedLinkID(t, filepath.Join(pinDir, "links", "tcx-pod-lxcaxt3")); id != 0 {
			t.Errorf("gc left the pod link of lxcaxt3 (id %d)", id)
		}
		if id := pinnedLinkID(t, podPin); id == 0 {
			t.Errorf("gc removed the valid pod link of lxcaxt1")
		}
	})

	t.Run("delete is idempotent", func(t *testing.T) {
		for i := range 2 {
			if err := c.DeleteEndpoint(ctx, api.Attachment{ContainerID: "c1", IfName: "eth0"}); err != nil {
				t.Fatalf("delete #%d: %v", i+1, err)
			}
		}
		if got := pinnedEndpoints(t, pinDir); len(got) != 0 {
			t.Errorf("endpoint map after delete %+v", got)
		}
		if id := pinnedLinkID(t, podPin); id != 0 {
			t.Errorf("pod link %d still pinned after delete", id)
		}
		eps, err := c.Endpoints(ctx)
		must(t, err)
		if len(eps) != 0 {
			t.Errorf("endpoints after delete %+v", eps)
		}
		if _, err := os.Stat(filepath.Join(cfg.StateDir, "endpoints", "c1_eth0.json")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("endpoint record still on disk: %v", err)
		}
		// "all" removes what is left, here an allocation without endpoint
		_, err = c.Allocate(ctx, api.AllocateRequest{ContainerID: "c8", IfName: "eth0"})
		must(t, err)
		gc, err := c.GC(ctx, api.GCRequest{All: true})
		must(t, err)
		if want := []api.Attachment{{ContainerID: "c8", IfName: "eth0"}}; !slices.Equal(gc.Removed, want) {
			t.Errorf("gc all removed %+v, want %+v", gc.Removed, want)
		}
		// the addresses went back to the pool: a new owner may get them
		ips, _ := os.ReadDir(filepath.Join(cfg.StateDir, "ipam"))
		for _, e := range ips {
			if e.Name() == addrs[0].IP.String() {
				t.Errorf("IPAM still holds %s", e.Name())
			}
		}
	})

	t.Run("socket LB hooks on the test cgroup, removed by --socket-lb=false", func(t *testing.T) {
		if n := attachedCgroupProgs(t, cgRoot); n != 10 {
			t.Errorf("%d programs attached to %s, want the 10 socket LB hooks", n, cgRoot)
		}
		agent.stop(t)
		off := cfg
		off.SocketLB = false
		agent = startAgent(t, top, n, off, logFile)
		eventually(t, "socket_lb disabled", 30*time.Second, func() error {
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			if d := findDecision(st.Datapath, DecisionSocketLB); d.Value != "disabled" || d.Reason != "--socket-lb=false" {
				return fmt.Errorf("socket_lb decision %+v", d)
			}
			return nil
		})
		eventually(t, "hooks detached", 10*time.Second, func() error {
			if n := attachedCgroupProgs(t, cgRoot); n != 0 {
				return fmt.Errorf("%d programs still attached to %s", n, cgRoot)
			}
			return nil
		})
		if pins, _ := filepath.Glob(filepath.Join(pinDir, "links", "cgroup-*")); len(pins) != 0 {
			t.Errorf("socket LB link pins left: %v", pins)
		}
	})
}

// attachedCgroupProgs counts the programs attached to the cgroup dir (all
// sock_addr attach types the socket LB uses).
func attachedCgroupProgs(t *testing.T, dir string) int {
	t.Helper()
	f, err := os.Open(dir)
	must(t, err)
	defer f.Close()
	total := 0
	for _, at := range []ebpf.AttachType{
		ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect, ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Sendmsg,
		ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCGroupUDP6Recvmsg, ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername,
		ebpf.AttachCGroupInet4Bind, ebpf.AttachCGroupInet6Bind,
	} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
		must(t, err)
		total += len(res.Programs)
	}
	return total
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func entriesEqual(a, b map[netip.Addr]MapEntry) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !v.same(w) {
			return false
		}
	}
	return true
}

// testCgroup creates a private cgroup v2 directory for the socket LB hooks
// and removes it when the test ends.
func testCgroup(t *testing.T) string {
	t.Helper()
	mnt := Cgroup2Mount()
	if mnt == "" {
		t.Skip("no cgroup2 filesystem mounted")
	}
	dir := filepath.Join(mnt, "axt-agent-"+testutil.RandSuffix(t))
	must(t, os.Mkdir(dir, 0o755))
	t.Cleanup(func() {
		var err error
		for range 100 { // EBUSY while a killed helper is still exiting
			if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("remove test cgroup %s: %v", dir, err)
	})
	return dir
}

func findDecision(ds []api.Decision, name string) api.Decision {
	for _, d := range ds {
		if d.Name == name {
			return d
		}
	}
	return api.Decision{}
}

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/cni"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
	"github.com/axonhq/axon/internal/uninstall"
)

// uninstallEnv makes the test binary run `axon uninstall` (uninstall.Run
// with the JSON Options in it) in the netns nsenter put it in; it prints
// the items as JSON and exits 1 on an error, as the CLI does.
const uninstallEnv = "AXON_AGENT_TEST_AS_UNINSTALL"

func runUninstallHelper(raw string) int {
	var o uninstall.Options
	if err := json.Unmarshal([]byte(raw), &o); err != nil {
		fmt.Fprintln(os.Stderr, "uninstall options:", err)
		return 2
	}
	items, err := uninstall.Run(o, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	_ = json.NewEncoder(os.Stdout).Encode(items)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestUninstall: a real agent (service-account login through
// --k8s-api-server, the Bandwidth Manager and the bypass on) networks two
// pods added through real CNI ADDs, with TCP between them; uninstall
// refuses while the agent runs, --dry-run changes nothing, and after the
// agent stopped it leaves no pin, no program attached to the node's devices
// or the test cgroup, no legacy filter, no CNI file, no pod device, no axon
// route and no state; a second run finds nothing; then the reference ptp
// plugin networks a pod in the same netns. Once with tcx links (where the
// kernel has them) and once with legacy cls_bpf filters.
func TestUninstall(t *testing.T) {
	for _, mode := range []string{"auto", "legacy"} {
		t.Run("attach-mode="+mode, func(t *testing.T) { testUninstall(t, mode) })
	}
}

func testUninstall(t *testing.T, attachMode string) {
	n := newInstallNode(t)
	ctx := context.Background()
	cfg := n.cfg
	cfg.AttachMode = attachMode
	if attachMode == "auto" {
		// the most kinds of attachment this kernel has: netkit pods where it
		// can, the north-south LB in XDP where the uplink's driver can
		cfg.DeviceMode = "auto"
		cfg.NodePortLB.Acceleration = "best-effort"
	}
	cfg.APIServer = n.apiURL
	cfg.BandwidthManager = true
	cfg.Sockmap = SockmapEnabled
	binDir := filepath.Join(n.dir, "bin")
	must(t, os.MkdirAll(binDir, 0o755))
	self, err := os.ReadFile(os.Args[0])
	must(t, err)
	must(t, os.WriteFile(filepath.Join(binDir, "axon-cni"), self, 0o755)) // as the DaemonSet installs it
	opts := uninstall.Options{BPFRoot: cfg.BPFRoot, StateDir: cfg.StateDir, Socket: cfg.Socket, CgroupRoot: cfg.CgroupRoot,
		CNIConfDir: cfg.CNIConfDir, CNIConfFile: CNIConfFile, CNIBinDir: binDir, RouteProtocol: RouteProtocol, DevicePrefix: cni.AliasPrefix}
	runUninstall := func(o uninstall.Options) ([]uninstall.Item, string, error) {
		raw, _ := json.Marshal(o)
		c := exec.Command("nsenter", "--net="+n.path, os.Args[0], "-test.run=^$")
		c.Env = append(os.Environ(), uninstallEnv+"="+string(raw))
		var out, errb bytes.Buffer
		c.Stdout, c.Stderr = &out, &errb
		err := c.Run()
		var items []uninstall.Item
		if jerr := json.Unmarshal(out.Bytes(), &items); jerr != nil {
			t.Fatalf("uninstall output %q: %v (stderr %s)", out.String(), jerr, errb.String())
		}
		return items, errb.String(), err
	}

	p := startAgentEnv(t, t, n.scratchNode, cfg, n.log, n.inPod...)
	c := api.NewClient(cfg.Socket)
	eventually(t, "agent ready with every component loaded", testutil.Stretch(t, 60*time.Second), func() error {
		st, err := c.Status(ctx)
		if err != nil {
			return err
		}
		if !st.Ready {
			return errors.New(st.Message)
		}
		for _, name := range []string{DecisionSocketLB, DecisionNodePortLB, DecisionBandwidth, DecisionSockmap} {
			if d := findDecision(st.Datapath, name); d.Value == "" || d.Value == "pending" || d.Value == "disabled" {
				return fmt.Errorf("decision %s = %q (%s)", name, d.Value, d.Reason)
			}
		}
		_, err = os.Stat(n.conflist())
		return err
	})
	st, err := c.Status(ctx)
	must(t, err)
	// the Bandwidth Manager's root qdisc (a0:; mq+fq, or mq alone when
	// degraded), read from the kernel: uninstall must list and remove it
	// (checked once the agent stopped)
	t.Logf("bandwidth manager: %s, root qdiscs a0: %v", findDecision(st.Datapath, DecisionBandwidth).Value, axonQdiscs(t, n))
	t.Logf("sockmap: %s (%s)", findDecision(st.Datapath, DecisionSockmap).Value, findDecision(st.Datapath, DecisionSockmap).Reason)

	// two pods through real CNI ADDs, with the configuration the agent wrote
	rawList, err := os.ReadFile(n.conflist())
	must(t, err)
	var list struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	must(t, json.Unmarshal(rawList, &list))
	conf := list.Plugins[0]
	conf["cniVersion"], conf["name"] = list.CNIVersion, list.Name
	confRaw, _ := json.Marshal(conf)
	type pod struct {
		name, netns string
		ip          net.IP
	}
	pods := []*pod{{name: "un-a"}, {name: "un-b"}}
	for _, pd := range pods {
		pd.netns = testutil.NewNetns(t, "axt-un-pod-")
		_, err := n.cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pd.name, Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{})
		must(t, err)
		out := cniInvoke(t, n.path, filepath.Join(binDir, "axon-cni"), binDir, confRaw, "ADD", pd.name+"-cid", pd.netns,
			"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME="+pd.name, cniPluginEnv+"=1")
		var r types100.Result
		must(t, json.Unmarshal(out, &r))
		for _, ipc := range r.IPs {
			if ipc.Address.IP.To4() != nil {
				pd.ip = ipc.Address.IP
			}
		}
		if pd.ip == nil {
			t.Fatalf("ADD %s: no IPv4 in %s", pd.name, out)
		}
	}
	tcpEcho(t, pods[0].netns, pods[1].netns, pods[1].ip)

	// what is attached now: the check below must see it, or it proves nothing
	before := attachedOnNode(t, n)
	cgBefore := attachedCgroupProgs(t, cfg.CgroupRoot) + attachedSockops(t, cfg.CgroupRoot)
	pinsBefore := countPins(t, cfg.BPFRoot)
	t.Logf("before uninstall: programs on the node's devices %v, %d on the cgroup, %d pins, routes %v", before, cgBefore, pinsBefore, n.axonRoutes(t))
	if len(before) == 0 || cgBefore == 0 || pinsBefore == 0 {
		t.Fatalf("nothing attached before uninstall (devices %v, cgroup %d, pins %d): the checks after it would prove nothing", before, cgBefore, pinsBefore)
	}

	t.Run("refuses while the agent runs", func(t *testing.T) {
		_, stderr, err := runUninstall(opts)
		if err == nil || !strings.Contains(stderr, "axon-agent still runs") || !strings.Contains(stderr, "stop it first") {
			t.Fatalf("uninstall with the agent running: err %v, stderr %s", err, stderr)
		}
		if got := countPins(t, cfg.BPFRoot); got != pinsBefore {
			t.Fatalf("refused uninstall changed the pins: %d, were %d", got, pinsBefore)
		}
	})
	p.stop(t)

	t.Run("dry run", func(t *testing.T) {
		o := opts
		o.DryRun = true
		items, stderr, err := runUninstall(o)
		if err != nil {
			t.Fatalf("dry run: %v\n%s", err, stderr)
		}
		kinds := map[string]int{}
		for _, it := range items {
			kinds[it.Kind]++
		}
		for _, k := range []string{"bpf-link", "bpf-pin", "device", "route", "file", "state"} {
			if kinds[k] == 0 {
				t.Errorf("dry run lists no %s: %v", k, items)
			}
		}
		if q := axonQdiscs(t, n); kinds["qdisc"] != len(q) { // the agent stopped: nothing changes them now
			t.Errorf("dry run lists %d qdiscs, the node has %v: %v", kinds["qdisc"], q, items)
		}
		if kinds["device"] != len(pods) {
			t.Errorf("dry run lists %d devices, want %d (the pods'): %v", kinds["device"], len(pods), items)
		}
		if got := countPins(t, cfg.BPFRoot); got != pinsBefore {
			t.Errorf("dry run changed the pins: %d, were %d", got, pinsBefore)
		}
		if _, err := os.Stat(n.conflist()); err != nil {
			t.Errorf("dry run removed the CNI configuration: %v", err)
		}
	})

	t.Run("uninstall leaves nothing", func(t *testing.T) {
		items, stderr, err := runUninstall(opts)
		if err != nil {
			t.Fatalf("uninstall: %v\n%s", err, stderr)
		}
		t.Logf("uninstall removed %d items", len(items))
		if _, err := os.Stat(cfg.BPFRoot); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there (%d pins): %v", cfg.BPFRoot, countPins(t, cfg.BPFRoot), err)
		}
		if left := attachedOnNode(t, n); len(left) != 0 {
			t.Errorf("programs still attached in the node netns: %v", left)
		}
		if left := attachedCgroupProgs(t, cfg.CgroupRoot) + attachedSockops(t, cfg.CgroupRoot); left != 0 {
			t.Errorf("%d programs still attached to the test cgroup", left)
		}
		for _, f := range []string{n.conflist(), filepath.Join(binDir, "axon-cni"), cfg.StateDir} {
			if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still there: %v", f, err)
			}
		}
		if r := n.axonRoutes(t); len(r) != 0 {
			t.Errorf("axon routes left: %v", r)
		}
		if d := axonDevices(t, n); len(d) != 0 {
			t.Errorf("axon-cni devices left: %v", d)
		}
		if q := axonQdiscs(t, n); len(q) != 0 {
			t.Errorf("the Bandwidth Manager's root qdisc left on %v", q)
		}
	})

	t.Run("second run finds nothing", func(t *testing.T) {
		items, stderr, err := runUninstall(opts)
		if err != nil || len(items) != 0 {
			t.Fatalf("second uninstall: %v, items %v\n%s", err, items, stderr)
		}
	})

	t.Run("ptp networks a pod afterwards", func(t *testing.T) {
		ptp, err := lab.DepPath("ptp")
		if err == nil {
			_, err = lab.DepPath("host-local")
		}
		if errors.Is(err, lab.ErrDepMissing) {
			t.Skipf("reference CNI plugins not built: %v", err)
		}
		must(t, err)
		plugins := filepath.Dir(ptp)
		podNS := testutil.NewNetns(t, "axt-un-ptp-")
		ptpConf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"ptpnet","type":"ptp","ipam":{"type":"host-local","subnet":"10.244.1.0/24","dataDir":%q}}`,
			filepath.Join(n.dir, "host-local"))
		out := cniInvoke(t, n.path, filepath.Join(plugins, "ptp"), plugins, []byte(ptpConf), "ADD", "ptp-cid", podNS, "", "")
		var r types100.Result
		must(t, json.Unmarshal(out, &r))
		if len(r.IPs) == 0 {
			t.Fatalf("ptp ADD: no address: %s", out)
		}
		// the node reaches the pod through ptp's host route
		tcpEchoFromNode(t, n, podNS, r.IPs[0].Address.IP)
		cniInvoke(t, n.path, filepath.Join(plugins, "ptp"), plugins, []byte(ptpConf), "DEL", "ptp-cid", podNS, "", "")
	})
}

// cniInvoke runs plugin as the kubelet does, in the node netns, and returns
// its stdout; a failure fails the test.
func cniInvoke(t *testing.T, nodeNS, plugin, path string, conf []byte, cmd, cid, podNS, args, extraEnv string) []byte {
	t.Helper()
	c := exec.Command("nsenter", "--net="+nodeNS, plugin)
	c.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND=" + cmd, "CNI_CONTAINERID=" + cid,
		"CNI_NETNS=" + netnsutil.Path(podNS), "CNI_IFNAME=eth0", "CNI_PATH=" + path, "CNI_ARGS=" + args}
	if extraEnv != "" {
		c.Env = append(c.Env, extraEnv)
	}
	c.Stdin = bytes.NewReader(conf)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		t.Fatalf("%s %s %s: %v\nstdout %s\nstderr %s", filepath.Base(plugin), cmd, cid, err, out.String(), errb.String())
	}
	return out.Bytes()
}

// tcpEcho connects from the netns from to ip:80 served in the netns to and
// checks that the bytes come back.
func tcpEcho(t *testing.T, from, to string, ip net.IP) {
	t.Helper()
	var ln net.Listener
	must(t, netnsutil.Do(to, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(ip.String(), "80"))
		return err
	}))
	echoOnce(t, ln, func() (net.Conn, error) {
		var c net.Conn
		err := netnsutil.Do(from, func() (err error) {
			c, err = net.DialTimeout("tcp", net.JoinHostPort(ip.String(), "80"), 5*time.Second)
			return err
		})
		return c, err
	})
}

func tcpEchoFromNode(t *testing.T, n *installNode, to string, ip net.IP) {
	t.Helper()
	tcpEcho(t, n.name, to, ip)
}

func echoOnce(t *testing.T, ln net.Listener, dial func() (net.Conn, error)) {
	t.Helper()
	defer ln.Close()
	testutil.ServeConns(ln, func(c net.Conn) { _, _ = io.Copy(c, c) })
	c, err := dial()
	if err != nil {
		t.Fatalf("connect to %s: %v", ln.Addr(), err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := []byte("axon uninstall test")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo through %s: %q, %v", ln.Addr(), got, err)
	}
}

// attachedOnNode lists, from the kernel, every BPF program attached to a
// device of the node netns: tcx ingress/egress and netkit (by link ID),
// XDP, and legacy cls_bpf filters.
func attachedOnNode(t *testing.T, n *installNode) []string {
	t.Helper()
	var out []string
	must(t, netnsutil.Do(n.name, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			a := l.Attrs()
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress, ebpf.AttachNetkitPrimary, ebpf.AttachNetkitPeer} {
				res, err := link.QueryPrograms(link.QueryOptions{Target: a.Index, Attach: at})
				if err != nil {
					continue // not this device type (netkit on a veth)
				}
				for _, p := range res.Programs {
					id, _ := p.LinkID()
					out = append(out, fmt.Sprintf("%s %v prog %d link %d", a.Name, at, p.ID, id))
				}
			}
			if a.Xdp != nil && a.Xdp.Attached {
				out = append(out, fmt.Sprintf("%s xdp prog %d", a.Name, a.Xdp.ProgId))
			}
			for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
				fs, _ := netlink.FilterList(l, parent)
				for _, f := range fs {
					if bf, ok := f.(*netlink.BpfFilter); ok {
						out = append(out, fmt.Sprintf("%s cls_bpf %s", a.Name, bf.Name))
					}
				}
			}
		}
		return nil
	}))
	return out
}

// attachedSockops counts sock_ops programs on the cgroup (the bypass).
func attachedSockops(t *testing.T, dir string) int {
	t.Helper()
	f, err := os.Open(dir)
	must(t, err)
	defer f.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	must(t, err)
	return len(res.Programs)
}

func countPins(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			n++
		}
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return n
}

func axonDevices(t *testing.T, n *installNode) []string {
	t.Helper()
	links, err := n.nl.LinkList()
	must(t, err)
	var out []string
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Alias, cni.AliasPrefix) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// axonQdiscs lists the devices of the node netns whose root qdisc is the
// Bandwidth Manager's (handle a0:).
func axonQdiscs(t *testing.T, n *installNode) []string {
	t.Helper()
	links, err := n.nl.LinkList()
	must(t, err)
	var out []string
	for _, l := range links {
		qs, err := n.nl.QdiscList(l)
		must(t, err)
		for _, q := range qs {
			if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Attrs().Handle == netlink.MakeHandle(0xa0, 0) {
				out = append(out, l.Attrs().Name+" "+q.Type())
			}
		}
	}
	return out
}

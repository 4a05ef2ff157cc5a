package agent

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/bwm"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/testutil"
)

// Ports of this file's control plane (each test file has its own).
const (
	cniConcAPIPort  = 16793
	cniConcEtcdPort = 12729
)

// cniPluginEnv makes the test binary run as axon-cni (cni.Main), so that the
// test invokes the real plugin exactly as the kubelet does, also where there is
// no Go toolchain to build cmd/axon-cni.
const cniPluginEnv = "AXON_AGENT_TEST_AS_CNI"

// cniPods is how many pods the concurrency test adds, then deletes, at once.
const cniPods = 32

// TestCNIConcurrentAddDel: 32 axon-cni ADDs at once against the real agent,
// each pod in its own netns, then 32 DELs at once. Every ADD must get its own
// addresses and its own host device, with its endpoint-map entries, tcx link
// (or legacy filter), route, bandwidth limit and socket-LB opt-out in place;
// after the DELs the node must be back to what it was before, read from the
// kernel (pinned maps, pins, netlink) and the IPAM state on disk, not from the
// agent's own bookkeeping.
func TestCNIConcurrentAddDel(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces, loads BPF programs, pins under /sys/fs/bpf")
	cp := startControlPlaneOn(t, cniConcAPIPort, cniConcEtcdPort)
	cs, err := cp.Client()
	must(t, err)
	ctx := context.Background()
	n := newScratchNode(t)

	fwd, err := controlplane.ListenForwarder([]string{n.path}, fmt.Sprintf("127.0.0.1:%d", cniConcAPIPort),
		fmt.Sprintf("127.0.0.1:%d", cniConcAPIPort), testLogger(t))
	must(t, err)
	fwdCtx, stopFwd := context.WithCancel(ctx)
	fwdDone := make(chan struct{})
	go func() { defer close(fwdDone); _ = fwd.Serve(fwdCtx) }()
	t.Cleanup(func() { stopFwd(); fwd.Close(); <-fwdDone })

	kubeconfig, err := cp.AgentKubeconfig("node1")
	must(t, err)
	dir := t.TempDir()
	pinDir := filepath.Join("/sys/fs/bpf", "axt-agent-cc-"+testutil.RandSuffix(t))
	t.Cleanup(func() { _ = os.RemoveAll(pinDir) })
	cgRoot := testCgroup(t)
	cfg := Defaults()
	cfg.CgroupRoot = cgRoot
	cfg.NodeName = "node1"
	cfg.Kubeconfig = kubeconfig
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Socket = filepath.Join(dir, "axon.sock")
	cfg.BPFRoot = pinDir
	cfg.HealthAddr = "127.0.0.1:19877" // inside the node netns
	cfg.BandwidthManager = true
	logFile := filepath.Join(dir, "agent.log")
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("AXON_TEST_AGENT_LOG") != "" {
			b, _ := os.ReadFile(logFile)
			t.Logf("agent log:\n%s", b)
		}
	})
	createNode(t, cs, node("node1", []string{"198.18.0.11", "fd00:198:18::11"}, "10.244.1.0/24", "fd00:10:244:1::/64"))

	// The Pod objects: every other pod has a bandwidth limit and opts out of
	// the socket LB, so that the bandwidth and skip maps hold entries to lose.
	type pod struct {
		name, netns, cid string
		annotated        bool
	}
	pods := make([]pod, cniPods)
	for i := range pods {
		p := pod{name: fmt.Sprintf("cc-%02d", i), annotated: i%2 == 0}
		p.cid = fmt.Sprintf("%s-%s", p.name, strings.Repeat("c", 20))
		p.netns = testutil.NewNetns(t, "axt-cc-pod-")
		pods[i] = p
		obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		if p.annotated {
			obj.Annotations = map[string]string{bwm.EgressAnnotation: "10M", bwm.IngressAnnotation: "20M",
				AnnotationSocketLB: SocketLBDisabled}
		}
		_, err := cs.CoreV1().Pods("default").Create(ctx, obj, metav1.CreateOptions{})
		must(t, err)
	}

	startAgent(t, t, n, cfg, logFile)
	c := api.NewClient(cfg.Socket)
	// Ready says the pod datapath is loaded; the socket LB, the north-south LB
	// and the Bandwidth Manager load after it and pin their own maps and links:
	// the baseline is taken once they are in and the pin tree holds still.
	snap := func() nodeSnapshot { return snapshotNode(t, n, pinDir, filepath.Join(cfg.StateDir, "ipam")) }
	var base nodeSnapshot
	eventually(t, "agent ready with every component loaded", testutil.Stretch(t, 60*time.Second), func() error {
		st, err := c.Status(ctx)
		if err != nil {
			return err
		}
		if !st.Ready {
			return errors.New(st.Message)
		}
		for _, d := range []api.Decision{findDecision(st.Datapath, DecisionSocketLB), findDecision(st.Datapath, DecisionNodePortLB),
			findDecision(st.Datapath, DecisionBandwidth)} {
			if d.Value == "" || d.Value == "disabled" {
				return fmt.Errorf("decision %s = %q (%s)", d.Name, d.Value, d.Reason)
			}
		}
		prev := snap()
		time.Sleep(500 * time.Millisecond)
		base = snap()
		if !slices.Equal(prev.pins, base.pins) {
			return fmt.Errorf("pins still changing: %d, then %d", len(prev.pins), len(base.pins))
		}
		return nil
	})
	t.Logf("baseline: %d devices, %d routes, %d pins, %d endpoint entries, %d IPAM files, maps %v",
		len(base.links), len(base.routes), len(base.pins), len(base.endpoints), len(base.ipam), base.mapSizes())

	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"axon","type":"axon-cni","socket":%q}`, cfg.Socket)
	invoke := func(cmd string, p pod) (string, error) {
		c := exec.Command("nsenter", "--net="+n.path, os.Args[0], "-test.run=^$")
		c.Env = []string{
			"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
			cniPluginEnv + "=1",
			"CNI_COMMAND=" + cmd,
			"CNI_CONTAINERID=" + p.cid,
			"CNI_NETNS=/run/netns/" + p.netns,
			"CNI_IFNAME=eth0",
			"CNI_PATH=" + filepath.Dir(os.Args[0]),
			"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=" + p.name,
		}
		c.Stdin = strings.NewReader(conf)
		var out, errb bytes.Buffer
		c.Stdout, c.Stderr = &out, &errb
		if err := c.Run(); err != nil {
			return out.String(), fmt.Errorf("%s %s: %v\nstdout %s\nstderr %s", cmd, p.name, err, out.String(), errb.String())
		}
		return out.String(), nil
	}
	all := func(cmd string) []string {
		outs := make([]string, len(pods))
		errs := make([]error, len(pods))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, p := range pods {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				outs[i], errs[i] = invoke(cmd, p)
			}()
		}
		t0 := time.Now()
		close(start)
		wg.Wait()
		t.Logf("%d parallel %s in %v", len(pods), cmd, time.Since(t0))
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		return outs
	}

	// ---- 32 ADDs at once ----
	outs := all("ADD")
	type wired struct {
		host  string
		index int
		ips   []netip.Addr
	}
	got := make([]wired, len(pods))
	ipOwner := map[netip.Addr]string{}
	hostOwner := map[string]string{}
	for i, out := range outs {
		var r types100.Result
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("ADD %s: result %q: %v", pods[i].name, out, err)
		}
		for _, ifc := range r.Interfaces {
			if ifc.Sandbox == "" {
				got[i].host = ifc.Name
			}
		}
		if got[i].host == "" {
			t.Fatalf("ADD %s: no host interface in %s", pods[i].name, out)
		}
		if o, dup := hostOwner[got[i].host]; dup {
			t.Errorf("host device %s given to both %s and %s", got[i].host, o, pods[i].name)
		}
		hostOwner[got[i].host] = pods[i].name
		for _, ipc := range r.IPs {
			a, _ := netip.AddrFromSlice(ipc.Address.IP)
			a = a.Unmap()
			if o, dup := ipOwner[a]; dup {
				t.Errorf("address %s given to both %s and %s", a, o, pods[i].name)
			}
			ipOwner[a] = pods[i].name
			got[i].ips = append(got[i].ips, a)
		}
		if len(got[i].ips) != 2 {
			t.Errorf("ADD %s: %d addresses, want one IPv4 and one IPv6: %s", pods[i].name, len(got[i].ips), out)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// What the 32 pods added, read from the kernel: each is a change the DELs must undo.
	during := snap()
	for i := range got {
		l, ok := during.links[got[i].host]
		if !ok {
			t.Errorf("%s: host device %s not in the node netns", pods[i].name, got[i].host)
			continue
		}
		got[i].index = l
		for _, a := range got[i].ips {
			if e, ok := during.endpoints[a]; !ok || e.IfIndex != l {
				t.Errorf("%s: endpoint map entry for %s = %+v (present %v), want ifindex %d (%s)", pods[i].name, a, e, ok, l, got[i].host)
			}
			bits := 32
			if a.Is6() {
				bits = 128
			}
			if r := fmt.Sprintf("%s dev %s", netip.PrefixFrom(a, bits), got[i].host); !during.hasRoute(r) {
				t.Errorf("%s: no route %q in the node netns", pods[i].name, r)
			}
		}
	}
	// Each pod's own eth0 carries exactly its addresses, and the endpoint map
	// points at that eth0's MAC: no two pods wired to each other's device.
	for i, p := range pods {
		testutil.InNetns(t, p.netns, func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
			if err != nil {
				return err
			}
			var have []netip.Addr
			for _, a := range addrs {
				if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.Unmap().IsLinkLocalUnicast() {
					have = append(have, ip.Unmap())
				}
			}
			slices.SortFunc(have, netip.Addr.Compare)
			want := slices.SortedFunc(slices.Values(got[i].ips), netip.Addr.Compare)
			if !slices.Equal(have, want) {
				t.Errorf("pod %s: eth0 has %v, its ADD result says %v", p.name, have, want)
			}
			for _, a := range want {
				if e := during.endpoints[a]; !bytes.Equal(e.PodMAC, l.Attrs().HardwareAddr) {
					t.Errorf("pod %s: endpoint map entry for %s has pod MAC %s, its eth0 is %s", p.name, a, e.PodMAC, l.Attrs().HardwareAddr)
				}
			}
			return nil
		})
	}
	if d := len(during.endpoints) - len(base.endpoints); d != 2*cniPods {
		t.Errorf("endpoint map grew by %d entries, want %d", d, 2*cniPods)
	}
	if d := len(during.ipam) - len(base.ipam); d != 2*cniPods {
		t.Errorf("IPAM state grew by %d allocations, want %d", d, 2*cniPods)
	}
	if d := len(during.links) - len(base.links); d != cniPods {
		t.Errorf("node netns has %d more devices, want %d", d, cniPods)
	}
	if during.attach == "tcx" {
		if d := len(during.pins) - len(base.pins); d < cniPods {
			t.Errorf("%d more pins under %s, want at least one tcx link per pod (%d)", d, pinDir, cniPods)
		}
	} else if d := during.filters - base.filters; d < cniPods {
		t.Errorf("%d more tc filters, want at least one per pod (%d)", d, cniPods)
	}
	// The bandwidth and skip maps are written from the Pod objects by the agent's
	// reconcilers: wait until the 16 annotated pods are in them.
	annotated := cniPods / 2
	eventually(t, "bandwidth limits and socket-LB opt-outs of the annotated pods written", testutil.Stretch(t, 30*time.Second), func() error {
		during = snap()
		if d := len(during.maps[socklb.MapLBSkip]) - len(base.maps[socklb.MapLBSkip]); d != annotated {
			return fmt.Errorf("%s grew by %d entries, want %d", socklb.MapLBSkip, d, annotated)
		}
		if d := len(during.maps[datapath.MapBWAddr]) - len(base.maps[datapath.MapBWAddr]); d < annotated {
			return fmt.Errorf("%s grew by %d entries, want at least %d", datapath.MapBWAddr, d, annotated)
		}
		return nil
	})
	t.Logf("with %d pods: %d devices, %d routes, %d pins, %d tc filters, %d endpoint entries, %d IPAM files, maps %v", cniPods,
		len(during.links), len(during.routes), len(during.pins), during.filters, len(during.endpoints), len(during.ipam), during.mapSizes())

	// ---- 32 DELs at once ----
	all("DEL")
	// The DELs are synchronous: the kernel state they own must be gone now.
	after := snap()
	after.compare(t, base, false)
	// The bandwidth and skip maps follow the endpoints through the reconcilers.
	delDone := time.Now()
	eventually(t, "the node back to its baseline", testutil.Stretch(t, 30*time.Second), func() error {
		after = snap()
		return after.diff(base, true)
	})
	t.Logf("bandwidth and skip maps back to the baseline %s after the DELs returned", time.Since(delDone).Round(time.Millisecond))
	for _, p := range pods {
		testutil.InNetns(t, p.netns, func() error {
			links, err := netlink.LinkList()
			if err != nil {
				return err
			}
			if len(links) != 1 {
				t.Errorf("pod %s: netns has %d links after DEL, want only lo", p.name, len(links))
			}
			return nil
		})
	}
}

// nodeSnapshot is the kernel state of a node that pods change, read from the
// kernel itself: devices and routes from netlink, tc filters on every device,
// the pin tree, pinned maps, and the IPAM allocations on disk.
type nodeSnapshot struct {
	links     map[string]int // name → ifindex
	routes    []string       // "dst dev name table T proto P", sorted
	filters   int            // legacy tc filters (clsact ingress+egress) on all devices
	attach    string         // "tcx" or "legacy" (pod device links pinned or not)
	pins      []string       // paths under the pin dir, sorted
	endpoints map[netip.Addr]MapEntry
	maps      map[string]map[string]string // per-pod maps: key hex → value hex ("" for per-CPU)
	ipam      []string                     // allocated addresses (IPAM state files)
}

// perPodMaps are the pinned maps with an entry per pod or per limited pod.
var perPodMaps = []string{datapath.MapBWAddr, datapath.MapBWState, datapath.MapBWStats, datapath.MapBWGate, socklb.MapLBSkip}

func snapshotNode(t *testing.T, n *scratchNode, pinDir, ipamDir string) nodeSnapshot {
	t.Helper()
	s := nodeSnapshot{links: map[string]int{}, maps: map[string]map[string]string{}, attach: "legacy"}
	links, err := n.nl.LinkList()
	must(t, err)
	for _, l := range links {
		s.links[l.Attrs().Name] = l.Attrs().Index
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := n.nl.FilterList(l, parent)
			if err == nil {
				s.filters += len(fs)
			}
		}
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := n.nl.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		must(t, err)
		for _, r := range rs {
			dev := fmt.Sprint(r.LinkIndex)
			for name, idx := range s.links {
				if idx == r.LinkIndex {
					dev = name
				}
			}
			s.routes = append(s.routes, fmt.Sprintf("%s dev %s table %d proto %d", r.Dst, dev, r.Table, int(r.Protocol)))
		}
	}
	sort.Strings(s.routes)
	must(t, filepath.WalkDir(pinDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(pinDir, p)
			s.pins = append(s.pins, rel)
			if strings.HasPrefix(rel, "links/tcx-") {
				s.attach = "tcx"
			}
		}
		return nil
	}))
	sort.Strings(s.pins)
	s.endpoints = pinnedEndpoints(t, pinDir)
	for _, name := range perPodMaps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) {
			continue // not pinned (yet): no entries
		}
		must(t, err)
		s.maps[name] = dumpMap(t, m)
		m.Close()
	}
	ents, err := os.ReadDir(ipamDir)
	must(t, err)
	for _, e := range ents {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			s.ipam = append(s.ipam, e.Name())
		}
	}
	return s
}

// dumpMap reads every entry of m as hex; per-CPU maps by key only (their
// values are counters that move with traffic).
func dumpMap(t *testing.T, m *ebpf.Map) map[string]string {
	t.Helper()
	out := map[string]string{}
	perCPU := m.Type() == ebpf.PerCPUHash || m.Type() == ebpf.PerCPUArray || m.Type() == ebpf.LRUCPUHash
	key := make([]byte, m.KeySize())
	var prev any // nil: the first key
	for {
		err := m.NextKey(prev, &key)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out
		}
		must(t, err)
		v := ""
		if !perCPU {
			val := make([]byte, m.ValueSize())
			if err := m.Lookup(key, &val); err == nil {
				v = hex.EncodeToString(val)
			}
		}
		out[hex.EncodeToString(key)] = v
		prev = slices.Clone(key)
	}
}

func (s nodeSnapshot) hasRoute(prefix string) bool {
	for _, r := range s.routes {
		if strings.HasPrefix(r, prefix+" ") {
			return true
		}
	}
	return false
}

func (s nodeSnapshot) mapSizes() map[string]int {
	out := map[string]int{}
	for k, v := range s.maps {
		out[k] = len(v)
	}
	return out
}

// diff says how s differs from base; the per-pod maps are compared only with
// withMaps (they are written by reconcilers, after the DEL returned).
func (s nodeSnapshot) diff(base nodeSnapshot, withMaps bool) error {
	var errs []error
	setDiff := func(what string, got, want []string) {
		extra, missing := []string{}, []string{}
		for _, g := range got {
			if !slices.Contains(want, g) {
				extra = append(extra, g)
			}
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				missing = append(missing, w)
			}
		}
		if len(extra)+len(missing) > 0 {
			errs = append(errs, fmt.Errorf("%s: %d left behind %v, %d gone %v", what, len(extra), extra, len(missing), missing))
		}
	}
	setDiff("devices", slices.Sorted(maps.Keys(s.links)), slices.Sorted(maps.Keys(base.links)))
	setDiff("routes", s.routes, base.routes)
	setDiff("pins", s.pins, base.pins)
	setDiff("IPAM allocations", s.ipam, base.ipam)
	var eps, baseEps []string
	for a, e := range s.endpoints {
		eps = append(eps, fmt.Sprintf("%s→%d", a, e.IfIndex))
	}
	for a, e := range base.endpoints {
		baseEps = append(baseEps, fmt.Sprintf("%s→%d", a, e.IfIndex))
	}
	setDiff("endpoint map", eps, baseEps)
	if s.filters != base.filters {
		errs = append(errs, fmt.Errorf("tc filters: %d, baseline %d", s.filters, base.filters))
	}
	if withMaps {
		for _, name := range perPodMaps {
			var got, want []string
			for k, v := range s.maps[name] {
				got = append(got, k+"="+v)
			}
			for k, v := range base.maps[name] {
				want = append(want, k+"="+v)
			}
			setDiff(name, got, want)
		}
	}
	return errors.Join(errs...)
}

func (s nodeSnapshot) compare(t *testing.T, base nodeSnapshot, withMaps bool) {
	t.Helper()
	if err := s.diff(base, withMaps); err != nil {
		t.Errorf("after the DELs returned: %v", err)
	}
}

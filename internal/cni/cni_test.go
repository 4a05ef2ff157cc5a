package cni

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/ipam"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
	"github.com/axonhq/axon/internal/unixsock"
)

// ---- a small in-test agent: the real IPAM allocator behind the real API ----

type testAgent struct {
	ipam *ipam.Allocator

	mu      sync.Mutex
	health  error
	failPut error
	eps     map[api.Attachment]api.Endpoint
	device  *api.DeviceConfig // the pod device Allocate answers
	gcs     []api.GCRequest   // every GC request received
}

func (a *testAgent) Healthy(context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.health
}
func (a *testAgent) Status(context.Context) (api.Status, error) {
	return api.Status{Node: "test", Ready: true, PodCIDRs: a.ipam.Pools()}, nil
}
func (a *testAgent) Endpoints(context.Context) ([]api.Endpoint, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []api.Endpoint
	for _, ep := range a.eps {
		out = append(out, ep)
	}
	return out, nil
}
func (a *testAgent) Allocate(_ context.Context, r api.AllocateRequest) (api.AllocateResponse, error) {
	addrs, err := a.ipam.Allocate(ipam.Owner{ContainerID: r.ContainerID, IfName: r.IfName})
	if err != nil {
		return api.AllocateResponse{}, &api.StatusError{Code: 503, Message: err.Error()}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return api.AllocateResponse{Addresses: addrs, Device: a.device}, nil
}
func (a *testAgent) Release(_ context.Context, r api.ReleaseRequest) error {
	return a.ipam.Release(ipam.Owner{ContainerID: r.ContainerID, IfName: r.IfName})
}
func (a *testAgent) PutEndpoint(_ context.Context, ep api.Endpoint) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.failPut != nil {
		return a.failPut
	}
	a.eps[api.Attachment{ContainerID: ep.ContainerID, IfName: ep.IfName}] = ep
	return nil
}
func (a *testAgent) DeleteEndpoint(_ context.Context, at api.Attachment) error {
	a.mu.Lock()
	delete(a.eps, at)
	a.mu.Unlock()
	return a.ipam.Release(ipam.Owner{ContainerID: at.ContainerID, IfName: at.IfName})
}
func (a *testAgent) GC(_ context.Context, r api.GCRequest) (api.GCResponse, error) {
	a.mu.Lock()
	a.gcs = append(a.gcs, r)
	a.mu.Unlock()
	if len(r.Valid) == 0 && !r.All { // as the agent: an empty list needs "all"
		return api.GCResponse{}, api.Errorf(400, "gc with an empty \"valid\" list: list the valid attachments, or send \"all\": true")
	}
	valid := map[ipam.Owner]bool{}
	for _, v := range r.Valid {
		valid[ipam.Owner{ContainerID: v.ContainerID, IfName: v.IfName}] = true
	}
	removed, err := a.ipam.GC(valid)
	var resp api.GCResponse
	a.mu.Lock()
	defer a.mu.Unlock()
	for at := range a.eps {
		if !valid[ipam.Owner{ContainerID: at.ContainerID, IfName: at.IfName}] {
			delete(a.eps, at)
		}
	}
	for _, o := range removed {
		resp.Removed = append(resp.Removed, api.Attachment{ContainerID: o.ContainerID, IfName: o.IfName})
	}
	return resp, err
}

func (a *testAgent) endpoint(cid, ifn string) (api.Endpoint, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ep, ok := a.eps[api.Attachment{ContainerID: cid, IfName: ifn}]
	return ep, ok
}

// ---- environment: node netns, agent, plugin binary ----

// asPluginEnv makes the test binary behave as axon-cni (see TestMain): the
// tests run the plugin exactly as kubelet does, also in the kernel-matrix VMs
// where there is no Go toolchain to build cmd/axon-cni.
const asPluginEnv = "AXON_CNI_TEST_AS_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(asPluginEnv) == "1" {
		os.Exit(Main())
	}
	os.Exit(m.Run())
}

// pluginBinary is the test binary itself, run with asPluginEnv=1.
func pluginBinary(t *testing.T) string {
	t.Helper()
	p, err := os.Executable()
	if err != nil {
		t.Fatalf("find the test binary to run as the plugin: %v", err)
	}
	return p
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

type env struct {
	t      *testing.T
	node   string // netns name
	sock   string
	state  string
	agent  *testAgent
	stop   context.CancelFunc
	bin    string
	nodeNS ns.NetNS
}

const (
	nodeIPv4 = "198.18.0.11"
	nodeIPv6 = "fd00:198:18::11"
)

func newEnv(t *testing.T) *env {
	t.Helper()
	testutil.RequireRoot(t, "creates network namespaces and veth pairs")
	e := &env{t: t, bin: pluginBinary(t)}
	e.node = testutil.NewNetnsKernelDAD(t, "axt-cni-node-")
	// No dummy module on this kernel: a veth pair stands in for the uplink.
	run(t, "ip", "-n", e.node, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0peer")
	run(t, "ip", "-n", e.node, "link", "set", "eth0peer", "up")
	run(t, "ip", "-n", e.node, "addr", "add", nodeIPv4+"/24", "dev", "eth0")
	run(t, "ip", "-n", e.node, "addr", "add", nodeIPv6+"/64", "dev", "eth0", "nodad")
	run(t, "ip", "-n", e.node, "link", "set", "eth0", "up")
	e.startNodeAgent(1)
	return e
}

// startNodeAgent opens the netns e.node and starts a test agent for it, with
// its own socket and IPAM state in a temporary directory and the pod pools of
// node i: 10.244.<i>.0/24 and fd00:10:244:<i>::/64.
func (e *env) startNodeAgent(i int) {
	t := e.t
	t.Helper()
	var err error
	e.nodeNS, err = ns.GetNS("/run/netns/" + e.node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.nodeNS.Close() })

	dir := t.TempDir()
	e.sock = filepath.Join(dir, "run", "axon.sock")
	e.state = filepath.Join(dir, "state", "ipam")
	alloc, err := ipam.New(e.state, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { alloc.Close() })
	if err := alloc.SetPools([]netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i)), netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", i))}); err != nil {
		t.Fatal(err)
	}
	e.agent = &testAgent{ipam: alloc, eps: map[api.Attachment]api.Endpoint{}}
	e.startAgent()
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func (e *env) startAgent() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Serve(ctx, e.sock, e.agent, quiet(), unixsock.Options{Group: unixsock.NoGroup}) }()
	e.stop = func() { cancel(); <-done }
	e.t.Cleanup(func() { cancel() })
	c := api.NewClient(e.sock)
	for i := 0; ; i++ {
		if err := c.Healthy(context.Background()); err == nil || api.IsStatus(err, 503) {
			return
		}
		if i > 200 {
			e.t.Fatal("test agent did not come up")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) conf(extra string) string {
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":"axon","type":"axon-cni","socket":%q,"mtu":1400%s}`, e.sock, extra)
}

type call struct {
	cmd, cid, netns, ifname, args string
	stdin                         string
	unsetNetns                    bool
}

type outcome struct {
	code   int // exit code
	stdout string
	stderr string
}

func (o outcome) cniErr(t *testing.T) types.Error {
	t.Helper()
	var e types.Error
	if err := json.Unmarshal([]byte(o.stdout), &e); err != nil || e.Code == 0 {
		t.Fatalf("expected a CNI error, got exit %d stdout %q stderr %q", o.code, o.stdout, o.stderr)
	}
	return e
}

// invoke runs the plugin binary in the node netns exactly as kubelet would.
func (e *env) invoke(c call) outcome {
	e.t.Helper()
	if c.ifname == "" {
		c.ifname = "eth0"
	}
	if c.stdin == "" {
		c.stdin = e.conf("")
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+e.node, e.bin)
	cmd.Env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"CNI_COMMAND=" + c.cmd,
		"CNI_CONTAINERID=" + c.cid,
		"CNI_IFNAME=" + c.ifname,
		"CNI_PATH=" + filepath.Dir(e.bin),
		"CNI_ARGS=" + c.args,
		asPluginEnv + "=1",
	}
	if !c.unsetNetns {
		cmd.Env = append(cmd.Env, "CNI_NETNS="+c.netns)
	}
	cmd.Stdin = strings.NewReader(c.stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			e.t.Fatalf("run plugin: %v", err)
		}
		code = ee.ExitCode()
	}
	return outcome{code: code, stdout: out.String(), stderr: errb.String()}
}

func (e *env) mustOK(c call) outcome {
	e.t.Helper()
	o := e.invoke(c)
	if o.code != 0 {
		e.t.Fatalf("%s %s: exit %d\nstdout %s\nstderr %s", c.cmd, c.cid, o.code, o.stdout, o.stderr)
	}
	return o
}

func (e *env) add(cid, pod string) *types100.Result {
	e.t.Helper()
	o := e.mustOK(call{cmd: "ADD", cid: cid, netns: "/run/netns/" + pod, args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=" + cid})
	var r types100.Result
	if err := json.Unmarshal([]byte(o.stdout), &r); err != nil {
		e.t.Fatalf("ADD result %q: %v", o.stdout, err)
	}
	return &r
}

func (e *env) inNode(f func() error) error {
	return e.nodeNS.Do(func(ns.NetNS) error { return f() })
}

func (e *env) hostLinks() []string {
	var names []string
	_ = e.inNode(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "lxc") {
				names = append(names, l.Attrs().Name)
			}
		}
		return nil
	})
	return names
}

func (e *env) ipFiles() []string {
	ents, _ := os.ReadDir(e.state)
	var out []string
	for _, en := range ents {
		if _, err := netip.ParseAddr(en.Name()); err == nil {
			out = append(out, en.Name())
		}
	}
	return out
}

// tcpEcho listens on addr in the node netns and dials it from the pod netns,
// checking that bytes go both ways.
func (e *env) tcpEcho(pod, addr string) error {
	ln, err := listenTCP(e.node, addr)
	if err != nil {
		return fmt.Errorf("listen in node: %w", err)
	}
	defer ln.Close()
	testutil.ServeConns(ln, func(c net.Conn) { _, _ = io.Copy(c, c) })
	return ns.WithNetNSPath("/run/netns/"+pod, func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		local := c.LocalAddr().(*net.TCPAddr).IP.String()
		if !strings.HasPrefix(local, "10.244.1.") && !strings.HasPrefix(local, "fd00:10:244:1::") {
			return fmt.Errorf("pod used source %s, want its pod address", local)
		}
		if _, err := c.Write([]byte("axon")); err != nil {
			return err
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "axon" {
			return fmt.Errorf("echo: %q %v", buf, err)
		}
		return nil
	})
}

// listenTCP listens for TCP on ip, any port, inside the named netns.
func listenTCP(netns, ip string) (net.Listener, error) {
	var ln net.Listener
	err := netnsutil.Do(netns, func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(ip, "0"))
		return err
	})
	return ln, err
}

// ---- tests ----

func TestHostVethName(t *testing.T) {
	tests := []struct{ cid, ifn, want string }{
		{"abc", "eth0", HostVethName("abc", "eth0")},
	}
	for _, tc := range tests {
		got := HostVethName(tc.cid, tc.ifn)
		if len(got) != 14 || !strings.HasPrefix(got, "lxc") || got != tc.want {
			t.Errorf("HostVethName(%q,%q) = %q", tc.cid, tc.ifn, got)
		}
	}
	if HostVethName("a", "eth0") == HostVethName("a", "eth1") {
		t.Error("ifName does not change the name")
	}
	// sha256("abc/eth0") starts with this.
	if got := HostVethName("abc", "eth0"); got != "lxc"+sha256hex("abc/eth0")[:11] {
		t.Errorf("got %s", got)
	}
}

func TestAddCheckDel(t *testing.T) {
	e := newEnv(t)
	pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
	res := e.add("ctr-a", pod)

	host := HostVethName("ctr-a", "eth0")
	if len(res.Interfaces) != 2 || res.Interfaces[0].Name != host || res.Interfaces[1].Name != "eth0" ||
		res.Interfaces[1].Sandbox != "/run/netns/"+pod || res.Interfaces[1].Mtu != 1400 {
		t.Fatalf("interfaces = %+v", res.Interfaces)
	}
	if len(res.IPs) != 2 || res.IPs[0].Address.String() != "10.244.1.1/32" || res.IPs[1].Address.String() != "fd00:10:244:1::1/128" ||
		*res.IPs[0].Interface != 1 || res.IPs[0].Gateway.String() != "169.254.1.1" {
		t.Fatalf("ips = %v", res.IPs)
	}
	if len(res.Routes) != 2 || res.Routes[0].Dst.String() != "0.0.0.0/0" || res.Routes[1].GW.String() != "fe80::1" {
		t.Fatalf("routes = %v", res.Routes)
	}

	ep, ok := e.agent.endpoint("ctr-a", "eth0")
	if !ok {
		t.Fatal("agent has no endpoint after ADD")
	}
	if ep.PodName != "ctr-a" || ep.PodNamespace != "default" || ep.HostIfName != host || ep.Netns != "/run/netns/"+pod ||
		ep.HostMAC.String() != res.Interfaces[0].Mac || ep.PodMAC.String() != res.Interfaces[1].Mac || len(ep.IPs) != 2 {
		t.Fatalf("endpoint = %+v", ep)
	}

	// Node side: device up with the right MTU, /32 and /128 routes to it.
	if err := e.inNode(func() error {
		l, err := netlink.LinkByName(host)
		if err != nil {
			return err
		}
		if l.Attrs().MTU != 1400 || l.Attrs().Flags&net.FlagUp == 0 || l.Attrs().Index != ep.HostIfIndex {
			return fmt.Errorf("host link %+v", l.Attrs())
		}
		if p := checkHost(l, ep.IPs); len(p) > 0 {
			return fmt.Errorf("node side: %v", p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Pod side: addresses, routes, PERMANENT neighbours to the host MAC.
	testutil.InNetns(t, pod, func() error {
		out, _ := exec.Command("ip", "-d", "addr", "show", "eth0").CombinedOutput()
		for _, want := range []string{"inet 10.244.1.1/32", "inet6 fd00:10:244:1::1/128", "mtu 1400"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("pod addr lacks %q:\n%s", want, out)
			}
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"ip", "-4", "route"}, "default via 169.254.1.1 dev eth0"},
			{[]string{"ip", "-6", "route"}, "default via fe80::1 dev eth0"},
			{[]string{"ip", "-4", "neigh"}, "169.254.1.1 dev eth0 lladdr " + ep.HostMAC.String() + " PERMANENT"},
			{[]string{"ip", "-6", "neigh"}, "fe80::1 dev eth0 lladdr " + ep.HostMAC.String() + " PERMANENT"},
		} {
			out, _ := exec.Command(c.args[0], c.args[1:]...).CombinedOutput()
			if !strings.Contains(string(out), c.want) {
				t.Errorf("%v lacks %q:\n%s", c.args, c.want, out)
			}
		}
		for name, want := range map[string]string{"ipv6/conf/eth0/accept_dad": "0", "ipv6/conf/eth0/accept_ra": "0", "ipv4/conf/eth0/rp_filter": "2"} {
			b, _ := os.ReadFile("/proc/sys/net/" + name)
			if strings.TrimSpace(string(b)) != want {
				t.Errorf("pod sysctl %s = %q, want %s", name, b, want)
			}
		}
		return nil
	})

	// The stack path works: a TCP round trip from the pod to the node's
	// addresses, v4 and v6 (no ping binary on this machine).
	for _, dst := range []string{nodeIPv4, nodeIPv6} {
		start := time.Now()
		if err := e.tcpEcho(pod, dst); err != nil {
			t.Errorf("pod -> node %s: %v", dst, err)
		}
		t.Logf("TCP echo pod -> node %s: %v", dst, time.Since(start))
	}

	// CHECK with the prevResult passes.
	prev, _ := json.Marshal(res)
	checkConf := e.conf(`,"prevResult":` + string(prev))
	e.mustOK(call{cmd: "CHECK", cid: "ctr-a", netns: "/run/netns/" + pod, stdin: checkConf})

	// Someone deletes the pod's default route: CHECK says what differs.
	run(t, "ip", "-n", pod, "route", "del", "default")
	o := e.invoke(call{cmd: "CHECK", cid: "ctr-a", netns: "/run/netns/" + pod, stdin: checkConf})
	if ce := o.cniErr(t); !strings.Contains(ce.Msg, "pod default route via 169.254.1.1 dev eth0 missing") || strings.Contains(ce.Msg, "fe80::1 dev eth0 missing") {
		t.Fatalf("CHECK error = %+v", ce)
	}
	// And a node route.
	run(t, "ip", "-n", e.node, "-6", "route", "del", "fd00:10:244:1::1/128")
	o = e.invoke(call{cmd: "CHECK", cid: "ctr-a", netns: "/run/netns/" + pod, stdin: checkConf})
	if ce := o.cniErr(t); !strings.Contains(ce.Msg, "node route fd00:10:244:1::1/128 dev "+host+" missing") {
		t.Fatalf("CHECK error = %+v", ce)
	}

	// Duplicate ADD repairs and is idempotent: same addresses.
	again := e.add("ctr-a", pod)
	if again.IPs[0].Address.String() != "10.244.1.1/32" || again.IPs[1].Address.String() != "fd00:10:244:1::1/128" {
		t.Fatalf("duplicate ADD gave %v", again.IPs)
	}
	e.mustOK(call{cmd: "CHECK", cid: "ctr-a", netns: "/run/netns/" + pod, stdin: checkConf})

	// The IPv6 gateway is an address of the node side (fe80::1): a pod (or a
	// VM guest behind it) without the PERMANENT entry resolves it with a
	// Neighbor Solicitation, which the node's kernel answers.
	run(t, "ip", "-n", pod, "-6", "neigh", "del", GatewayV6.String(), "dev", "eth0")
	if err := e.tcpEcho(pod, nodeIPv6); err != nil {
		t.Errorf("pod -> node %s without the gateway's PERMANENT entry: %v", nodeIPv6, err)
	}
	if out, _ := exec.Command("ip", "-n", pod, "-6", "neigh", "show", GatewayV6.String(), "dev", "eth0").CombinedOutput(); !strings.Contains(string(out), "lladdr "+ep.HostMAC.String()) ||
		strings.Contains(string(out), "PERMANENT") {
		t.Errorf("the pod did not resolve %s to the node side's MAC %s by itself: %s", GatewayV6, ep.HostMAC, out)
	}

	// DEL twice.
	for i := range 2 {
		e.mustOK(call{cmd: "DEL", cid: "ctr-a", netns: "/run/netns/" + pod})
		if l := e.hostLinks(); len(l) != 0 {
			t.Fatalf("DEL %d left links %v", i, l)
		}
		if f := e.ipFiles(); len(f) != 0 {
			t.Fatalf("DEL %d left IP files %v", i, f)
		}
		if _, ok := e.agent.endpoint("ctr-a", "eth0"); ok {
			t.Fatalf("DEL %d left the endpoint", i)
		}
	}
	// CHECK after DEL fails and says why.
	o = e.invoke(call{cmd: "CHECK", cid: "ctr-a", netns: "/run/netns/" + pod, stdin: checkConf})
	if ce := o.cniErr(t); !strings.Contains(ce.Msg, "axon-agent has no endpoint") || !strings.Contains(ce.Msg, "node device "+host+" missing") {
		t.Fatalf("CHECK after DEL = %+v", ce)
	}
}

func TestDelIdempotent(t *testing.T) {
	e := newEnv(t)
	pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
	e.add("ctr-gone", pod)
	// The runtime already removed the netns (the veth dies with it).
	run(t, "ip", "netns", "del", pod)

	tests := []struct {
		name string
		c    call
	}{
		{"netns gone", call{cmd: "DEL", cid: "ctr-gone", netns: "/run/netns/" + pod}},
		{"no netns given", call{cmd: "DEL", cid: "ctr-gone", unsetNetns: true}},
		{"unknown container", call{cmd: "DEL", cid: "never-added", netns: "/run/netns/nope"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { e.mustOK(tc.c) })
	}
	if f := e.ipFiles(); len(f) != 0 {
		t.Fatalf("IP files left: %v", f)
	}
	if l := e.hostLinks(); len(l) != 0 {
		t.Fatalf("links left: %v", l)
	}

	// Agent down on DEL: the veth is still removed, but DEL fails (code 11)
	// because succeeding would leak the allocation.
	pod2 := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
	e.add("ctr-b", pod2)
	e.stop()
	o := e.invoke(call{cmd: "DEL", cid: "ctr-b", netns: "/run/netns/" + pod2})
	if ce := o.cniErr(t); ce.Code != types.ErrTryAgainLater || !strings.Contains(ce.Msg, "is the agent running?") {
		t.Fatalf("DEL with agent down: %+v", ce)
	}
	if l := e.hostLinks(); len(l) != 0 {
		t.Fatalf("DEL with agent down left links %v", l)
	}
	e.startAgent()
	e.mustOK(call{cmd: "DEL", cid: "ctr-b", netns: "/run/netns/" + pod2})
	if f := e.ipFiles(); len(f) != 0 {
		t.Fatalf("IP files left after retried DEL: %v", f)
	}
}

func TestStatus(t *testing.T) {
	e := newEnv(t)
	e.mustOK(call{cmd: "STATUS"})

	e.agent.mu.Lock()
	e.agent.health = errors.New("datapath not loaded yet")
	e.agent.mu.Unlock()
	ce := e.invoke(call{cmd: "STATUS"}).cniErr(t)
	if ce.Code != types.ErrPluginNotAvailable || !strings.Contains(ce.Msg, "datapath not loaded yet") {
		t.Fatalf("STATUS unhealthy = %+v", ce)
	}

	e.stop()
	ce = e.invoke(call{cmd: "STATUS"}).cniErr(t)
	if ce.Code != types.ErrPluginNotAvailable || !strings.Contains(ce.Msg, "not reachable at "+e.sock) || !strings.Contains(ce.Msg, wantAgentHint) {
		t.Fatalf("STATUS down = %+v, want the socket and what to do (%q)", ce, wantAgentHint)
	}
}

func TestGC(t *testing.T) {
	e := newEnv(t)
	podA, podB := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-"), testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
	e.add("keep", podA)
	e.add("drop", podB)
	// A device that is not ours must survive GC.
	run(t, "ip", "-n", e.node, "link", "add", "lxcforeign", "type", "veth", "peer", "name", "lxcforeign2")

	gc := e.conf(`,"cni.dev/valid-attachments":[{"containerID":"keep","ifname":"eth0"}]`)
	e.mustOK(call{cmd: "GC", stdin: gc})

	if _, ok := e.agent.endpoint("drop", "eth0"); ok {
		t.Error("endpoint of dropped attachment survived GC")
	}
	if _, ok := e.agent.endpoint("keep", "eth0"); !ok {
		t.Error("endpoint of valid attachment removed by GC")
	}
	links := strings.Join(e.hostLinks(), " ")
	if strings.Contains(links, HostVethName("drop", "eth0")) || !strings.Contains(links, HostVethName("keep", "eth0")) || !strings.Contains(links, "lxcforeign") {
		t.Errorf("links after GC: %s", links)
	}
	if f := e.ipFiles(); len(f) != 2 {
		t.Errorf("IP files after GC: %v (want the 2 of 'keep')", f)
	}
	if gcs := e.agent.gcs; len(gcs) != 1 || gcs[0].All || len(gcs[0].Valid) != 1 {
		t.Errorf("GC requests to the agent %+v, want one with the valid attachment and no \"all\"", gcs)
	}
	// a runtime's empty list says no attachment is valid: the plugin says "all"
	// and everything of axon-cni goes
	e.mustOK(call{cmd: "GC", stdin: e.conf(`,"cni.dev/valid-attachments":[]`)})
	if gcs := e.agent.gcs; len(gcs) != 2 || !gcs[1].All || len(gcs[1].Valid) != 0 {
		t.Errorf("GC requests to the agent %+v, want the second with \"all\"", gcs)
	}
	if _, ok := e.agent.endpoint("keep", "eth0"); ok {
		t.Error("endpoint of 'keep' survived GC with an empty valid-attachments list")
	}
	if links := strings.Join(e.hostLinks(), " "); strings.Contains(links, HostVethName("keep", "eth0")) || !strings.Contains(links, "lxcforeign") {
		t.Errorf("links after GC of everything: %s", links)
	}
	// no list at all is not "none valid": the agent refuses, the plugin says why
	ce := e.invoke(call{cmd: "GC", stdin: e.conf("")}).cniErr(t)
	if !strings.Contains(ce.Msg, "empty") || !strings.Contains(ce.Msg, "all") {
		t.Errorf("GC without valid-attachments: %+v, want the agent's refusal", ce)
	}
	if gcs := e.agent.gcs; len(gcs) != 3 || gcs[2].All {
		t.Errorf("GC requests to the agent %+v, want the third without \"all\"", gcs)
	}
	// GC before 1.1.0 is refused by the spec.
	ce = e.invoke(call{cmd: "GC", stdin: strings.Replace(gc, "1.1.0", "1.0.0", 1)}).cniErr(t)
	if ce.Code != types.ErrIncompatibleCNIVersion {
		t.Errorf("GC with 1.0.0: %+v", ce)
	}
}

// wantAgentHint is what axon-cni's errors say to do when the node's agent is not there.
const wantAgentHint = "kubectl get pods -A -o wide -l app.kubernetes.io/name=axon-agent"

func TestBadInput(t *testing.T) {
	e := newEnv(t)
	pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
	base := func(c call) call {
		if c.netns == "" && !c.unsetNetns {
			c.netns = "/run/netns/" + pod
		}
		if c.cid == "" {
			c.cid = "bad-1"
		}
		return c
	}
	tests := []struct {
		name string
		c    call
		code uint
		msg  string
	}{
		{"malformed JSON", call{cmd: "ADD", stdin: `{"cniVersion":"1.1.0","name":`}, types.ErrDecodingFailure, "not valid JSON"},
		{"missing cniVersion", call{cmd: "ADD", stdin: `{"name":"axon","type":"axon-cni"}`}, types.ErrIncompatibleCNIVersion, `no "cniVersion": set it to one of 0.4.0, 1.0.0, 1.1.0`},
		{"unknown cniVersion", call{cmd: "ADD", stdin: `{"cniVersion":"9.9.9","name":"axon","type":"axon-cni"}`}, types.ErrIncompatibleCNIVersion, `cniVersion "9.9.9" is not supported`},
		{"mtu out of range", call{cmd: "ADD", stdin: e.conf(`,"mtu":100`)}, types.ErrInvalidNetworkConfig, `"mtu" 100 is out of range: set it between 1280 and 65535`},
		{"relative socket", call{cmd: "ADD", stdin: `{"cniVersion":"1.1.0","name":"axon","type":"axon-cni","socket":"axon.sock"}`}, types.ErrInvalidNetworkConfig, `"socket" "axon.sock" must be an absolute path`},
		{"netns does not exist", call{cmd: "ADD", netns: "/run/netns/axt-cni-does-not-exist"}, types.ErrInvalidNetNS, `open pod netns "/run/netns/axt-cni-does-not-exist"`},
		{"CNI_NETNS unset", call{cmd: "ADD", unsetNetns: true}, types.ErrInvalidEnvironmentVariables, "CNI_NETNS"},
		{"agent down", call{cmd: "ADD", stdin: `{"cniVersion":"1.1.0","name":"axon","type":"axon-cni","socket":"/run/axt-cni-nobody/axon.sock"}`}, types.ErrTryAgainLater, "axon-agent not reachable at /run/axt-cni-nobody/axon.sock: is the agent running?"},
		// what to do, in the pod's events: the agent of this node, and how to find it
		{"agent down: what to do", call{cmd: "ADD", stdin: `{"cniVersion":"1.1.0","name":"axon","type":"axon-cni","socket":"/run/axt-cni-nobody/axon.sock"}`}, types.ErrTryAgainLater, wantAgentHint},
		{"agent down: DEL says what to do", call{cmd: "DEL", stdin: `{"cniVersion":"1.1.0","name":"axon","type":"axon-cni","socket":"/run/axt-cni-nobody/axon.sock"}`}, types.ErrTryAgainLater, wantAgentHint},
		{"CHECK before 0.4.0", call{cmd: "CHECK", stdin: strings.Replace(e.conf(""), "1.1.0", "0.3.1", 1)}, types.ErrIncompatibleCNIVersion, "0.3.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := e.invoke(base(tc.c))
			if o.code == 0 {
				t.Fatalf("exit 0, stdout %s", o.stdout)
			}
			ce := o.cniErr(t)
			if ce.Code != tc.code || !strings.Contains(ce.Msg, tc.msg) {
				t.Fatalf("got code %d %q, want code %d containing %q", ce.Code, ce.Msg, tc.code, tc.msg)
			}
		})
	}
	if l := e.hostLinks(); len(l) != 0 {
		t.Errorf("bad input left links %v", l)
	}
	if f := e.ipFiles(); len(f) != 0 {
		t.Errorf("bad input left IP files %v", f)
	}
}

func TestAddConflictsAndRollback(t *testing.T) {
	e := newEnv(t)

	// The pod netns already has an eth0 that is not ours: ADD fails, nothing leaks.
	pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
	run(t, "ip", "-n", pod, "link", "add", "eth0", "type", "veth", "peer", "name", "other0")
	ce := e.invoke(call{cmd: "ADD", cid: "clash", netns: "/run/netns/" + pod}).cniErr(t)
	if !strings.Contains(ce.Msg, "already exists") {
		t.Fatalf("ADD onto existing eth0: %+v", ce)
	}

	// The same attachment ADDed into a different netns: clear error, the
	// first pod keeps working.
	podA, podB := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-"), testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
	e.add("dup", podA)
	ce = e.invoke(call{cmd: "ADD", cid: "dup", netns: "/run/netns/" + podB}).cniErr(t)
	if !strings.Contains(ce.Msg, "duplicate ADD for dup/eth0") || !strings.Contains(ce.Msg, "run DEL for this container first") {
		t.Fatalf("duplicate ADD elsewhere: %+v", ce)
	}
	if _, ok := e.agent.endpoint("dup", "eth0"); !ok {
		t.Fatal("failed duplicate ADD removed the first pod's endpoint")
	}
	e.mustOK(call{cmd: "DEL", cid: "dup", netns: "/run/netns/" + podA})

	// The agent refuses the endpoint: the veth and the addresses are rolled back.
	e.agent.mu.Lock()
	e.agent.failPut = &api.StatusError{Code: 409, Message: "endpoint map full"}
	e.agent.mu.Unlock()
	ce = e.invoke(call{cmd: "ADD", cid: "rollback", netns: "/run/netns/" + podB}).cniErr(t)
	if !strings.Contains(ce.Msg, "register endpoint with axon-agent: axon-agent: endpoint map full (HTTP 409)") {
		t.Fatalf("PutEndpoint failure: %+v", ce)
	}
	if l := e.hostLinks(); len(l) != 0 {
		t.Fatalf("links after rollback: %v", l)
	}
	if f := e.ipFiles(); len(f) != 0 {
		t.Fatalf("IP files after rollback: %v", f)
	}
	testutil.InNetns(t, podB, func() error {
		if _, err := netlink.LinkByName("eth0"); err == nil {
			t.Error("pod eth0 left after rollback")
		}
		return nil
	})
}

func TestChurn(t *testing.T) {
	e := newEnv(t)
	pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
	seen := map[string]bool{}
	start := time.Now()
	for i := range 20 {
		cid := fmt.Sprintf("churn-%02d", i)
		r := e.add(cid, pod)
		ip := r.IPs[0].Address.IP.String()
		if seen[ip] {
			t.Fatalf("round %d reused %s immediately", i, ip)
		}
		seen[ip] = true
		e.mustOK(call{cmd: "DEL", cid: cid, netns: "/run/netns/" + pod})
	}
	t.Logf("20 ADD+DEL in %v (%v per pair)", time.Since(start), time.Since(start)/20)
	if l := e.hostLinks(); len(l) != 0 {
		t.Fatalf("links leaked: %v", l)
	}
	if f := e.ipFiles(); len(f) != 0 {
		t.Fatalf("IP files leaked: %v", f)
	}
	if a := e.agent.ipam.Allocations(); len(a) != 0 {
		t.Fatalf("allocations leaked: %v", a)
	}
	testutil.InNetns(t, pod, func() error {
		links, _ := netlink.LinkList()
		if len(links) != 1 {
			t.Errorf("pod netns has %d links, want only lo", len(links))
		}
		return nil
	})
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestAddResultPerVersion(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		version string
		want    []string // fragments of the printed result
	}{
		{"0.4.0", []string{`"cniVersion":"0.4.0"`, `"version":"4"`, `"address":"10.244.1.`, `"interface":1`}},
		{"1.0.0", []string{`"cniVersion":"1.0.0"`, `"address":"fd00:10:244:1::`, `"sandbox":"/run/netns/`}},
		{"1.1.0", []string{`"cniVersion":"1.1.0"`, `"gateway":"169.254.1.1"`, `"gw":"fe80::1"`}},
	}
	for i, tc := range tests {
		t.Run(tc.version, func(t *testing.T) {
			pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
			cid := fmt.Sprintf("ver-%d", i)
			conf := strings.Replace(e.conf(""), "1.1.0", tc.version, 1)
			o := e.mustOK(call{cmd: "ADD", cid: cid, netns: "/run/netns/" + pod, stdin: conf})
			compact := strings.Join(strings.Fields(o.stdout), "")
			for _, w := range tc.want {
				if !strings.Contains(compact, w) {
					t.Errorf("result lacks %s:\n%s", w, o.stdout)
				}
			}
			e.mustOK(call{cmd: "DEL", cid: cid, netns: "/run/netns/" + pod, stdin: conf})
		})
	}
}

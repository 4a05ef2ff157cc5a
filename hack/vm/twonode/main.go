// Command twonode is the guest side of the kernel matrix's two-VM subset: two QEMU VMs,
// one axon node each, joined by one virtio-net NIC per VM over QEMU's UDP socket netdev.
//
// VM a (node1) runs etcd + kube-apiserver (internal/lab/controlplane), exposes the apiserver
// on its wire address, creates both Node objects and both Pods, and runs its own axon-agent;
// VM b (node2) runs axon-agent against a's apiserver over the virtio link. Each node wires one
// pod with axon-cni as the kubelet would. b serves the lab's echo server in its pod; a probes
// b's pod over TCP, UDP and ICMP, IPv4 and IPv6, from a's pod and from a's node, so the
// traffic goes pod → axon pod program → virtio_net → axon uplink program → pod. Each side
// also checks that its kernel forwarded no IP datagram (IpForwDatagrams delta 0): the BPF
// host routing, not the kernel's forwarding, moved the packets.
//
// The VMs meet through files in a shared directory (-share, the run dir shared with both).
// Output is `go test -v` text (pseudo tests TwoVM*), read by internal/vmtest like a test binary.
// It is started by the VM runner (internal/vmtest, `go run ./hack/vm -twovm`); it changes
// the VM it runs in (addresses, namespaces, BPF) and is not meant to run anywhere else.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/lab/probe"
)

// node is one VM's axon node.
type node struct {
	Name     string
	Index    int // 1 for a, 2 for b
	WireV4   netip.Addr
	WireV6   netip.Addr
	PodCIDRs []string
}

func nodeFor(i int) node {
	return node{
		Name:     fmt.Sprintf("node%d", i),
		Index:    i,
		WireV4:   netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i)}),
		WireV6:   netip.MustParseAddr(fmt.Sprintf("fd00:198:18::%d", 10+i)),
		PodCIDRs: []string{fmt.Sprintf("10.244.%d.0/24", i), fmt.Sprintf("fd00:10:244:%d::/64", i)},
	}
}

// Work dirs inside the VM (tmpfs): nothing of this outlives the VM.
const (
	workDir  = "/run/axt-twovm"
	podNetns = "axt-twovm-pod"
	apiPort  = 6443
)

// Rendezvous files in the shared dir.
const (
	fileCPReady = "cp-ready"         // a: control plane up, objects created, node2.kubeconfig written
	fileBReady  = "b-ready"          // b: agent ready, pod wired, echo server listening; JSON podInfo
	fileADone   = "a-done"           // a: probes finished
	fileNode2KC = "node2.kubeconfig" // b's agent kubeconfig (server = a's wire address)
	fileFailed  = "failed-"          // + role: that side gave up; the other stops waiting
)

type podInfo struct {
	IPs []string `json:"ips"`
}

func main() {
	role := flag.String("role", "", "a (node1 + control plane) or b (node2)")
	share := flag.String("share", "", "directory shared by both VMs for the rendezvous files")
	bin := flag.String("bin", "/run/axon-vm/bin", "directory with axon, axon-agent, axon-cni")
	mac := flag.String("mac", "", "MAC of this VM's wire NIC")
	logs := flag.String("logs", "/run/axon-vm/out", "directory for agent and control-plane logs")
	timeout := flag.Duration("timeout", 8*time.Minute, "give up after this long")
	flag.Parse()
	if (*role != "a" && *role != "b") || *share == "" || *mac == "" {
		fmt.Fprintln(os.Stderr, "twonode: need -role a|b, -share DIR and -mac MAC (it is started by the VM runner)")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	g := &guest{role: *role, share: *share, bin: *bin, mac: *mac, logs: *logs, rep: &reporter{w: os.Stdout}}
	if *role == "a" {
		g.me, g.peer = nodeFor(1), nodeFor(2)
	} else {
		g.me, g.peer = nodeFor(2), nodeFor(1)
	}
	g.run(ctx)
	g.cleanup()
	if g.rep.failed {
		_ = os.WriteFile(filepath.Join(g.share, fileFailed+g.role), nil, 0o644)
		fmt.Println("FAIL")
		os.Exit(1)
	}
	fmt.Println("PASS")
}

type guest struct {
	role, share, bin, mac, logs string
	me, peer                    node
	rep                         *reporter
	uplink                      string
	agent                       *exec.Cmd
	echo                        *exec.Cmd
	echoIn                      io.Closer
	containerID                 string
	kubeconfig                  string
	admin                       kubernetes.Interface
	podIPs                      []string
}

// run performs the steps in order; the first failure ends the run (later steps need it).
func (g *guest) run(ctx context.Context) {
	steps := []struct {
		name string
		fn   func(context.Context) error
		only string // "" both, "a" or "b"
	}{
		{"TwoVMWire" + g.suffix(), g.wire, ""},
		{"TwoVMControlPlane", g.controlPlane, "a"},
		{"TwoVMJoin", g.join, "b"},
		{"TwoVMAgent" + g.suffix(), g.startAgent, ""},
		{"TwoVMPod" + g.suffix(), g.wirePod, ""},
		{"TwoVMServe", g.serve, "b"},
		{"TwoVMCrossNode", g.probe, "a"},
		{"TwoVMNoForwarding" + g.suffix(), g.waitDone, "b"},
	}
	for _, s := range steps {
		if s.only != "" && s.only != g.role {
			continue
		}
		if !g.rep.run(s.name, func(log func(string, ...any)) error { return s.fn(withLog(ctx, log)) }) {
			return
		}
	}
}

func (g *guest) suffix() string { return "Node" + strconv.Itoa(g.me.Index) }

type logKey struct{}

func withLog(ctx context.Context, log func(string, ...any)) context.Context {
	return context.WithValue(ctx, logKey{}, log)
}

func logf(ctx context.Context, format string, args ...any) {
	if l, ok := ctx.Value(logKey{}).(func(string, ...any)); ok {
		l(format, args...)
	}
}

// wire gives this VM's wire NIC its node addresses and waits until the peer answers (b) or
// the link is up (a: b may still be booting).
func (g *guest) wire(ctx context.Context) error {
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, i := range ifs {
		if strings.EqualFold(i.HardwareAddr.String(), g.mac) {
			g.uplink = i.Name
		}
	}
	if g.uplink == "" {
		return fmt.Errorf("no NIC with MAC %s", g.mac)
	}
	drv, _ := os.Readlink("/sys/class/net/" + g.uplink + "/device/driver")
	logf(ctx, "wire NIC %s (driver %s): %s, %s", g.uplink, filepath.Base(drv), g.me.WireV4, g.me.WireV6)
	for _, argv := range [][]string{
		{"ip", "addr", "add", g.me.WireV4.String() + "/24", "dev", g.uplink},
		{"ip", "addr", "add", g.me.WireV6.String() + "/64", "dev", g.uplink, "nodad"},
		{"ip", "link", "set", g.uplink, "up"},
		{"ip", "link", "set", "lo", "up"},
	} {
		if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, out)
		}
	}
	if g.role == "b" {
		return waitFor(ctx, 3*time.Minute, "ping "+g.peer.WireV4.String(), func() error {
			return exec.CommandContext(ctx, "ping", "-n", "-c", "1", "-W", "2", g.peer.WireV4.String()).Run()
		})
	}
	return nil
}

// controlPlane (a) starts etcd + kube-apiserver, exposes the apiserver on the wire address,
// and creates both Nodes and Pods plus b's kubeconfig.
func (g *guest) controlPlane(ctx context.Context) error {
	etcd, err := lab.DepPath("etcd")
	if err != nil {
		return err
	}
	apiserver, err := lab.DepPath("kube-apiserver")
	if err != nil {
		return err
	}
	t0 := time.Now()
	cp, err := controlplane.Start(ctx, controlplane.Config{
		Dir: filepath.Join(workDir, "controlplane"), EtcdBinary: etcd, APIServerBinary: apiserver,
		ExtraSANs: []net.IP{net.IP(g.me.WireV4.AsSlice())}, ReadyTimeout: 4 * time.Minute,
	})
	if err != nil {
		return err
	}
	logf(ctx, "etcd + kube-apiserver ready in %s", time.Since(t0).Round(time.Millisecond))
	// The apiserver listens on 127.0.0.1 only: forward the wire address to it.
	ln, err := net.Listen("tcp", netip.AddrPortFrom(g.me.WireV4, apiPort).String())
	if err != nil {
		return fmt.Errorf("apiserver forwarder: %w", err)
	}
	go forward(ln, fmt.Sprintf("127.0.0.1:%d", apiPort))
	if g.admin, err = cp.Client(); err != nil {
		return err
	}
	for _, n := range []node{g.me, g.peer} {
		if err := createNode(ctx, g.admin, n); err != nil {
			return err
		}
		if err := createPod(ctx, g.admin, n); err != nil {
			return err
		}
	}
	if g.kubeconfig, err = cp.AgentKubeconfig(g.me.Name); err != nil {
		return err
	}
	kc2, err := cp.AgentKubeconfig(g.peer.Name)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(kc2)
	if err != nil {
		return err
	}
	remote := bytes.ReplaceAll(b, []byte(cp.Server()), []byte(fmt.Sprintf("https://%s:%d", g.me.WireV4, apiPort)))
	if bytes.Equal(remote, b) {
		return fmt.Errorf("agent kubeconfig %s does not name the server %s", kc2, cp.Server())
	}
	if err := os.WriteFile(filepath.Join(g.share, fileNode2KC), remote, 0o600); err != nil {
		return err
	}
	logf(ctx, "Nodes %s, %s and one Pod each created; %s's kubeconfig points at https://%s:%d", g.me.Name, g.peer.Name, g.peer.Name, g.me.WireV4, apiPort)
	return os.WriteFile(filepath.Join(g.share, fileCPReady), nil, 0o644)
}

func forward(ln net.Listener, target string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			u, err := net.DialTimeout("tcp", target, 10*time.Second)
			if err != nil {
				return
			}
			defer u.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
			go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
			<-done
		}()
	}
}

func createNode(ctx context.Context, c kubernetes.Interface, n node) error {
	obj, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{"kubernetes.io/hostname": n.Name}},
		Spec:       corev1.NodeSpec{PodCIDR: n.PodCIDRs[0], PodCIDRs: n.PodCIDRs},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	now := metav1.Now()
	obj.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: n.Name},
		{Type: corev1.NodeInternalIP, Address: n.WireV4.String()},
		{Type: corev1.NodeInternalIP, Address: n.WireV6.String()},
	}
	obj.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		Reason: "AxonTwoVM", LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", n.Name, err)
	}
	return nil
}

func podName(n node) string { return n.Name + "-pod1" }

func createPod(ctx context.Context, c kubernetes.Interface, n node) error {
	_, err := c.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(n), Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: n.Name,
			Containers: []corev1.Container{{Name: "app", Image: "axon.dev/lab-netns:latest"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", podName(n), err)
	}
	return nil
}

// join (b) waits for a's control plane and takes the kubeconfig a wrote for node2.
func (g *guest) join(ctx context.Context) error {
	t0 := time.Now()
	if err := g.waitFile(ctx, 6*time.Minute, fileCPReady); err != nil {
		return err
	}
	g.kubeconfig = filepath.Join(workDir, "node2.kubeconfig")
	b, err := os.ReadFile(filepath.Join(g.share, fileNode2KC))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(workDir, 0o700); err != nil {
		return err
	}
	logf(ctx, "control plane on %s ready after %s of waiting", g.peer.Name, time.Since(t0).Round(time.Millisecond))
	return os.WriteFile(g.kubeconfig, b, 0o600)
}

func (g *guest) socket() string { return filepath.Join(workDir, "axon.sock") }

// startAgent runs axon-agent for this node, its uplink the virtio NIC, and waits for /healthz.
func (g *guest) startAgent(ctx context.Context) error {
	logPath := filepath.Join(g.logs, "twovm-agent-"+g.me.Name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	g.agent = exec.Command(filepath.Join(g.bin, "axon-agent"),
		"--node-name", g.me.Name, "--kubeconfig", g.kubeconfig,
		"--state-dir", filepath.Join(workDir, "state"), "--socket", g.socket(),
		"--bpf-root", "/sys/fs/bpf/axon", "--uplink", g.uplink, "--log-format", "text")
	g.agent.Stdout, g.agent.Stderr = lf, lf
	if err := g.agent.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("start axon-agent: %w", err)
	}
	lf.Close()
	t0 := time.Now()
	c := api.NewClient(g.socket())
	err = waitFor(ctx, 4*time.Minute, "axon-agent /healthz", func() error {
		if g.agent.ProcessState != nil {
			return errors.New("axon-agent exited")
		}
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return c.Healthy(hctx)
	})
	if err != nil {
		return fmt.Errorf("%w; agent log tail:\n%s", err, tailFile(logPath, 20))
	}
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	logf(ctx, "axon-agent %s healthy after %s", g.me.Name, time.Since(t0).Round(time.Millisecond))
	for _, d := range st.Datapath {
		logf(ctx, "decision %s = %s (%s)", d.Name, d.Value, d.Reason)
	}
	return nil
}

// wirePod creates the pod netns and runs axon-cni ADD in the node (root) netns, as kubelet does.
func (g *guest) wirePod(ctx context.Context) error {
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", podNetns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add: %w: %s", err, out)
	}
	_ = exec.CommandContext(ctx, "ip", "-n", podNetns, "link", "set", "lo", "up").Run()
	g.containerID = "twovm" + strconv.Itoa(g.me.Index) + strings.Repeat("0", 58)
	out, err := g.cni(ctx, "ADD")
	if err != nil {
		return err
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("CNI ADD result: %w: %s", err, out)
	}
	for _, ip := range res.IPs {
		p, err := netip.ParsePrefix(ip.Address)
		if err != nil {
			return fmt.Errorf("CNI ADD result address %q: %w", ip.Address, err)
		}
		g.podIPs = append(g.podIPs, p.Addr().String())
	}
	if len(g.podIPs) != 2 {
		return fmt.Errorf("CNI ADD gave %v, want one IPv4 and one IPv6 address", g.podIPs)
	}
	logf(ctx, "pod %s wired by axon-cni: %v", podName(g.me), g.podIPs)
	return nil
}

func (g *guest) cni(ctx context.Context, command string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "axon", "type": "axon-cni", "socket": g.socket(), "mtu": 1500})
	cmd := exec.CommandContext(ctx, filepath.Join(g.bin, "axon-cni"))
	cmd.Env = append(os.Environ(), "CNI_COMMAND="+command, "CNI_CONTAINERID="+g.containerID,
		"CNI_NETNS=/run/netns/"+podNetns, "CNI_IFNAME=eth0", "CNI_PATH="+g.bin,
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME="+podName(g.me)+";K8S_POD_INFRA_CONTAINER_ID="+g.containerID)
	cmd.Stdin = bytes.NewReader(conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("axon-cni %s: %w: %s %s", command, err, stdout.String(), stderr.String())
	}
	return stdout.Bytes(), nil
}

// serve (b) starts the lab's echo server in the pod and publishes the pod's addresses.
func (g *guest) serve(ctx context.Context) error {
	g.echo = exec.Command("nsenter", "--net=/run/netns/"+podNetns, "--", filepath.Join(g.bin, "axon"),
		"lab", "_echo", "serve", "--port", strconv.Itoa(probe.EchoPort))
	in, err := g.echo.StdinPipe()
	if err != nil {
		return err
	}
	g.echoIn = in
	out, err := g.echo.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	g.echo.Stderr = &stderr
	if err := g.echo.Start(); err != nil {
		return fmt.Errorf("start echo server: %w", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("echo server did not start (%q, %v): %s", line, err, stderr.String())
	}
	b, _ := json.Marshal(podInfo{IPs: g.podIPs})
	if err := writeAtomic(filepath.Join(g.share, fileBReady), b); err != nil {
		return err
	}
	logf(ctx, "echo server listening on port %d in %s", probe.EchoPort, podName(g.me))
	return nil
}

// probe (a) runs TCP, UDP and ICMP probes, IPv4 and IPv6, to b's pod from a's pod and from
// a's node, and checks that neither kernel forwarded a datagram.
func (g *guest) probe(ctx context.Context) error {
	if err := g.waitFile(ctx, 6*time.Minute, fileBReady); err != nil {
		return err
	}
	defer func() { _ = writeAtomic(filepath.Join(g.share, fileADone), nil) }()
	var peer podInfo
	b, err := os.ReadFile(filepath.Join(g.share, fileBReady))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &peer); err != nil {
		return fmt.Errorf("%s: %w", fileBReady, err)
	}
	var probes []string
	for _, ip := range peer.IPs {
		for _, proto := range []string{"tcp", "udp", "icmp"} {
			probes = append(probes, proto+"/"+ip)
		}
	}
	fwd0, err := forwarded()
	if err != nil {
		return err
	}
	var failed []string
	for _, from := range []struct {
		name string
		argv []string
	}{
		{"pod " + podName(g.me), []string{"nsenter", "--net=/run/netns/" + podNetns, "--"}},
		{"node " + g.me.Name, nil},
	} {
		argv := append(from.argv, filepath.Join(g.bin, "axon"), "lab", "_echo", "probe", "--timeout", "10s")
		argv = append(argv, probes...)
		out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
		if err != nil {
			return fmt.Errorf("probes from %s: %w", from.name, err)
		}
		n := 0
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var r probe.PodResult
			if json.Unmarshal([]byte(line), &r) != nil {
				continue
			}
			n++
			if r.OK {
				logf(ctx, "%s → %s/%s %s: ok in %s", from.name, r.Proto, r.Addr, podName(g.peer), r.RTT.Round(time.Microsecond))
			} else {
				failed = append(failed, fmt.Sprintf("%s → %s/%s: %s", from.name, r.Proto, r.Addr, r.Err))
			}
		}
		if n != len(probes) {
			failed = append(failed, fmt.Sprintf("%s: %d probe results, want %d", from.name, n, len(probes)))
		}
	}
	fwd1, err := forwarded()
	if err != nil {
		return err
	}
	logf(ctx, "%s IpForwDatagrams delta %d", g.me.Name, fwd1-fwd0)
	if fwd1 != fwd0 {
		failed = append(failed, fmt.Sprintf("%s's kernel forwarded %d datagrams: pod traffic took the kernel routing path, not BPF host routing", g.me.Name, fwd1-fwd0))
	}
	if len(failed) > 0 {
		return errors.New(strings.Join(failed, "\n"))
	}
	return nil
}

// waitDone (b) keeps the echo server up until a has probed, then checks b's own forwarding
// counter over that time.
func (g *guest) waitDone(ctx context.Context) error {
	fwd0, err := forwarded()
	if err != nil {
		return err
	}
	if err := g.waitFile(ctx, 6*time.Minute, fileADone); err != nil {
		return err
	}
	fwd1, err := forwarded()
	if err != nil {
		return err
	}
	logf(ctx, "%s IpForwDatagrams delta %d while %s probed", g.me.Name, fwd1-fwd0, g.peer.Name)
	if fwd1 != fwd0 {
		return fmt.Errorf("%s's kernel forwarded %d datagrams: traffic to the pod took the kernel routing path, not bpf_redirect_peer", g.me.Name, fwd1-fwd0)
	}
	return nil
}

// forwarded returns IpForwDatagrams of this (root) netns from /proc/net/snmp.
func forwarded() (uint64, error) {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0, err
	}
	var head []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "Ip:" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		for i, h := range head {
			if h == "ForwDatagrams" && i < len(f) {
				return strconv.ParseUint(f[i], 10, 64)
			}
		}
	}
	return 0, errors.New("IpForwDatagrams not found in /proc/net/snmp")
}

// cleanup tears down what run created (the VM powers off right after; this proves DEL works
// and leaves the logs complete).
func (g *guest) cleanup() {
	if g.echoIn != nil {
		g.echoIn.Close()
		_ = g.echo.Wait()
	}
	if g.containerID != "" && g.agent != nil {
		if _, err := g.cni(context.Background(), "DEL"); err != nil {
			fmt.Printf("# cleanup: %v\n", err)
		}
	}
	if g.agent != nil && g.agent.Process != nil {
		_ = g.agent.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = g.agent.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = g.agent.Process.Kill()
		}
	}
	_ = exec.Command("ip", "netns", "del", podNetns).Run()
	if g.role == "a" {
		_ = controlplane.Stop(filepath.Join(workDir, "controlplane"))
	}
}

// waitFile waits for name in the share, or for the other side's failure marker.
func (g *guest) waitFile(ctx context.Context, limit time.Duration, name string) error {
	other := "b"
	if g.role == "b" {
		other = "a"
	}
	return waitFor(ctx, limit, "the other VM ("+name+")", func() error {
		if _, err := os.Stat(filepath.Join(g.share, fileFailed+other)); err == nil {
			return errPermanent{fmt.Errorf("the other VM (%s) failed; see its output", other)}
		}
		_, err := os.Stat(filepath.Join(g.share, name))
		return err
	})
}

type errPermanent struct{ error }

// waitFor polls fn every 500 ms until it succeeds, returns errPermanent, or limit/ctx ends.
func waitFor(ctx context.Context, limit time.Duration, what string, fn func() error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		err := fn()
		if err == nil {
			return nil
		}
		var perm errPermanent
		if errors.As(err, &perm) {
			return perm.error
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waited %s for %s: %w (last: %v)", limit, what, ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// reporter prints pseudo tests in `go test -v` format for test2json.
type reporter struct {
	w      io.Writer
	failed bool
}

func (r *reporter) run(name string, fn func(log func(string, ...any)) error) bool {
	fmt.Fprintf(r.w, "=== RUN   %s\n", name)
	t0 := time.Now()
	log := func(format string, args ...any) {
		for _, line := range strings.Split(fmt.Sprintf(format, args...), "\n") {
			fmt.Fprintf(r.w, "    %s\n", line)
		}
	}
	err := fn(log)
	took := time.Since(t0).Seconds()
	if err != nil {
		log("twonode.go: %v", err)
		fmt.Fprintf(r.w, "--- FAIL: %s (%.2fs)\n", name, took)
		r.failed = true
		return false
	}
	fmt.Fprintf(r.w, "--- PASS: %s (%.2fs)\n", name, took)
	return true
}

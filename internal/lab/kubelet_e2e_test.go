package lab_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/deploy/image/e2eref"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/clusterdns"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/netnsutil"
)

// axonImage is the archive `make image` packs (make test builds it first).
func axonImage(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../../bin/image/axon-image.tar")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// needKubelet skips without the real-kubelet dependencies or images, naming what builds them.
func needKubelet(t *testing.T) {
	t.Helper()
	for _, d := range []string{"kubelet", "kube-scheduler", "kube-controller-manager", "containerd", "containerd-shim-runc-v2", "ctr", "runc-debian", "helm"} {
		if _, err := lab.DepPath(d); errors.Is(err, lab.ErrDepMissing) {
			t.Skipf("cached dependency missing (%v): run `make deps`", err)
		}
	}
	for _, img := range e2eref.Images {
		if _, err := os.Stat(filepath.Join(lab.ImagesDir(), e2eref.Archive(img.Ref))); img.Required && err != nil {
			t.Skipf("image archive missing (%v): run `make images`", err)
		}
	}
	if _, err := os.Stat(axonImage(t)); err != nil {
		t.Skipf("axon image missing (%v): run `make image`", err)
	}
	if _, err := exec.LookPath("bpftool"); err != nil {
		t.Skip("bpftool not found: `make packages` (the test lists the programs on the nodes' cgroups)")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not found: install it (the probes run it inside pods' and nodes' namespaces)")
	}
}

// TestKubeletLab brings up two real kubelet nodes with `axon lab up --kubelet` (axon installed
// from its chart) and checks what a cluster gets from axon: the DaemonSet Ready on both nodes,
// pod IPs from axon's IPAM (the node's podCIDR) through axon-cni (the agent lists the sandbox),
// and a Deployment behind a ClusterIP and a NodePort Service (EndpointSlices from the real
// controller) reachable from a pod on each node, from each node and from outside.
func TestKubeletLab(t *testing.T) {
	need(t, "axon")
	needKubelet(t)
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()

	// Registered before up(): runs after its `down`. kubelet, containerd, shims and pods all
	// live in the node's cgroups; none may be left.
	t.Cleanup(func() {
		for _, node := range []string{"node1", "node2"} {
			cg, err := lab.KubeletNodeCgroup(node)
			if err != nil {
				t.Error(err)
				continue
			}
			if _, err := os.Stat(cg); err == nil {
				t.Errorf("node %s's cgroup %s left after down", node, cg)
			}
		}
	})
	l := up(t, "--kubelet", "--nodes", "2", "--pods-per-node", "0", "--image", axonImage(t)) // logs the time to axon Ready
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}

	// The DaemonSet's pods: one Ready on each node, started by kubelet from the chart.
	ds, err := kube.AppsV1().DaemonSets(lab.AxonNamespace).Get(ctx, lab.AxonDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Status.NumberReady != 2 {
		t.Fatalf("DaemonSet %s: %d pods Ready, want 2", ds.Name, ds.Status.NumberReady)
	}
	agents, err := kube.CoreV1().Pods(lab.AxonNamespace).List(ctx, metav1.ListOptions{LabelSelector: lab.AxonAgentSelector})
	if err != nil {
		t.Fatal(err)
	}
	var agentNodes []string
	for _, p := range agents.Items {
		agentNodes = append(agentNodes, p.Spec.NodeName)
	}
	slices.Sort(agentNodes)
	if !slices.Equal(agentNodes, []string{"node1", "node2"}) {
		t.Fatalf("axon agent pods on nodes %v, want one on node1 and one on node2", agentNodes)
	}
	// The cluster DNS add-on: CoreDNS's replicas Ready (up waited for them) behind kube-dns.
	dnsIPs, err := clusterdns.ServiceIPs(kubeproxy.ServiceCIDRs)
	if err != nil {
		t.Fatal(err)
	}
	coredns, err := kube.AppsV1().Deployments(clusterdns.Namespace).Get(ctx, clusterdns.Deployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if coredns.Status.ReadyReplicas != clusterdns.Replicas {
		t.Errorf("Deployment %s/%s: %d replicas Ready, want %d", coredns.Namespace, coredns.Name, coredns.Status.ReadyReplicas, clusterdns.Replicas)
	}
	// A hostNetwork pod (the agent) has its node's hostname, as on a real node: each node has
	// its own UTS namespace (the conformance specs of hostNetwork endpoints compare the two).
	for _, p := range agents.Items {
		out, err := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(containerPID(t, p, "axon-agent")), "-u", "hostname").Output()
		if err != nil || strings.TrimSpace(string(out)) != p.Spec.NodeName {
			t.Errorf("hostNetwork pod %s on %s: hostname %q (%v), want the node's name", p.Name, p.Spec.NodeName, strings.TrimSpace(string(out)), err)
		}
	}

	// Each node's agent has the node to itself: its socket LB hooks on the node's cgroup2
	// subtree (the chart's hostCgroupRoot), none on the machine's cgroup2 root; its pins in the
	// node's own bpffs, none in the machine's /sys/fs/bpf.
	for _, n := range l.Nodes() {
		cg, err := lab.KubeletNodeCgroup(n.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got := cgroupProgs(t, cg); !slices.Contains(got, "axon_sock_connect4") {
			t.Errorf("cgroup %s of %s: programs %v, want axon's socket LB (axon_sock_connect4)", cg, n.Name, got)
		}
		if got := cgroupProgs(t, filepath.Dir(cg)); slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, "axon_") }) {
			t.Errorf("the machine's cgroup2 root %s has axon programs %v: the socket LB must stay in the nodes' subtrees", filepath.Dir(cg), got)
		}
	}
	if _, err := os.Stat("/sys/fs/bpf/axon"); err == nil {
		t.Errorf("/sys/fs/bpf/axon exists in the machine's bpffs: an agent pinned outside its node's own bpffs")
	}

	pods := deployWeb(ctx, t, kube)
	cip, cip6, nodePort := webServices(ctx, t, kube)

	// IPAM and CNI: each pod's IP is in its node's podCIDR, and its node's agent lists the
	// sandbox (axon-cni registered it through the agent's socket).
	for _, n := range l.Nodes() {
		var p *corev1.Pod
		for i := range pods {
			if pods[i].Spec.NodeName == n.Name {
				p = &pods[i]
			}
		}
		ip := netip.MustParseAddr(p.Status.PodIP)
		// dual-stack: an address of each family, each from the node's podCIDR of its family
		if len(p.Status.PodIPs) != 2 || !netip.MustParseAddr(p.Status.PodIPs[1].IP).Is6() {
			t.Errorf("pod %s on %s has IPs %v, want an IPv4 and an IPv6 address", p.Name, n.Name, p.Status.PodIPs)
		}
		for _, pip := range p.Status.PodIPs {
			a := netip.MustParseAddr(pip.IP)
			if !slices.ContainsFunc(n.PodCIDRs, func(c netip.Prefix) bool { return c.Contains(a) }) {
				t.Errorf("pod %s on %s has IP %s, outside the node's podCIDRs %v: not axon's IPAM", p.Name, n.Name, a, n.PodCIDRs)
			}
		}
		node, err := kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var internal []string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		if want := []string{n.IP.String(), n.IPs[1].String()}; !slices.Equal(internal, want) || len(node.Spec.PodCIDRs) != 2 {
			t.Errorf("Node %s: InternalIPs %v, podCIDRs %v; want %v (kubelet's dual-stack --node-ip) and one podCIDR per family", n.Name, internal, node.Spec.PodCIDRs, want)
		}
		c, err := l.Agent(n.Name)
		if err != nil {
			t.Fatal(err)
		}
		eps, err := c.Endpoints(ctx)
		if err != nil {
			t.Fatalf("agent of %s: endpoints: %v", n.Name, err)
		}
		found := false
		for _, ep := range eps {
			if ep.PodName == p.Name && ep.PodNamespace == p.Namespace && slices.Contains(ep.IPs, ip) {
				found = true
				if !strings.HasPrefix(ep.Netns, "/var/run/netns/cni-") {
					t.Errorf("endpoint of %s: netns %q, want containerd's /var/run/netns/cni-<id> (the node's own /run/netns)", p.Name, ep.Netns)
				}
			}
		}
		if !found {
			t.Errorf("agent of %s lists no endpoint for pod %s (%s): the sandbox did not go through axon-cni; it has %+v", n.Name, p.Name, ip, eps)
		}
	}

	// kubectl exec and logs on both nodes: the apiserver reaches each kubelet on its node IP
	// through the lab's egress proxy (the egress selector's "cluster" connection).
	kubeconfig := l.State().ControlPlane.Kubeconfig
	names := []string{pods[0].Name, pods[1].Name}
	for _, p := range pods {
		out := kubectl(ctx, t, kubeconfig, "exec", "-n", p.Namespace, p.Name, "--", "hostname")
		if strings.TrimSpace(out) != p.Name {
			t.Errorf("kubectl exec %s -- hostname (pod on %s) printed %q, want the pod's name", p.Name, p.Spec.NodeName, out)
		}
		if logs := kubectl(ctx, t, kubeconfig, "logs", "-n", p.Namespace, p.Name); !strings.Contains(logs, "8080") {
			t.Errorf("kubectl logs %s (pod on %s): %q, want netexec's start line naming port 8080", p.Name, p.Spec.NodeName, logs)
		}
		// The cluster DNS: CoreDNS pods behind kube-dns (its ClusterIP in the pod's resolv.conf,
		// search default.svc.cluster.local), then the Service by its short name.
		if rc := kubectl(ctx, t, kubeconfig, "exec", "-n", p.Namespace, p.Name, "--", "cat", "/etc/resolv.conf"); !strings.Contains(rc, "nameserver "+dnsIPs[0].String()+"\n") {
			t.Errorf("pod %s's resolv.conf %q: want nameserver %s (the kube-dns Service)", p.Name, rc, dnsIPs[0])
		}
		out = kubectl(ctx, t, kubeconfig, "exec", "-n", p.Namespace, p.Name, "--", "curl", "-sS", "--max-time", "5", "http://web/hostname")
		if !slices.Contains(names, strings.TrimSpace(out)) {
			t.Errorf("from pod %s: curl http://web/hostname = %q, want one of %v (cluster DNS, then the ClusterIP)", p.Name, out, names)
		}
		// The apiserver through the `kubernetes` Service, verified with the pod's ServiceAccount CA.
		out = kubectl(ctx, t, kubeconfig, "exec", "-n", p.Namespace, p.Name, "--", "curl", "-sS", "--max-time", "5",
			"--cacert", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", "https://kubernetes.default.svc/version")
		if !strings.Contains(out, `"gitVersion"`) {
			t.Errorf("from pod %s: GET https://kubernetes.default.svc/version = %q, want the apiserver's version", p.Name, out)
		}
	}

	targets := []string{hostPort(cip, 80), hostPort(cip6, 80)}
	for _, n := range l.Nodes() {
		for _, ip := range n.IPs { // the Node's InternalIPs: its wire IPv4 and IPv6
			targets = append(targets, hostPort(ip, nodePort))
		}
	}
	// From a pod on each node: the probe runs in the netexec container's netns and cgroup (the
	// socket LB hooks the node's cgroup subtree).
	for _, p := range pods {
		netns, cg := podNamespaces(t, p)
		for _, dst := range targets {
			probeHostname(ctx, t, "pod "+p.Name+" on "+p.Spec.NodeName, netns, cg, dst, names)
		}
	}
	optOutPodLB(ctx, t, l, kube, kubeconfig, []netip.Addr{cip, cip6}, names)
	// From each node's netns, in the node's cgroup (where its own processes run).
	for _, n := range l.Nodes() {
		cg, err := lab.KubeletNodeCgroup(n.Name)
		if err != nil {
			t.Fatal(err)
		}
		for _, dst := range targets {
			probeHostname(ctx, t, "node "+n.Name, netnsutil.Path(n.Netns), filepath.Join(cg, "runtime"), dst, names)
		}
	}
	// From outside the cluster: the NodePort on both nodes, both families.
	for _, dst := range targets[2:] {
		probeHostname(ctx, t, "external", netnsutil.Path(l.External().Netns), "", dst, names)
	}

	labToolsKnowKubelet(t, l, pods)
	kubeProxyPortsFromChart(ctx, t, l, kube)

	// kubelet restarts on node1: the pod there is the same container, not restarted, and the
	// Service still reaches it from node1.
	var p1 corev1.Pod
	for _, p := range pods {
		if p.Spec.NodeName == "node1" {
			p1 = p
		}
	}
	restarted := time.Now().Truncate(time.Second) // heartbeats have second resolution
	if err := l.RestartKubelet(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	waitUntil(ctx, t, 30*time.Second, "node1 Ready, reported by the restarted kubelet", func() (bool, string) {
		n, err := kube.CoreV1().Nodes().Get(ctx, "node1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		hb := time.Time{}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				hb = c.LastHeartbeatTime.Time
			}
		}
		return !hb.Before(restarted), fmt.Sprintf("Ready heartbeat %s, restart at %s", hb, restarted)
	})
	kept, err := kube.CoreV1().Pods(p1.Namespace).Get(ctx, p1.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := kept.Status.ContainerStatuses; kept.UID != p1.UID || len(cs) != 1 || cs[0].ContainerID != p1.Status.ContainerStatuses[0].ContainerID || cs[0].RestartCount != 0 {
		t.Errorf("after node1's kubelet restarted, pod %s is uid %s, containers %+v; before uid %s container %s", p1.Name, kept.UID, cs, p1.UID, p1.Status.ContainerStatuses[0].ContainerID)
	}
	cg1, err := lab.KubeletNodeCgroup("node1")
	if err != nil {
		t.Fatal(err)
	}
	probeHostname(ctx, t, "node node1 after kubelet's restart", netnsutil.Path(l.Nodes()[0].Netns), filepath.Join(cg1, "runtime"), targets[0], names)

	// Operating axon (kubelet_ops_e2e_test.go, with AXON_LAB_KUBELET_OPS=1): the DaemonSet rolls
	// to a new image tag, then the agents are killed, while clients stream through the ClusterIP
	// and the NodePorts; after the missing agent, 50 pods through kubelet across agent kills.
	ops := os.Getenv(opsEnv) != ""
	if ops {
		countersShowResets(ctx, t, l, pods)
		rollAgentsUnderTraffic(ctx, t, l, kube, pods, cip.String(), nodePort, names)
		killAgentsUnderTraffic(ctx, t, l, kube, pods, cip.String(), nodePort, names)
	}

	agentMissing(ctx, t, kube)

	if !ops {
		t.Logf("the rolling update and agent kills under traffic and the pod churn (about 90 s more) run with %s=1 (make test-kubelet-ops)", opsEnv)
		return
	}
	podChurn(ctx, t, l, kube)
}

// labToolsKnowKubelet runs `axon lab status`, `exec` and `check` on the kubelet lab: status
// shows each node's holder, containerd and kubelet running, its DaemonSet agent ready and the
// pods kubelet runs; exec enters a pod kubelet runs by <namespace>/<pod>; check probes between
// pods kubelet runs for it (two per node) and the nodes, every probe passing.
func labToolsKnowKubelet(t *testing.T, l *lab.Lab, pods []corev1.Pod) {
	t.Helper()
	status := axon(t, "status")
	if !strings.HasPrefix(status, "lab UP") || strings.Contains(status, "PROBLEM") {
		t.Errorf("axon lab status: want lab UP without problems:\n%s", status)
	}
	for _, n := range l.Nodes() {
		for _, p := range []string{"holder", "containerd", "kubelet"} {
			if !regexp.MustCompile(`(?m)^\s+` + p + "/" + n.Name + `\s+pid \d+\s+running$`).MatchString(status) {
				t.Errorf("axon lab status: no running %s/%s:\n%s", p, n.Name, status)
			}
		}
		if !regexp.MustCompile(`(?m)^` + n.Name + `\s.*\sready\s`).MatchString(status) {
			t.Errorf("axon lab status: node %s's agent (DaemonSet) not shown ready:\n%s", n.Name, status)
		}
		if want := "axon-agent/" + n.Name + " "; !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(want) + `\s*healthz on kube-proxy's port 127\.0\.0\.1:10256: 200 OK, last updated `).MatchString(status) {
			t.Errorf("axon lab status: node %s's agent not shown answering kube-proxy's healthz:\n%s", n.Name, status)
		}
	}
	for _, p := range pods {
		if !regexp.MustCompile(`(?m)^` + p.Namespace + "/" + p.Name + `\s+` + p.Spec.NodeName + `\s+Running\s+pod\s+` + regexp.QuoteMeta(p.Status.PodIP)).MatchString(status) {
			t.Errorf("axon lab status: pod %s/%s (%s on %s) not listed Running:\n%s", p.Namespace, p.Name, p.Status.PodIP, p.Spec.NodeName, status)
		}
	}

	p := pods[0]
	if out := axon(t, "exec", p.Namespace+"/"+p.Name, "--", "ip", "-o", "-4", "addr", "show", "dev", "eth0"); !strings.Contains(out, " "+p.Status.PodIP+"/") {
		t.Errorf("axon lab exec %s/%s -- ip addr: %q, want the pod's address %s", p.Namespace, p.Name, out, p.Status.PodIP)
	}
	if out, err := axonErr(t, "exec", "no-such-pod", "--", "true"); err == nil || !strings.Contains(out, `no pod "no-such-pod" in any namespace`) {
		t.Errorf("axon lab exec no-such-pod: %v, %q; want an error naming the missing pod", err, out)
	}

	check := axon(t, "check")
	// 4 probe pods, each to the 3 others and 2 nodes, IPv4 and IPv6, TCP/UDP/ICMP
	if !strings.Contains(check, "120/120 probes passed (IPv4+IPv6 × TCP/UDP/ICMP; ok = all 6)") {
		t.Errorf("axon lab check: want 120/120 probes passed:\n%s", check)
	}
	t.Logf("axon lab check:\n%s", check)
}

// kubectl runs the lab's kubectl with kubeconfig and returns its stdout; it fails the test
// with stderr when kubectl fails.
func kubectl(ctx context.Context, t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	bin, err := lab.DepPath("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(cctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// agentMissing takes axon's agent off node2 (a DaemonSet nodeSelector only node1 matches): a
// pod bound to node2 must report the CNI plugin's error (agent not reachable) in its events,
// then come up with an IP once the agent is back.
func agentMissing(ctx context.Context, t *testing.T, kube kubernetes.Interface) {
	t.Helper()
	patch := func(p string) {
		t.Helper()
		if _, err := kube.AppsV1().DaemonSets(lab.AxonNamespace).Patch(ctx, lab.AxonDaemonSet, types.JSONPatchType, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kube.CoreV1().Nodes().Patch(ctx, "node1", types.MergePatchType, []byte(`{"metadata":{"labels":{"lab-agent":"on"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	patch(`[{"op":"add","path":"/spec/template/spec/nodeSelector/lab-agent","value":"on"}]`)
	waitUntil(ctx, t, 30*time.Second, "axon's agent gone from node2", func() (bool, string) {
		l, err := kube.CoreV1().Pods(lab.AxonNamespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node2",
			LabelSelector: lab.AxonAgentSelector})
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, p := range l.Items {
			left = append(left, fmt.Sprintf("%s %s deleting=%v", p.Name, p.Status.Phase, p.DeletionTimestamp != nil))
		}
		return len(l.Items) == 0, fmt.Sprintf("axon pods on node2: %v", left)
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName: "node2", Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers:                    []corev1.Container{{Name: "netexec", Image: lab.AgnhostImage, ImagePullPolicy: corev1.PullNever, Args: []string{"netexec"}}},
		},
	}
	if _, err := kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// What is wrong (the agent's socket) and what to do (find the node's agent pod).
	const want, todo = "axon-agent not reachable at /var/run/axon/axon.sock", "kubectl get pods -A -o wide -l app.kubernetes.io/name=axon-agent"
	var lateEvent string
	waitUntil(ctx, t, 30*time.Second, "pod late's events name the missing agent and what to do", func() (bool, string) {
		l, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=late,type=Warning"})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range l.Items {
			if strings.Contains(e.Message, want) && strings.Contains(e.Message, todo) {
				lateEvent = e.Reason + ": " + e.Message
				return true, ""
			}
		}
		return false, podEvents(ctx, kube)
	})
	t.Logf("with the agent missing: %s", lateEvent)
	patch(`[{"op":"remove","path":"/spec/template/spec/nodeSelector/lab-agent"}]`)
	waitUntil(ctx, t, 60*time.Second, "pod late Running with an IP once the agent is back", func() (bool, string) {
		p, err := kube.CoreV1().Pods("default").Get(ctx, "late", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", fmt.Sprintf("%s ip=%q", p.Status.Phase, p.Status.PodIP)
	})
}

// cgroupProgs lists the names of the BPF programs attached to cgroup dir (bpftool).
func cgroupProgs(t *testing.T, dir string) []string {
	t.Helper()
	out, err := exec.Command("bpftool", "-j", "cgroup", "show", dir).Output()
	if err != nil {
		t.Fatalf("bpftool cgroup show %s: %v", dir, err)
	}
	var progs []struct {
		Name string `json:"name"`
	}
	if len(bytes.TrimSpace(out)) == 0 { // bpftool prints nothing for a cgroup without programs
		return nil
	}
	if err := json.Unmarshal(out, &progs); err != nil {
		t.Fatalf("bpftool cgroup show %s: %v: %s", dir, err, out)
	}
	var names []string
	for _, p := range progs {
		names = append(names, p.Name)
	}
	return names
}

func hostPort(ip netip.Addr, port int) string { return netip.AddrPortFrom(ip, uint16(port)).String() }

// deployWeb creates Deployment web (2 agnhost netexec replicas, one per node) and returns its
// pods once both are Ready.
func deployWeb(ctx context.Context, t *testing.T, kube kubernetes.Interface) []corev1.Pod {
	t.Helper()
	labels := map[string]string{"app": "web"}
	replicas := int32(2)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					}},
					TerminationGracePeriodSeconds: ptr(int64(1)),
					Containers: []corev1.Container{{
						Name: "netexec", Image: lab.AgnhostImage, ImagePullPolicy: corev1.PullNever,
						Args: []string{"netexec", "--http-port=8080"},
						// Burstable, not BestEffort: a BestEffort pod's cgroup has cpu.shares 2
						// against the agent's 102, and a restarted agent verifies its programs
						// (about a core-second) next to it; the likely cause of a 2 s stall that
						// the rolling update under traffic once counted (docs/kubelet.md).
						Resources:      corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
					}},
				},
			},
		},
	}
	if _, err := kube.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	waitUntil(ctx, t, 90*time.Second, "2 web pods Ready, one per node", func() (bool, string) {
		l, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, err.Error()
		}
		pods = l.Items
		var nodes, states []string
		for _, p := range pods {
			ready := slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			})
			states = append(states, fmt.Sprintf("%s on %q %s ready=%v", p.Name, p.Spec.NodeName, p.Status.Phase, ready))
			if ready {
				nodes = append(nodes, p.Spec.NodeName)
			}
		}
		slices.Sort(nodes)
		return len(pods) == 2 && slices.Equal(nodes, []string{"node1", "node2"}), strings.Join(states, "; ") + podEvents(ctx, kube)
	})
	return pods
}

// webServices creates ClusterIP Service web and NodePort Service web-np (both dual-stack) in
// front of the web pods, waits for the EndpointSlice controller to list both pods in each
// family, and returns the IPv4 and IPv6 ClusterIPs and the node port.
func webServices(ctx context.Context, t *testing.T, kube kubernetes.Interface) (cip, cip6 netip.Addr, nodePort int) {
	t.Helper()
	dual := corev1.IPFamilyPolicyRequireDualStack
	for _, typ := range []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort} {
		name := map[corev1.ServiceType]string{corev1.ServiceTypeClusterIP: "web", corev1.ServiceTypeNodePort: "web-np"}[typ]
		svc, err := kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{Type: typ, Selector: map[string]string{"app": "web"}, IPFamilyPolicy: &dual,
				Ports: []corev1.ServicePort{
					{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
					{Name: "udp", Port: 81, TargetPort: intstr.FromInt32(8081), Protocol: corev1.ProtocolUDP}, // netexec's UDP server
				}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if typ == corev1.ServiceTypeClusterIP {
			if len(svc.Spec.ClusterIPs) != 2 {
				t.Fatalf("Service %s: ClusterIPs %v, want one per family (RequireDualStack)", name, svc.Spec.ClusterIPs)
			}
			cip, cip6 = netip.MustParseAddr(svc.Spec.ClusterIPs[0]), netip.MustParseAddr(svc.Spec.ClusterIPs[1])
		} else {
			nodePort = int(svc.Spec.Ports[0].NodePort)
		}
		waitUntil(ctx, t, 30*time.Second, "EndpointSlice of "+name+" with both pods ready, from the controller", func() (bool, string) {
			l, err := kube.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
			if err != nil {
				return false, err.Error()
			}
			ready := 0
			var got []string
			for _, s := range l.Items {
				got = append(got, fmt.Sprintf("%s managed-by=%s", s.Name, s.Labels[discoveryv1.LabelManagedBy]))
				if s.Labels[discoveryv1.LabelManagedBy] != "endpointslice-controller.k8s.io" {
					continue
				}
				for _, e := range s.Endpoints {
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						ready++
					}
				}
			}
			return ready == 4, fmt.Sprintf("%d ready endpoints (want both pods in each family's slice) in %v", ready, got)
		})
	}
	return cip, cip6, nodePort
}

// podNamespaces returns the netns path and the cgroup2 dir of p's (first) container.
func podNamespaces(t *testing.T, p corev1.Pod) (netns, cgroup string) {
	t.Helper()
	c, err := lab.KubeletContainer(p, "")
	if err != nil {
		t.Fatal(err)
	}
	return c.Netns, c.Cgroup
}

// probeHostname GETs http://dst/hostname with curl in netns (and cgroup, when set) until it
// answers with one of names; the agents program a new Service within seconds.
func probeHostname(ctx context.Context, t *testing.T, from, netns, cgroup, dst string, names []string) {
	t.Helper()
	waitUntil(ctx, t, 20*time.Second, from+" GET http://"+dst+"/hostname answers a web pod", func() (bool, string) {
		cmd := exec.CommandContext(ctx, "nsenter", "--net="+netns, "--", "curl", "-gsS", "-m", "2", "http://"+dst+"/hostname") // -g: [IPv6] is no glob
		if cgroup != "" {
			fd, err := syscall.Open(cgroup, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			if err != nil {
				return false, err.Error()
			}
			defer syscall.Close(fd)
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		}
		out, err := cmd.CombinedOutput()
		runtime.KeepAlive(cmd)
		got := strings.TrimSpace(string(out))
		return err == nil && slices.Contains(names, got), fmt.Sprintf("%q (%v)", got, err)
	})
}

// podEvents lists the Warning events of the default namespace (CNI errors show there).
func podEvents(ctx context.Context, kube kubernetes.Interface) string {
	l, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err != nil || len(l.Items) == 0 {
		return ""
	}
	var b strings.Builder
	for _, e := range l.Items {
		fmt.Fprintf(&b, "; event %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
	}
	return b.String()
}

func waitUntil(ctx context.Context, t *testing.T, timeout time.Duration, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := f()
		if ok {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not after %s: %s", what, timeout, state)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// optOutPodLB: a pod on node2 annotated axon.io/socket-lb: disabled, its sockets untranslated,
// reaches the web ClusterIP over both families through its own per-packet pod LB, and node2's
// agent says so (the socket_lb line lists it as opted out and served by the pod LB).
func optOutPodLB(ctx context.Context, t *testing.T, l *lab.Lab, kube kubernetes.Interface, kubeconfig string, cips []netip.Addr, names []string) {
	t.Helper()
	var grace int64
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "optout", Namespace: "default", Annotations: map[string]string{"axon.io/socket-lb": "disabled"}},
		Spec: corev1.PodSpec{NodeName: "node2", TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "c", Image: lab.AgnhostImage, ImagePullPolicy: corev1.PullNever, Args: []string{"pause"}}}},
	}
	if _, err := kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := kube.CoreV1().Pods("default").Delete(ctx, "optout", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			t.Errorf("delete pod optout: %v", err)
		}
	}()
	waitUntil(ctx, t, 60*time.Second, "pod optout Running", func() (bool, string) {
		p, err := kube.CoreV1().Pods("default").Get(ctx, "optout", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase)
	})
	c, err := l.Agent("node2")
	if err != nil {
		t.Fatal(err)
	}
	var reason string
	waitUntil(ctx, t, 30*time.Second, "node2's agent: optout opted out and served by its pod LB", func() (bool, string) {
		st, err := c.Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, d := range st.Datapath {
			if d.Name == "socket_lb" {
				reason = d.Reason
				return strings.Contains(d.Reason, "default/optout") && strings.Contains(d.Reason, "per-packet pod LB on 1 pod"), d.Reason
			}
		}
		return false, "no socket_lb decision"
	})
	for _, cip := range cips {
		url := "http://" + hostPort(cip, 80) + "/hostname"
		out := kubectl(ctx, t, kubeconfig, "exec", "-n", "default", "optout", "--", "curl", "-sS", "--max-time", "5", url)
		if !slices.Contains(names, strings.TrimSpace(out)) {
			t.Errorf("from the opted-out pod: curl %s = %q, want one of %v (its pod LB translating)", url, out, names)
		}
		t.Logf("opted-out pod: %s answered by %s", url, strings.TrimSpace(out))
	}
	t.Logf("node2's agent: socket_lb %s", reason)
}

// kubeProxyPortsFromChart: the chart's agents answer on kube-proxy's ports in their node's netns
// (where a hostNetwork pod, a cloud load balancer or the conformance spec asks): /healthz 200
// with kube-proxy's JSON and a current lastUpdated, /proxyMode "axon". A Node the cluster
// autoscaler is about to remove answers 503 (nodeEligible false) so load balancers drain it,
// while the other node stays 200; untainted, it answers 200 again.
func kubeProxyPortsFromChart(ctx context.Context, t *testing.T, l *lab.Lab, kube kubernetes.Interface) {
	t.Helper()
	healthz := func(n lab.Node) (int, map[string]any, string) {
		body, status, err := kubeproxy.HTTPGet(ctx, netnsutil.Path(n.Netns), kubeproxy.HealthzAddr, "/healthz", 3*time.Second)
		if err != nil {
			return 0, nil, err.Error()
		}
		var j map[string]any
		if err := json.Unmarshal(body, &j); err != nil {
			return 0, nil, fmt.Sprintf("%s: body %q: %v", status, body, err)
		}
		code, _ := strconv.Atoi(strings.Fields(status)[0])
		return code, j, status + " " + string(body)
	}
	for _, n := range l.Nodes() {
		code, j, got := healthz(n)
		last, err := time.Parse(time.RFC3339Nano, fmt.Sprint(j["lastUpdated"]))
		if code != 200 || j["healthy"] != true || j["nodeEligible"] != true || err != nil || time.Since(last) > time.Minute {
			t.Errorf("node %s: GET %s/healthz = %s; want 200, healthy, nodeEligible and a current lastUpdated", n.Name, kubeproxy.HealthzAddr, got)
		}
		body, status, err := kubeproxy.HTTPGet(ctx, netnsutil.Path(n.Netns), kubeproxy.MetricsAddr, "/proxyMode", 3*time.Second)
		if err != nil || !strings.HasPrefix(status, "200 ") || string(body) != "axon" {
			t.Errorf("node %s: GET %s/proxyMode = %s %q (%v); want 200 axon", n.Name, kubeproxy.MetricsAddr, status, body, err)
		}
	}
	taint := func(on bool) {
		t.Helper()
		n, err := kube.CoreV1().Nodes().Get(ctx, "node2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == "ToBeDeletedByClusterAutoscaler" })
		if on {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "ToBeDeletedByClusterAutoscaler", Value: strconv.FormatInt(time.Now().Unix(), 10), Effect: corev1.TaintEffectNoSchedule})
		}
		if _, err := kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	nodes := l.Nodes()
	taint(true)
	defer taint(false)
	waitUntil(ctx, t, 15*time.Second, "node2's healthz draining it", func() (bool, string) {
		code, j, got := healthz(nodes[1])
		return code == 503 && j["nodeEligible"] == false && j["healthy"] == true, got
	})
	if code, _, got := healthz(nodes[0]); code != 200 {
		t.Errorf("node1 answered %s while only node2 is tainted", got)
	}
	taint(false)
	waitUntil(ctx, t, 15*time.Second, "node2's healthz back to 200", func() (bool, string) {
		code, _, got := healthz(nodes[1])
		return code == 200, got
	})
}

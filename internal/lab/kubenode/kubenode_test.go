package kubenode_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/lab/kubenode"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/proc"
	"github.com/axonhq/axon/internal/testutil"
	"github.com/axonhq/axon/internal/testutil/controlplanetest"
)

// nodeBinaries resolves the node's programs in the dependency cache (`make deps`), or skips.
// Names hack/deps.sh does not know yet fall back to their cache paths.
func nodeBinaries(t *testing.T) (kubenode.Binaries, string) {
	t.Helper()
	fallback := map[string]string{
		"kubelet":                 "k8s-" + lab.K8sVersion + "/kubelet",
		"containerd":              "containerd-v2.4.2/containerd",
		"containerd-shim-runc-v2": "containerd-v2.4.2/containerd-shim-runc-v2",
		"ctr":                     "containerd-v2.4.2/ctr",
		// Debian's runc has seccomp (libseccomp2), which kubelet's sandboxes need
		"runc-debian": "runc-debian-1.1.5+ds1-1+deb12u1/runc",
		"ptp":         "cni-plugins-" + lab.CNIPluginsVersion + "/ptp",
		"host-local":  "cni-plugins-" + lab.CNIPluginsVersion + "/host-local",
	}
	path := map[string]string{}
	for dep, rel := range fallback {
		p, err := lab.DepPath(dep)
		if err != nil && !errors.Is(err, lab.ErrDepMissing) {
			p = filepath.Join(lab.DepsDir(), rel) // not a known dependency (yet)
		}
		if st, serr := os.Stat(p); err != nil && errors.Is(err, lab.ErrDepMissing) || serr != nil || st.Mode().Perm()&0o111 == 0 {
			t.Skipf("%s not built (%s): run `make deps` (hack/deps.sh)", dep, p)
		}
		path[dep] = p
	}
	return kubenode.Binaries{
		Containerd: path["containerd"],
		ShimDir:    filepath.Dir(path["containerd-shim-runc-v2"]),
		Ctr:        path["ctr"],
		Runc:       path["runc-debian"],
		Kubelet:    path["kubelet"],
	}, filepath.Dir(path["ptp"])
}

// TestNodeRunsPods starts one real node (containerd + runc + kubelet) against a throwaway
// apiserver and checks what a lab node must do: register and go Ready, run a Pod whose IP
// answers HTTP from the node netns, tear a deleted Pod's sandbox and netns down, never change
// the host's kernel tunables, and leave no process, mount, cgroup or netns after Stop.
func TestNodeRunsPods(t *testing.T) {
	testutil.RequireRoot(t, "creates network and mount namespaces, cgroups, runs containerd and kubelet")
	nodeBinaries(t) // skip before anything starts
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hostSysctls := readSysctls(t)
	hostFiles := hostRuntimeFiles(t)

	c := newTestCluster(ctx, t)
	tStarted := time.Now()
	n := c.startNode(ctx, t, 1)
	node, nodeName, nsName, dir, cs := n.node, n.name, n.nsName, n.dir, c.cs
	tNode := time.Now()

	// kubelet started with protectKernelDefaults: it saw its values, in the node's mount ns only.
	if out, err := exec.Command("nsenter", "-t", strconv.Itoa(node.HolderPID()), "-m", "cat", "/proc/sys/vm/overcommit_memory").Output(); err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Errorf("vm.overcommit_memory in the node's mount namespace = %q (%v), want 1 (kubelet's)", out, err)
	}

	waitNodeReady(ctx, t, cs, nodeName)
	tReady := time.Now()

	web, stay := createPod(ctx, t, cs, nodeName, "web", serverImage), createPod(ctx, t, cs, nodeName, "stay", serverImage)
	web, stay = waitRunning(ctx, t, cs, web), waitRunning(ctx, t, cs, stay)
	tPods := time.Now()
	for _, p := range []*corev1.Pod{web, stay} {
		if got := httpGet(t, nsName, p.Status.PodIP); got != p.Name {
			t.Errorf("GET http://%s:8080/ from the node netns = %q, want the pod's hostname %q", p.Status.PodIP, got, p.Name)
		}
	}

	// Delete one pod: its containers stop and go, its sandbox stops (no task left) and its netns
	// goes. The stopped sandbox's record stays until kubelet's container GC (every minute).
	before := taskIDs(ctx, t, node)
	netnsBefore := podNetnsFiles(t, dir)
	if len(before) != 4 || len(netnsBefore) != 2 {
		t.Fatalf("with two pods: running tasks %v (want 2 sandboxes + 2 apps), pod netns %v (want 2)", before, netnsBefore)
	}
	webCtr := strings.TrimPrefix(web.Status.ContainerStatuses[0].ContainerID, "containerd://")
	stayCtr := strings.TrimPrefix(stay.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if !slices.Contains(before, webCtr) || !slices.Contains(before, stayCtr) {
		t.Fatalf("the pods' containers %s, %s are not among containerd's running tasks %v", webCtr, stayCtr, before)
	}
	zero := int64(0)
	if err := cs.CoreV1().Pods("default").Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	var after []string
	waitFor(ctx, t, 30*time.Second, "web's container and sandbox stopped, its netns removed", func() (bool, string) {
		after = taskIDs(ctx, t, node)
		files := podNetnsFiles(t, dir)
		return len(after) == 2 && !slices.Contains(after, webCtr) && slices.Contains(after, stayCtr) && len(files) == 1,
			fmt.Sprintf("running tasks %v, pod netns %v", after, files)
	})
	if slices.Equal(podNetnsFiles(t, dir), netnsBefore[:1]) == slices.Equal(podNetnsFiles(t, dir), netnsBefore[1:]) {
		t.Errorf("pod netns left %v: want exactly one of %v", podNetnsFiles(t, dir), netnsBefore)
	}
	if err := tcpDial(nsName, web.Status.PodIP); err == nil {
		t.Errorf("web's IP %s still answers after the pod was deleted", web.Status.PodIP)
	}
	tDeleted := time.Now()

	// Stop with "stay" still running: everything goes.
	pids, err := node.CgroupPIDs()
	if err != nil {
		t.Fatal(err)
	}
	holderMnt := nsInode(t, node.HolderPID(), "mnt")
	nodeNet := nsInode(t, node.HolderPID(), "net")
	podNets := map[string]bool{}
	for _, pid := range pids {
		if ino, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && ino != nodeNet {
			podNets[ino] = true
		}
	}
	if len(pids) < 6 || len(podNets) != 1 {
		t.Fatalf("before Stop: node cgroups hold %v (want holder, containerd, kubelet, shim(s), stay's sandbox and server), pod netns %v (want stay's only)", pids, podNets)
	}
	cgroupRoot := "/axon-kubenode-" + nodeName
	if err := kubenode.Stop(dir); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	tStopped := time.Now()
	for _, pid := range pids {
		if !proc.Exited(pid) {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			t.Errorf("pid %d (%s) of the node still runs after Stop", pid, strings.TrimSpace(string(comm)))
		}
	}
	for _, p := range procsInNamespaces(t, map[string]bool{holderMnt: true}, podNets) {
		t.Errorf("after Stop a process is still in the node's mount namespace or a pod netns: %s", p)
	}
	assertNoCgroups(t, cgroupRoot)
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), dir) {
		t.Errorf("a mount under %s is visible in the root mount namespace after Stop:\n%s", dir, mi)
	}
	for _, sub := range []string{"containerd", "kubelet", "pod-logs"} {
		if _, err := os.Stat(filepath.Join(dir, sub)); err == nil {
			t.Errorf("%s still exists after Stop", filepath.Join(dir, sub))
		}
	}
	if after := hostRuntimeFiles(t); !slices.Equal(after, hostFiles) {
		t.Errorf("the host's runtime directories changed (they belong in the node's mount namespace):\nbefore %v\nafter  %v", hostFiles, after)
	}
	if after := readSysctls(t); !maps(hostSysctls, after) {
		t.Errorf("host kernel tunables changed: before %v, after %v", hostSysctls, after)
	}
	t.Logf("control plane and images %v, node started %v, Ready %v, two pods Running %v, pod deleted %v, Stop %v; total %v",
		tStarted.Sub(t0).Round(time.Millisecond), tNode.Sub(tStarted).Round(time.Millisecond), tReady.Sub(tNode).Round(time.Millisecond),
		tPods.Sub(tReady).Round(time.Millisecond), tDeleted.Sub(tPods).Round(time.Millisecond), tStopped.Sub(tDeleted).Round(time.Millisecond),
		time.Since(t0).Round(time.Millisecond))
}

// testCluster is a throwaway control plane, the node binaries and the test's images.
type testCluster struct {
	cp     *controlplane.ControlPlane
	cs     kubernetes.Interface
	bins   kubenode.Binaries
	cniBin string
	images string
	work   string
}

const pauseImage, serverImage = "axon.test/pause:1", "axon.test/podserver:1"

func newTestCluster(ctx context.Context, t *testing.T) *testCluster {
	t.Helper()
	bins, cniBin := nodeBinaries(t)
	apiPort, etcdPort := freePorts(t)
	cp := controlplanetest.Start(t, controlplane.Config{APIPort: apiPort, EtcdPort: etcdPort})
	cs, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	bindNodeRole(ctx, t, cs)
	work := t.TempDir()
	return &testCluster{cp: cp, cs: cs, bins: bins, cniBin: cniBin, work: work, images: buildImages(t, work, pauseImage, serverImage)}
}

type testNode struct {
	name, nsName, dir string
	node              *kubenode.Node
}

// startNode starts node i: a netns with an uplink address (a veth pair, both ends inside) and
// a default route, the apiserver forwarded into it, ptp + host-local on 10.247.<i>.0/24.
func (c *testCluster) startNode(ctx context.Context, t *testing.T, i int) testNode {
	t.Helper()
	n := testNode{name: "kn-" + testutil.RandSuffix(t), nsName: testutil.NewNetns(t, "kn-")}
	nsPath := netnsutil.Path(n.nsName)
	nodeIP := net.IPv4(198, 19, 0, 1)
	testutil.InNetns(t, n.nsName, func() error { return uplink(nodeIP) })
	hostport := strings.TrimPrefix(c.cp.Server(), "https://")
	fwd, err := controlplane.ListenForwarder([]string{nsPath}, hostport, hostport, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithCancel(context.Background())
	go func() { _ = fwd.Serve(fctx) }()
	t.Cleanup(func() { fcancel(); fwd.Close() })

	work := filepath.Join(c.work, n.name)
	cniConf := filepath.Join(work, "cni")
	if err := os.MkdirAll(cniConf, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeconfig := kubeletKubeconfig(t, c.cp, n.name, filepath.Join(work, "kubelet.kubeconfig"))
	conflist := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"kubenode-test","plugins":[{"type":"ptp","ipMasq":false,`+
		`"ipam":{"type":"host-local","ranges":[[{"subnet":"10.247.%d.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":%q}}]}`, i, filepath.Join(work, "ipam"))
	if err := os.WriteFile(filepath.Join(cniConf, "10-test.conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	n.dir = filepath.Join(work, "node")
	n.node, err = kubenode.Start(ctx, kubenode.Config{
		Name: n.name, NetnsPath: nsPath, NodeIP: nodeIP, Kubeconfig: kubeconfig, ClientCAFile: c.cp.CAFile(),
		Binaries: c.bins, CNIBinDir: c.cniBin, CNIConfDir: cniConf, Dir: n.dir, PauseImage: pauseImage,
		Images: []string{c.images}, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatalf("Start %s: %v", n.name, err)
	}
	t.Cleanup(func() {
		if err := kubenode.Stop(n.dir); err != nil {
			t.Errorf("cleanup Stop: %v", err)
		}
	})
	t.Cleanup(func() { // before Stop (cleanups run last-in first-out)
		if t.Failed() {
			dumpLogs(t, filepath.Join(n.dir, "logs"))
		}
	})
	return n
}

func waitNodeReady(ctx context.Context, t *testing.T, cs kubernetes.Interface, nodeName string) {
	t.Helper()
	waitFor(ctx, t, 60*time.Second, "Node "+nodeName+" Ready", func() (bool, string) {
		n, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, c.Reason + ": " + c.Message
			}
		}
		return false, "no Ready condition"
	})
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func freePorts(t *testing.T) (api, etcd int) {
	t.Helper()
	// etcd needs etcd and etcd+1 (peer): take a port whose successor is free too.
	for range 50 {
		l1, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l1.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		if err != nil {
			l1.Close()
			continue
		}
		l3, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		api = l3.Addr().(*net.TCPAddr).Port
		l1.Close()
		l2.Close()
		l3.Close()
		return api, p
	}
	t.Fatal("no free port pair for etcd")
	return 0, 0
}

var sysctlPaths = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

func readSysctls(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range sysctlPaths {
		b, err := os.ReadFile("/proc/sys/" + p)
		if err != nil {
			t.Fatal(err)
		}
		out[p] = strings.TrimSpace(string(b))
	}
	return out
}

func maps(a, b map[string]string) bool {
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

// bindNodeRole gives kubelets (group system:nodes) the bootstrap ClusterRole system:node: the
// test's apiserver authorizes with RBAC only, without the Node authorizer.
func bindNodeRole(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubenode-test-nodes"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:nodes"}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// kubeletKubeconfig issues a client certificate CN=system:node:<node>, O=system:nodes from the
// control plane's CA and writes a kubeconfig for it.
func kubeletKubeconfig(t *testing.T, cp *controlplane.ControlPlane, node, path string) string {
	t.Helper()
	caPEM, err := os.ReadFile(cp.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(filepath.Dir(cp.CAFile()), "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := pem.Decode(caPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		t.Fatal("CA certificate or key is not PEM")
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := parseKey(kb)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		NotBefore:    time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = &clientcmdapi.Cluster{Server: cp.Server(), CertificateAuthorityData: caPEM}
	cfg.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		ClientKeyData:         pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
	cfg.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: "kubelet"}
	cfg.CurrentContext = "lab"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func parseKey(b *pem.Block) (any, error) {
	switch b.Type {
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(b.Bytes)
	}
	return x509.ParsePKCS8PrivateKey(b.Bytes)
}

// uplink gives the calling thread's netns eth0 (a veth whose peer stays in the same netns)
// with ip/24 and a default route: kubelet and the CNI plugin want a node address and a route.
func uplink(ip net.IP) error {
	la := netlink.NewLinkAttrs()
	la.Name = "eth0"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0peer"}); err != nil {
		return fmt.Errorf("add veth: %w", err)
	}
	for _, n := range []string{"eth0", "eth0peer"} {
		l, err := netlink.LinkByName(n)
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		if err != nil {
			return fmt.Errorf("set %s up: %w", n, err)
		}
	}
	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(24, 32)}}); err != nil {
		return fmt.Errorf("address eth0: %w", err)
	}
	gw := net.IPv4(ip[12], ip[13], ip[14], 254)
	return netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw, Flags: int(netlink.FLAG_ONLINK)})
}

// buildImages builds testdata/podserver statically and packs it as two images in one docker
// archive: pause (entrypoint /pause, a symlink: the program then waits for a signal) and the
// HTTP server (entrypoint /podserver).
func buildImages(t *testing.T, dir, pause, server string) string {
	t.Helper()
	bin := filepath.Join(dir, "podserver")
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(gobin, "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./testdata/podserver")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build podserver: %v\n%s", err, out)
	}
	content, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	for _, h := range []*tar.Header{
		{Name: "podserver", Mode: 0o755, Size: int64(len(content)), Typeflag: tar.TypeReg},
		{Name: "pause", Linkname: "podserver", Mode: 0o777, Typeflag: tar.TypeSymlink},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(content); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	refs := map[name.Reference]v1.Image{}
	for ref, entry := range map[string]string{pause: "/pause", server: "/podserver"} {
		img, err := mutate.AppendLayers(empty.Image, layer)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cf = cf.DeepCopy()
		cf.Architecture, cf.OS = runtime.GOARCH, "linux"
		cf.Config.Entrypoint = []string{entry}
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
		tag, err := name.NewTag(ref)
		if err != nil {
			t.Fatal(err)
		}
		refs[tag] = img
	}
	out := filepath.Join(dir, "images.tar")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := tarball.MultiRefWrite(refs, f); err != nil {
		t.Fatal(err)
	}
	return out
}

func createPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, node, podName, image string) *corev1.Pod {
	t.Helper()
	grace := int64(1)
	p, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName},
		Spec: corev1.PodSpec{
			NodeName:                      node, // no scheduler in this test
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  new(bool),
			Containers: []corev1.Container{{
				Name: "server", Image: image, ImagePullPolicy: corev1.PullNever,
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func waitRunning(ctx context.Context, t *testing.T, cs kubernetes.Interface, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	var cur *corev1.Pod
	waitFor(ctx, t, 45*time.Second, "Pod "+p.Name+" Running with an IP", func() (bool, string) {
		var err error
		cur, err = cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := cur.Status.Phase == corev1.PodRunning && cur.Status.PodIP != "" && len(cur.Status.ContainerStatuses) == 1 && cur.Status.ContainerStatuses[0].Ready
		return ready, fmt.Sprintf("phase %s ip %q conditions %v containers %v", cur.Status.Phase, cur.Status.PodIP, cur.Status.Conditions, cur.Status.ContainerStatuses)
	})
	return cur
}

func waitFor(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(testutil.Stretch(t, timeout))
	var last string
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not after %v; last state: %s", what, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// httpGet fetches http://ip:8080/ over a socket made in the node netns.
func httpGet(t *testing.T, nsName, ip string) string {
	t.Helper()
	var c net.Conn
	testutil.InNetns(t, nsName, func() error {
		var err error
		c, err = net.DialTimeout("tcp", net.JoinHostPort(ip, "8080"), 3*time.Second)
		return err
	})
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", ip)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET from %s: %v", ip, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func tcpDial(nsName, ip string) error {
	return netnsutil.Do(nsName, func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "8080"), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// taskIDs lists the running tasks of the node's containerd namespace k8s.io (sandboxes
// included).
func taskIDs(ctx context.Context, t *testing.T, n *kubenode.Node) []string {
	t.Helper()
	out, err := n.Ctr(ctx, "tasks", "list", "-q")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range strings.Fields(out) {
		if len(l) == 64 { // skip warnings: IDs are 64 hex digits
			ids = append(ids, l)
		}
	}
	slices.Sort(ids)
	return ids
}

// kubeletPID is the kubelet's PID in the node's node.json.
func kubeletPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "node.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Processes []struct {
			Name string `json:"name"`
			PID  int    `json:"pid"`
		} `json:"processes"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Processes {
		if p.Name == "kubelet" {
			return p.PID
		}
	}
	t.Fatalf("%s/node.json records no kubelet", dir)
	return 0
}

// podNetnsFiles lists the pod netns bind-mount targets in the node's /run/netns.
func podNetnsFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "run-netns", "cni-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func nsInode(t *testing.T, pid int, ns string) string {
	t.Helper()
	l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// procsInNamespaces lists processes whose mount namespace is in mnts or netns in nets.
func procsInNamespaces(t *testing.T, mnts, nets map[string]bool) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		mnt, _ := os.Readlink("/proc/" + e.Name() + "/ns/mnt")
		net, _ := os.Readlink("/proc/" + e.Name() + "/ns/net")
		if mnts[mnt] || nets[net] {
			comm, _ := os.ReadFile("/proc/" + e.Name() + "/comm")
			out = append(out, fmt.Sprintf("pid %s (%s) %s %s", e.Name(), strings.TrimSpace(string(comm)), mnt, net))
		}
	}
	return out
}

func assertNoCgroups(t *testing.T, root string) {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		i := slices.Index(f, "-")
		if i < 0 || i+1 >= len(f) || (f[i+1] != "cgroup" && f[i+1] != "cgroup2") {
			continue
		}
		checked++
		if _, err := os.Stat(filepath.Join(f[4], root)); err == nil {
			t.Errorf("cgroup %s still exists after Stop", filepath.Join(f[4], root))
		}
	}
	if checked == 0 {
		t.Error("no cgroup hierarchy found to check")
	}
}

// dumpLogs shows the warnings and errors of the node's logs (the state dir goes with the test).
func dumpLogs(t *testing.T, dir string) {
	for _, f := range []string{"containerd.log", "kubelet.log"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Logf("%s: %v", f, err)
			continue
		}
		var keep []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "E") || strings.HasPrefix(l, "W") || strings.Contains(l, "level=error") || strings.Contains(l, "level=warn") {
				keep = append(keep, l)
			}
		}
		if len(keep) > 60 {
			keep = keep[len(keep)-60:]
		}
		t.Logf("%s, last warnings and errors:\n%s", f, strings.Join(keep, "\n"))
	}
}

// hostRuntimeFiles lists what is in the host's copies of the directories kubelet, containerd and
// CNI installers write whatever their config says (the node binds its own over them).
func hostRuntimeFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, root := range []string{"/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/run/containerd", "/etc/cni/net.d", "/opt/cni/bin"} {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && p != root {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

// TestTwoNodesShareTheHost runs two nodes at once, as the lab does: each registers and runs a
// pod; each kubelet's hard-coded paths land in its own dir; stopping one leaves the other's
// processes and pod running.
func TestTwoNodesShareTheHost(t *testing.T) {
	testutil.RequireRoot(t, "creates network and mount namespaces, cgroups, runs containerd and kubelet")
	nodeBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hostFiles := hostRuntimeFiles(t)
	c := newTestCluster(ctx, t)
	a, b := c.startNode(ctx, t, 1), c.startNode(ctx, t, 2)
	waitNodeReady(ctx, t, c.cs, a.name)
	waitNodeReady(ctx, t, c.cs, b.name)
	pa, pb := createPod(ctx, t, c.cs, a.name, "on-a", serverImage), createPod(ctx, t, c.cs, b.name, "on-b", serverImage)
	pa, pb = waitRunning(ctx, t, c.cs, pa), waitRunning(ctx, t, c.cs, pb)
	if got := httpGet(t, a.nsName, pa.Status.PodIP); got != "on-a" {
		t.Errorf("pod on %s answers %q, want on-a", a.name, got)
	}
	if got := httpGet(t, b.nsName, pb.Status.PodIP); got != "on-b" {
		t.Errorf("pod on %s answers %q, want on-b", b.name, got)
	}
	for _, n := range []testNode{a, b} {
		if _, err := os.Stat(filepath.Join(n.dir, "kubelet", "device-plugins", "kubelet.sock")); err != nil {
			t.Errorf("kubelet of %s: device-plugin socket not in the node's own /var/lib/kubelet: %v", n.name, err)
		}
	}
	if nsInode(t, a.node.HolderPID(), "mnt") == nsInode(t, b.node.HolderPID(), "mnt") {
		t.Error("the two nodes share a mount namespace")
	}

	// kubelet restarts (as a node's service manager restarts it): containerd and the pod stay,
	// the same container, not restarted, still answering.
	before := kubeletPID(t, b.dir)
	if err := kubenode.RestartKubelet(ctx, b.dir, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if after := kubeletPID(t, b.dir); after == before || !proc.Exited(before) || proc.Exited(after) {
		t.Errorf("kubelet of %s: pid %d before the restart, %d after (want the old one gone, a new one running)", b.name, before, after)
	}
	waitNodeReady(ctx, t, c.cs, b.name)
	time.Sleep(2 * time.Second) // one pod sync of the new kubelet
	kept, err := c.cs.CoreV1().Pods(pb.Namespace).Get(ctx, pb.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if kept.UID != pb.UID || kept.Status.PodIP != pb.Status.PodIP || kept.Status.ContainerStatuses[0].ContainerID != pb.Status.ContainerStatuses[0].ContainerID || kept.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("after kubelet's restart pod on-b is uid %s ip %s container %s restarts %d; before uid %s ip %s container %s",
			kept.UID, kept.Status.PodIP, kept.Status.ContainerStatuses[0].ContainerID, kept.Status.ContainerStatuses[0].RestartCount,
			pb.UID, pb.Status.PodIP, pb.Status.ContainerStatuses[0].ContainerID)
	}
	if got := httpGet(t, b.nsName, pb.Status.PodIP); got != "on-b" {
		t.Errorf("after kubelet's restart the pod on %s answers %q, want on-b", b.name, got)
	}

	bPIDs, err := b.node.CgroupPIDs()
	if err != nil {
		t.Fatal(err)
	}
	if err := kubenode.Stop(a.dir); err != nil {
		t.Fatalf("Stop %s: %v", a.name, err)
	}
	for _, pid := range bPIDs {
		if proc.Exited(pid) {
			t.Errorf("pid %d of node %s exited when node %s stopped", pid, b.name, a.name)
		}
	}
	if got := httpGet(t, b.nsName, pb.Status.PodIP); got != "on-b" {
		t.Errorf("after %s stopped, the pod on %s answers %q, want on-b", a.name, b.name, got)
	}
	if err := kubenode.Stop(b.dir); err != nil {
		t.Fatalf("Stop %s: %v", b.name, err)
	}
	if after := hostRuntimeFiles(t); !slices.Equal(after, hostFiles) {
		t.Errorf("the host's runtime directories changed:\nbefore %v\nafter  %v", hostFiles, after)
	}
}

// TestStartFailureCleansUp: a kubelet that dies at once fails Start with its log's tail, and
// Start's own Stop (from node.json alone) leaves no process, cgroup or runtime dir behind.
func TestStartFailureCleansUp(t *testing.T) {
	testutil.RequireRoot(t, "creates network and mount namespaces, cgroups, runs containerd")
	bins, cniBin := nodeBinaries(t)
	work := t.TempDir()
	fake := filepath.Join(work, "kubelet")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho simulated kubelet failure >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bins.Kubelet = fake
	for _, f := range []string{"kubeconfig", "ca.crt"} {
		if err := os.WriteFile(filepath.Join(work, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	nodeName := "kn-" + testutil.RandSuffix(t)
	nsName := testutil.NewNetns(t, "kn-")
	dir := filepath.Join(work, "node")
	hostFiles := hostRuntimeFiles(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := kubenode.Start(ctx, kubenode.Config{
		Name: nodeName, NetnsPath: netnsutil.Path(nsName), NodeIP: net.IPv4(198, 19, 0, 1),
		Kubeconfig: filepath.Join(work, "kubeconfig"), ClientCAFile: filepath.Join(work, "ca.crt"),
		Binaries: bins, CNIBinDir: cniBin, CNIConfDir: work, Dir: dir, Logger: testLogger(t),
	})
	if err == nil {
		t.Fatal("Start succeeded with a kubelet that exits at once")
	}
	for _, want := range []string{"kubelet", "exited", "simulated kubelet failure", "kubelet.log"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start's error does not say %q:\n%v", want, err)
		}
	}
	b, rerr := os.ReadFile(filepath.Join(dir, "logs", "containerd.log"))
	if rerr != nil || !strings.Contains(string(b), "containerd successfully booted") {
		t.Fatalf("containerd did not run before kubelet (so this test checks nothing): %v\n%s", rerr, b)
	}
	for _, p := range psWithArg(t, dir) {
		t.Errorf("after the failed Start a process still runs with %s in its command line: %s", dir, p)
	}
	assertNoCgroups(t, "/axon-kubenode-"+nodeName)
	if _, err := os.Stat(filepath.Join(dir, "containerd")); err == nil {
		t.Errorf("%s still exists after the failed Start", filepath.Join(dir, "containerd"))
	}
	if after := hostRuntimeFiles(t); !slices.Equal(after, hostFiles) {
		t.Errorf("the host's runtime directories changed:\nbefore %v\nafter  %v", hostFiles, after)
	}
}

// psWithArg lists processes whose command line mentions s.
func psWithArg(t *testing.T, s string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || proc.Exited(pid) {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if bytes.Contains(cmd, []byte(s)) {
			out = append(out, fmt.Sprintf("pid %d: %s", pid, bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
		}
	}
	return out
}

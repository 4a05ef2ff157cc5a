package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/cni"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/testutil"
)

// Ports of the install tests' control plane (each test file has its own).
const (
	installAPIPort  = 16833
	installEtcdPort = 12769
)

// The kubernetes Service's address as the kubelet gives it to a Pod
// (KUBERNETES_SERVICE_HOST/PORT): nothing in the node netns answers it, as on
// a node where kube-proxy does not run and axon serves no Service yet.
const unreachableClusterIP = "10.96.0.1"

// installNode is a scratch node whose agent authenticates as a Pod does:
// a service-account token and the cluster CA in a directory.
type installNode struct {
	*scratchNode
	cp     *controlplane.ControlPlane
	cs     kubernetes.Interface
	dir    string
	cfg    Config
	log    string
	inPod  []string // the Pod's environment: the unreachable kubernetes Service
	apiURL string   // the real apiserver as seen from the node netns
}

func newInstallNode(t *testing.T) *installNode {
	t.Helper()
	testutil.RequireRoot(t, "creates network namespaces, loads BPF programs, pins under /sys/fs/bpf")
	cp := startControlPlaneOn(t, installAPIPort, installEtcdPort)
	cs, err := cp.Client()
	must(t, err)
	ctx := context.Background()
	n := newScratchNode(t)
	apiAddr := fmt.Sprintf("127.0.0.1:%d", installAPIPort)
	fwd, err := controlplane.ListenForwarder([]string{n.path}, apiAddr, apiAddr, testLogger(t))
	must(t, err)
	fwdCtx, stopFwd := context.WithCancel(ctx)
	fwdDone := make(chan struct{})
	go func() { defer close(fwdDone); _ = fwd.Serve(fwdCtx) }()
	t.Cleanup(func() { stopFwd(); fwd.Close(); <-fwdDone })

	// the agent's service account, bound to the agent's ClusterRole, and a
	// token for it as the kubelet projects one into the Pod
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "axon-agent", Namespace: "default"}}
	_, err = cs.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{})
	must(t, err)
	_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "axon-agent-sa"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: controlplane.AgentRoleName},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}},
	}, metav1.CreateOptions{})
	must(t, err)
	exp := int64(3600)
	tok, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	must(t, err)
	dir := t.TempDir()
	saDir := filepath.Join(dir, "serviceaccount")
	must(t, os.MkdirAll(saDir, 0o700))
	must(t, os.WriteFile(filepath.Join(saDir, "token"), []byte(tok.Status.Token), 0o600))
	must(t, os.WriteFile(filepath.Join(saDir, "ca.crt"), cp.CACertPEM(), 0o600))
	must(t, os.MkdirAll(filepath.Join(dir, "net.d"), 0o755))

	pinDir := filepath.Join("/sys/fs/bpf", "axt-install-"+testutil.RandSuffix(t))
	t.Cleanup(func() { _ = os.RemoveAll(pinDir) })
	cfg := Defaults()
	cfg.CgroupRoot = testCgroup(t)
	cfg.NodeName = "node1"
	cfg.ServiceAccountDir = saDir
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Socket = filepath.Join(dir, "axon.sock")
	cfg.BPFRoot = pinDir
	cfg.CNIConfDir = filepath.Join(dir, "net.d")
	cfg.HealthAddr = "127.0.0.1:19879" // inside the node netns
	logFile := filepath.Join(dir, "agent.log")
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("AXON_TEST_AGENT_LOG") != "" {
			b, _ := os.ReadFile(logFile)
			t.Logf("agent log:\n%s", b)
		}
	})
	createNode(t, cs, node("node1", []string{"198.18.0.11", "fd00:198:18::11"}, "10.244.1.0/24", "fd00:10:244:1::/64"))
	createNode(t, cs, node("node2", []string{"198.18.0.12", "fd00:198:18::12"}, "10.244.2.0/24", "fd00:10:244:2::/64"))
	return &installNode{scratchNode: n, cp: cp, cs: cs, dir: dir, cfg: cfg, log: logFile,
		inPod:  []string{"KUBERNETES_SERVICE_HOST=" + unreachableClusterIP, "KUBERNETES_SERVICE_PORT=443"},
		apiURL: "https://" + apiAddr}
}

func (n *installNode) conflist() string { return filepath.Join(n.cfg.CNIConfDir, CNIConfFile) }

// TestAgentFirstBoot: an agent in a Pod-like setup (service-account token
// and CA, $KUBERNETES_SERVICE_HOST pointing at a ClusterIP nothing serves)
// stays unready and writes no CNI configuration; with --k8s-api-server it
// becomes ready, and only then writes the configuration, which axon-cni's
// parser accepts, and which stays when the agent stops.
func TestAgentFirstBoot(t *testing.T) {
	n := newInstallNode(t)
	ctx := context.Background()
	c := api.NewClient(n.cfg.Socket)

	// without --k8s-api-server: the ClusterIP, unreachable
	p := startAgentEnv(t, t, n.scratchNode, n.cfg, n.log, n.inPod...)
	eventually(t, "agent reports the kubernetes Service unreachable", testutil.Stretch(t, 40*time.Second), func() error {
		st, err := c.Status(ctx)
		if err != nil {
			return err
		}
		if st.Ready || st.APIServer.Connected || !strings.Contains(st.Message, unreachableClusterIP) {
			return fmt.Errorf("status ready=%v apiserver %+v message %q", st.Ready, st.APIServer, st.Message)
		}
		return nil
	})
	if _, err := os.Stat(n.conflist()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s while the agent is not ready: %v", n.conflist(), err)
	}
	// what a startup probe sees at a first boot without the apiserver:
	// /livez passes (a restart would not help), /readyz says why not
	for path, want := range map[string]int{"/livez": 200, "/readyz": 503} {
		code, body, err := n.httpGet("http://" + n.cfg.HealthAddr + path)
		if err != nil || code != want {
			t.Errorf("GET %s: %d %q %v, want %d", path, code, body, err, want)
		}
	}
	p.stop(t)

	// with it: ready, and the configuration appears no earlier
	cfg := n.cfg
	cfg.APIServer = strings.TrimPrefix(n.apiURL, "https://") // host:port form
	p = startAgentEnv(t, t, n.scratchNode, cfg, n.log, n.inPod...)
	eventually(t, "agent ready through --k8s-api-server", testutil.Stretch(t, 60*time.Second), func() error {
		_, fileErr := os.Stat(n.conflist()) // first the file, then readiness: a file before ready shows here
		st, err := c.Status(ctx)
		if err != nil {
			return err
		}
		if fileErr == nil && !st.Ready {
			t.Fatalf("%s exists while the agent is not ready: %s", n.conflist(), st.Message)
		}
		if !st.Ready {
			return errors.New(st.Message)
		}
		if fileErr != nil {
			return fileErr
		}
		return nil
	})
	fi, err := os.Stat(n.conflist())
	must(t, err)
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("%s mode %v, want 0644", n.conflist(), fi.Mode().Perm())
	}
	raw, err := os.ReadFile(n.conflist())
	must(t, err)
	nc, err := cni.ParseConfList(raw)
	if err != nil {
		t.Fatalf("axon-cni rejects the written configuration: %v\n%s", err, raw)
	}
	if nc.Socket != cfg.Socket || nc.MTU != cni.DefaultMTU || nc.Type != "axon-cni" {
		t.Errorf("written configuration: socket %q mtu %d type %q, want %q %d axon-cni", nc.Socket, nc.MTU, nc.Type, cfg.Socket, cni.DefaultMTU)
	}
	ents, err := os.ReadDir(n.cfg.CNIConfDir)
	must(t, err)
	if len(ents) != 1 {
		t.Errorf("%s holds %d entries, want only %s (no temporary file left)", n.cfg.CNIConfDir, len(ents), CNIConfFile)
	}
	// SIGTERM keeps it: a restart must not make the node's network unready
	p.stop(t)
	if after, err := os.ReadFile(n.conflist()); err != nil || string(after) != string(raw) {
		t.Errorf("%s after SIGTERM: %v (content changed: %v)", n.conflist(), err, string(after) != string(raw))
	}
}

// Package deploy holds the Kubernetes manifests (deploy/kubernetes) and the
// image recipe (deploy/Dockerfile). These tests keep the manifests true to
// the code: the RBAC equals what the lab's agents get, every agent flag
// exists, the CNI configuration parses with axon-cni's own parser, and a real
// kube-apiserver accepts every object (server-side dry run).
package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/axonhq/axon/internal/cni"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/testutil/controlplanetest"
)

const manifest = "kubernetes/axon.yaml"

// Ports of this package's control plane: distinct from every other test
// package's pair, so packages run in any order.
const (
	testAPIPort  = 16813
	testEtcdPort = 12749
)

func decodeManifest(t *testing.T) []runtime.Object {
	t.Helper()
	raw, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read %s: %v", manifest, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decode a document of %s: %v\n%s", manifest, err, doc)
		}
		objs = append(objs, obj)
	}
	return objs
}

func find[T runtime.Object](t *testing.T, objs []runtime.Object) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%s: want exactly one %T, found %d", manifest, zero, len(found))
	}
	return found[0]
}

// TestManifestRBACMatchesLab: the DaemonSet's ClusterRole is exactly the
// least-privilege role the lab gives its agents (and that the agent tests
// prove is enough), bound to the DaemonSet's service account.
func TestManifestRBACMatchesLab(t *testing.T) {
	objs := decodeManifest(t)
	role := find[*rbacv1.ClusterRole](t, objs)
	want := controlplane.AgentClusterRole()
	if role.Name != want.Name {
		t.Errorf("ClusterRole name %q, lab uses %q", role.Name, want.Name)
	}
	if !reflect.DeepEqual(role.Rules, want.Rules) {
		t.Errorf("ClusterRole rules differ from internal/lab/controlplane/rbac.go:\nmanifest: %+v\nlab:      %+v", role.Rules, want.Rules)
	}
	b := find[*rbacv1.ClusterRoleBinding](t, objs)
	ds := find[*appsv1.DaemonSet](t, objs)
	if b.RoleRef.Name != role.Name || b.RoleRef.Kind != "ClusterRole" {
		t.Errorf("ClusterRoleBinding refers to %s/%s, want ClusterRole/%s", b.RoleRef.Kind, b.RoleRef.Name, role.Name)
	}
	sa := find[*corev1.ServiceAccount](t, objs)
	if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != sa.Name || b.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("ClusterRoleBinding subjects %+v, want the ServiceAccount %s/%s", b.Subjects, sa.Namespace, sa.Name)
	}
	if ds.Spec.Template.Spec.ServiceAccountName != sa.Name || ds.Namespace != sa.Namespace {
		t.Errorf("DaemonSet runs as %s/%s, want %s/%s", ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
}

// TestManifestCNIConfig: the conflist in the ConfigMap is accepted by
// axon-cni's own config parser, and its socket is the one the agent serves.
func TestManifestCNIConfig(t *testing.T) {
	objs := decodeManifest(t)
	cm := find[*corev1.ConfigMap](t, objs)
	raw, ok := cm.Data["05-axon.conflist"]
	if !ok {
		t.Fatalf("ConfigMap %s has no 05-axon.conflist key", cm.Name)
	}
	var list struct {
		CNIVersion string            `json:"cniVersion"`
		Name       string            `json:"name"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(raw), &list); err != nil {
		t.Fatalf("conflist is not JSON: %v", err)
	}
	if len(list.Plugins) != 1 {
		t.Fatalf("conflist has %d plugins, want 1 (axon-cni)", len(list.Plugins))
	}
	// libcni injects cniVersion and name into each plugin's config.
	var plugin map[string]any
	if err := json.Unmarshal(list.Plugins[0], &plugin); err != nil {
		t.Fatal(err)
	}
	plugin["cniVersion"], plugin["name"] = list.CNIVersion, list.Name
	conf, _ := json.Marshal(plugin)
	nc, err := cni.ParseConfig(conf)
	if err != nil {
		t.Fatalf("axon-cni rejects the manifest's config: %v", err)
	}
	ds := find[*appsv1.DaemonSet](t, objs)
	if got := flagValue(agentContainer(t, ds).Args, "--socket"); got != nc.Socket {
		t.Errorf("CNI socket %q, agent --socket %q: they must match", nc.Socket, got)
	}
}

// TestManifestAgentFlags: every flag the DaemonSet passes exists in the
// axon-agent built from this tree (its --help), so a renamed flag cannot
// leave the manifest behind.
func TestManifestAgentFlags(t *testing.T) {
	objs := decodeManifest(t)
	ds := find[*appsv1.DaemonSet](t, objs)
	c := agentContainer(t, ds)
	bin := filepath.Join(t.TempDir(), "axon-agent")
	build := exec.Command("go", "build", "-o", bin, "../cmd/axon-agent")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/axon-agent: %v\n%s", err, out)
	}
	help, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("axon-agent --help: %v\n%s", err, help)
	}
	if len(c.Args) == 0 {
		t.Fatal("agent container has no args")
	}
	for _, a := range c.Args {
		name, _, _ := strings.Cut(a, "=")
		if !strings.HasPrefix(name, "--") {
			t.Errorf("arg %q: the manifest passes flags as --name=value only", a)
			continue
		}
		if !bytes.Contains(help, []byte("  "+name+" ")) && !bytes.Contains(help, []byte("  "+name+"\n")) {
			t.Errorf("axon-agent has no flag %s (from the manifest's args); --help says:\n%s", name, help)
		}
	}
	var node bool
	for _, e := range c.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			node = true
		}
	}
	if !node {
		t.Error("agent container must get NODE_NAME from spec.nodeName (the agent's default --node-name)")
	}
	if !ds.Spec.Template.Spec.HostNetwork {
		t.Error("the agent must run in the host network namespace (hostNetwork: true)")
	}
}

// TestManifestProbes: the kubelet probes liveness on /livez and readiness
// on /readyz of the agent's --health-addr (the agent serves both, see
// internal/agent/health.go); liveness on /healthz or /readyz would restart
// the agent in a loop while the apiserver is down.
func TestManifestProbes(t *testing.T) {
	c := agentContainer(t, find[*appsv1.DaemonSet](t, decodeManifest(t)))
	var health string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--health-addr="); ok {
			health = v
		}
	}
	if health == "" {
		t.Fatal("the agent container passes no --health-addr: the probes have nothing to ask")
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"livenessProbe", c.LivenessProbe, "/livez"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe of %s", p.name, p.path)
			continue
		}
		g := p.probe.HTTPGet
		if got := g.Host + ":" + g.Port.String(); got != health || g.Path != p.path {
			t.Errorf("%s: GET %s%s, want %s%s (--health-addr=%s)", p.name, got, g.Path, health, p.path, health)
		}
	}
}

// TestManifestServerDryRun: a real kube-apiserver (v1.36, the version the
// lab runs) validates and admits every object in the manifest.
func TestManifestServerDryRun(t *testing.T) {
	kubectl, err := lab.DepPath("kubectl")
	if errors.Is(err, lab.ErrDepMissing) {
		t.Skipf("kubectl not built: run make deps (%v)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	cp := controlplanetest.Start(t, controlplane.Config{APIPort: testAPIPort, EtcdPort: testEtcdPort})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.AdminKubeconfig(),
		"apply", "--dry-run=server", "-f", manifest, "-o", "name")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr // warnings (the lab control plane already created the role) go here
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server -f %s: %v\n%s%s", manifest, err, out, stderr.Bytes())
	}
	got := strings.Fields(string(out))
	want := []string{
		"serviceaccount/axon-agent", "clusterrole.rbac.authorization.k8s.io/axon-agent",
		"clusterrolebinding.rbac.authorization.k8s.io/axon-agent", "configmap/axon-cni", "daemonset.apps/axon-agent",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("kubectl applied %q, want %q", got, want)
	}
	// kustomize (built into kubectl) renders the same objects with the image override.
	out, err = exec.CommandContext(ctx, kubectl, "kustomize", "kubernetes").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize deploy/kubernetes: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("image: ghcr.io/axonhq/axon:latest")) {
		t.Errorf("kustomize output lacks the image reference:\n%s", out)
	}
}

func agentContainer(t *testing.T, ds *appsv1.DaemonSet) corev1.Container {
	t.Helper()
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "axon-agent" {
			return c
		}
	}
	t.Fatalf("DaemonSet %s has no axon-agent container", ds.Name)
	return corev1.Container{}
}

func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// Package deploy holds the Helm chart (deploy/helm/axon), the plain manifest
// rendered from it for kubectl-only users (deploy/kubernetes/axon.yaml, `make
// manifests`); the image is built by deploy/image. These tests keep the
// chart true to the code: the committed manifest equals a fresh rendering,
// the RBAC equals what the lab's agents get, every agent flag has a chart
// value and every value a flag, the rendered options load in the axon-agent
// built from this tree (--config-dir --check-config), the CNI configuration
// parses with axon-cni's own parser, and a real kube-apiserver admits every
// object (server-side dry run).
package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/axonhq/axon/internal/agent"
	"github.com/axonhq/axon/internal/cni"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/testutil/charttest"
	"github.com/axonhq/axon/internal/testutil/controlplanetest"
)

const (
	manifest = "kubernetes/axon.yaml"
	chart    = "helm/axon"
)

// Ports of this package's control plane: distinct from every other test
// package's pair, so packages run in any order.
const (
	testAPIPort  = 16813
	testEtcdPort = 12749
)

// layoutFlags are the agent flags the chart fixes in the DaemonSet's args or
// env (they follow from the pod's mounts and the downward API) instead of
// offering a value; values.yaml's header names them.
var layoutFlags = map[string]string{
	"node-name":      "$NODE_NAME from spec.nodeName",
	"health-addr":    "$(HOST_IP) from status.hostIP and metrics.port",
	"socket":         "the run-axon hostPath, named by the CNI conflist",
	"state-dir":      "the state hostPath",
	"bpf-root":       "the bpffs hostPath",
	"cgroup-root":    "the cgroup2 hostPath (hostCgroupRoot)",
	"kubeconfig":     "the in-cluster service account",
	"cni-conf-dir":   "the cni-conf hostPath (cni.confDir), mounted at /host/etc/cni/net.d",
	"k8s-api-server": "$AXON_K8S_API_SERVER from k8sServiceHost and k8sServicePort",
}

// chartDefaultsDiffer are the agent values whose chart default differs from
// the flag's, on purpose.
var chartDefaultsDiffer = map[string]string{
	"log-format": "json", // for log collectors
	// axon replaces kube-proxy on the chart's nodes: its ports, where kube-proxy has them
	"kube-proxy-healthz-addr": "0.0.0.0:10256",
	"kube-proxy-metrics-addr": "127.0.0.1:10249",
}

func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	return charttest.Helm(t, args...)
}

// render runs `helm template` on the chart with extra arguments (--set ...).
func render(t *testing.T, extra ...string) []byte {
	t.Helper()
	return charttest.Render(t, chart, extra...)
}

func decode(t *testing.T, raw []byte) []runtime.Object {
	t.Helper()
	return charttest.Decode(t, raw)
}

func decodeManifest(t *testing.T) []runtime.Object {
	t.Helper()
	raw, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, raw)
}

func find[T runtime.Object](t *testing.T, objs []runtime.Object, name string) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			if m, ok := o.(interface{ GetName() string }); name == "" || (ok && m.GetName() == name) {
				found = append(found, v)
			}
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want exactly one %T named %q, found %d", zero, name, len(found))
	}
	return found[0]
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

// camel turns a flag name into its chart value name: ct-max -> ctMax.
func camel(flag string) string {
	parts := strings.Split(flag, "-")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

// agentBinary builds cmd/axon-agent once per test binary.
func agentBinary(t *testing.T) string {
	t.Helper()
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "axon-deploy-test")
		if err != nil {
			agentErr = err
			return
		}
		agentBin = filepath.Join(dir, "axon-agent")
		if out, err := exec.Command("go", "build", "-o", agentBin, "../cmd/axon-agent").CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("go build ./cmd/axon-agent: %w\n%s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if agentBin != "" {
		os.RemoveAll(filepath.Dir(agentBin))
	}
	os.Exit(code)
}

type option struct{ value, source string }

// checkConfig runs `axon-agent --check-config` with args and returns each
// option's value and source.
func checkConfig(t *testing.T, args ...string) map[string]option {
	t.Helper()
	cmd := exec.Command(agentBinary(t), append([]string{"--check-config", "--node-name=deploy-test"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("axon-agent --check-config %q: %v\n%s", args, err, &stderr)
	}
	opts := map[string]option{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(l, "\t")
		if len(f) != 3 {
			t.Fatalf("--check-config line %q: want name, value, source", l)
		}
		opts[f[0]] = option{f[1], f[2]}
	}
	if len(opts) < 10 {
		t.Fatalf("--check-config printed %d options:\n%s", len(opts), out)
	}
	return opts
}

// writeConfigMap writes a ConfigMap's data as a ConfigMap volume shows it:
// one file per key.
func writeConfigMap(t *testing.T, cm *corev1.ConfigMap) string {
	t.Helper()
	dir := t.TempDir()
	for k, v := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestManifestIsRendered: deploy/kubernetes/axon.yaml is exactly what `make
// manifests` renders from the chart now.
func TestManifestIsRendered(t *testing.T) {
	if _, err := helm(t, "version", "--short"); err != nil {
		t.Fatal(err)
	}
	fresh, err := exec.Command("bash", "../hack/manifests.sh", "-").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		t.Fatalf("hack/manifests.sh -: %v", err)
	}
	committed, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, committed) {
		a, b := strings.Split(string(committed), "\n"), strings.Split(string(fresh), "\n")
		i := 0
		for i < len(a) && i < len(b) && a[i] == b[i] {
			i++
		}
		t.Fatalf("%s is not the chart's current rendering (first difference at line %d): run `make manifests`", manifest, i+1)
	}
}

// TestManifestRBACMatchesLab: the DaemonSet's ClusterRole is exactly the
// least-privilege role the lab gives its agents (and that the agent tests
// prove is enough), bound to the DaemonSet's service account.
func TestManifestRBACMatchesLab(t *testing.T) {
	objs := decodeManifest(t)
	role := find[*rbacv1.ClusterRole](t, objs, "")
	want := controlplane.AgentClusterRole()
	if role.Name != want.Name {
		t.Errorf("ClusterRole name %q, lab uses %q", role.Name, want.Name)
	}
	if !reflect.DeepEqual(role.Rules, want.Rules) {
		t.Errorf("ClusterRole rules differ from internal/lab/controlplane/rbac.go:\nmanifest: %+v\nlab:      %+v", role.Rules, want.Rules)
	}
	b := find[*rbacv1.ClusterRoleBinding](t, objs, "")
	ds := find[*appsv1.DaemonSet](t, objs, "")
	if b.RoleRef.Name != role.Name || b.RoleRef.Kind != "ClusterRole" {
		t.Errorf("ClusterRoleBinding refers to %s/%s, want ClusterRole/%s", b.RoleRef.Kind, b.RoleRef.Name, role.Name)
	}
	sa := find[*corev1.ServiceAccount](t, objs, "")
	if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != sa.Name || b.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("ClusterRoleBinding subjects %+v, want the ServiceAccount %s/%s", b.Subjects, sa.Namespace, sa.Name)
	}
	if ds.Spec.Template.Spec.ServiceAccountName != sa.Name || ds.Namespace != sa.Namespace {
		t.Errorf("DaemonSet runs as %s/%s, want %s/%s", ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
}

// TestManifestCNIConfig: the agent writes the conflist (cni.ConfList) into
// the host's CNI configuration folder once it is ready: the DaemonSet passes
// --cni-conf-dir at the mount of the cni.confDir hostPath, and the conflist
// the agent writes for its --socket and --cni-mtu is accepted by axon-cni's
// own parser. No ConfigMap carries a second copy of it.
func TestManifestCNIConfig(t *testing.T) {
	objs := decodeManifest(t)
	for _, o := range objs {
		if cm, ok := o.(*corev1.ConfigMap); ok {
			if _, ok := cm.Data[cni.ConfListFile]; ok {
				t.Errorf("ConfigMap %s carries %s: the agent writes it once ready (--cni-conf-dir), one source", cm.Name, cni.ConfListFile)
			}
		}
	}
	ds := find[*appsv1.DaemonSet](t, objs, "")
	c := agentContainer(t, ds)
	dir := flagValue(c.Args, "--cni-conf-dir")
	if dir == "" {
		t.Fatal("the agent's args lack --cni-conf-dir: nothing would write the CNI configuration")
	}
	var mount string
	for _, m := range c.VolumeMounts {
		if m.MountPath == dir {
			mount = m.Name
		}
	}
	var hostPath string
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == mount && v.HostPath != nil {
			hostPath = v.HostPath.Path
		}
	}
	if hostPath != "/etc/cni/net.d" {
		t.Errorf("--cni-conf-dir=%s is mounted from host path %q (volume %q), want /etc/cni/net.d", dir, hostPath, mount)
	}
	socket := flagValue(c.Args, "--socket")
	raw, err := cni.ConfList(socket, 1500)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := cni.ParseConfList(raw)
	if err != nil {
		t.Fatalf("axon-cni rejects the conflist the agent writes: %v", err)
	}
	if nc.Socket != socket {
		t.Errorf("CNI socket %q, agent --socket %q: they must match", nc.Socket, socket)
	}
	// the init container installs the plugin the conflist names
	if len(ds.Spec.Template.Spec.InitContainers) != 1 {
		t.Fatalf("%d init containers, want 1 (install axon-cni)", len(ds.Spec.Template.Spec.InitContainers))
	}
	if got := ds.Spec.Template.Spec.InitContainers[0].Command; !reflect.DeepEqual(got, []string{"/usr/local/bin/axon-cni", "install", "/host/opt/cni/bin"}) {
		t.Errorf("init container runs %q, want axon-cni install /host/opt/cni/bin", got)
	}
}

// TestChartValuesMatchFlags: every axon-agent flag has a value in the
// chart's agent block or is fixed by the pod's layout (and then passed in
// args or env), every agent value names a flag, every value is documented
// in values.yaml, and the chart's defaults are the agent's own except where
// chartDefaultsDiffer says why.
func TestChartValuesMatchFlags(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := utilyaml.Unmarshal(raw, &values); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	agentValues, ok := values["agent"].(map[string]any)
	if !ok {
		t.Fatalf("values.yaml has no agent: block")
	}
	// values.schema.json types every agent value like its default and allows no other key
	rawSchema, err := os.ReadFile(filepath.Join(chart, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Agent struct {
				AdditionalProperties *bool `json:"additionalProperties"`
				Properties           map[string]struct {
					Type any `json:"type"`
				} `json:"properties"`
			} `json:"agent"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(rawSchema, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	sa := schema.Properties.Agent
	if sa.AdditionalProperties == nil || *sa.AdditionalProperties {
		t.Error("values.schema.json: agent must have additionalProperties: false (a misspelt value fails helm install)")
	}
	for key, v := range agentValues {
		p, ok := sa.Properties[key]
		want := map[string]any{"bool": "boolean", "int64": "integer", "float64": "integer", "string": "string", "<nil>": []any{"string", "null"}}[fmt.Sprintf("%T", v)]
		switch {
		case !ok:
			t.Errorf("values.schema.json: agent.%s is missing: add it with type %v", key, want)
		case !reflect.DeepEqual(p.Type, want):
			t.Errorf("values.schema.json: agent.%s has type %v, want %v (the default is %v)", key, p.Type, want, v)
		}
	}
	for key := range sa.Properties {
		if _, ok := agentValues[key]; !ok {
			t.Errorf("values.schema.json: agent.%s is not in values.yaml", key)
		}
	}
	defaults := checkConfig(t)
	ds := find[*appsv1.DaemonSet](t, decode(t, render(t)), "")
	c := agentContainer(t, ds)
	for name := range defaults {
		_, hasValue := agentValues[camel(name)]
		if why, ok := layoutFlags[name]; ok {
			if hasValue {
				t.Errorf("agent.%s: --%s is fixed by the pod's layout (%s), not a value", camel(name), name, why)
			}
			continue
		}
		if !hasValue {
			t.Errorf("axon-agent --%s has no chart value agent.%s (or add it to layoutFlags, saying where the chart sets it)", name, camel(name))
		}
	}
	for key := range agentValues {
		name := strings.ToLower(strings.Join(splitCamel(key), "-"))
		if _, ok := defaults[name]; !ok || camel(name) != key {
			t.Errorf("values.yaml agent.%s names no axon-agent flag (--%s)", key, name)
		}
	}
	// the layout flags the chart passes on the command line
	for _, name := range []string{"health-addr", "socket", "state-dir", "bpf-root", "cgroup-root", "cni-conf-dir"} {
		if flagValue(c.Args, "--"+name) == "" {
			t.Errorf("the DaemonSet's args lack --%s (%s)", name, layoutFlags[name])
		}
	}
	// every value documented: a comment "# key:" right above it
	lines := strings.Split(string(raw), "\n")
	documented := func(key, indent string) bool {
		for i, l := range lines {
			if strings.HasPrefix(l, indent+key+":") {
				for j := i - 1; j >= 0 && strings.HasPrefix(strings.TrimSpace(lines[j]), "#"); j-- {
					if strings.HasPrefix(strings.TrimSpace(lines[j]), "# "+key+":") {
						return true
					}
				}
				return false
			}
		}
		return false
	}
	for key := range values {
		if !documented(key, "") {
			t.Errorf("values.yaml: %s has no \"# %s: ...\" comment above it", key, key)
		}
	}
	for key := range agentValues {
		if !documented(key, "  ") {
			t.Errorf("values.yaml: agent.%s has no \"# %s: ...\" comment above it", key, key)
		}
	}
	// the rendered defaults load and equal the agent's own
	cm := find[*corev1.ConfigMap](t, decode(t, render(t)), "axon-agent-config")
	loaded := checkConfig(t, "--config-dir", writeConfigMap(t, cm))
	for name, def := range defaults {
		got := loaded[name]
		if _, ok := cm.Data[name]; ok && got.source != "config-dir" {
			t.Errorf("--%s: in the ConfigMap but --check-config says source %q", name, got.source)
		}
		want := def.value
		if v, ok := chartDefaultsDiffer[name]; ok {
			want = v
		}
		if got.value != want {
			t.Errorf("--%s: the chart's default gives %q, the agent's default is %q", name, got.value, def.value)
		}
	}
}

func splitCamel(s string) []string {
	var parts []string
	start := 0
	for i := 1; i < len(s); i++ {
		if s[i] >= 'A' && s[i] <= 'Z' && s[i-1] >= 'a' && s[i-1] <= 'z' || s[i] >= 'A' && s[i] <= 'Z' && s[i-1] >= '0' && s[i-1] <= '9' {
			parts = append(parts, s[start:i])
			start = i
		}
	}
	return append(parts, s[start:])
}

// TestChartConfigMapLoads: options set through the chart reach the agent:
// the rendered ConfigMap, loaded with --config-dir, gives each value with
// source config-dir (large numbers stay whole numbers, a null value leaves
// the agent's default), and a key the agent does not know is refused.
func TestChartConfigMapLoads(t *testing.T) {
	tests := []struct {
		name    string
		set     []string
		extra   []string // more helm arguments
		want    map[string]option
		absent  []string // keys the ConfigMap must not have
		wantErr string   // --check-config fails with this
	}{{
		name:   "defaults",
		want:   map[string]option{"log-format": {"json", "config-dir"}, "sockmap": {"disabled", "default"}, "ct-max": {"131072", "config-dir"}},
		absent: []string{"sockmap", "health-addr", "socket"},
	}, {
		name: "overrides",
		set:  []string{"agent.ctMax=16777216", "agent.ctUnrepliedMax=1000000", "agent.sockmap=enabled", "agent.bandwidthHorizon=5s", "agent.socketLb=false", "agent.logLevel=debug"},
		want: map[string]option{"ct-max": {"16777216", "config-dir"}, "ct-unreplied-max": {"1000000", "config-dir"}, "sockmap": {"enabled", "config-dir"}, "bandwidth-horizon": {"5s", "config-dir"}, "socket-lb": {"false", "config-dir"}, "log-level": {"debug", "config-dir"}},
	}, {
		name: "bypass-only leaves sockmap to the agent",
		set:  []string{"agent.mode=bypass-only"},
		want: map[string]option{"mode": {"bypass-only", "config-dir"}, "sockmap": {"enabled", "default"}},
	}, {
		// values.schema.json refuses it first (TestChartRefusesBadValues); the agent is the second line
		name:    "a misspelt value is refused by the agent, naming the flag",
		set:     []string{"agent.ctMaxx=4096"},
		extra:   []string{"--skip-schema-validation"},
		wantErr: `did you mean "ct-max"`,
	}, {
		name:    "a bad value is refused by the agent's validation",
		set:     []string{"agent.nodeportMode=fast"},
		extra:   []string{"--skip-schema-validation"},
		wantErr: "--nodeport-mode",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.extra
			for _, s := range tt.set {
				args = append(args, "--set", s)
			}
			cm := find[*corev1.ConfigMap](t, decode(t, render(t, args...)), "axon-agent-config")
			for _, k := range tt.absent {
				if _, ok := cm.Data[k]; ok {
					t.Errorf("ConfigMap has %s=%q, want it absent", k, cm.Data[k])
				}
			}
			dir := writeConfigMap(t, cm)
			if tt.wantErr != "" {
				out, err := exec.Command(agentBinary(t), "--check-config", "--node-name=deploy-test", "--config-dir", dir).CombinedOutput()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), tt.wantErr) {
					t.Fatalf("--check-config on %v: err %v, want exit 2 saying %q:\n%s", tt.set, err, tt.wantErr, out)
				}
				return
			}
			got := checkConfig(t, "--config-dir", dir)
			for name, want := range tt.want {
				if got[name] != want {
					t.Errorf("--%s: %+v, want %+v", name, got[name], want)
				}
			}
		})
	}
}

// TestChartRefusesBadValues: values that cannot work fail `helm template`
// (and so `helm install`) with a message saying what to fix.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tt := range []struct {
		set, want string
	}{
		{`image.tag="latest"`, "image.tag latest is refused"},
		{`image.digest="sha256:abc"`, "is not sha256:<64 hex digits>"},
		{"agent.cniMtu=1000", "at '/agent/cniMtu': minimum: got 1,000, want 1,280"},
		{"k8sServicePort=0", "at '/k8sServicePort': minimum: got 0, want 1"},
		{"metrics.port=0", "metrics.port 0 is outside 1..65535"},
		{"agent.ctMax=1.5", "at '/agent/ctMax': got number, want integer"}, // values.schema.json
		{"agent.ctMaxx=1", "additional properties 'ctMaxx' not allowed"},
		{`agent.socketLb="yes"`, "at '/agent/socketLb': got string, want boolean"},
		{`metrics.serviceMonitr={"enabled":true}`, "additional properties 'serviceMonitr' not allowed"},
	} {
		t.Run(tt.set, func(t *testing.T) {
			_, err := helm(t, "template", "axon", chart, "--set-json", tt.set)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("helm template --set-json %s: %v, want an error saying %q", tt.set, err, tt.want)
			}
		})
	}
}

// TestChartImage: the image is pinned: appVersion by default, the tag when
// set, repository@digest when a digest is set (it wins over the tag).
func TestChartImage(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	for _, tt := range []struct {
		name string
		set  []string
		want string
	}{
		{"default", nil, "ghcr.io/axonhq/axon:0.1.0"},
		{"tag", []string{"image.repository=registry.example.com/axon", "image.tag=v0.2"}, "registry.example.com/axon:v0.2"},
		{"digest wins", []string{"image.tag=v0.2", "image.digest=" + digest}, "ghcr.io/axonhq/axon@" + digest},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var args []string
			for _, s := range tt.set {
				args = append(args, "--set", s)
			}
			ds := find[*appsv1.DaemonSet](t, decode(t, render(t, args...)), "")
			spec := ds.Spec.Template.Spec
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				if c.Image != tt.want {
					t.Errorf("container %s: image %q, want %q", c.Name, c.Image, tt.want)
				}
			}
		})
	}
}

// TestChartPod: the agent's pod runs with explicit capabilities (not
// privileged), system-node-critical, on every node, serves /metrics and
// the probes on the node's IP at metrics.port with the Prometheus
// annotations, probes /livez (startup, liveness) and /readyz, and mounts
// nothing it does not read (no /lib/modules).
func TestChartPod(t *testing.T) {
	ds := find[*appsv1.DaemonSet](t, decode(t, render(t, "--set", "metrics.port=9999")), "")
	spec := ds.Spec.Template.Spec
	c := agentContainer(t, ds)
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", spec.PriorityClassName)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Errorf("tolerations %+v, want the agent on every node (operator Exists)", spec.Tolerations)
	}
	if !spec.HostNetwork {
		t.Error("the agent must run in the host network namespace (hostNetwork: true)")
	}
	for _, ct := range append(spec.InitContainers, spec.Containers...) {
		sc := ct.SecurityContext
		if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("container %s: securityContext %+v, want not privileged, capabilities drop ALL", ct.Name, sc)
		}
	}
	for _, ct := range spec.InitContainers {
		if add := ct.SecurityContext.Capabilities.Add; len(add) != 0 {
			t.Errorf("init container %s adds %v: installing axon-cni as uid 0 needs no capability", ct.Name, add)
		}
	}
	wantCaps := []corev1.Capability{"BPF", "PERFMON", "NET_ADMIN", "SYS_ADMIN"} // docs/operate.md#capabilities
	if got := c.SecurityContext.Capabilities.Add; !slices.Equal(got, wantCaps) {
		t.Errorf("agent capabilities %v, want %v", got, wantCaps)
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil && strings.HasPrefix(v.HostPath.Path, "/lib/modules") {
			t.Errorf("volume %s mounts %s: the agent reads no kernel modules", v.Name, v.HostPath.Path)
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["NODE_NAME"] != "spec.nodeName" || env["HOST_IP"] != "status.hostIP" {
		t.Errorf("env %v: want NODE_NAME from spec.nodeName and HOST_IP from status.hostIP", env)
	}
	if got := flagValue(c.Args, "--health-addr"); got != "$(HOST_IP):9999" {
		t.Errorf("--health-addr=%q, want $(HOST_IP):9999 (the node's IP, metrics.port)", got)
	}
	ann := ds.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != "9999" || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("pod annotations %v: want prometheus.io/scrape true, port 9999, path /metrics", ann)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"startupProbe", c.StartupProbe, "/livez"}, {"livenessProbe", c.LivenessProbe, "/livez"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe of %s", p.name, p.path)
			continue
		}
		// no host: the kubelet asks the pod's IP, which on the host network is the node's
		if g := p.probe.HTTPGet; g.Host != "" || g.Port.IntValue() != 9999 || g.Path != p.path {
			t.Errorf("%s: GET %s:%s%s, want the pod IP at :9999%s", p.name, g.Host, g.Port.String(), g.Path, p.path)
		}
	}
	if c.StartupProbe != nil && c.StartupProbe.FailureThreshold*max(c.StartupProbe.PeriodSeconds, 1) < 120 {
		t.Errorf("startupProbe gives the first start %ds, want at least 120 s (loading every program)", c.StartupProbe.FailureThreshold*c.StartupProbe.PeriodSeconds)
	}
}

// TestChartServiceMonitor: the ServiceMonitor (and its headless Service)
// render only when asked for and the cluster serves the CRD's API.
func TestChartServiceMonitor(t *testing.T) {
	kinds := func(raw []byte) []string {
		var ks []string
		for _, o := range decode(t, raw) {
			ks = append(ks, o.GetObjectKind().GroupVersionKind().Kind)
		}
		return ks
	}
	for _, tt := range []struct {
		name string
		args []string
		want bool
	}{
		{"off", []string{"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"}, false},
		{"on without the CRD", []string{"--set", "metrics.serviceMonitor.enabled=true"}, false},
		{"on with the CRD", []string{"--set", "metrics.serviceMonitor.enabled=true", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ks := kinds(render(t, tt.args...))
			if got := slices.Contains(ks, "ServiceMonitor"); got != tt.want || slices.Contains(ks, "Service") != tt.want {
				t.Errorf("kinds %v: ServiceMonitor and Service rendered = %v, want %v", ks, got, tt.want)
			}
		})
	}
	objs := decode(t, render(t, "--set", "metrics.serviceMonitor.enabled=true", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"))
	svc := find[*corev1.Service](t, objs, "axon-agent-metrics")
	ds := find[*appsv1.DaemonSet](t, objs, "")
	if !reflect.DeepEqual(svc.Spec.Selector, ds.Spec.Selector.MatchLabels) || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("Service selects %v port %s; the agents are %v with port name metrics", svc.Spec.Selector, svc.Spec.Ports[0].TargetPort.String(), ds.Spec.Selector.MatchLabels)
	}
}

// TestManifestServerDryRun: a real kube-apiserver (v1.36, the version the
// lab runs) validates and admits every object of the committed manifest
// and of a rendering with the optional metrics Service.
func TestManifestServerDryRun(t *testing.T) {
	kubectl, err := lab.DepPath("kubectl")
	if errors.Is(err, lab.ErrDepMissing) {
		t.Skipf("kubectl not built: run make deps (%v)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	// the Service of the ServiceMonitor (which needs the CRD this apiserver lacks)
	var svc []byte
	for _, doc := range strings.Split(string(render(t, "--set", "metrics.serviceMonitor.enabled=true", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")), "\n---") {
		if strings.Contains(doc, "\nkind: Service\n") {
			svc = []byte(doc)
		}
	}
	if svc == nil {
		t.Fatal("no metrics Service rendered with metrics.serviceMonitor.enabled")
	}
	svcFile := filepath.Join(t.TempDir(), "service.yaml")
	if err := os.WriteFile(svcFile, svc, 0o644); err != nil {
		t.Fatal(err)
	}
	cp := controlplanetest.Start(t, controlplane.Config{APIPort: testAPIPort, EtcdPort: testEtcdPort})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.AdminKubeconfig(),
		"apply", "--dry-run=server", "-f", manifest, "-f", svcFile, "-o", "name")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr // warnings (the lab control plane already created the role) go here
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server -f %s: %v\n%s%s", manifest, err, out, stderr.Bytes())
	}
	got := strings.Fields(string(out))
	want := []string{
		"serviceaccount/axon-agent", "configmap/axon-agent-config",
		"clusterrole.rbac.authorization.k8s.io/axon-agent", "clusterrolebinding.rbac.authorization.k8s.io/axon-agent",
		"daemonset.apps/axon-agent", "service/axon-agent-metrics",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("kubectl applied %q, want %q", got, want)
	}
}

// TestChartAPIServer: k8sServiceHost and k8sServicePort reach the agent as
// $AXON_K8S_API_SERVER (--k8s-api-server) in a form the agent accepts; by
// default the variable is absent (the kubernetes Service).
func TestChartAPIServer(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  []string
		want string
	}{
		{"default", nil, ""},
		{"host", []string{"--set", "k8sServiceHost=10.0.0.10"}, "10.0.0.10:6443"},
		{"host and port", []string{"--set", "k8sServiceHost=api.example.internal", "--set", "k8sServicePort=8443"}, "api.example.internal:8443"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := agentContainer(t, find[*appsv1.DaemonSet](t, decode(t, render(t, tt.set...)), ""))
			var got string
			for _, e := range c.Env {
				if e.Name == agent.APIServerEnv {
					got = e.Value
				}
			}
			if got != tt.want {
				t.Fatalf("$%s = %q, want %q", agent.APIServerEnv, got, tt.want)
			}
			if got == "" {
				return
			}
			if _, err := agent.ParseAPIServer(got); err != nil {
				t.Errorf("the agent refuses the chart's $%s: %v", agent.APIServerEnv, err)
			}
		})
	}
}

// TestChartBypassOnlyHostPID: only --mode=bypass-only shares the host's PID
// namespace (it finds pods' network namespaces through /proc/<pid>/ns/net);
// an axon-networked node's agent does not see the node's processes.
func TestChartBypassOnlyHostPID(t *testing.T) {
	for _, tt := range []struct {
		set  []string
		want bool
	}{
		{nil, false},
		{[]string{"--set", "agent.mode=full"}, false},
		{[]string{"--set", "agent.mode=bypass-only"}, true},
	} {
		ds := find[*appsv1.DaemonSet](t, decode(t, render(t, tt.set...)), "")
		if got := ds.Spec.Template.Spec.HostPID; got != tt.want {
			t.Errorf("helm template %v: hostPID %v, want %v", tt.set, got, tt.want)
		}
	}
}

package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/axonhq/axon/internal/cni"
	"github.com/axonhq/axon/internal/testutil"
	"github.com/axonhq/axon/internal/testutil/charttest"
)

// chartDir is the Helm chart, relative to this package.
const chartDir = "../../deploy/helm/axon"

// The downward-API values the kubelet gives the agent's container on the
// scratch node: its Node's name and its address on eth0 (newInstallNode).
const (
	chartNodeName = "node1"
	chartHostIP   = "198.18.0.11"
)

// renderChart runs `helm template` on the chart (helm from make deps) and
// returns its ConfigMap axon-agent-config and its DaemonSet.
func renderChart(t *testing.T, set ...string) (*corev1.ConfigMap, *appsv1.DaemonSet) {
	t.Helper()
	var args []string
	for _, s := range set {
		args = append(args, "--set", s)
	}
	var cm *corev1.ConfigMap
	var ds *appsv1.DaemonSet
	for _, obj := range charttest.Decode(t, charttest.Render(t, chartDir, args...)) {
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			if o.Name == "axon-agent-config" {
				cm = o
			}
		case *appsv1.DaemonSet:
			ds = o
		}
	}
	if cm == nil || ds == nil {
		t.Fatalf("the rendered chart lacks the ConfigMap axon-agent-config (%v) or the DaemonSet (%v)", cm != nil, ds != nil)
	}
	return cm, ds
}

// buildCommands builds ../../cmd/<name> for each name into dir, in one go
// build (the links run in parallel), and returns their paths.
func buildCommands(t *testing.T, dir string, names ...string) []string {
	t.Helper()
	start := time.Now()
	args := []string{"build", "-o", dir + "/"}
	var bins []string
	for _, name := range names {
		args = append(args, "../../cmd/"+name)
		bins = append(bins, filepath.Join(dir, name))
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("built %s in %s", strings.Join(names, ", "), time.Since(start).Round(time.Millisecond))
	return bins
}

// agentContainerOf is the DaemonSet's axon-agent container.
func agentContainerOf(t *testing.T, ds *appsv1.DaemonSet) *corev1.Container {
	t.Helper()
	for i := range ds.Spec.Template.Spec.Containers {
		if ds.Spec.Template.Spec.Containers[i].Name == "axon-agent" {
			return &ds.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatal("the DaemonSet has no axon-agent container")
	return nil
}

// podCommand turns the DaemonSet's agent container c into the command line
// and environment the kubelet would run on the scratch node:
//   - env: NODE_NAME (spec.nodeName) and HOST_IP (status.hostIP) get the
//     scratch node's name and eth0 address; plain values (the chart's
//     $AXON_K8S_API_SERVER) stay; $(VAR) in args is expanded as the kubelet
//     does;
//   - every path in args lies under one of the container's volume mounts and
//     is moved to where that volume lives in the test (mounts: a volume
//     name -> host directory; the kubelet bind-mounts them the same way), so
//     a new mount the test does not know fails here instead of writing on
//     the host.
func podCommand(t *testing.T, c *corev1.Container, mounts map[string]string) (args, env []string) {
	t.Helper()
	vars := map[string]string{}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			switch f := e.ValueFrom.FieldRef; {
			case f != nil && f.FieldPath == "spec.nodeName":
				v = chartNodeName
			case f != nil && f.FieldPath == "status.hostIP":
				v = chartHostIP
			default:
				t.Fatalf("env %s comes from %+v: the test does not know what the kubelet puts there", e.Name, e.ValueFrom)
			}
		}
		vars[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	for _, a := range c.Args {
		for k, v := range vars {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		if strings.Contains(a, "$(") {
			t.Fatalf("arg %q names a variable the container does not set", a)
		}
		if name, val, ok := strings.Cut(a, "="); ok && strings.HasPrefix(val, "/") {
			moved := ""
			for _, m := range c.VolumeMounts {
				if rest, ok := strings.CutPrefix(val, m.MountPath); ok && (rest == "" || rest[0] == '/') {
					dir, ok := mounts[m.Name]
					if !ok {
						t.Fatalf("%s is on the volume %s, which the test does not map", a, m.Name)
					}
					moved = dir + rest
				}
			}
			if moved == "" {
				t.Fatalf("%s is on no volume of the container: the agent would write into its image", a)
			}
			a = name + "=" + moved
		}
		args = append(args, a)
	}
	return args, env
}

// saScript starts the agent (its arguments) in a private mount namespace
// where the service-account directory ($1) is where the kubelet mounts it,
// /var/run/secrets/kubernetes.io/serviceaccount, on a tmpfs over /run (the
// host's /run is not touched; the agent's paths in this test are elsewhere).
const saScript = `set -e
sa=$1; shift
mount -t tmpfs axon-test-run /run
mkdir -p /run/secrets/kubernetes.io/serviceaccount
mount --bind "$sa" /run/secrets/kubernetes.io/serviceaccount
exec "$@"`

// TestChartFirstBoot: the chart installs axon on a node without kube-proxy.
// The chart is rendered with k8sServiceHost/k8sServicePort naming the test
// apiserver; the real axon-agent binary runs in a fresh node netns with the
// DaemonSet's args and env, the rendered ConfigMap as its --config-dir and
// the service-account token and CA at the kubelet's path, while the
// kubernetes ClusterIP ($KUBERNETES_SERVICE_HOST) answers nothing. It turns
// ready where the readiness probe asks (HOST_IP:metrics.port/readyz), writes
// the conflist into the mapped --cni-conf-dir no earlier (axon-cni's parser
// accepts it), routes to the other Node's podCIDRs; then `axon uninstall`
// with the same paths leaves no pin, no attached program, no route, no
// conflist and no state.
func TestChartFirstBoot(t *testing.T) {
	n := newInstallNode(t)
	cm, ds := renderChart(t, "k8sServiceHost=127.0.0.1", "k8sServicePort="+strconv.Itoa(installAPIPort))
	bins := buildCommands(t, t.TempDir(), "axon-agent", "axon")
	agentBin, axonBin := bins[0], bins[1]

	// the ConfigMap volume: one file per key
	cfgDir := filepath.Join(n.dir, "config")
	must(t, os.MkdirAll(cfgDir, 0o755))
	for k, v := range cm.Data {
		must(t, os.WriteFile(filepath.Join(cfgDir, k), []byte(v), 0o644))
	}
	mounts := map[string]string{
		"config":   cfgDir,
		"bpffs":    n.cfg.BPFRoot,    // a directory of our own on the host's bpffs
		"cgroup2":  n.cfg.CgroupRoot, // the test's cgroup stands for the host's hierarchy
		"run-axon": filepath.Join(n.dir, "run"),
		"state":    n.cfg.StateDir,
		"cni-conf": n.cfg.CNIConfDir,
	}
	for _, d := range mounts {
		must(t, os.MkdirAll(d, 0o755)) // hostPath DirectoryOrCreate
	}
	c := agentContainerOf(t, ds)
	args, env := podCommand(t, c, mounts)
	t.Logf("axon-agent %s\nenv %s", strings.Join(args, " "), strings.Join(env, " "))
	flag := func(name string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		t.Fatalf("the DaemonSet passes no --%s", name)
		return ""
	}
	bpfRoot, socket, stateDir, cgroupRoot, confDir := flag("bpf-root"), flag("socket"), flag("state-dir"), flag("cgroup-root"), flag("cni-conf-dir")
	conflist := filepath.Join(confDir, CNIConfFile)

	f, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	must(t, err)
	argv := []string{"--net=" + n.path, "unshare", "--mount", "--propagation", "private", "sh", "-c", saScript, "sh", n.cfg.ServiceAccountDir}
	if caps := os.Getenv(agentCapsEnv); caps != "" {
		argv = append(argv, capsBoundingArgs(caps)...)
	}
	cmd := exec.Command("nsenter", append(append(argv, agentBin), args...)...)
	// the container's environment: PATH, what the kubelet sets for every
	// Pod (the kubernetes Service, unreachable here) and the container's env
	cmd.Env = append(append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, n.inPod...), env...)
	cmd.Stdout, cmd.Stderr = f, f
	must(t, cmd.Start())
	f.Close()
	p := &agentProc{cmd: cmd, done: make(chan error, 1), log: n.log}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() { p.stop(t) })

	// the readiness probe as the kubelet sends it: no host, so the pod's IP,
	// which on the host network is the node's
	probe := c.ReadinessProbe
	if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Host != "" {
		t.Fatalf("the agent's readinessProbe %+v: want an httpGet of the pod's IP", probe)
	}
	readyz := fmt.Sprintf("http://%s:%d%s", chartHostIP, probe.HTTPGet.Port.IntValue(), probe.HTTPGet.Path)
	started := time.Now()
	eventually(t, "agent ready at "+readyz, testutil.Stretch(t, 60*time.Second), func() error {
		_, fileErr := os.Stat(conflist) // first the file, then readiness: a file before ready shows here
		code, body, err := n.httpGet(readyz)
		if err != nil {
			return err
		}
		if fileErr == nil && code != 200 {
			t.Fatalf("%s exists while /readyz answers %d %q", conflist, code, body)
		}
		if code != 200 {
			return fmt.Errorf("/readyz %d %q", code, body)
		}
		return fileErr
	})
	t.Logf("ready and %s written %s after the start", CNIConfFile, time.Since(started).Round(time.Millisecond))
	raw, err := os.ReadFile(conflist)
	must(t, err)
	nc, err := cni.ParseConfList(raw)
	if err != nil {
		t.Fatalf("axon-cni rejects the written configuration: %v\n%s", err, raw)
	}
	if mtu, _ := strconv.Atoi(cm.Data["cni-mtu"]); nc.Socket != socket || nc.MTU != mtu || nc.Type != "axon-cni" {
		t.Errorf("written configuration: socket %q mtu %d type %q, want %q %d (the ConfigMap's cni-mtu) axon-cni", nc.Socket, nc.MTU, nc.Type, socket, mtu)
	}
	want := map[string]string{
		"10.244.2.0/24":      "via 198.18.0.12 dev eth0 proto 0xa0",
		"fd00:10:244:2::/64": "via fd00:198:18::12 dev eth0 proto 0xa0",
	}
	eventually(t, "routes to node2's podCIDRs", testutil.Stretch(t, 20*time.Second), func() error {
		if got := n.axonRoutes(t); !mapsEqual(got, want) {
			return fmt.Errorf("routes %v, want %v", got, want)
		}
		return nil
	})

	// what the agent attached: the checks after uninstall must see it go
	attached := attachedOnNode(t, n)
	cgroupProgs := attachedCgroupProgs(t, cgroupRoot)
	pins := countPins(t, bpfRoot)
	t.Logf("before uninstall: %d pins, programs on devices %v, %d on the cgroup", pins, attached, cgroupProgs)
	if pins == 0 || len(attached) == 0 || cgroupProgs == 0 {
		t.Fatalf("nothing attached before uninstall (pins %d, devices %v, cgroup %d): the checks after it would prove nothing", pins, attached, cgroupProgs)
	}
	p.stop(t)

	un := exec.Command("nsenter", "--net="+n.path, axonBin, "uninstall", "--bpf-root", bpfRoot, "--socket", socket,
		"--state-dir", stateDir, "--cgroup-root", cgroupRoot, "--cni-conf-dir", confDir)
	out, err := un.CombinedOutput()
	if err != nil {
		t.Fatalf("axon uninstall: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Logf("axon uninstall: %s", lines[len(lines)-1])
	if _, err := os.Stat(bpfRoot); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there (%d pins): %v", bpfRoot, countPins(t, bpfRoot), err)
	}
	if left := attachedOnNode(t, n); len(left) != 0 {
		t.Errorf("programs still attached in the node netns: %v", left)
	}
	if left := attachedCgroupProgs(t, cgroupRoot) + attachedSockops(t, cgroupRoot); left != 0 {
		t.Errorf("%d programs still attached to the test cgroup", left)
	}
	for _, f := range []string{conflist, stateDir} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there: %v", f, err)
		}
	}
	if r := n.axonRoutes(t); len(r) != 0 {
		t.Errorf("axon routes left: %v", r)
	}
}

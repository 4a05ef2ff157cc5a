package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/testutil"
)

func TestParseSocketLBAnnotation(t *testing.T) {
	tests := []struct {
		ann     map[string]string
		want    optState
		wantErr bool
	}{
		{nil, optUnset, false},
		{map[string]string{"other": "disabled"}, optUnset, false},
		{map[string]string{AnnotationSocketLB: "disabled"}, optOut, false},
		{map[string]string{AnnotationSocketLB: " disabled "}, optOut, false},
		{map[string]string{AnnotationSocketLB: "enabled"}, optIn, false},
		{map[string]string{AnnotationSocketLB: "off"}, optUnset, true},
		{map[string]string{AnnotationSocketLB: ""}, optUnset, true},
		{map[string]string{AnnotationSocketLB: "Disabled"}, optUnset, true},
	}
	for _, tt := range tests {
		got, err := parseSocketLBAnnotation(tt.ann)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("%v: got %v, %v; want %v, error %v", tt.ann, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), `use "disabled"`) {
			t.Errorf("error %q does not say what to use", err)
		}
	}
}

// skipRecorder is a sockLB that records the opted-out netns cookies.
type skipRecorder struct {
	fakeSockLB
	mu   sync.Mutex
	skip []uint64
	sets int
}

func (r *skipRecorder) SetSkipNetns(c []uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.skip = slices.Clone(c)
	r.sets++
	return nil
}

func (r *skipRecorder) get() ([]uint64, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.skip), r.sets
}

// TestOptOutAgainstAPIServer: Pod and Namespace annotations (real
// apiserver, the agent's own RBAC) turn into the netns cookies of exactly the
// opted-out pods; a malformed value gets an Event and is ignored.
func TestOptOutAgainstAPIServer(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	cp := startServiceControlPlane(t)
	cs, err := cp.Client()
	must(t, err)
	ctx := t.Context()
	createNode(t, cs, node("node1", []string{"198.18.0.11"}, "10.244.1.0/24"))
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mesh",
		Annotations: map[string]string{AnnotationSocketLB: SocketLBDisabled}}}, metav1.CreateOptions{})
	must(t, err)

	log := testLogger(t)
	reg, err := openRegistry(t.TempDir(), log)
	must(t, err)
	pods := []struct {
		ns, name, ann string
	}{
		{"mesh", "a", ""},              // namespace says disabled: out
		{"mesh", "b", SocketLBEnabled}, // pod overrides its namespace: in
		{"default", "c", SocketLBDisabled},
		{"default", "d", "nope"}, // malformed: Event, ignored (in)
	}
	cookies := map[string]uint64{}
	for i, p := range pods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		if p.ann != "" {
			pod.Annotations = map[string]string{AnnotationSocketLB: p.ann}
		}
		_, err := cs.CoreV1().Pods(p.ns).Create(ctx, pod, metav1.CreateOptions{})
		must(t, err)
		path := "/var/run/netns/" + testutil.NewNetns(t, "axt-slb-optout-")
		c, err := socklb.NetnsCookie(path)
		must(t, err)
		cookies[p.name] = c
		must(t, reg.Put(api.Endpoint{ContainerID: fmt.Sprintf("ctr%d", i), IfName: "eth0", Netns: path, PodName: p.name, PodNamespace: p.ns,
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)})}, HostIfName: fmt.Sprintf("lxc%d", i),
			PodMAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(i)}}))
	}

	k, s := runKubeAndServices(t, cp, log)
	rec := &skipRecorder{}
	sl := &socketLB{cfg: Config{NodeName: "node1", SocketLB: true, SocketLBMode: SocketLBModeAll}, log: log, reg: reg,
		kube: func() *kube { return k }, svc: s, lb: rec}

	expect := func(what string, names ...string) {
		t.Helper()
		var want []uint64
		for _, n := range names {
			want = append(want, cookies[n])
		}
		slices.Sort(want)
		eventually(t, what, 20*time.Second, func() error {
			sl.syncOptOut()
			got, sets := rec.get()
			if sets == 0 || !slices.Equal(got, want) {
				return fmt.Errorf("skip set %v (%d writes), want %v (pods %v)", got, sets, want, names)
			}
			return nil
		})
		var wantPods []string
		for _, n := range names {
			for _, p := range pods {
				if p.name == n {
					wantPods = append(wantPods, p.ns+"/"+n)
				}
			}
		}
		slices.Sort(wantPods)
		if got := sl.optedOut(); !slices.Equal(got, wantPods) {
			t.Errorf("%s: opted-out pods %v, want %v", what, got, wantPods)
		}
	}
	expect("namespace and pod annotations", "a", "c")
	msg := waitEvent(t, cs, "default", "Pod", "d", ReasonInvalidAnnotation)
	if !strings.Contains(msg, `"nope"`) || !strings.Contains(msg, "ignored") {
		t.Errorf("event %q does not name the bad value and what happens", msg)
	}
	_, sets := rec.get()
	sl.syncOptOut()
	if _, again := rec.get(); again != sets {
		t.Errorf("an unchanged opt-out set was written again (%d -> %d writes)", sets, again)
	}

	patch := func(kind, ns, name, value string) {
		t.Helper()
		v := "null"
		if value != "" {
			v = `"` + value + `"`
		}
		body := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, AnnotationSocketLB, v))
		var err error
		if kind == "Pod" {
			_, err = cs.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
		} else {
			_, err = cs.CoreV1().Namespaces().Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
		}
		must(t, err)
		// the agent's caches see it before the next check (a step whose
		// expected set equals the previous one must not pass on stale data)
		eventually(t, kind+" "+name+" in the agent's cache", 10*time.Second, func() error {
			var ann map[string]string
			if kind == "Pod" {
				p, err := k.pods.Pods(ns).Get(name)
				if err != nil {
					return err
				}
				ann = p.Annotations
			} else {
				n, err := s.namespaces.Get(name)
				if err != nil {
					return err
				}
				ann = n.Annotations
			}
			if ann[AnnotationSocketLB] != value {
				return fmt.Errorf("annotation %q, want %q", ann[AnnotationSocketLB], value)
			}
			return nil
		})
	}
	patch("Pod", "default", "c", SocketLBEnabled)
	expect("pod c opted back in", "a")
	patch("Namespace", "", "mesh", "")
	expect("namespace annotation removed")
	patch("Pod", "default", "d", SocketLBDisabled)
	expect("pod d fixed its annotation", "d")
	patch("Namespace", "", "mesh", "sometimes")
	expect("a malformed namespace annotation is ignored", "d")
	// Events of cluster-scoped objects land in the default namespace
	if msg := waitEvent(t, cs, "default", "Namespace", "mesh", ReasonInvalidAnnotation); !strings.Contains(msg, `"sometimes"`) {
		t.Errorf("namespace event %q does not name the bad value", msg)
	}
}

// runKube runs node1's kube watch against cp until the test ends, as the
// agent does.
func runKube(t *testing.T, cp *controlplane.ControlPlane, log *slog.Logger) *kube {
	t.Helper()
	k, err := newKube(agentRESTConfig(t, cp, "node1"), "node1", log, func() {})
	must(t, err)
	runCtx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); k.run(runCtx, func() {}) }()
	t.Cleanup(func() { stop(); <-done })
	return k
}

// runKubeAndServices runs node1's kube watch and Service sync against cp
// until the test ends, as the agent does.
func runKubeAndServices(t *testing.T, cp *controlplane.ControlPlane, log *slog.Logger) (*kube, *serviceSync) {
	t.Helper()
	k := runKube(t, cp, log)
	s, err := newServiceSync(agentRESTConfig(t, cp, "node1"), "node1", log)
	must(t, err)
	runCtx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); s.run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	return k, s
}

// node1Config is the agent configuration of node1 with its state in a
// fresh directory and its pins under pin, and the endpoint registry there.
func node1Config(t *testing.T, pin string, log *slog.Logger) (Config, *registry) {
	t.Helper()
	cfg := Defaults()
	cfg.NodeName, cfg.StateDir, cfg.BPFRoot = "node1", t.TempDir(), pin
	reg, err := openRegistry(cfg.StateDir, log)
	must(t, err)
	return cfg, reg
}

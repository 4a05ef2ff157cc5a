package agent

// The VM-pod bridge bypass (docs/vm-bypass.md). A KubeVirt VM pod with the
// bridge binding that carries
//
//	axon.io/vm-bypass: "enabled"
//
// gets BPF redirects between its guest's tap and its pod interface, skipping
// the in-pod bridge (internal/datapath/vmbypass). The agent detects the
// layout in the pod's netns at each reconcile: an annotated pod without it
// gets a Warning Event with the reason (VMBypassNotApplied) and nothing
// changes; a pod whose tap disappeared (the VM stopped) loses the bypass,
// which is counted, and gets it back when a new tap is there. Removing the
// annotation, or the pod, removes the bypass and the bridge carries the
// traffic again. Any other annotation value gets an InvalidAnnotation Event
// and is treated as absent. Nothing here fails the reconcile.
//
// --vm-bypass switches it node-wide: annotated (the default: the pods that
// ask), all (every pod with the layout, unless annotated "disabled"; a pod
// that did not ask and has no such layout is no VM pod, and is left alone
// without a word), off (none; bypasses in place are removed).

import (
	"cmp"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/datapath/vmbypass"
)

// AnnotationVMBypass switches the bypass on (or, with --vm-bypass=all, off) for a VM pod.
const AnnotationVMBypass = "axon.io/vm-bypass"

// Values of --vm-bypass (Config.VMBypass).
const (
	VMBypassAnnotated = "annotated" // the pods annotated axon.io/vm-bypass=enabled (the default)
	VMBypassAll       = "all"       // every pod with the bridge-binding layout, unless annotated disabled
	VMBypassOff       = "off"       // no pod: bypasses in place are removed
)

func (c Config) validateVMBypass() error {
	switch c.VMBypass {
	case VMBypassAnnotated, VMBypassAll, VMBypassOff, "": // "" (a Config built by hand) = annotated
		return nil
	}
	return fmt.Errorf("--vm-bypass %q is invalid: use %s (VM pods annotated %s=enabled), %s (every VM pod with the bridge-binding layout, unless annotated disabled) or %s",
		c.VMBypass, VMBypassAnnotated, AnnotationVMBypass, VMBypassAll, VMBypassOff)
}

// vmBypassWanted says whether a pod gets the bypass under --vm-bypass mode,
// from its annotation (set: present and valid; on: "enabled").
func vmBypassWanted(mode string, set, on bool) bool {
	switch mode {
	case VMBypassOff:
		return false
	case VMBypassAll:
		return !set || on
	}
	return on
}

// DecisionVMBypass names the VM bypass line of `axon status`.
const DecisionVMBypass = "vm_bypass"

// ReasonVMBypassNotApplied is the Event of an annotated pod without the
// bridge-binding layout (or whose attach failed).
const ReasonVMBypassNotApplied = "VMBypassNotApplied"

// vmBypasser is what the agent needs of *vmbypass.Bypass.
type vmBypasser interface {
	Attach(id, netnsPath, podIf string) (vmbypass.Layout, error)
	Detach(id, netnsPath string) error
	Stats(id, netnsPath string) (vmbypass.Stats, error)
}

// vmBypass is the feature: which pods want it, which have it, why not.
type vmBypass struct {
	cfg  Config
	log  *slog.Logger
	reg  *registry
	kube func() *kube
	newB func() (vmBypasser, error)

	mu        sync.Mutex
	b         vmBypasser
	loadErr   string
	netns     map[string]string // pod UID → netns path of the attached bypass
	tap       map[string]string // pod UID → the tap of the attached bypass
	recorder  record.EventRecorder
	broadcast record.EventBroadcaster
	sent      map[string]bool // Events sent: pod UID + message

	stMu     sync.Mutex
	on       []string          // pods with the bypass (namespace/name), sorted
	onTaps   map[string]string // endpoint (cookieKey) → tap, of the pods with the bypass
	notOn    map[string]string // annotated pods without it → why
	tapsLost uint64            // bypasses removed because their tap went away
	stLoad   string            // loadErr as of the last reconcile
}

func newVMBypass(cfg Config, log *slog.Logger, reg *registry, kube func() *kube) *vmBypass {
	return &vmBypass{cfg: cfg, log: log.With("component", "vm-bypass"), reg: reg, kube: kube,
		newB: func() (vmBypasser, error) {
			return vmbypass.New(vmbypass.Config{PinDir: cfg.BPFRoot, AttachMode: cfg.AttachMode, Logger: log})
		},
		netns: map[string]string{}, tap: map[string]string{}, sent: map[string]bool{}, notOn: map[string]string{}}
}

// parseVMBypass reads AnnotationVMBypass: set when it is "enabled" or
// "disabled", on for "enabled"; another value is an error (and counts as
// absent).
func parseVMBypass(ann map[string]string) (set, on bool, err error) {
	v, ok := ann[AnnotationVMBypass]
	if !ok {
		return false, false, nil
	}
	switch strings.TrimSpace(v) {
	case "enabled":
		return true, true, nil
	case "disabled":
		return true, false, nil
	}
	return false, false, fmt.Errorf("annotation %s=%q is invalid and ignored: use \"enabled\" (skip the VM pod's in-pod bridge) or \"disabled\"", AnnotationVMBypass, v)
}

func (v *vmBypass) event(k *kube, pod *corev1.Pod, reason, msg string) {
	key := string(pod.UID) + "\x00" + reason + "\x00" + msg
	if v.sent[key] {
		return
	}
	v.sent[key] = true
	v.log.Warn(msg, "pod", pod.Namespace+"/"+pod.Name, "reason", reason)
	if v.recorder == nil && k != nil {
		v.broadcast = record.NewBroadcaster()
		v.broadcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: k.client.CoreV1().Events("")})
		v.recorder = v.broadcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "axon-agent", Host: v.cfg.NodeName})
	}
	if v.recorder != nil {
		v.recorder.Event(pod, corev1.EventTypeWarning, reason, msg)
	}
}

// reconcile attaches the bypass of every annotated local VM pod that has the
// layout, removes it where the annotation, the pod or the tap went, and
// records why annotated pods do not have it.
func (v *vmBypass) reconcile() {
	if v == nil {
		return
	}
	k := v.kube()
	if k == nil || !k.isSynced() {
		return // an empty cache must not remove every bypass
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	want, seen := map[string]bool{}, map[string]bool{}
	podNetns := map[string]string{} // pod UID → netns path, of every local pod
	var on []string
	notOn, onTaps := map[string]string{}, map[string]string{}
	for _, ep := range v.reg.List() {
		if ep.PodName == "" || ep.Netns == "" {
			continue
		}
		pod, err := k.pods.Pods(ep.PodNamespace).Get(ep.PodName)
		if err != nil {
			continue
		}
		seen[string(pod.UID)] = true
		podNetns[string(pod.UID)] = ep.Netns
		set, enabled, err := parseVMBypass(pod.Annotations)
		if err != nil {
			v.event(k, pod, ReasonInvalidAnnotation, err.Error())
		}
		if !vmBypassWanted(v.cfg.VMBypass, set, enabled) {
			continue
		}
		asked := enabled // the pod asked (annotated): it hears why it has no bypass
		name, id := pod.Namespace+"/"+pod.Name, string(pod.UID)
		if v.b == nil {
			if v.b, err = v.newB(); err != nil {
				v.b, v.loadErr = nil, err.Error()
				if asked {
					notOn[name] = "the bypass cannot be loaded: " + err.Error()
				}
				continue
			}
			v.loadErr = ""
		}
		want[id] = true
		if _, ok := v.netns[id]; ok {
			st, err := v.b.Stats(id, ep.Netns)
			if err == nil && st.Problem == "" {
				on = append(on, name)
				onTaps[cookieKey(ep)] = v.tap[id]
				continue
			}
			why := "its counters are gone"
			if err == nil {
				why = st.Problem
			}
			v.log.Warn("VM bypass lost its tap or programs: removed, attached again when the layout is back", "pod", name, "why", why)
			if st.Problem != "" && !st.TapAttached {
				v.countTapLost()
			}
			if err := v.b.Detach(id, ep.Netns); err != nil {
				v.log.Warn("VM bypass: detach", "pod", name, "error", err)
			}
			delete(v.netns, id)
			delete(v.tap, id)
		}
		l, err := v.b.Attach(id, ep.Netns, ep.IfName)
		if err != nil && !asked && vmbypass.ReasonOf(err) != "" {
			delete(want, id) // --vm-bypass=all: not a VM pod of the bridge binding
			continue
		}
		if err != nil {
			msg := fmt.Sprintf("VM bypass not applied: %v; the pod keeps its bridge path", err)
			if r := vmbypass.ReasonOf(err); r != "" {
				notOn[name] = string(r)
			} else {
				notOn[name] = err.Error()
			}
			v.event(k, pod, ReasonVMBypassNotApplied, msg)
			continue
		}
		v.netns[id], v.tap[id] = ep.Netns, l.Tap
		v.log.Info("VM bypass applied", "pod", name, "tap", l.Tap, "bridge", l.Bridge, "pod_if", l.Pod)
		on = append(on, name)
		onTaps[cookieKey(ep)] = l.Tap
	}
	// the annotation or the pod went: remove the bypass (pins of a previous
	// run included)
	ids := map[string]bool{}
	for id := range v.netns {
		ids[id] = true
	}
	if ents, err := os.ReadDir(filepath.Join(v.cfg.BPFRoot, "vmbypass")); err == nil {
		for _, e := range ents {
			ids[e.Name()] = true
		}
	}
	for id := range ids {
		if want[id] {
			continue
		}
		if v.b == nil {
			b, err := v.newB()
			if err != nil {
				v.log.Warn("VM bypass: cannot load to remove a bypass", "id", id, "error", err)
				continue
			}
			v.b = b
		}
		ns := cmp.Or(v.netns[id], podNetns[id]) // a previous run's bypass of a pod still here: its netns
		if ns == "" {
			ns = "/nonexistent" // the pod is gone: only its pins are left to remove
		}
		if err := v.b.Detach(id, ns); err != nil {
			v.log.Warn("VM bypass: detach", "id", id, "error", err)
			continue
		}
		delete(v.netns, id)
		delete(v.tap, id)
	}
	for key := range v.sent { // forget the Events of pods that left
		if !seen[key[:strings.IndexByte(key, 0)]] {
			delete(v.sent, key)
		}
	}
	sort.Strings(on)
	v.stMu.Lock()
	v.on, v.notOn, v.onTaps, v.stLoad = on, notOn, onTaps, v.loadErr
	v.stMu.Unlock()
}

// taps lists the endpoints (cookieKey) of the pods with the bypass and their
// taps: their guests' ClusterIP traffic gets the pod LB (podlb.go), its
// replies translated at the tap.
func (v *vmBypass) taps() map[string]string {
	if v == nil {
		return nil
	}
	v.stMu.Lock()
	defer v.stMu.Unlock()
	return maps.Clone(v.onTaps)
}

func (v *vmBypass) countTapLost() {
	v.stMu.Lock()
	v.tapsLost++
	v.stMu.Unlock()
}

// podState is the pod's VM bypass for `axon endpoint list`: "bypassed",
// "not bypassed: <reason>" for an annotated pod without it, "" otherwise.
func (v *vmBypass) podState(pod string) string {
	if v == nil { // an Agent built by hand (tests)
		return ""
	}
	v.stMu.Lock()
	defer v.stMu.Unlock()
	if slices.Contains(v.on, pod) {
		return "bypassed"
	}
	if why, ok := v.notOn[pod]; ok {
		return "not bypassed: " + why
	}
	return ""
}

// decision is the `axon status` line.
func (v *vmBypass) decision() api.Decision {
	if v == nil {
		return api.Decision{Name: DecisionVMBypass, Value: "0 pod(s)", Reason: "not running"}
	}
	v.stMu.Lock()
	defer v.stMu.Unlock()
	d := api.Decision{Name: DecisionVMBypass, Value: fmt.Sprintf("%d pod(s)", len(v.on))}
	var parts []string
	if len(v.on) > 0 {
		parts = append(parts, "bypassed: "+strings.Join(v.on, ", "))
	}
	var not []string
	for pod, why := range v.notOn {
		not = append(not, pod+" ("+why+")")
	}
	slices.Sort(not)
	if len(not) > 0 {
		parts = append(parts, "annotated but not bypassed: "+strings.Join(not, ", "))
	}
	if v.tapsLost > 0 {
		parts = append(parts, fmt.Sprintf("%d bypass(es) removed after their tap went away", v.tapsLost))
	}
	switch mode := cmp.Or(v.cfg.VMBypass, VMBypassAnnotated); {
	case mode == VMBypassOff:
		parts = append([]string{"--vm-bypass=off: no pod gets it"}, parts...)
	case mode == VMBypassAll:
		parts = append([]string{"--vm-bypass=all: every pod with the bridge-binding layout, unless annotated " + AnnotationVMBypass + "=disabled"}, parts...)
		if v.stLoad != "" {
			parts = append(parts, "the bypass cannot be loaded: "+v.stLoad)
		}
	case len(parts) == 0:
		parts = append(parts, "no pod with "+AnnotationVMBypass+"=enabled")
	}
	d.Reason = strings.Join(parts, "; ")
	return d
}

// vmPods is how many pods want the bypass (bypassed, or annotated and not).
func (v *vmBypass) vmPods() int {
	if v == nil {
		return 0
	}
	v.stMu.Lock()
	defer v.stMu.Unlock()
	return len(v.on) + len(v.notOn)
}

// withBigTCPNote adds to the vm_bypass decision that BIG TCP is on while the
// node has VM pods (vmPods): TCP into their guests arrives in packets over
// 64 KiB, which the tap (a virtio-net frame is at most 64 KiB) segments to
// MTU in software; throughput into the guests halves, bridge or bypass
// (docs/vm-bypass.md). decisions holds the pod datapath's big_tcp.
func withBigTCPNote(vm api.Decision, vmPods int, decisions []api.Decision) api.Decision {
	if vmPods == 0 {
		return vm
	}
	for _, d := range decisions {
		if d.Name == podpath.DecisionBigTCP && d.Value != "off" {
			vm.Reason += "; BIG TCP is on (" + d.Value + "): TCP into the guests is segmented to MTU at their taps, about half the throughput; turn it off on nodes with VM pods (--enable-ipv4-big-tcp=false --enable-ipv6-big-tcp=false)"
		}
	}
	return vm
}

func (v *vmBypass) close() {
	if v == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.broadcast != nil {
		v.broadcast.Shutdown()
	}
}

package agent

// Per-Pod and per-Namespace opt-out of socket load balancing.
//
// A sidecar mesh or a VM inside a pod needs to see the ClusterIP on the
// wire, not the backend the socket LB picked. The annotation
//
//	axon.io/socket-lb: "disabled"
//
// on the Pod or on its Namespace leaves the pod's sockets untranslated: the
// agent writes the netns cookie of the pod's network namespace into
// axon_lb_skip, which the connect/sendmsg hooks check first. "enabled" on a
// Pod overrides "disabled" on its Namespace. Any other value is ignored with
// an Event on the object and a log line. What the skipped sockets get is
// the pod's own per-packet LB (podlb.go): their packets to a ClusterIP are
// translated on the pod's interface.

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/socklb"
)

// AnnotationSocketLB is the opt-out annotation (Pod or Namespace).
const AnnotationSocketLB = "axon.io/socket-lb"

// Values of AnnotationSocketLB.
const (
	SocketLBDisabled = "disabled"
	SocketLBEnabled  = "enabled"
)

// optState says what an annotation asks for.
type optState int

const (
	optUnset optState = iota
	optIn
	optOut
)

// parseSocketLBAnnotation reads AnnotationSocketLB from annotations; a
// malformed value gives an error (and optUnset: it is ignored).
func parseSocketLBAnnotation(annotations map[string]string) (optState, error) {
	v, ok := annotations[AnnotationSocketLB]
	if !ok {
		return optUnset, nil
	}
	switch strings.TrimSpace(v) {
	case SocketLBDisabled:
		return optOut, nil
	case SocketLBEnabled:
		return optIn, nil
	}
	return optUnset, fmt.Errorf("annotation %s=%q is invalid and ignored: use %q (skip socket load balancing: the pod sees ClusterIPs) or %q",
		AnnotationSocketLB, v, SocketLBDisabled, SocketLBEnabled)
}

// optOutState is the socket LB's opt-out bookkeeping (guarded by
// socketLB.mu; the opted-out pods status shows are socketLB.optOutPods).
type optOutState struct {
	cookies map[string]uint64 // "<containerID>/<ifName>@<netns path>" → netns cookie
	applied []uint64          // what axon_lb_skip holds, sorted; nil = never written
}

// setNamespaceHook makes Namespace changes call f (the agent's kick).
func (s *serviceSync) setNamespaceHook(f func()) {
	s.mu.Lock()
	s.onNS = f
	s.mu.Unlock()
}

// optedOut lists the pods whose sockets skip socket LB.
func (s *socketLB) optedOut() []string {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	return slices.Clone(s.optOutPods)
}

// podOptOut decides for one pod: the Pod's annotation, else its
// Namespace's. Malformed values are reported (Event + log) and ignored.
func (s *serviceSync) podOptOut(pod *corev1.Pod) bool {
	st, err := parseSocketLBAnnotation(pod.Annotations)
	if err != nil {
		s.ev.emit(pod, "pod "+pod.Namespace+"/"+pod.Name, corev1.EventTypeWarning, ReasonInvalidAnnotation, err.Error())
	}
	if st != optUnset {
		return st == optOut
	}
	ns, err := s.namespaces.Get(pod.Namespace)
	if err != nil {
		return false
	}
	st, err = parseSocketLBAnnotation(ns.Annotations)
	if err != nil {
		s.ev.emit(ns, "namespace "+ns.Name, corev1.EventTypeWarning, ReasonInvalidAnnotation, err.Error())
	}
	return st == optOut
}

// syncOptOut writes the netns cookies of this node's opted-out pods into
// the socket LB: from the reconcile, and from PutEndpoint so that a pod
// that opted out is skipped from its first connect.
func (s *socketLB) syncOptOut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.syncOptOutLocked()
}

// syncOptOutLocked is syncOptOut with s.mu held. It waits for the Pod and
// Namespace caches (an empty cache must not opt everybody back in).
func (s *socketLB) syncOptOutLocked() {
	svc := s.svc
	if svc == nil || s.lb == nil || svc.nsSynced == nil || !svc.nsSynced() {
		return
	}
	k := s.kube()
	if k == nil || !k.isSynced() {
		return
	}
	eps := s.reg.List()
	var want []uint64
	var pods []string
	var untranslated []api.Endpoint // endpoints whose sockets the socket LB skips: the pod LB serves them
	opt := &s.opt
	if opt.cookies == nil {
		opt.cookies = map[string]uint64{}
	}
	live := map[string]bool{}
	for _, ep := range eps {
		if ep.PodName == "" || ep.PodNamespace == "" || ep.Netns == "" {
			continue
		}
		pod, err := k.pods.Pods(ep.PodNamespace).Get(ep.PodName)
		if err != nil || !svc.podOptOut(pod) {
			continue
		}
		ck := cookieKey(ep)
		live[ck] = true
		c, ok := opt.cookies[ck]
		if !ok {
			if c, err = socklb.NetnsCookie(ep.Netns); err != nil {
				s.log.Warn("socket LB opt-out: cannot read the pod's netns cookie; its sockets stay translated", "pod", ep.PodNamespace+"/"+ep.PodName, "error", err)
				continue
			}
			opt.cookies[ck] = c
		}
		want = append(want, c)
		pods = append(pods, ep.PodNamespace+"/"+ep.PodName)
		untranslated = append(untranslated, ep)
	}
	if s.cfg.SocketLBMode == SocketLBModeHostNS { // no pod's sockets are translated
		untranslated = untranslated[:0]
		for _, ep := range eps {
			if ep.Netns != "" {
				untranslated = append(untranslated, ep)
			}
		}
	}
	var taps map[string]string
	if s.vmTaps != nil {
		taps = s.vmTaps()
	}
	if s.newPodLB != nil {
		s.syncPodLBLocked(eps, untranslated, taps)
	}
	for ck := range opt.cookies {
		if !live[ck] {
			delete(opt.cookies, ck)
		}
	}
	slices.Sort(want)
	want = slices.Compact(want)
	slices.Sort(pods)
	if want == nil {
		want = []uint64{}
	}
	if opt.applied != nil && slices.Equal(want, opt.applied) {
		s.setOptedOut(pods)
		return
	}
	if err := s.lb.SetSkipNetns(want); err != nil {
		s.log.Warn("socket LB opt-out: write opted-out netns", "error", err)
		return
	}
	if !slices.Equal(pods, s.optedOut()) {
		s.log.Info("socket LB opt-out applied", "annotation", AnnotationSocketLB+"="+SocketLBDisabled, "pods", pods)
	}
	opt.applied = want
	s.setOptedOut(pods)
}

func (s *socketLB) setOptedOut(pods []string) {
	s.stMu.Lock()
	s.optOutPods = pods
	s.stMu.Unlock()
}

func cookieKey(ep api.Endpoint) string {
	return ep.ContainerID + "/" + ep.IfName + "@" + ep.Netns
}

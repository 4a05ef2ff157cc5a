package agent

// A malformed axon.io/lb-algorithm annotation is reported as a
// Warning Event on the Service (once per distinct problem), besides the log
// line and `axon service list`; the Service uses the node default meanwhile.

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/axonhq/axon/internal/lb"
)

// EventReasonLBAlgorithm is the reason of the Event for a malformed annotation.
const EventReasonLBAlgorithm = "InvalidLBAlgorithm"

// annotationProblems returns the current problems about the algorithm
// annotation, by "service\x00reason".
func (s *serviceSync) annotationProblems() map[string]lb.Problem {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]lb.Problem{}
	for _, probs := range s.problems {
		for _, p := range probs {
			if strings.Contains(p.Object, lb.AnnotationAlgorithm) {
				out[p.Service+"\x00"+p.Reason] = p
			}
		}
	}
	return out
}

// emitAnnotationEvents creates one Event per new annotation problem; sent
// remembers what was emitted (forgotten when the problem goes away).
func (n *nodePort) emitAnnotationEvents(ctx context.Context, sent map[string]bool) {
	if n.svc == nil {
		return
	}
	k := n.kube()
	if k == nil {
		return
	}
	cur := n.svc.annotationProblems()
	for key := range sent {
		if _, ok := cur[key]; !ok {
			delete(sent, key)
		}
	}
	for key, p := range cur {
		if sent[key] {
			continue
		}
		ns, name, _ := strings.Cut(p.Service, "/")
		now := metav1.NewTime(time.Now())
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: name + ".", Namespace: ns},
			InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: ns, Name: name},
			Reason:         EventReasonLBAlgorithm,
			Message:        fmt.Sprintf("%s: %s", p.Object, p.Reason),
			Type:           corev1.EventTypeWarning,
			Source:         corev1.EventSource{Component: "axon-agent", Host: n.cfg.NodeName},
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
			ReportingController: "axon.io/agent", ReportingInstance: n.cfg.NodeName,
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := k.client.CoreV1().Events(ns).Create(cctx, ev, metav1.CreateOptions{})
		cancel()
		if err != nil {
			n.log.Warn("could not report an Event for a malformed annotation", "service", p.Service, "error", err)
			continue
		}
		sent[key] = true
	}
}

package agent

// Bad input the agent ignores (a Service part Translate skipped, a
// Service that does not fit the socket LB maps, a malformed opt-out
// annotation) is reported where the user looks: a Kubernetes Event on the
// object, plus one log line. Nothing else is disturbed.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// Event reasons the agent uses (Warning unless said otherwise).
const (
	ReasonServiceEntryIgnored = "ServiceEntryIgnored"  // part of a Service or its slices cannot be programmed
	ReasonServiceNotFit       = "ServiceNotProgrammed" // the Service does not fit the socket LB maps
	ReasonServiceProgrammed   = "ServiceProgrammed"    // Normal: programmed after an earlier refusal
	ReasonInvalidAnnotation   = "InvalidAnnotation"    // malformed axon.io/* annotation, ignored
)

// maxEventMessage keeps Events within what the apiserver accepts (1 KiB note
// for events.k8s.io; core/v1 has more room, but a wall of text helps nobody).
const maxEventMessage = 1000

// events emits Events once per distinct (object, reason, message): retries
// of the same refusal do not flood the apiserver.
type events struct {
	rec  record.EventRecorder // nil: log only
	log  *slog.Logger
	stop func()

	mu   sync.Mutex
	sent map[string]bool
}

// newEvents starts an event broadcaster that writes core/v1 Events with
// source component axon-agent, host node.
func newEvents(ctx context.Context, client kubernetes.Interface, node string, log *slog.Logger) *events {
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return &events{
		rec:  b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "axon-agent", Host: node}),
		log:  log,
		stop: b.Shutdown,
		sent: map[string]bool{},
	}
}

// emit records an Event on obj (and logs it) unless the same one was
// already sent. what names the object in the log line.
func (e *events) emit(obj runtime.Object, what, eventType, reason, msg string) {
	if e == nil {
		return
	}
	if len(msg) > maxEventMessage {
		msg = msg[:maxEventMessage-3] + "..."
	}
	key := fmt.Sprintf("%s\x00%s\x00%s", what, reason, msg)
	e.mu.Lock()
	if e.sent[key] {
		e.mu.Unlock()
		return
	}
	if len(e.sent) > 10000 { // bounded: forget and possibly repeat, never grow
		clear(e.sent)
	}
	e.sent[key] = true
	e.mu.Unlock()
	if eventType == corev1.EventTypeWarning {
		e.log.Warn(msg, "object", what, "reason", reason)
	} else {
		e.log.Info(msg, "object", what, "reason", reason)
	}
	if e.rec != nil && obj != nil {
		e.rec.Event(obj, eventType, reason, msg)
	}
}

// forget lets the next emit of (what, reason) through again, e.g. after a
// refused Service was programmed.
func (e *events) forget(what, reason string) {
	if e == nil {
		return
	}
	prefix := what + "\x00" + reason + "\x00"
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.sent {
		if len(k) >= len(prefix) && k[:len(prefix)] == prefix {
			delete(e.sent, k)
		}
	}
}

func (e *events) shutdown() {
	if e != nil && e.stop != nil {
		e.stop()
	}
}

// Package bwm is the control-plane side of axon's Bandwidth Manager (issue
// 6): the Pod annotations kubernetes.io/egress-bandwidth and
// kubernetes.io/ingress-bandwidth parsed and validated, the fq (or mq + fq)
// qdisc the EDT timestamps need on the uplink, and BBR inside pod network
// namespaces. The BPF side lives in bpf/lib/edt.h, bpf/uplink_egress.c and
// internal/datapath/bwm.go.
package bwm

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// The Pod annotations (the same the bandwidth CNI plugin and kubelet read).
const (
	EgressAnnotation  = "kubernetes.io/egress-bandwidth"
	IngressAnnotation = "kubernetes.io/ingress-bandwidth"
)

// Range accepted for a limit, in bits per second: Kubernetes' own
// validation (pkg/util/bandwidth) uses the same bounds.
const (
	MinBits uint64 = 1_000                 // 1k
	MaxBits uint64 = 1_000_000_000_000_000 // 1P
)

// Limits are a pod's bandwidth limits in bits per second; 0 = unlimited.
type Limits struct {
	Egress  uint64
	Ingress uint64
}

// Limited reports whether any direction is limited.
func (l Limits) Limited() bool { return l.Egress > 0 || l.Ingress > 0 }

// Problem is an annotation that was rejected; its direction stays unlimited.
type Problem struct {
	Annotation string
	Value      string
	Reason     string
}

func (p Problem) Error() string {
	return fmt.Sprintf("annotation %s=%q ignored, that direction stays unlimited: %s", p.Annotation, p.Value, p.Reason)
}

// ParseQuantity parses one annotation value (Kubernetes quantity syntax:
// "10M", "1G", "500k", "1.5M") into bits per second and checks the range.
func ParseQuantity(v string) (uint64, error) {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("not a Kubernetes quantity (use e.g. 10M, 500k, 1G): %v", err)
	}
	if q.Sign() <= 0 {
		return 0, fmt.Errorf("must be positive (use e.g. 10M)")
	}
	// compare as quantities first: Value() saturates on huge numbers
	if q.Cmp(*resource.NewQuantity(int64(MaxBits), resource.DecimalSI)) > 0 {
		return 0, fmt.Errorf("%s is unreasonably large (> 1P bit/s)", q.String())
	}
	bits := uint64(q.Value()) // rounds fractions up
	if bits < MinBits {
		return 0, fmt.Errorf("%s is unreasonably small (< 1k bit/s)", q.String())
	}
	return bits, nil
}

// ParseAnnotations reads both annotations. Each direction is independent: a
// bad value leaves its direction unlimited and is returned as a Problem, the
// other direction still applies.
func ParseAnnotations(ann map[string]string) (Limits, []Problem) {
	var l Limits
	var probs []Problem
	for _, d := range []struct {
		key string
		dst *uint64
	}{{EgressAnnotation, &l.Egress}, {IngressAnnotation, &l.Ingress}} {
		v, ok := ann[d.key]
		if !ok {
			continue
		}
		bits, err := ParseQuantity(v)
		if err != nil {
			probs = append(probs, Problem{Annotation: d.key, Value: v, Reason: err.Error()})
			continue
		}
		*d.dst = bits
	}
	return l, probs
}

// FormatBits renders bits per second the way the annotations are written
// ("10M", "1.5G", "800k").
func FormatBits(bits uint64) string {
	for _, u := range []struct {
		div  uint64
		unit string
	}{{1e15, "P"}, {1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if bits >= u.div {
			if bits%u.div == 0 {
				return fmt.Sprintf("%d%s", bits/u.div, u.unit)
			}
			return fmt.Sprintf("%.4g%s", float64(bits)/float64(u.div), u.unit)
		}
	}
	return fmt.Sprintf("%d", bits)
}

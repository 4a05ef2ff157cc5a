package datapath

import (
	"testing"

	"github.com/cilium/ebpf"
)

// Pure logic: the embedded objects are the ones the loader uses.
func TestObjects(t *testing.T) {
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"podegress": "axon_pod_egress", "uplinkingress": "axon_uplink_ingress"}
	seen := map[string]bool{}
	for _, o := range objs {
		seen[o.Name] = true
		prog, ok := want[o.Name]
		if !ok {
			continue // a new object: fine, the verifier report picks it up
		}
		ps := o.Spec.Programs[prog]
		if ps == nil || ps.Type != ebpf.SchedCLS {
			t.Errorf("object %s: program %s missing or not sched_cls: %+v", o.Name, prog, ps)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("object %s not embedded (have %d objects)", name, len(objs))
		}
	}
}

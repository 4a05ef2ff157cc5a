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
	type prog struct {
		name string
		typ  ebpf.ProgramType
	}
	want := map[string]prog{
		"podegress": {"axon_pod_egress", ebpf.SchedCLS}, "uplinkingress": {"axon_uplink_ingress", ebpf.SchedCLS},
		"sockops": {"axon_sockops", ebpf.SockOps}, "skmsg": {"axon_sk_msg", ebpf.SkMsg},
	}
	seen := map[string]bool{}
	for _, o := range objs {
		seen[o.Name] = true
		p, ok := want[o.Name]
		if !ok {
			continue // a new object: fine, the verifier report picks it up
		}
		ps := o.Spec.Programs[p.name]
		if ps == nil || ps.Type != p.typ {
			t.Errorf("object %s: program %s missing or not %s: %+v", o.Name, p.name, p.typ, ps)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("object %s not embedded (have %d objects)", name, len(objs))
		}
	}
}

package drops

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

// objects are the compiled objects that include bpf/lib/drop.h (built by
// `make bpf`).
var objects = map[string]string{
	"pod_egress":     "../podpath/podegress_bpfel.o",
	"uplink_ingress": "../podpath/uplinkingress_bpfel.o",
	"lb_tc":          "../nodeport/lbtc_bpfel.o",
	"lb_xdp":         "../nodeport/lbxdp_bpfel.o",
	"uplink_egress":  "../bandwidth/uplinkegress_bpfel.o",
	"sock_lb":        "../socklb/socklb_bpfel.o",
	"pod_lb":         "../podlb/podlb_bpfel.o",
}

func loaders() map[string]func() (*ebpf.CollectionSpec, error) {
	m := map[string]func() (*ebpf.CollectionSpec, error){}
	for name, path := range objects {
		m[name] = func() (*ebpf.CollectionSpec, error) { return ebpf.LoadCollectionSpec(path) }
	}
	return m
}

// TestEnumsMatchBTF holds the Go names of the drop vocabulary to the C
// enums in every object's BTF (reason names are "drop_" + the C name).
func TestEnumsMatchBTF(t *testing.T) {
	var reasons []string
	for _, r := range reasonNames {
		reasons = append(reasons, strings.TrimPrefix(r, "drop_"))
	}
	dptest.CheckEnums(t, loaders(), []dptest.EnumCase{
		{Enum: "axon_drop_reason", Prefix: "AXON_DROP_REASON_", Max: "AXON_DROP_REASON_MAX", Names: reasons},
		{Enum: "axon_drop_dir", Prefix: "AXON_DROP_DIR_", Max: "AXON_DROP_DIR_MAX", Names: directionNames},
		{Enum: "axon_prog", Prefix: "AXON_PROG_", Max: "AXON_PROG_MAX", Names: progNames},
		{Enum: "axon_drop_ring_stat", Prefix: "AXON_DROP_RING_", Max: "AXON_DROP_RING_MAX", Names: ringStatNames},
	})
}

// TestEventLayout holds Decode's offsets to struct axon_drop_event.
func TestEventLayout(t *testing.T) {
	want := map[string]uint32{
		"ts_ns": offTS, "ifindex": offIfindex, "len": offLen, "prog": offProg, "reason": offReason,
		"dir": offDir, "cap_len": offCapLen, "family": offFamily, "proto": offProto, "dport": offDport,
		"daddr": offDaddr, "sample": offSample,
	}
	for name, path := range objects {
		spec, err := ebpf.LoadCollectionSpec(path)
		if err != nil {
			t.Fatalf("%s: %v (run make bpf)", name, err)
		}
		var s *btf.Struct
		if err := spec.Types.TypeByName("axon_drop_event", &s); err != nil {
			t.Fatalf("%s: struct axon_drop_event: %v", name, err)
		}
		if s.Size != eventSize {
			t.Errorf("%s: struct axon_drop_event is %d bytes, Go decodes %d", name, s.Size, eventSize)
		}
		if len(s.Members) != len(want) {
			t.Errorf("%s: struct axon_drop_event has %d members, Go knows %d", name, len(s.Members), len(want))
		}
		for _, m := range s.Members {
			off, ok := want[m.Name]
			if !ok {
				t.Errorf("%s: member %s unknown to Decode", name, m.Name)
				continue
			}
			if uint32(m.Offset.Bytes()) != off {
				t.Errorf("%s: member %s at %d, Decode reads %d", name, m.Name, m.Offset.Bytes(), off)
			}
		}
	}
}

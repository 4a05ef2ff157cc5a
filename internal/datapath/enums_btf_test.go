package datapath

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/axonhq/axon/internal/lb"
)

// btfEnumCase is one C enum of bpf/ and what Go keeps of it: a table of
// names in enum order (names) or constants by member name (values).
type btfEnumCase struct {
	enum   string            // the C enum
	prefix string            // dropped from a member's name, which is then lower-cased, to give its Go name
	max    string            // the member that counts the others (not a name), "" if none
	names  []string          // the Go table of names, index = value
	values map[string]uint64 // Go constants by C member name: every member must be there
}

// TestEnumsMatchBTF checks the Go tables and constants that mirror C enums
// of bpf/ (metric and verdict names, directions, hooks, flag bits, LB
// scopes and states) against the enums in the BTF of the compiled objects,
// so that neither side can change alone: same members in the same order,
// same values, same count. The enums are in BTF through the
// AXON_BTF_ANCHOR globals (bpf/lib/common.h). Every object holding an enum
// is checked; each enum must be in at least one.
func TestEnumsMatchBTF(t *testing.T) {
	objects := map[string]func() (*ebpf.CollectionSpec, error){
		"pod_egress":     loadPodEgress,
		"uplink_ingress": loadUplinkIngress,
		"uplink_egress":  loadUplinkEgress,
		"lb_tc":          loadLbTC,
		"lb_xdp":         loadLbXDP,
		"sock_lb":        loadSockLB,
		"sock_destroy":   loadSockDestroy,
	}
	specs := map[string]*btf.Spec{}
	for name, load := range objects {
		spec, err := load()
		if err != nil {
			t.Fatalf("load %s: %v", name, err)
		}
		specs[name] = spec.Types
	}
	cases := []btfEnumCase{
		{enum: "axon_dir", prefix: "AXON_DIR_", max: "AXON_DIR_MAX", names: directionNames},
		{enum: "axon_reason", prefix: "AXON_", max: "AXON_REASON_MAX", names: reasonNames},
		{enum: "np_hook", prefix: "NP_HOOK_", max: "NP_HOOK_MAX", names: npHookNames},
		{enum: "np_reason", prefix: "NP_", max: "NP_REASON_MAX", names: npReasonNames},
		{enum: "axon_bw_stat", prefix: "AXON_BW_", max: "AXON_BW_STAT_MAX", names: bwStatNames},
		{enum: "axon_bw_dir", values: map[string]uint64{"AXON_BW_EGRESS": uint64(BWEgress), "AXON_BW_INGRESS": uint64(BWIngress)}},
		{enum: "np_svc_flag", values: map[string]uint64{
			"NP_F_AFFINITY": npFlagAffinity, "NP_F_MAGLEV": npFlagMaglev, "NP_F_SRC_RANGES": npFlagSrcRanges,
			"NP_F_DSR": npFlagDSR, "NP_F_LOCAL_ONLY": npFlagLocalOnly,
		}},
		{enum: "np_be_flag", values: map[string]uint64{"NP_BE_F_LOCAL": npBackendLocal}},
		{enum: "np_ct_flag", values: map[string]uint64{
			"NP_CT_LOCAL": npCTLocal, "NP_CT_SNAT": npCTSNAT, "NP_CT_DSR": npCTDSR, "NP_CT_CLOSING": npCTClosing,
		}},
		{enum: "np_nat_flag", values: map[string]uint64{"NP_NAT_SNAT": npNATSNAT, "NP_NAT_LOCAL": npNATLocal, "NP_NAT_DSR": npNATDSR}},
		{enum: "axon_lb_scope", values: map[string]uint64{
			"AXON_LB_SCOPE_CLUSTER": uint64(lb.ScopeCluster), "AXON_LB_SCOPE_NODEPORT": uint64(lb.ScopeNodePort),
			"AXON_LB_SCOPE_HOSTPORT": uint64(lb.ScopeHostPort),
		}},
		{enum: "axon_lb_state", values: map[string]uint64{
			"AXON_LB_ACTIVE": uint64(lb.Active), "AXON_LB_TERMINATING": uint64(lb.Terminating),
			"AXON_LB_QUARANTINED": uint64(lb.Quarantined),
		}},
		{enum: "axon_lb_flag", values: map[string]uint64{"AXON_LB_F_AFFINITY": lbFlagAffinity}},
		{enum: "axon_gone", values: map[string]uint64{"AXON_GONE_UDP": goneUDP, "AXON_GONE_TCP": goneTCP}},
	}
	for _, c := range cases {
		t.Run(c.enum, func(t *testing.T) {
			found := 0
			for obj, types := range specs {
				var e *btf.Enum
				err := types.TypeByName(c.enum, &e)
				if errors.Is(err, btf.ErrNotFound) {
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", obj, err)
				}
				found++
				for _, msg := range c.check(e) {
					t.Errorf("%s: enum %s: %s", obj, c.enum, msg)
				}
			}
			if found == 0 {
				t.Fatalf("enum %s is in no object's BTF (an AXON_BTF_ANCHOR lost?)", c.enum)
			}
		})
	}
}

// check compares e with the Go side of c; it returns the disagreements.
func (c btfEnumCase) check(e *btf.Enum) []string {
	var msgs []string
	var members []btf.EnumValue
	count := uint64(0)
	hasMax := false
	for _, v := range e.Values {
		if c.max != "" && v.Name == c.max {
			count, hasMax = v.Value, true
			continue
		}
		members = append(members, v)
	}
	if c.max != "" && !hasMax {
		msgs = append(msgs, "no member "+c.max)
	}
	if c.names != nil {
		var want []string
		for i, v := range members {
			if v.Value != uint64(i) {
				msgs = append(msgs, v.Name+" is not the next value: the Go table is indexed by value")
			}
			want = append(want, strings.ToLower(strings.TrimPrefix(v.Name, c.prefix)))
		}
		if hasMax && count != uint64(len(members)) {
			msgs = append(msgs, c.max+" does not count the members")
		}
		if !slices.Equal(c.names, want) {
			msgs = append(msgs, "Go names "+strings.Join(c.names, ",")+"; C has "+strings.Join(want, ","))
		}
	}
	if c.values != nil {
		seen := map[string]bool{}
		for _, v := range members {
			seen[v.Name] = true
			got, ok := c.values[v.Name]
			switch {
			case !ok:
				msgs = append(msgs, v.Name+" has no Go counterpart")
			case got != v.Value:
				msgs = append(msgs, v.Name+": C and Go values differ")
			}
		}
		for name := range c.values {
			if !seen[name] {
				msgs = append(msgs, "Go has "+name+", C does not")
			}
		}
	}
	return msgs
}

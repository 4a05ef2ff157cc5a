package datapath

import "testing"

// Pure logic: the registry's tc hooks keep the pin names and filter handles
// running nodes have, and hooks that share the uplink never share a filter.
func TestTCHookRegistry(t *testing.T) {
	want := map[string]struct {
		egress bool
		handle uint32
		filter string
	}{
		RolePod:       {false, 0xa10, "axon_pod"},
		RoleUplink:    {false, 0xa10, "axon_uplink"},
		RoleBandwidth: {true, 0xa16, "axon_bwm"},
		RoleLBIn:      {false, 0xa17, "axon_lb"},
		RoleLBOut:     {true, 0xa17, "axon_lb"},
		RoleLBDecap:   {false, 0xa18, "axon_lb"},
		RoleVMBTap:    {false, 0xa19, "axon_vmb"},
		RoleVMBPod:    {false, 0xa19, "axon_vmb"},
		RolePodLBOut:  {true, 0xa1a, "axon_podlb"},
		RolePodLBIn:   {false, 0xa1a, "axon_podlb"},
		RolePodLBTap:  {true, 0xa1a, "axon_podlb"},
	}
	seen := map[string]bool{}
	onUplink := map[[2]uint32]string{}
	for _, h := range TCHooks() {
		w, ok := want[h.Role]
		if !ok || seen[h.Role] {
			t.Errorf("role %q: unexpected or listed twice", h.Role)
			continue
		}
		seen[h.Role] = true
		if h.Egress != w.egress || h.Handle != w.handle || h.Filter != w.filter || h.Legacy {
			t.Errorf("role %s: %+v, want egress %v handle %#x filter %s", h.Role, h, w.egress, w.handle, w.filter)
		}
		if h.Role == RolePod || h.Role == RoleVMBTap || h.Role == RoleVMBPod || h.Role == RolePodLBOut || h.Role == RolePodLBIn || h.Role == RolePodLBTap {
			continue // pods' devices carry nothing else (the VM bypass's two are on two devices of the pod's netns, the pod LB's on both hooks of its interface or a VM pod's tap)
		}
		dir := uint32(0)
		if h.Egress {
			dir = 1
		}
		k := [2]uint32{dir, h.Handle}
		if other, dup := onUplink[k]; dup {
			t.Errorf("roles %s and %s share filter handle %#x on the same hook", other, h.Role, h.Handle)
		}
		onUplink[k] = h.Role
	}
	if len(seen) != len(want) {
		t.Errorf("registry has %d tc hooks, want %d", len(seen), len(want))
	}
	if h := TCHook(RoleLBIn, true); !h.Legacy || !h.First || PinPath("/p", PinTC, h.Role, "eth0") != "/p/links/tc-lbin-eth0" {
		t.Errorf("TCHook(lbin, legacy) = %+v", h)
	}
}

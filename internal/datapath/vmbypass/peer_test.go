package vmbypass

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/testutil"
)

// TestNodePeerRedirectReachesTap: the node's shortest way toward the guest.
// A frame the node moves into the pod with bpf_redirect_peer (as axon's pod
// programs deliver to pods) lands in eth0's ingress inside the pod netns,
// where axon_vmb_from_pod runs and redirects it to the tap: two redirects,
// no bridge (isolated here), no backlog queue. The node's program is on the
// ingress of a second veth pair in the node netns, r1, fed from r2.
func TestNodePeerRedirectReachesTap(t *testing.T) {
	v := newVMPod(t, "", false)
	dptest.NSConf(t, v.pod).Sysctl("net.ipv6.conf.all.disable_ipv6", "1")
	v.isolate(true)
	v.attach()
	nc := dptest.NSConf(t, v.node)
	nc.Sysctl("net.ipv6.conf.all.disable_ipv6", "1")
	nc.Veth("r1", "", "r2", "", "")
	nc.Up("r1", "r2")
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "node_to_pod", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R1, int32(nc.Index(nodeDev))),
			asm.Mov.Imm(asm.R2, 0),
			asm.FnRedirectPeer.Call(),
			asm.Return(),
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if datapath.ProbeTCX().Available {
		var l link.Link
		dptest.InNetns(t, v.node, func() {
			l, err = link.AttachTCX(link.TCXOptions{Interface: nc.Index("r1"), Program: prog, Attach: ebpf.AttachTCXIngress})
		})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	} else { // before 6.6: a cls_bpf filter; r1 goes with the netns
		r1 := nc.Link("r1")
		if err := nc.H.QdiscAdd(&netlink.GenericQdisc{QdiscType: "clsact",
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: r1.Attrs().Index, Parent: netlink.HANDLE_CLSACT, Handle: netlink.MakeHandle(0xffff, 0)}}); err != nil {
			t.Fatalf("clsact on r1: %v", err)
		}
		if err := nc.H.FilterAdd(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: r1.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
			Handle: 1, Priority: 1, Protocol: unix.ETH_P_ALL}, Fd: prog.FD(), Name: "node_to_pod", DirectAction: true}); err != nil {
			t.Fatalf("cls_bpf on r1: %v", err)
		}
	}

	before := v.stats().Counters["pod_frames"]
	f := eth(guestMAC, nodeMAC, unix.ETH_P_IP, udp(node4, guest4, 40000, 7, []byte("peer redirect")))
	dptest.SendRaw(t, v.node, "r2", [][]byte{f})
	if m := missing([][]byte{f}, tapFrames(t, v.tap, testutil.Stretch(t, 300*time.Millisecond))); len(m) > 0 {
		t.Fatalf("a frame redirected into the pod with bpf_redirect_peer did not reach the tap")
	}
	if d := v.stats().Counters["pod_frames"] - before; d != 1 {
		t.Errorf("pod_frames moved by %d, want 1: the frame did not come through axon_vmb_from_pod", d)
	}
}

package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/testutil"
)

// needNetkit skips where the kernel cannot create netkit devices (the 6.18
// development host has CONFIG_NETKIT unset; the Debian 6.12 VM has it):
//
//	make test-vm KERNEL=debian-6.12 VM_PKGS=./internal/cni VM_RUN=Netkit VM_LAB=0
func needNetkit(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t, "probes the kernel for netkit devices")
	if c := datapath.ProbeNetkit(); !c.Available {
		t.Skip("kernel has no netkit (run in the 6.12 VM: make test-vm KERNEL=debian-6.12 VM_PKGS=./internal/cni VM_RUN=Netkit VM_LAB=0): " + c.Reason)
	}
}

func (e *env) hostLink(name string) netlink.Link {
	e.t.Helper()
	var l netlink.Link
	if err := e.inNode(func() error {
		var err error
		l, err = netlink.LinkByName(name)
		return err
	}); err != nil {
		e.t.Fatalf("node device %s: %v", name, err)
	}
	return l
}

func podLinkOf(t *testing.T, pod, ifname string) netlink.Link {
	t.Helper()
	var l netlink.Link
	testutil.InNetns(t, pod, func() error {
		var err error
		l, err = netlink.LinkByName(ifname)
		return err
	})
	return l
}

// loadDatapath loads the real axon datapath in the test's node netns (uplink
// eth0), as the agent does, with pins under a private bpffs dir.
func (e *env) loadDatapath(mode string) *podpath.Datapath {
	e.t.Helper()
	pin := filepath.Join(datapath.BPFFSRoot, "axt-cni-"+e.node) // e.node is unique per test and pid
	var d *podpath.Datapath
	if err := e.inNode(func() error {
		var err error
		d, err = podpath.Load(podpath.Config{PinDir: pin, Uplink: "eth0", DeviceMode: mode, Logger: quiet()})
		return err
	}); err != nil {
		e.t.Fatalf("load datapath: %v", err)
	}
	e.t.Cleanup(func() {
		d.Close()
		_ = e.inNode(func() error { return podpath.Uninstall(pin) })
	})
	return d
}

// register does what the agent's PutEndpoint does: attach, then map entries.
func (e *env) register(d *podpath.Datapath, cid string) api.Endpoint {
	e.t.Helper()
	ep, ok := e.agent.endpoint(cid, "eth0")
	if !ok {
		e.t.Fatalf("no endpoint for %s", cid)
	}
	if err := e.inNode(func() error {
		if err := d.AttachPod(ep.HostIfName); err != nil {
			return err
		}
		for _, ip := range ep.IPs {
			if err := d.UpsertEndpoint(podpath.Endpoint{IP: ip, IfIndex: ep.HostIfIndex, PodMAC: ep.PodMAC, HostMAC: ep.HostMAC}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		e.t.Fatalf("register %s: %v", cid, err)
	}
	return ep
}

// podDial connects from one pod to addr:port and echoes 4 bytes.
func podDial(pod, addr string) error {
	return ns.WithNetNSPath("/run/netns/"+pod, func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("axon")); err != nil {
			return err
		}
		buf := make([]byte, 4)
		if _, err := c.Read(buf); err != nil || string(buf) != "axon" {
			return fmt.Errorf("echo %q: %v", buf, err)
		}
		return nil
	})
}

// podEcho starts a TCP echo server in pod on ip and returns host:port.
func podEcho(t *testing.T, pod, ip string) string {
	t.Helper()
	ln, err := listenTCP(pod, ip)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	testutil.ServeConns(ln, func(c net.Conn) {
		buf := make([]byte, 4)
		if _, err := c.Read(buf); err == nil {
			_, _ = c.Write(buf)
		}
	})
	return ln.Addr().String()
}

func addrOf(r *types100.Result, v4 bool) string {
	for _, ip := range r.IPs {
		if (ip.Address.IP.To4() != nil) == v4 {
			return ip.Address.IP.String()
		}
	}
	return ""
}

func TestNetkitAddCheckDel(t *testing.T) {
	needNetkit(t)
	for _, tc := range []struct {
		mode    string
		nkMode  netlink.NetkitMode
		apiMode string
	}{
		{ModeNetkit, netlink.NETKIT_MODE_L3, "l3"},
		{ModeNetkitL2, netlink.NETKIT_MODE_L2, "l2"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			e := newEnv(t)
			pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
			stdin := e.conf(fmt.Sprintf(`,"deviceMode":%q`, tc.mode))
			o := e.mustOK(call{cmd: "ADD", cid: "nk1", netns: "/run/netns/" + pod, stdin: stdin})
			if !strings.Contains(o.stdout, `"ips"`) {
				t.Fatalf("ADD result without IPs: %s", o.stdout)
			}
			host := HostVethName("nk1", "eth0")
			nk, ok := e.hostLink(host).(*netlink.Netkit)
			if !ok {
				t.Fatalf("node device %s is a %s, want netkit", host, e.hostLink(host).Type())
			}
			if !nk.IsPrimary() || nk.Mode != tc.nkMode {
				t.Errorf("node device: primary %v mode %v, want primary in mode %v", nk.IsPrimary(), nk.Mode, tc.nkMode)
			}
			// nothing is attached yet (the test agent attaches nothing): blackhole both ways
			if nk.Policy != netlink.NETKIT_POLICY_BLACKHOLE || nk.PeerPolicy != netlink.NETKIT_POLICY_BLACKHOLE {
				t.Errorf("policies primary %v peer %v before attach, want blackhole (2) both", nk.Policy, nk.PeerPolicy)
			}
			pl, ok := podLinkOf(t, pod, "eth0").(*netlink.Netkit)
			if !ok || pl.IsPrimary() || pl.Attrs().Index != nk.Attrs().ParentIndex {
				t.Fatalf("pod eth0 is not the netkit peer of %s: %+v", host, podLinkOf(t, pod, "eth0").Attrs())
			}
			if l3 := tc.apiMode == "l3"; noARP(pl) != l3 {
				t.Errorf("pod eth0 NOARP = %v, want %v", noARP(pl), l3)
			}
			ep, ok := e.agent.endpoint("nk1", "eth0")
			if !ok || ep.DeviceType != api.DeviceNetkit || ep.NetkitMode != tc.apiMode {
				t.Errorf("endpoint device %q %q, want netkit %s", ep.DeviceType, ep.NetkitMode, tc.apiMode)
			}
			e.mustOK(call{cmd: "CHECK", cid: "nk1", netns: "/run/netns/" + pod, stdin: stdin})
			// duplicate ADD keeps the device
			e.mustOK(call{cmd: "ADD", cid: "nk1", netns: "/run/netns/" + pod, stdin: stdin})
			if got := e.hostLink(host).Attrs().Index; got != nk.Attrs().Index {
				t.Errorf("duplicate ADD re-created the device: ifindex %d → %d", nk.Attrs().Index, got)
			}
			e.mustOK(call{cmd: "DEL", cid: "nk1", netns: "/run/netns/" + pod, stdin: stdin})
			if l := e.hostLinks(); len(l) != 0 {
				t.Errorf("devices left after DEL: %v", l)
			}
			if f := e.ipFiles(); len(f) != 0 {
				t.Errorf("addresses left after DEL: %v", f)
			}
		})
	}
}

// TestNetkitBlackholeUntilAttach: a packet the pod sends before the agent
// attached its programs is dropped (policy blackhole); after AttachPod the
// same traffic flows, through axon's peer program.
func TestNetkitBlackholeUntilAttach(t *testing.T) {
	needNetkit(t)
	e := newEnv(t)
	pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
	stdin := e.conf(`,"deviceMode":"netkit"`)
	e.mustOK(call{cmd: "ADD", cid: "bh1", netns: "/run/netns/" + pod, stdin: stdin})
	host := HostVethName("bh1", "eth0")

	// a UDP listener on the node; the pod sends to it before any attach
	var uc *net.UDPConn
	if err := e.inNode(func() error {
		var err error
		uc, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(nodeIPv4)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	send := func() {
		testutil.InNetns(t, pod, func() error {
			c, err := net.Dial("udp4", uc.LocalAddr().String())
			if err != nil {
				return err
			}
			defer c.Close()
			for range 5 {
				_, _ = c.Write([]byte("before-attach"))
			}
			return nil
		})
	}
	received := func() int {
		n := 0
		buf := make([]byte, 64)
		for {
			_ = uc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if _, _, err := uc.ReadFrom(buf); err != nil {
				return n
			}
			n++
		}
	}
	droppedBefore := podLinkOf(t, pod, "eth0").Attrs().Statistics.TxDropped
	send()
	if n := received(); n != 0 {
		t.Fatalf("%d packets sent before attach reached the node: want 0 (blackhole)", n)
	}
	if d := podLinkOf(t, pod, "eth0").Attrs().Statistics.TxDropped - droppedBefore; d < 5 {
		t.Errorf("pod eth0 tx_dropped grew by %d, want >= 5", d)
	}

	d := e.loadDatapath(podpath.DeviceModeNetkit)
	e.register(d, "bh1")
	nk := e.hostLink(host).(*netlink.Netkit)
	if nk.Policy != netlink.NETKIT_POLICY_FORWARD || nk.PeerPolicy != netlink.NETKIT_POLICY_FORWARD {
		t.Errorf("policies after attach primary %v peer %v, want forward (0)", nk.Policy, nk.PeerPolicy)
	}
	send()
	if n := received(); n != 5 {
		t.Errorf("%d of 5 packets reached the node after attach", n)
	}
	if err := e.tcpEcho(pod, nodeIPv4); err != nil {
		t.Errorf("pod → node TCP after attach: %v", err)
	}
	if err := e.tcpEcho(pod, nodeIPv6); err != nil {
		t.Errorf("pod → node TCP over IPv6 after attach: %v", err)
	}
	// DetachPod closes the device again
	if err := e.inNode(func() error { return d.DetachPod(host) }); err != nil {
		t.Fatal(err)
	}
	if nk := e.hostLink(host).(*netlink.Netkit); nk.PeerPolicy != netlink.NETKIT_POLICY_BLACKHOLE {
		t.Errorf("peer policy after DetachPod %v, want blackhole", nk.PeerPolicy)
	}
	e.mustOK(call{cmd: "DEL", cid: "bh1", netns: "/run/netns/" + pod, stdin: stdin})
}

// TestNetkitPeerProgramNotDetachableFromPod: root inside the pod netns
// cannot detach (or replace) the peer program: netkit only takes requests
// that name the primary, which is not in the pod's netns.
func TestNetkitPeerProgramNotDetachableFromPod(t *testing.T) {
	needNetkit(t)
	e := newEnv(t)
	pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
	stdin := e.conf(`,"deviceMode":"netkit"`)
	e.mustOK(call{cmd: "ADD", cid: "pp1", netns: "/run/netns/" + pod, stdin: stdin})
	d := e.loadDatapath(podpath.DeviceModeNetkit)
	ep := e.register(d, "pp1")

	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}}) // TC_ACT_SHOT
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	peerIdx := podLinkOf(t, pod, "eth0").Attrs().Index
	testutil.InNetns(t, pod, func() error {
		for _, at := range []ebpf.AttachType{ebpf.AttachNetkitPeer, ebpf.AttachNetkitPrimary} {
			err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: peerIdx, Program: prog, Attach: at})
			if !errors.Is(err, unix.EACCES) {
				t.Errorf("detach (%v) via the peer eth0 from the pod: %v, want EACCES", at, err)
			}
			l, err := link.AttachNetkit(link.NetkitOptions{Interface: peerIdx, Program: prog, Attach: at})
			if err == nil {
				l.Close()
				t.Errorf("attach (%v) via the peer eth0 from the pod succeeded, want EACCES", at)
			} else if !errors.Is(err, unix.EACCES) {
				t.Errorf("attach (%v) via the peer eth0 from the pod: %v, want EACCES", at, err)
			}
		}
		// the primary's ifindex means nothing (or another device) in the pod netns
		err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: ep.HostIfIndex, Program: prog, Attach: ebpf.AttachNetkitPeer})
		if err == nil {
			t.Errorf("detach via the primary's ifindex %d from the pod succeeded", ep.HostIfIndex)
		}
		return nil
	})
	// still attached and forwarding
	if err := e.tcpEcho(pod, nodeIPv4); err != nil {
		t.Errorf("pod → node after the detach attempts: %v", err)
	}
}

// TestNetkitPodToPod: netkit ↔ netkit and netkit ↔ veth pods on one node,
// forwarded by axon's programs (endpoint map, bpf_redirect from the netkit
// peer, bpf_redirect_peer into netkit from a veth host side).
func TestNetkitPodToPod(t *testing.T) {
	needNetkit(t)
	e := newEnv(t)
	d := e.loadDatapath(podpath.DeviceModeNetkit)
	pods := map[string]string{}
	res := map[string]*types100.Result{}
	for _, p := range []struct{ cid, mode string }{{"nka", ModeNetkit}, {"nkb", ModeNetkit}, {"vea", ModeVeth}, {"nl2", ModeNetkitL2}} {
		pods[p.cid] = testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
		o := e.mustOK(call{cmd: "ADD", cid: p.cid, netns: "/run/netns/" + pods[p.cid], stdin: e.conf(fmt.Sprintf(`,"deviceMode":%q`, p.mode))})
		var r types100.Result
		if err := json.Unmarshal([]byte(o.stdout), &r); err != nil {
			t.Fatalf("ADD result %q: %v", o.stdout, err)
		}
		res[p.cid] = &r
		e.register(d, p.cid)
	}
	for _, pair := range [][2]string{{"nka", "nkb"}, {"nkb", "nka"}, {"nka", "vea"}, {"vea", "nka"}, {"nl2", "nka"}, {"vea", "nl2"}} {
		for _, v4 := range []bool{true, false} {
			dst := podEcho(t, pods[pair[1]], addrOf(res[pair[1]], v4))
			if err := podDial(pods[pair[0]], dst); err != nil {
				t.Errorf("%s → %s (%s): %v", pair[0], pair[1], dst, err)
			}
		}
	}
	m, err := d.MetricsByDirection()
	if err != nil {
		t.Fatal(err)
	}
	if m["pod_egress"]["redirect_peer_local"] == 0 {
		t.Errorf("no local redirects counted by pod_egress: %v", m["pod_egress"])
	}
}

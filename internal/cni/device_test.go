package cni

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/testutil"
)

func TestParseConfigDeviceMode(t *testing.T) {
	tests := []struct {
		mode    string
		wantErr string
	}{
		{"", ""},
		{"veth", ""},
		{"netkit", ""},
		{"netkit-l2", ""},
		{"auto", ""},
		{"bogus", `"deviceMode" "bogus" is unknown: use one of veth, netkit, netkit-l2, auto`},
		{"Netkit", `"deviceMode" "Netkit" is unknown`},
	}
	for _, tc := range tests {
		conf, err := ParseConfig([]byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"axon","type":"axon-cni","deviceMode":%q}`, tc.mode)))
		if tc.wantErr == "" {
			if err != nil || conf.DeviceMode != tc.mode {
				t.Errorf("mode %q: %v, %+v", tc.mode, err, conf)
			}
			continue
		}
		var e *types.Error
		if !errors.As(err, &e) || e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, tc.wantErr) {
			t.Errorf("mode %q: error %v, want code 7 with %q", tc.mode, err, tc.wantErr)
		}
	}
}

func TestDeviceFor(t *testing.T) {
	big := &api.DeviceConfig{Type: api.DeviceNetkit, NetkitMode: "l3", GSOMaxSize: 196608}
	tests := []struct {
		name      string
		confMode  string
		agent     *api.DeviceConfig
		wantType  string
		wantMode  string
		wantGSOMx uint32
	}{
		{"no agent answer", "", nil, api.DeviceVeth, "", 0},
		{"agent netkit", "", big, api.DeviceNetkit, "l3", 196608},
		{"config veth wins, sizes kept", ModeVeth, big, api.DeviceVeth, "", 196608},
		{"config netkit-l2", ModeNetkitL2, nil, api.DeviceNetkit, "l2", 0},
		{"agent netkit without mode", "", &api.DeviceConfig{Type: api.DeviceNetkit}, api.DeviceNetkit, "l3", 0},
	}
	for _, tc := range tests {
		got := deviceFor(&NetConf{DeviceMode: tc.confMode}, tc.agent)
		if got.Type != tc.wantType || got.NetkitMode != tc.wantMode || got.GSOMaxSize != tc.wantGSOMx {
			t.Errorf("%s: got %+v", tc.name, got)
		}
	}
}

// TestNetkitUnavailableAdd: where the kernel has no netkit, an ADD that asks
// for one (config or agent) fails with a clear error and leaves nothing:
// no device, no address, no endpoint.
func TestNetkitUnavailableAdd(t *testing.T) {
	e := newEnv(t)
	if c := datapath.ProbeNetkit(); c.Available {
		t.Skip("kernel has netkit: this test covers kernels without it (the 6.18 host)")
	}
	for _, tc := range []struct {
		name, stdin string
		agent       *api.DeviceConfig
	}{
		{"config", e.conf(`,"deviceMode":"netkit"`), nil},
		{"agent", e.conf(""), &api.DeviceConfig{Type: api.DeviceNetkit, NetkitMode: "l3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.agent.mu.Lock()
			e.agent.device = tc.agent
			e.agent.mu.Unlock()
			pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
			o := e.invoke(call{cmd: "ADD", cid: "nonk-" + tc.name, netns: "/run/netns/" + pod, stdin: tc.stdin})
			ce := o.cniErr(t)
			if !strings.Contains(ce.Msg, "no netkit devices") || !strings.Contains(ce.Msg, "CONFIG_NETKIT") {
				t.Errorf("error %q does not say that the kernel lacks netkit and what to do", ce.Msg)
			}
			if l := e.hostLinks(); len(l) != 0 {
				t.Errorf("devices left: %v", l)
			}
			if f := e.ipFiles(); len(f) != 0 {
				t.Errorf("addresses left: %v", f)
			}
			if _, ok := e.agent.endpoint("nonk-"+tc.name, "eth0"); ok {
				t.Error("endpoint registered")
			}
			testutil.InNetns(t, pod, func() error {
				if _, err := netlink.LinkByName("eth0"); err == nil {
					return errors.New("eth0 exists in the pod")
				}
				return nil
			})
		})
	}
}

// TestDeviceModeAuto: "auto" gives netkit where the kernel has it (6.12 VM)
// and a veth where not (6.18 host).
func TestDeviceModeAuto(t *testing.T) {
	e := newEnv(t)
	pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
	stdin := e.conf(`,"deviceMode":"auto"`)
	e.mustOK(call{cmd: "ADD", cid: "auto1", netns: "/run/netns/" + pod, stdin: stdin})
	want := "veth"
	if datapath.ProbeNetkit().Available {
		want = "netkit"
	}
	if got := e.hostLink(HostVethName("auto1", "eth0")).Type(); got != want {
		t.Errorf("auto created a %s, want %s on this kernel", got, want)
	}
	if ep, _ := e.agent.endpoint("auto1", "eth0"); ep.DeviceType != want {
		t.Errorf("endpoint device type %q, want %q", ep.DeviceType, want)
	}
	e.mustOK(call{cmd: "CHECK", cid: "auto1", netns: "/run/netns/" + pod, stdin: stdin})
	e.mustOK(call{cmd: "DEL", cid: "auto1", netns: "/run/netns/" + pod, stdin: stdin})
}

// bigTCPDevice is what the agent answers with BIG TCP on or off; kernels
// before 6.3 (Debian 6.1) have no IPv4 BIG TCP, and the agent then leaves
// the IPv4 sizes alone.
func bigTCPDevice(on, v4 bool) *api.DeviceConfig {
	if !on {
		return &api.DeviceConfig{Type: api.DeviceVeth}
	}
	d := &api.DeviceConfig{Type: api.DeviceVeth, GSOMaxSize: 196608, GROMaxSize: 196608}
	if v4 {
		d.GSOIPv4MaxSize, d.GROIPv4MaxSize = 196608, 196608
	}
	return d
}

// gsoCounter attaches (tcx ingress, first) a program to ifindex in the
// current netns that counts packets and packets with skb->len > 65535.
func gsoCounter(t *testing.T, ifindex int) (read func() (all, big uint64)) {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	count := func(key int32, label string) asm.Instructions {
		return asm.Instructions{
			asm.StoreImm(asm.RFP, -4, int64(key), asm.Word).WithSymbol(label),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "next_"+label),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("next_" + label),
		}
	}
	insns := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, 0, asm.Word), // skb->len
	}
	insns = append(insns, count(0, "all")...)
	insns = append(insns, asm.JLE.Imm(asm.R6, 65535, "exit"))
	insns = append(insns, count(1, "big")...)
	insns = append(insns, asm.Mov.Imm(asm.R0, -1).WithSymbol("exit"), asm.Return()) // TCX_NEXT
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: insns})
	if err != nil {
		t.Fatalf("load GSO counter: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress, Anchor: link.Head()})
	switch {
	case errors.Is(err, link.ErrNotSupported): // < 6.6 (Debian 6.1): a cls_bpf filter; the netns takes it along
		q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_CLSACT, Handle: netlink.MakeHandle(0xffff, 0)}, QdiscType: "clsact"}
		if err := netlink.QdiscAdd(q); err != nil {
			t.Fatalf("clsact for the GSO counter: %v", err)
		}
		f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_MIN_INGRESS, Handle: 1, Priority: 1, Protocol: unix.ETH_P_ALL},
			Fd: prog.FD(), Name: "axt_gso", DirectAction: true}
		if err := netlink.FilterAdd(f); err != nil {
			t.Fatalf("cls_bpf GSO counter: %v", err)
		}
	case err != nil:
		t.Fatalf("attach GSO counter: %v", err)
	default:
		t.Cleanup(func() { l.Close() })
	}
	return func() (uint64, uint64) {
		var all, big uint64
		_ = m.Lookup(uint32(0), &all)
		_ = m.Lookup(uint32(1), &big)
		return all, big
	}
}

// bulk sends n bytes over TCP from pod to addr in the node netns.
func (e *env) bulk(pod, addr string, n int64) error {
	ln, err := listenTCP(e.node, addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	done := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- 0
			return
		}
		defer c.Close()
		got, _ := io.Copy(io.Discard, c)
		done <- got
	}()
	err = ns.WithNetNSPath("/run/netns/"+pod, func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 3*time.Second)
		if err != nil {
			return err
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 1<<20)
		for sent := int64(0); sent < n; sent += int64(len(buf)) {
			if _, err := c.Write(buf); err != nil {
				c.Close()
				return err
			}
		}
		return c.Close()
	})
	if err != nil {
		return err
	}
	if got := <-done; got < n {
		return fmt.Errorf("node received %d of %d bytes", got, n)
	}
	return nil
}

// TestBigTCP: the sizes the agent asks for are set on both ends of a veth
// and of a netkit pair and read back through netlink, and with them the pod
// sends GSO packets over 64 KiB (counted by a BPF program on the host side of
// the pod device), with the kernel defaults none. A netkit pod gets the
// datapath's programs first: until then its device drops everything.
func TestBigTCP(t *testing.T) {
	for _, tc := range []struct {
		mode string
		on   bool
	}{{ModeVeth, true}, {ModeVeth, false}, {ModeNetkit, true}, {ModeNetkit, false}} {
		t.Run(fmt.Sprintf("%s/on=%v", tc.mode, tc.on), func(t *testing.T) {
			on := tc.on
			if tc.mode == ModeNetkit {
				needNetkit(t)
			}
			e := newEnv(t)
			if !datapath.Probe().BigTCP.Available {
				t.Skip("kernel refuses gso_max_size > 64k")
			}
			v4 := e.hostLink("eth0").Attrs().GSOIPv4MaxSize > 0 // 0: no IFLA_GSO_IPV4_MAX_SIZE (< 6.3)
			e.agent.device = bigTCPDevice(on, v4)
			pod := testutil.NewNetnsKernelDAD(t, "axt-cni-pod-")
			stdin := e.conf(fmt.Sprintf(`,"deviceMode":%q`, tc.mode))
			e.mustOK(call{cmd: "ADD", cid: "big1", netns: "/run/netns/" + pod, stdin: stdin})
			if tc.mode == ModeNetkit {
				e.register(e.loadDatapath(podpath.DeviceModeNetkit), "big1")
			}
			want := uint32(65536)
			if on {
				want = 196608
			}
			host := e.hostLink(HostVethName("big1", "eth0"))
			if host.Type() != tc.mode {
				t.Fatalf("node device %s is a %s, want %s", host.Attrs().Name, host.Type(), tc.mode)
			}
			for where, l := range map[string]netlink.Link{"node": host, "pod": podLinkOf(t, pod, "eth0")} {
				a := l.Attrs()
				want4 := want
				if !v4 {
					want4 = 0
				}
				if a.GSOMaxSize != want || a.GROMaxSize != want || a.GSOIPv4MaxSize != want4 || a.GROIPv4MaxSize != want4 {
					t.Errorf("%s side: gso %d gro %d gso_ipv4 %d gro_ipv4 %d, want %d (ipv4 %d)", where, a.GSOMaxSize, a.GROMaxSize, a.GSOIPv4MaxSize, a.GROIPv4MaxSize, want, want4)
				}
			}
			var read func() (uint64, uint64)
			if err := e.inNode(func() error { read = gsoCounter(t, host.Attrs().Index); return nil }); err != nil {
				t.Fatal(err)
			}
			for _, addr := range []string{nodeIPv4, nodeIPv6} {
				all0, big0 := read()
				if err := e.bulk(pod, addr, 64<<20); err != nil {
					t.Fatalf("bulk to %s: %v", addr, err)
				}
				all, big := read()
				all, big = all-all0, big-big0
				t.Logf("to %s: %d packets, %d over 64 KiB", addr, all, big)
				if on && big == 0 && (v4 || addr == nodeIPv6) {
					t.Errorf("BIG TCP on: no packet over 64 KiB among %d to %s", all, addr)
				}
				if (!on || (!v4 && addr == nodeIPv4)) && big != 0 {
					t.Errorf("BIG TCP off: %d packets over 64 KiB to %s", big, addr)
				}
			}
			e.mustOK(call{cmd: "DEL", cid: "big1", netns: "/run/netns/" + pod, stdin: stdin})
		})
	}
}

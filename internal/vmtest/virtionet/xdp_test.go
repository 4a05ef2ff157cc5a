package virtionet

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// xdpAttachedDriver is IFLA_XDP_ATTACHED's value for a program in the driver (native) path.
const xdpAttachedDriver = 1

// reflectPort is the UDP port the XDP_TX program answers on (discard: nothing listens there).
const reflectPort = 9

// pair is the two back-to-back virtio NICs, each moved into its own namespace:
// a (198.18.97.1) gets the XDP program, b (198.18.97.2) sends to it.
type pair struct {
	nsA, nsB   string
	devA, devB string
	ipA, ipB   string
}

// nicPair finds the VM's two virtio NICs by $AXON_VM_NIC_MACS and moves them into two
// fresh namespaces (deleted at cleanup, which hands the NICs back to the root namespace).
func nicPair(t *testing.T) pair {
	t.Helper()
	testutil.RequireRoot(t, "moves NICs between namespaces and attaches XDP programs")
	macs := strings.Split(os.Getenv(EnvNICMACs), ",")
	if len(macs) != 2 {
		t.Skipf("$%s is not set: these tests need the two back-to-back virtio-net NICs of a kernel-matrix VM "+
			"(make test-vm VM_PKGS=./internal/vmtest/virtionet)", EnvNICMACs)
	}
	var devs [2]string
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		for i, mac := range macs {
			if strings.EqualFold(l.Attrs().HardwareAddr.String(), mac) {
				devs[i] = l.Attrs().Name
			}
		}
	}
	if devs[0] == "" || devs[1] == "" {
		t.Fatalf("NICs with MACs %v not found in the root namespace (found %q, %q)", macs, devs[0], devs[1])
	}
	for _, d := range devs {
		drv, err := os.Readlink("/sys/class/net/" + d + "/device/driver")
		if err != nil || !strings.HasSuffix(drv, "/virtio_net") {
			t.Fatalf("%s: driver %q (%v), want virtio_net", d, drv, err)
		}
	}
	p := pair{nsA: testutil.NewNetns(t, "axt-xdp-a-"), nsB: testutil.NewNetns(t, "axt-xdp-b-"), devA: devs[0], devB: devs[1], ipA: "198.18.97.1", ipB: "198.18.97.2"}
	for _, c := range []struct{ ns, dev, ip string }{{p.nsA, p.devA, p.ipA}, {p.nsB, p.devB, p.ipB}} {
		run(t, "ip", "link", "set", c.dev, "netns", c.ns)
		run(t, "ip", "-n", c.ns, "addr", "add", c.ip+"/24", "dev", c.dev)
		run(t, "ip", "-n", c.ns, "link", "set", c.dev, "up")
	}
	// The link comes up asynchronously; the first ping also resolves ARP.
	if out, err := ping(p.nsB, p.ipA, 3, 5*time.Second); err != nil {
		t.Fatalf("ping over the virtio NICs before any XDP program: %v\n%s", err, out)
	}
	return p
}

func run(t *testing.T, argv ...string) {
	t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

// ping sends count echo requests from netns ns; err when none came back.
func ping(ns, dst string, count int, wait time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count)*time.Second+wait+5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+ns, "--", "ping", "-n", "-c", fmt.Sprint(count),
		"-i", "0.2", "-W", fmt.Sprint(int(wait.Seconds())), dst).CombinedOutput()
	return string(out), err
}

// xdpProgram counts every packet in counter[0] and returns action; with reflect, IPv4 UDP
// packets to reflectPort go back out of the NIC they came in on (XDP_TX) with MACs, IPs
// and ports swapped (checksums stay valid: the sums do not depend on the order).
func xdpProgram(t *testing.T, action uint32, reflect bool) (*ebpf.Program, *ebpf.Map) {
	t.Helper()
	counter, err := ebpf.NewMap(&ebpf.MapSpec{Name: "axt_xdp_count", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatalf("create counter map: %v", err)
	}
	t.Cleanup(func() { counter.Close() })
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, counter.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "counted"),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0),
		asm.Mov.Imm(asm.R0, int32(action)).WithSymbol("counted"),
	}
	if !reflect {
		insns = append(insns, asm.Return())
	} else {
		swap := func(off1, off2 int16, size asm.Size) asm.Instructions {
			return asm.Instructions{
				asm.LoadMem(asm.R4, asm.R2, off1, size),
				asm.LoadMem(asm.R5, asm.R2, off2, size),
				asm.StoreMem(asm.R2, off1, asm.R5, size),
				asm.StoreMem(asm.R2, off2, asm.R4, size),
			}
		}
		portBE := int32(reflectPort>>8 | (reflectPort&0xff)<<8)
		insns = append(insns,
			asm.LoadMem(asm.R2, asm.R6, 0, asm.Word), // ctx->data
			asm.LoadMem(asm.R3, asm.R6, 4, asm.Word), // ctx->data_end
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, 42), // eth 14 + IPv4 20 + UDP 8
			asm.JGT.Reg(asm.R4, asm.R3, "pass"),
			asm.LoadMem(asm.R4, asm.R2, 12, asm.Half),
			asm.JNE.Imm(asm.R4, 0x0008, "pass"), // ETH_P_IP, network order read little-endian
			asm.LoadMem(asm.R4, asm.R2, 14, asm.Byte),
			asm.JNE.Imm(asm.R4, 0x45, "pass"), // IPv4 without options
			asm.LoadMem(asm.R4, asm.R2, 23, asm.Byte),
			asm.JNE.Imm(asm.R4, 17, "pass"), // UDP
			asm.LoadMem(asm.R4, asm.R2, 36, asm.Half),
			asm.JNE.Imm(asm.R4, portBE, "pass"),
		)
		insns = append(insns, swap(0, 6, asm.Word)...)   // MACs, first 4 bytes
		insns = append(insns, swap(4, 10, asm.Half)...)  // MACs, last 2 bytes
		insns = append(insns, swap(26, 30, asm.Word)...) // IPv4 addresses
		insns = append(insns, swap(34, 36, asm.Half)...) // UDP ports
		insns = append(insns,
			asm.Mov.Imm(asm.R0, 3), // XDP_TX
			asm.Return(),
			asm.Mov.Imm(asm.R0, 2).WithSymbol("pass"), // XDP_PASS
			asm.Return(),
		)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "axt_xdp", Type: ebpf.XDP, License: "GPL", Instructions: insns})
	if err != nil {
		t.Fatalf("load XDP program: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog, counter
}

func count(t *testing.T, m *ebpf.Map) uint64 {
	t.Helper()
	var n uint64
	if err := m.Lookup(uint32(0), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// attachNative attaches prog to dev in ns in driver mode and checks the kernel reports it so.
func attachNative(t *testing.T, ns, dev string, prog *ebpf.Program) link.Link {
	t.Helper()
	var l link.Link
	var mode uint32
	err := netnsutil.Do(ns, func() error {
		nl, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: nl.Attrs().Index, Flags: link.XDPDriverMode})
		if err != nil {
			return fmt.Errorf("attach XDP in driver mode to %s: %w", dev, err)
		}
		nl, err = netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if x := nl.Attrs().Xdp; x != nil {
			mode = x.AttachMode
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if mode != xdpAttachedDriver {
		t.Fatalf("%s reports XDP attach mode %d, want %d (driver/native)", dev, mode, xdpAttachedDriver)
	}
	return l
}

// TestXDPNativeVirtio attaches XDP programs in driver (native) mode to a virtio_net NIC
// and proves each runs: a counting XDP_PASS program sees the pings that still get answered,
// an XDP_DROP program makes them vanish, and an XDP_TX program bounces UDP back to the
// sender from the NIC it came in on.
func TestXDPNativeVirtio(t *testing.T) {
	p := nicPair(t)

	t.Run("pass counts and forwards", func(t *testing.T) {
		prog, counter := xdpProgram(t, 2, false) // XDP_PASS
		l := attachNative(t, p.nsA, p.devA, prog)
		defer l.Close()
		if out, err := ping(p.nsB, p.ipA, 5, 3*time.Second); err != nil {
			t.Fatalf("ping through the XDP_PASS program: %v\n%s", err, out)
		}
		if n := count(t, counter); n < 5 {
			t.Errorf("XDP_PASS program counted %d packets, want at least the 5 echo requests", n)
		} else {
			t.Logf("XDP_PASS in driver mode on %s: %d packets counted, 5 pings answered", p.devA, n)
		}
	})

	t.Run("drop", func(t *testing.T) {
		prog, counter := xdpProgram(t, 1, false) // XDP_DROP
		l := attachNative(t, p.nsA, p.devA, prog)
		out, err := ping(p.nsB, p.ipA, 3, 1*time.Second)
		if err == nil {
			t.Fatalf("ping answered although XDP_DROP is attached:\n%s", out)
		}
		if n := count(t, counter); n < 3 {
			t.Errorf("XDP_DROP program counted %d packets, want at least the 3 echo requests", n)
		}
		l.Close()
		if out, err := ping(p.nsB, p.ipA, 3, 5*time.Second); err != nil {
			t.Errorf("ping after detaching XDP_DROP: %v\n%s", err, out)
		}
	})

	t.Run("tx reflects", func(t *testing.T) {
		prog, counter := xdpProgram(t, 2, true)
		l := attachNative(t, p.nsA, p.devA, prog)
		defer l.Close()
		var conn net.PacketConn
		if err := netnsutil.Do(p.nsB, func() (err error) {
			conn, err = net.ListenPacket("udp4", p.ipB+":0")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		dst := &net.UDPAddr{IP: net.ParseIP(p.ipA), Port: reflectPort}
		msg := []byte("axon-xdp-tx-" + testutil.RandSuffix(t))
		buf := make([]byte, 256)
		var got []byte
		var from net.Addr
		for attempt := 0; attempt < 5 && got == nil; attempt++ {
			if _, err := conn.WriteTo(msg, dst); err != nil {
				t.Fatalf("send to %v: %v", dst, err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, a, err := conn.ReadFrom(buf)
			if err == nil {
				got, from = append([]byte(nil), buf[:n]...), a
			}
		}
		if got == nil {
			t.Fatalf("no reflected UDP packet from %v within 5 tries (%d packets counted by the program)", dst, count(t, counter))
		}
		if !bytes.Equal(got, msg) || from.String() != dst.String() {
			t.Errorf("got %q from %v, want %q from %v", got, from, msg, dst)
		}
		t.Logf("XDP_TX in driver mode on %s bounced %q back from %v", p.devA, got, from)
	})
}

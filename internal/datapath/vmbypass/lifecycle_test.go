package vmbypass

import (
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// progsOn counts the BPF programs on dev's tc ingress in netns ns: tcx
// programs and cls_bpf filters.
func progsOn(t *testing.T, ns, dev string) int {
	t.Helper()
	n := 0
	dptest.InNetns(t, ns, func() {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		if datapath.ProbeTCX().Available {
			res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				t.Fatalf("query tcx programs of %s: %v", dev, err)
			}
			n += len(res.Programs)
		}
		fs, _ := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
		n += len(fs)
	})
	return n
}

// TestSwitchUnderTraffic: a UDP echo stream between the guest and the
// remote host (both directions, sequence-numbered) runs while the bypass is
// attached and then detached; the bypass carried it while attached (its
// counters moved), the bridge after (its forwarding database learns the
// guest's MAC on the tap again), and no datagram was lost at either switch.
//
// One exception, the kernel's and measured as such: in legacy mode, the
// first attach adds a clsact qdisc to the tap and to eth0, and adding a
// qdisc to a device that is up deactivates its transmit queues for the
// moment of the graft (qdisc_graft -> dev_deactivate): frames being sent
// through either device then are dropped. The "legacy-fresh" case allows
// loss only in the attach call's window; "legacy" (clsact already there, as
// after any earlier attach) and tcx must lose nothing, which shows that the
// rest of the switch-over is lossless.
func TestSwitchUnderTraffic(t *testing.T) {
	cases := []struct {
		name       string
		mode       string
		preClsact  bool // add the clsact qdiscs before the traffic starts
		attachLoss bool // loss allowed in the attach window (a qdisc graft under traffic)
	}{
		{name: "tcx", mode: datapath.ModeTCX},
		{name: "legacy", mode: datapath.ModeLegacy, preClsact: true},
		{name: "legacy-fresh", mode: datapath.ModeLegacy, attachLoss: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.mode == datapath.ModeTCX && !datapath.ProbeTCX().Available {
				t.Skip("no tcx on this kernel (< 6.6): the legacy cases cover it")
			}
			switchUnderTraffic(t, tc.mode, tc.preClsact, tc.attachLoss)
		})
	}
}

// seqStream is the sequence-numbered datagram stream of TestSwitchUnderTraffic:
// when each datagram was sent, and which came back.
type seqStream struct {
	mu     sync.Mutex
	sentAt []time.Time // by sequence number
	echoed map[uint64]bool
}

func (s *seqStream) send(c *net.UDPConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	msg := make([]byte, 16)
	binary.BigEndian.PutUint64(msg, uint64(len(s.sentAt)))
	if _, err := c.Write(msg); err == nil {
		s.sentAt = append(s.sentAt, time.Now())
	}
}

func (s *seqStream) sent() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sentAt)
}

func (s *seqStream) echo(b []byte) {
	if len(b) < 8 {
		return
	}
	s.mu.Lock()
	s.echoed[binary.BigEndian.Uint64(b)] = true
	s.mu.Unlock()
}

// lost returns the send times of the datagrams that did not come back.
func (s *seqStream) lost() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var l []time.Time
	for i, at := range s.sentAt {
		if !s.echoed[uint64(i)] {
			l = append(l, at)
		}
	}
	return l
}

type window struct{ from, to time.Time }

func (w window) holds(at time.Time, slack time.Duration) bool {
	return !at.Before(w.from.Add(-slack)) && !at.After(w.to.Add(slack))
}

func switchUnderTraffic(t *testing.T, mode string, preClsact, attachLoss bool) {
	g := newGuestNet(t, mode)
	if preClsact {
		pc := dptest.NSConf(t, g.pod)
		for _, dev := range []string{"eth0", tapName} {
			q := &netlink.GenericQdisc{
				QdiscAttrs: netlink.QdiscAttrs{LinkIndex: pc.Index(dev), Parent: netlink.HANDLE_CLSACT, Handle: netlink.MakeHandle(0xffff, 0)},
				QdiscType:  "clsact",
			}
			if err := pc.H.QdiscAdd(q); err != nil {
				t.Fatalf("add clsact to %s: %v", dev, err)
			}
		}
	}
	var srv, cli *net.UDPConn
	var err error
	dptest.InNetns(t, g.remote, func() { srv, err = net.ListenUDP("udp4", &net.UDPAddr{IP: remote4.AsSlice(), Port: 7000}) })
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dptest.ForceRcvBuf(t, srv, 8<<20)
	go func() { // echo
		buf := make([]byte, 64)
		for {
			n, from, err := srv.ReadFromUDP(buf)
			if err != nil {
				return
			}
			_, _ = srv.WriteToUDP(buf[:n], from)
		}
	}()
	dptest.InNetns(t, g.guest, func() { cli, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: remote4.AsSlice(), Port: 7000}) })
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	dptest.ForceRcvBuf(t, cli, 8<<20)
	// warm up: ARP resolved, the bridge has learnt both MACs
	if _, err := cli.Write(make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	_ = cli.SetReadDeadline(time.Now().Add(testutil.Stretch(t, 5*time.Second)))
	if _, err := cli.Read(make([]byte, 64)); err != nil {
		t.Fatalf("warm-up echo through the bridge: %v", err)
	}
	udpErrs := func() map[string]uint64 { // the sockets' own drops (a stalled reader), both ends
		m := map[string]uint64{}
		for _, ns := range []string{g.guest, g.remote} {
			for k, v := range dptest.ProcCounters(t, ns) {
				if strings.HasPrefix(k, "Udp:") && strings.HasSuffix(k, "Errors") {
					m[ns+" "+k] = v
				}
			}
		}
		return m
	}
	udp0 := udpErrs()

	s := &seqStream{echoed: map[uint64]bool{}}
	wait := testutil.Stretch(t, time.Second) // the echo reader gives up after this much silence
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		buf := make([]byte, 64)
		for {
			_ = cli.SetReadDeadline(time.Now().Add(wait))
			n, err := cli.Read(buf)
			if err != nil {
				return
			}
			s.echo(buf[:n])
		}
	}()
	stop := make(chan struct{})
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		tick := time.NewTicker(500 * time.Microsecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			s.send(cli)
		}
	}()
	phase := func(what string) {
		before := s.sent()
		time.Sleep(testutil.Stretch(t, 300*time.Millisecond))
		if n := s.sent() - before; n < 50 {
			t.Fatalf("%s: the sender sent only %d datagrams in a phase", what, n)
		}
	}
	phase("bridge")
	var attachW, detachW window
	attachW.from = time.Now()
	g.attach()
	attachW.to = time.Now()
	s0 := g.stats()
	phase("bypass")
	s1 := g.stats()
	detachW.from = time.Now()
	if err := g.b.Detach(g.id, g.podPath); err != nil {
		t.Fatal(err)
	}
	detachW.to = time.Now()
	phase("bridge again")
	close(stop)
	<-sendDone
	<-recvDone

	for _, c := range []string{"tap_frames", "pod_frames"} {
		if d := s1.Counters[c] - s0.Counters[c]; d < 50 {
			t.Errorf("bypass attached for a phase: %s moved by %d, want the stream's datagrams", c, d)
		}
	}
	if progsOn(t, g.pod, tapName) != 0 || progsOn(t, g.pod, "eth0") != 0 {
		t.Errorf("programs left on the tap or eth0 after detach")
	}
	// the bridge carries the stream again: it has relearnt the guest's MAC on the tap
	pc := dptest.NSConf(t, g.pod)
	fdb, err := pc.H.NeighList(pc.Index(tapName), unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	learnt := false
	for _, n := range fdb {
		learnt = learnt || n.HardwareAddr.String() == guestMAC.String()
	}
	if !learnt {
		t.Errorf("after detach the bridge has no forwarding entry for the guest's MAC on %s: %v", tapName, fdb)
	}

	// where the lost datagrams were sent: a datagram sent shortly before a
	// switch can still be on its way when it happens (slack)
	slack := testutil.Stretch(t, 20*time.Millisecond)
	var atAttach, atDetach, elsewhere int
	for _, at := range s.lost() {
		switch {
		case attachW.holds(at, slack):
			atAttach++
		case detachW.holds(at, slack):
			atDetach++
		default:
			elsewhere++
		}
	}
	udp1 := udpErrs()
	for k, v := range udp1 {
		if d := v - udp0[k]; d != 0 {
			t.Logf("socket drops during the stream: %s +%d", k, d)
		}
	}
	t.Logf("sent %d, lost %d at attach (%v), %d at detach (%v), %d elsewhere; bypass while attached: %d frames up, %d down",
		s.sent(), atAttach, attachW.to.Sub(attachW.from).Round(time.Microsecond), atDetach, detachW.to.Sub(detachW.from).Round(time.Microsecond), elsewhere,
		s1.Counters["tap_frames"]-s0.Counters["tap_frames"], s1.Counters["pod_frames"]-s0.Counters["pod_frames"])
	if atDetach != 0 {
		t.Errorf("%d datagrams lost at detach: removing the bypass must lose nothing", atDetach)
	}
	if atAttach != 0 && !attachLoss {
		t.Errorf("%d datagrams lost at attach: with the hooks' qdiscs already there, attaching must lose nothing", atAttach)
	}
	if elsewhere != 0 {
		t.Errorf("%d datagrams lost away from both switches (see the socket drops above)", elsewhere)
	}
}

// TestTapGone: the VM's tap disappears under an attached bypass (the VM
// stopped): Stats says the tap's program is gone and what to do, Detect
// says there is no tap, Detach cleans up the rest. A new tap of the same
// name is not covered by the old programs until Attach runs again.
func TestTapGone(t *testing.T) {
	v := newVMPod(t, "", false)
	v.attach()
	if st := v.stats(); !st.TapAttached || !st.PodAttached || st.Problem != "" {
		t.Fatalf("attached: %+v", st)
	}
	v.tap.Close()
	st := v.stats()
	if st.TapAttached || !st.PodAttached || !strings.Contains(st.Problem, "tap is gone") {
		t.Errorf("tap closed: stats %+v, want the tap's program reported gone", st)
	}
	if _, err := Detect(v.podPath, ""); ReasonOf(err) != ReasonNoTap {
		t.Errorf("Detect without the tap: %v, want reason %s", err, ReasonNoTap)
	}
	// a new tap of the same name: not bypassed until attached again
	v.tap = openTap(t, v.pod, tapName, false)
	pc := dptest.NSConf(t, v.pod)
	if err := pc.H.LinkSetMaster(pc.Link(tapName), pc.Link(bridgeName)); err != nil {
		t.Fatal(err)
	}
	pc.Up(tapName)
	if st := v.stats(); st.TapAttached {
		t.Errorf("a re-created tap reported as attached: %+v", st)
	}
	v.attach()
	if st := v.stats(); !st.TapAttached || !st.PodAttached {
		t.Errorf("attached again to the new tap: %+v", st)
	}
	if err := v.b.Detach(v.id, v.podPath); err != nil {
		t.Fatal(err)
	}
	if left := pinsUnder(t, PodPinDir(v.pinDir, v.id)); len(left) > 0 {
		t.Errorf("pins left: %v", left)
	}
	if n := progsOn(t, v.pod, "eth0") + progsOn(t, v.pod, tapName); n != 0 {
		t.Errorf("%d programs left on the pod's devices", n)
	}
	if _, err := v.b.Stats(v.id, v.podPath); err == nil || !strings.Contains(err.Error(), "not attached") {
		t.Errorf("Stats after detach: %v, want 'not attached'", err)
	}
}

// TestDetectBadLayouts: pod netns without the bridge-binding layout get the
// reason from Detect and from Attach, and nothing is attached or pinned.
func TestDetectBadLayouts(t *testing.T) {
	dptest.RequireRoot(t)
	pinDir := dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, func(dir string) error { return os.RemoveAll(dir) })
	b, err := New(Config{PinDir: pinDir, Logger: dptest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	// build sets the pod netns up; eth0 always exists unless noEth0
	cases := []struct {
		name   string
		taps   int
		bridge bool
		extra  bool // a veth port besides eth0 and the taps
		noEth0 bool
		want   Reason
	}{
		{name: "plain pod", want: ReasonNotBridged},
		{name: "tap not bridged", taps: 1, want: ReasonNotBridged},
		{name: "bridge without tap", bridge: true, want: ReasonNoTap},
		{name: "two taps", bridge: true, taps: 2, want: ReasonSeveralTaps},
		{name: "extra port", bridge: true, taps: 1, extra: true, want: ReasonOtherPorts},
		{name: "no pod interface", bridge: true, taps: 1, noEth0: true, want: ReasonNoPodInterface},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns := dptest.NewNetns(t, "vmbad")
			pc := dptest.NSConf(t, ns)
			node := dptest.NewNetns(t, "vmbadnode")
			podIf := "eth0"
			if c.noEth0 {
				podIf = "net1"
			}
			pc.Veth(podIf, "", "peer", "", node)
			var br netlink.Link
			if c.bridge {
				if err := pc.H.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName}}); err != nil {
					t.Fatal(err)
				}
				br = pc.Link(bridgeName)
				if err := pc.H.LinkSetMaster(pc.Link(podIf), br); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < c.taps; i++ {
				name := "tap" + string(rune('0'+i))
				openTap(t, ns, name, false)
				if br != nil {
					if err := pc.H.LinkSetMaster(pc.Link(name), br); err != nil {
						t.Fatal(err)
					}
				}
			}
			if c.extra {
				pc.Veth("x0", "", "x1", "", "")
				if err := pc.H.LinkSetMaster(pc.Link("x0"), br); err != nil {
					t.Fatal(err)
				}
			}
			path := netnsutil.Path(ns)
			if _, err := Detect(path, ""); ReasonOf(err) != c.want {
				t.Errorf("Detect: %v, want reason %s", err, c.want)
			}
			_, err := b.Attach("bad-"+ns[len(ns)-6:], path, "")
			if ReasonOf(err) != c.want {
				t.Errorf("Attach: %v, want reason %s", err, c.want)
			}
			if left := pinsUnder(t, pinDir); len(left) > 0 {
				t.Errorf("pins after a refused attach: %v", left)
			}
			for _, dev := range []string{podIf, "tap0", "tap1"} {
				if _, err := pc.H.LinkByName(dev); err != nil {
					continue
				}
				if n := progsOn(t, ns, dev); n != 0 {
					t.Errorf("%d programs on %s after a refused attach", n, dev)
				}
			}
		})
	}
	t.Run("missing netns", func(t *testing.T) {
		_, err := b.Attach("bad-nonetns", "/run/netns/axt-does-not-exist", "")
		if ReasonOf(err) != ReasonNoNetns {
			t.Errorf("Attach: %v, want reason %s", err, ReasonNoNetns)
		}
	})
	t.Run("bad id", func(t *testing.T) {
		for _, id := range []string{"", "../x", "a/b", strings.Repeat("a", 65), ".hidden"} {
			if _, err := b.Attach(id, "/proc/self/ns/net", ""); err == nil || !strings.Contains(err.Error(), "invalid VM bypass id") {
				t.Errorf("Attach(id %q): %v, want invalid id", id, err)
			}
		}
	})
}

// TestUninstall: axon uninstall's part. A legacy-mode bypass keeps its
// cls_bpf filters in the pod's netns, out of reach of the pins; Uninstall,
// given the node's pod netns (an unrelated one first), deletes exactly
// those filters and every pin.
func TestUninstall(t *testing.T) {
	v := newVMPod(t, datapath.ModeLegacy, false)
	v.attach()
	other := newVMPod(t, datapath.ModeLegacy, false) // a VM pod without the bypass: its devices keep their filters
	otherFilter := dptest.NSConf(t, other.pod)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// a filter of someone else on the other pod's tap, same handle as axon's
	must(otherFilter.H.QdiscAdd(&netlink.GenericQdisc{QdiscType: "clsact", QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: otherFilter.Index(tapName), Parent: netlink.HANDLE_CLSACT, Handle: netlink.MakeHandle(0xffff, 0)}}))
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	must(err)
	defer prog.Close()
	must(otherFilter.H.FilterAdd(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: otherFilter.Index(tapName), Parent: netlink.HANDLE_MIN_INGRESS,
		Handle: 0xa19, Priority: 1, Protocol: unix.ETH_P_ALL}, Fd: prog.FD(), Name: "not_axon", DirectAction: true}))
	if n := progsOn(t, v.pod, "eth0") + progsOn(t, v.pod, tapName); n != 2 {
		t.Fatalf("legacy attach: %d filters, want 2", n)
	}
	must(Uninstall(v.pinDir, []string{other.podPath, "/run/netns/axt-gone", v.podPath}))
	if n := progsOn(t, v.pod, "eth0") + progsOn(t, v.pod, tapName); n != 0 {
		t.Errorf("%d filters left in the bypassed pod", n)
	}
	if n := progsOn(t, other.pod, tapName); n != 1 {
		t.Errorf("the other pod's own filter: %d filters, want 1 (not axon's to delete)", n)
	}
	if left := pinsUnder(t, v.pinDir); len(left) > 0 {
		t.Errorf("pins left: %v", left)
	}
	if _, err := os.Stat(filepath.Join(v.pinDir, "vmbypass")); !os.IsNotExist(err) {
		t.Errorf("vmbypass dir left: %v", err)
	}
}

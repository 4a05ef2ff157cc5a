package vmbypass

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/podlb"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/pktgen"
	"github.com/axonhq/axon/internal/testutil"
)

// TestCPUPerFrame measures the host CPU per frame from the VM's tap to the
// node, the bridge path against the bypass, interleaved. Run it with
// AXON_VMB_BENCH=1 (AXON_VMB_BENCH_REPS, default 10; AXON_VMB_BENCH_DURATION,
// default 1s per arm; AXON_VMB_BENCH_OUT: also write the Markdown there;
// AXON_VMB_BENCH_CSV: one line per sample there, with the load average;
// AXON_VMB_BENCH_BURST: the writer sleeps 1 µs after every that many frames,
// for an instruction-counted VM (hack/vm -icount), where both vCPUs take turns
// on one host thread and the node's NAPI thread otherwise gets ~20 % of the
// frames; the sleeps' cost is in every arm, the floor's too).
//
// The guest is a thread pinned to CPU 1 writing one 60-byte UDP frame to the
// tap fd in a loop: the tap's receive path (tc ingress, then the bridge or
// the bypass, then eth0's veth transmit) runs in that write(2), so the
// thread's CPU clock holds it. The node's veth has pktgen's XDP sink and
// threaded NAPI pinned to CPU 0: that thread's CPU clock holds the node's
// receive. Four arms per repetition, their order rotated: "floor" (a tcx
// program drops every frame at the tap's ingress: the write(2), the skb and
// tc, which both paths pay and which is the guest's side of the tap),
// "bridge", "bypass", "mirred" (Kata Containers' way: a match-all u32
// filter on the tap's clsact ingress with a mirred egress redirect to eth0)
// and "podlb": the bypass with the pod LB the agent gives a VM pod with the
// bypass (its program on eth0's egress looks up every guest packet's
// destination among the Services; these frames are to no Service). Host CPU per frame = writer CPU / frames written
// + NAPI thread CPU / frames the sink received (frames the node's full
// receive ring drops have crossed the path all the same); the path's own =
// that minus the floor of the same repetition.
func TestCPUPerFrame(t *testing.T) {
	if os.Getenv("AXON_VMB_BENCH") == "" {
		t.Skip("benchmark: set AXON_VMB_BENCH=1 to run it (about 50 s)")
	}
	reps := testutil.EnvInt(t, "AXON_VMB_BENCH_REPS", 10)
	dur := time.Second
	if s := os.Getenv("AXON_VMB_BENCH_DURATION"); s != "" {
		var err error
		if dur, err = time.ParseDuration(s); err != nil {
			t.Fatalf("AXON_VMB_BENCH_DURATION: %v", err)
		}
	}
	burst := testutil.EnvInt(t, "AXON_VMB_BENCH_BURST", 0) // 0: no pauses
	if !datapath.ProbeTCX().Available {
		t.Skip("the floor arm attaches with tcx (6.6+); the kernel has none")
	}
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs: the writer and the node's NAPI thread are pinned apart")
	}
	v := newVMPod(t, "", false)
	const port = 9
	frame, err := pktgen.UDP4{SrcMAC: guestMAC, DstMAC: nodeMAC, Src: mustAP("10.0.2.2:40000"), Dst: mustAP("10.0.2.1:9")}.Frame()
	if err != nil {
		t.Fatal(err)
	}
	sink, err := pktgen.AttachSink(v.node, nodeDev, port)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	napi, err := pktgen.ThreadedNAPI(v.node, nodeDev)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range napi {
		if err := pktgen.Pin(pid, 0); err != nil {
			t.Fatal(err)
		}
	}
	// the bridge learns the node's MAC on eth0 (it forwards, not floods)
	dptest.SendRaw(t, v.node, nodeDev, [][]byte{eth(guestMAC, nodeMAC, unix.ETH_P_IP, udp(node4, guest4, 9, 9, []byte("learn")))})
	drop, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "vmb_floor", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}}) // TC_ACT_SHOT
	if err != nil {
		t.Fatal(err)
	}
	defer drop.Close()
	tapIndex := dptest.NSConf(t, v.pod).Index(tapName)

	type sample struct{ writer, napi, frames, sunk float64 }
	arms := []string{"floor", "bridge", "bypass", "mirred", "podlb"}
	plb := benchPodLB(t, v)
	res := map[string][]sample{}
	napiCPU := func() time.Duration {
		var sum time.Duration
		for _, pid := range napi {
			d, err := pktgen.CPUTime(pid)
			if err != nil {
				t.Fatal(err)
			}
			sum += d
		}
		return sum
	}
	run := func(arm string) sample {
		// the bridge forwards only in its own arm: what reaches the node in
		// the others came through the arm's redirect (checked at the end)
		v.isolate(arm != "bridge")
		var l link.Link
		switch arm {
		case "floor":
			dptest.InNetns(t, v.pod, func() {
				l, err = link.AttachTCX(link.TCXOptions{Interface: tapIndex, Program: drop, Attach: ebpf.AttachTCXIngress})
			})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
		case "mirred": // Kata Containers' way: a match-all filter with a mirred egress redirect
			pc := dptest.NSConf(t, v.pod)
			clsact := &netlink.GenericQdisc{QdiscType: "clsact", QdiscAttrs: netlink.QdiscAttrs{LinkIndex: tapIndex,
				Parent: netlink.HANDLE_CLSACT, Handle: netlink.MakeHandle(0xffff, 0)}}
			if err := pc.H.QdiscAdd(clsact); err != nil {
				t.Fatalf("clsact on the tap: %v", err)
			}
			defer func() {
				if err := pc.H.QdiscDel(clsact); err != nil {
					t.Fatal(err)
				}
			}()
			// u32 with no key matches every frame (cls_matchall is not on every kernel)
			if err := pc.H.FilterAdd(&netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: tapIndex, Parent: netlink.HANDLE_MIN_INGRESS,
				Priority: 1, Protocol: unix.ETH_P_ALL}, Actions: []netlink.Action{netlink.NewMirredAction(pc.Index("eth0"))}}); err != nil {
				t.Fatalf("u32 + mirred on the tap: %v", err)
			}
		case "bypass", "podlb":
			v.attach()
			defer func() {
				if err := v.b.Detach(v.id, v.podPath); err != nil {
					t.Fatal(err)
				}
			}()
			if arm == "podlb" {
				if err := plb.Attach(v.id, v.podPath, podlb.Target{Ifname: "eth0", Tap: tapName}); err != nil {
					t.Fatal(err)
				}
				defer func() {
					if err := plb.Detach(v.id, v.podPath); err != nil {
						t.Fatal(err)
					}
				}()
			}
		}
		s0, _ := sink.Count()
		n0 := napiCPU()
		w, n := writeLoop(t, v.tap, frame, dur, burst)
		time.Sleep(100 * time.Millisecond) // the NAPI thread drains its ring (not into the next arm)
		s1, _ := sink.Count()
		return sample{writer: float64(w.Nanoseconds()), napi: float64((napiCPU() - n0).Nanoseconds()), frames: float64(n), sunk: float64(s1 - s0)}
	}
	csv := "rep,order,arm,writer_cpu_ns,napi_cpu_ns,frames_written,frames_received,load1\n"
	for r := 0; r < reps; r++ {
		for i := range arms {
			arm := arms[(i+r)%len(arms)]
			s := run(arm)
			res[arm] = append(res[arm], s)
			csv += fmt.Sprintf("%d,%d,%s,%.0f,%.0f,%.0f,%.0f,%s\n", r, i, arm, s.writer, s.napi, s.frames, s.sunk, load1())
		}
	}
	if out := os.Getenv("AXON_VMB_BENCH_CSV"); out != "" {
		if err := os.WriteFile(out, []byte(csv), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	perFrame := func(arm string) (tot, wr, np, deliv []float64) {
		for _, s := range res[arm] {
			// the writer did the path's work for every frame written (a frame
			// the node's full ring drops has crossed it); the NAPI thread
			// for each frame it received
			var n float64
			if s.sunk > 0 {
				n = s.napi / s.sunk
			}
			tot = append(tot, s.writer/s.frames+n)
			wr = append(wr, s.writer/s.frames)
			np = append(np, n)
			deliv = append(deliv, s.sunk/s.frames)
		}
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "kernel %s, %d repetitions × %s per arm, interleaved; ns per frame, median (min–max)", kernel(), reps, dur)
	if burst > 0 {
		fmt.Fprintf(&b, "; the writer sleeps 1 µs after every %d frames", burst)
	}
	b.WriteString("\n\n")
	fmt.Fprintf(&b, "| arm | host CPU / frame | writer: write(2) + tap rx path, per frame written | node NAPI, per frame received | received / written | path (minus floor) |\n|---|---:|---:|---:|---:|---:|\n")
	floorTot, _, _, _ := perFrame("floor")
	path := map[string][]float64{}
	for _, arm := range arms {
		tot, wr, np, dl := perFrame(arm)
		for i := range tot {
			path[arm] = append(path[arm], tot[i]-floorTot[i])
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", arm, cell(tot, 0), cell(wr, 0), cell(np, 0), cell(dl, 3), cell(path[arm], 0))
	}
	bypTot, bypWr, _, _ := perFrame("bypass")
	brTot, brWr, _, _ := perFrame("bridge")
	_, flWr, _, _ := perFrame("floor")
	hop := func(wr []float64) (out []float64) { // the tap -> eth0 hop alone: the writer minus the floor
		for i := range wr {
			out = append(out, wr[i]-flWr[i])
		}
		return out
	}
	fmt.Fprintf(&b, "\nbypass / bridge, paired (95 %% CI): host CPU per frame %s; the path's own (minus the floor) %s; "+
		"the tap -> eth0 hop alone (writer minus floor, no node receive) %s\n",
		bench.FormatPaired(bench.Pair(bypTot, brTot)), bench.FormatPaired(bench.Pair(path["bypass"], path["bridge"])),
		bench.FormatPaired(bench.Pair(hop(bypWr), hop(brWr))))
	mirTot, mirWr, _, _ := perFrame("mirred")
	fmt.Fprintf(&b, "\nbypass / tc mirred, paired (95 %% CI): host CPU per frame %s; the path's own %s; the hop alone %s\n",
		bench.FormatPaired(bench.Pair(bypTot, mirTot)), bench.FormatPaired(bench.Pair(path["bypass"], path["mirred"])),
		bench.FormatPaired(bench.Pair(hop(bypWr), hop(mirWr))))
	fmt.Fprintf(&b, "\ntc mirred / bridge, paired (95 %% CI): host CPU per frame %s; the hop alone %s\n",
		bench.FormatPaired(bench.Pair(mirTot, brTot)), bench.FormatPaired(bench.Pair(hop(mirWr), hop(brWr))))
	plbTot, plbWr, _, _ := perFrame("podlb")
	fmt.Fprintf(&b, "\nbypass + pod LB / bridge, paired (95 %% CI): host CPU per frame %s; the path's own %s; the hop alone %s\n",
		bench.FormatPaired(bench.Pair(plbTot, brTot)), bench.FormatPaired(bench.Pair(path["podlb"], path["bridge"])),
		bench.FormatPaired(bench.Pair(hop(plbWr), hop(brWr))))
	fmt.Fprintf(&b, "\nbypass + pod LB / bypass, paired (95 %% CI): host CPU per frame %s; the hop alone %s\n",
		bench.FormatPaired(bench.Pair(plbTot, bypTot)), bench.FormatPaired(bench.Pair(hop(plbWr), hop(bypWr))))
	t.Log("\n" + b.String())
	if out := os.Getenv("AXON_VMB_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, arm := range []string{"bridge", "bypass", "mirred", "podlb"} {
		_, _, _, dl := perFrame(arm)
		if st := bench.Summarize(dl); st.Median < 0.5 {
			t.Errorf("%s: only %.2f of the frames reached the node's sink: the arm measured drops, not the path (or, with the bridge's ports isolated, its redirect did not work)", arm, st.Median)
		}
	}
}

// writeLoop writes frame to the tap from a thread pinned to CPU 1 for d and
// returns that thread's CPU time and the frames written. With burst > 0 the
// thread sleeps 1 µs after every burst frames.
func writeLoop(t *testing.T, tap *os.File, frame []byte, d time.Duration, burst int) (time.Duration, int) {
	type out struct {
		cpu time.Duration
		n   int
		err error
	}
	ch := make(chan out, 1)
	raw, err := tap.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	_ = raw.Control(func(f uintptr) { fd = int(f) })
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var set unix.CPUSet
		set.Set(1)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			ch <- out{err: err}
			return
		}
		var ts0, ts1 unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts0)
		n := 0
		end := time.Now().Add(d)
		pause := unix.Timespec{Nsec: 1000}
		per := 256
		if burst > 0 {
			per = burst
		}
		for time.Now().Before(end) {
			for range per {
				if _, err := unix.Write(fd, frame); err == nil {
					n++
				}
			}
			if burst > 0 {
				_ = unix.Nanosleep(&pause, nil)
			}
		}
		_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts1)
		ch <- out{cpu: time.Duration(ts1.Nano() - ts0.Nano()), n: n}
	}()
	o := <-ch
	if o.err != nil {
		t.Fatal(o.err)
	}
	return o.cpu, o.n
}

func cell(v []float64, prec int) string {
	s := bench.Summarize(v)
	return fmt.Sprintf("%s (%s–%s)", strconv.FormatFloat(s.Median, 'f', prec, 64), strconv.FormatFloat(s.Min, 'f', prec, 64), strconv.FormatFloat(s.Max, 'f', prec, 64))
}

func kernel() string {
	var u unix.Utsname
	_ = unix.Uname(&u)
	return unix.ByteSliceToString(u.Release[:])
}

func mustAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// load1 is the 1-minute load average (the CPU pressure around a sample).
func load1() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.Fields(string(b))[0]
}

// benchPodLB loads the socket LB (on an empty cgroup of its own, one Service
// that is not the frames' destination) in v's pin dir and returns a pod LB
// for the "podlb" arm.
func benchPodLB(t *testing.T, v *vmPod) *podlb.LB {
	t.Helper()
	cg, _ := testutil.NewCgroup(t, "axt-vmb-bench-")
	sock, err := socklb.Load(v.pinDir, cg, dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sock.Close()
		if err := socklb.Uninstall(v.pinDir, cg); err != nil {
			t.Errorf("socket LB uninstall: %v", err)
		}
	})
	if err := sock.UpsertFrontend(lb.Frontend{Key: lb.FrontendKey{Addr: netip.MustParseAddr("10.96.8.9"), Port: 80, Proto: lb.UDP, Scope: lb.ScopeCluster},
		Backends: []lb.Backend{{Addr: netip.MustParseAddr("10.0.3.2"), Port: 80, State: lb.Active}}}); err != nil {
		t.Fatal(err)
	}
	p, err := podlb.New(podlb.Config{PinDir: v.pinDir, Logger: dptest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

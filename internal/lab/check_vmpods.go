package lab

// `axon lab check`, VM pod part (--vm-pods, vmpods.go): per VM pod, the
// agent reports its bypass attached; the guest answers ICMP and TCP (its
// echo) over IPv4 from a pod on its node, a pod on another node and its
// node; its Service demo-<pod> answers with the guest as its only backend
// (ClusterIP through the socket LB from those pods and the node, NodePort per
// packet from the external namespace); from inside the guest (its command
// port), the same pods and node answer its TCP and ICMP and the demo
// ClusterIP its TCP (through the VM pod's per-packet pod LB: the guest's
// sockets are not the node's); and the bypass's counters moved by frames
// both ways during the probes, so the traffic crossed the bypass, not the
// bridge.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/axonhq/axon/internal/datapath/vmbypass"
	"github.com/axonhq/axon/internal/lab/probe"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/vmguest"
)

// VMCheck is one check of one VM pod.
type VMCheck struct {
	VMPod  string
	What   string // "bypass", "icmp from node1-pod1", "service tcp/10.96.101.1:80 from node1", ...
	OK     bool
	NA     string // not empty: not run, with the reason
	Detail string // the error, or what was seen
}

// VMCheckResult is the VM pod part of `axon lab check`.
type VMCheckResult struct {
	Checks  []VMCheck
	Elapsed time.Duration
}

// Failed returns the failed checks as "vm-pod what: detail" lines.
func (r *VMCheckResult) Failed() []string {
	var out []string
	for _, c := range r.Checks {
		if !c.OK && c.NA == "" {
			out = append(out, fmt.Sprintf("%s %s: %s", c.VMPod, c.What, c.Detail))
		}
	}
	return out
}

// Counts returns (passed, ran, not applicable).
func (r *VMCheckResult) Counts() (ok, ran, na int) {
	for _, c := range r.Checks {
		switch {
		case c.NA != "":
			na++
		case c.OK:
			ok++
			ran++
		default:
			ran++
		}
	}
	return ok, ran, na
}

// Print writes one line per check and a summary.
func (r *VMCheckResult) Print(w io.Writer) {
	fmt.Fprintf(w, "VM pods (QEMU guests behind KubeVirt's bridge binding, IPv4; TCP to the guest's echo on %d):\n", probe.EchoPort)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range r.Checks {
		verdict := "ok"
		switch {
		case c.NA != "":
			verdict = "n/a"
		case !c.OK:
			verdict = "FAIL"
		}
		detail := c.Detail
		if c.NA != "" {
			detail = c.NA
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.VMPod, c.What, verdict, detail)
	}
	tw.Flush()
	for _, f := range r.Failed() {
		fmt.Fprintln(w, "FAIL", f)
	}
	ok, ran, na := r.Counts()
	fmt.Fprintf(w, "%d/%d VM pod checks passed, %d n/a, in %s\n", ok, ran, na, r.Elapsed.Round(time.Millisecond))
}

// vmProbe is one probe of the plan: from source (a pod, a node or external)
// with the `_echo probe` (Pod) or the `_probe` (Service) prober.
type vmProbe struct {
	vm, source string
	pod        *probe.Pod
	svc        *probe.Service
	na         string
}

func (p vmProbe) what() string {
	if p.svc != nil {
		return "service " + p.svc.String() + " from " + p.source
	}
	if p.pod.Addr.Is6() {
		return p.pod.Proto + "6 from " + p.source
	}
	return p.pod.Proto + " from " + p.source
}

// planVMProbes lists the probes of each VM pod (pure logic): ICMP and TCP to
// the guest from the first pod of its node, the first pod of another node and
// its node; its Service's ClusterIP from those and its NodePort on the VM
// pod's node from external. A source that does not exist is n/a with the reason.
func planVMProbes(st *State) []vmProbe {
	var out []vmProbe
	for k, v := range st.VMPods {
		_, svcIP, svcNodePort := DemoVMService(k+1, v.Name)
		var same, other string
		for _, p := range st.Pods {
			if p.Node == v.Node && same == "" {
				same = p.Name
			}
			if p.Node != v.Node && other == "" {
				other = p.Name
			}
		}
		sources := []struct{ name, na string }{
			{same, "no pod on " + v.Node + " (--pods-per-node 0)"},
			{other, "no pod on another node (--nodes 1 or --pods-per-node 0)"},
			{v.Node, ""},
		}
		for _, fam := range guestFamilies(v) {
			for _, s := range sources {
				for _, proto := range []string{"icmp", "tcp"} {
					p := vmProbe{vm: v.Name, source: s.name, pod: &probe.Pod{Proto: proto, Addr: familyAddr(v.IPs, fam)}}
					if s.name == "" {
						p.source, p.na = "-", s.na
					}
					out = append(out, p)
				}
			}
		}
		svc := &probe.Service{Proto: "tcp", Addr: netip.AddrPortFrom(svcIP, DemoPort)}
		for _, s := range sources {
			p := vmProbe{vm: v.Name, source: s.name, svc: svc}
			switch {
			case s.name == "":
				p.source, p.na = "-", s.na
			case !st.DemoServices:
				p.na = "no demo Services (--no-demo)"
			case serviceImpl(st) == "":
				p.na = "nothing serves Services"
			}
			out = append(out, p)
		}
		if n, ok := st.Node(v.Node); ok {
			p := vmProbe{vm: v.Name, source: ExternalName, svc: &probe.Service{Proto: "tcp", Addr: netip.AddrPortFrom(n.IP, uint16(svcNodePort))}}
			if !st.DemoServices {
				p.na = "no demo Services (--no-demo)"
			}
			out = append(out, p)
		}
	}
	return out
}

// guestProbe is one probe from inside a guest: a command its shell runs
// (vmguest.Session) and the output that means it passed.
type guestProbe struct {
	vm, what, cmd, want, na string
	echo                    string // the pod or node whose echo server answers
	service                 bool   // through the demo ClusterIP: its backends' echo servers answer
}

// planGuestProbes lists the probes from inside each guest (pure logic): TCP
// echo and ICMP to the first pod of its node, the first pod of another node
// and its node, and TCP echo through the demo ClusterIP (n/a with the
// reason when the VM pod has no pod LB: noPodLB, VM pod → why). secs bounds
// each command in the guest.
func planGuestProbes(st *State, secs int, noPodLB map[string]string) []guestProbe {
	var out []guestProbe
	var clusterIPs []netip.Addr
	for _, d := range DemoServices() {
		if d.Name == DemoClusterIP {
			clusterIPs = d.ClusterIPs
		}
	}
	for _, v := range st.VMPods {
		token := "axon-guest-" + v.Name
		tcp := func(what, echo string, addr netip.AddrPort, na string) guestProbe {
			return guestProbe{vm: v.Name, what: "from the guest: " + what, na: na, want: token, echo: echo,
				cmd: fmt.Sprintf("echo %s | nc -w %d %s %d", token, secs, addr.Addr(), addr.Port())}
		}
		icmp := func(what string, addr netip.Addr, na string) guestProbe {
			ping := "ping"
			if addr.Is6() {
				ping = "ping6"
			}
			return guestProbe{vm: v.Name, what: "from the guest: " + what, na: na, want: " 0% packet loss",
				cmd: fmt.Sprintf("%s -c 1 -W %d %s", ping, secs, addr)}
		}
		var same, other *Pod
		for i := range st.Pods {
			p := &st.Pods[i]
			if p.Node == v.Node && same == nil {
				same = p
			}
			if p.Node != v.Node && other == nil {
				other = p
			}
		}
		for _, fam := range guestFamilies(v) {
			ipOf := func(ips []netip.Addr) netip.Addr { return familyAddr(ips, fam) }
			for _, t := range []struct {
				p  *Pod
				na string
			}{{same, "no pod on " + v.Node + " (--pods-per-node 0)"}, {other, "no pod on another node (--nodes 1 or --pods-per-node 0)"}} {
				if t.p == nil {
					out = append(out, tcp(fam.tcp+" to -", "", netip.AddrPort{}, t.na), icmp(fam.icmp+" to -", netip.Addr{}, t.na))
					continue
				}
				ip := ipOf(t.p.IPs)
				out = append(out, tcp(fam.tcp+" to "+t.p.Name, t.p.Name, netip.AddrPortFrom(ip, probe.EchoPort), ""), icmp(fam.icmp+" to "+t.p.Name, ip, ""))
			}
			if n, ok := st.Node(v.Node); ok {
				ip := ipOf(n.IPs)
				out = append(out, tcp(fam.tcp+" to "+n.Name, n.Name, netip.AddrPortFrom(ip, probe.EchoPort), ""), icmp(fam.icmp+" to "+n.Name, ip, ""))
			}
			svc := netip.AddrPortFrom(ipOf(clusterIPs), DemoPort)
			na := ""
			switch {
			case !st.DemoServices:
				na = "no demo Services (--no-demo)"
			case serviceImpl(st) == "":
				na = "nothing serves Services"
			case noPodLB[v.Name] != "":
				na = noPodLB[v.Name]
			}
			sp := tcp("service tcp/"+svc.String()+" ("+DemoClusterIP+")", "", svc, na)
			sp.service = true
			out = append(out, sp)
		}
	}
	return out
}

// guestFamily names a family's probes: IPv4 "tcp"/"icmp", IPv6 "tcp6"/"icmp6".
type guestFamily struct {
	v6        bool
	tcp, icmp string
}

// guestFamilies are the families of v's guest: IPv4, and IPv6 when the guest
// has the pod's IPv6 address.
func guestFamilies(v VMPod) []guestFamily {
	fams := []guestFamily{{false, "tcp", "icmp"}}
	if guestIPv6(v).IsValid() {
		fams = append(fams, guestFamily{true, "tcp6", "icmp6"})
	}
	return fams
}

// familyAddr is the first address of ips in fam (invalid: none).
func familyAddr(ips []netip.Addr, fam guestFamily) netip.Addr {
	for _, a := range ips {
		if a.Is6() == fam.v6 {
			return a
		}
	}
	return netip.Addr{}
}

// runGuestProbes runs v's probes in its guest, one after the other, and
// records each.
func runGuestProbes(ctx context.Context, v VMPod, probes []guestProbe, timeout time.Duration, record func(i int, ok bool, detail string)) {
	if _, err := os.Stat(v.CommandSocket()); err != nil {
		for i := range probes {
			record(i, false, "the guest has no command port ("+err.Error()+"): a lab brought up by an older axon; axon lab down && axon lab up")
		}
		return
	}
	s, err := vmguest.Dial(ctx, v.CommandSocket())
	if err != nil {
		for i := range probes {
			record(i, false, err.Error())
		}
		return
	}
	defer s.Close()
	for i, p := range probes {
		start := time.Now()
		// the guest's shell under TCG adds its own time to the command's bound
		out, rc, err := s.Run(p.cmd, timeout+10*time.Second)
		switch {
		case err != nil:
			record(i, false, err.Error())
		case rc != 0 || !strings.Contains(out, p.want):
			record(i, false, fmt.Sprintf("%s: exit %d: %s", p.cmd, rc, firstNonEmpty(lastLine(out), "no output")))
		default:
			record(i, true, "answered in "+time.Since(start).Round(time.Millisecond).String()+" (the guest's shell included)")
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// GuestRun runs command (one shell line) inside the guest of VM pod name
// through its command port, within timeout, and returns its output and exit
// code.
func (l *Lab) GuestRun(ctx context.Context, name, command string, timeout time.Duration) (string, int, error) {
	st := l.State()
	v := st.vmPod(name)
	if v == nil {
		var have []string
		for _, p := range st.VMPods {
			have = append(have, p.Name)
		}
		if len(have) == 0 {
			return "", -1, fmt.Errorf("no VM pod %q: the lab has none (axon lab up --vm-pods N)", name)
		}
		return "", -1, fmt.Errorf("no VM pod %q (have %s)", name, strings.Join(have, ", "))
	}
	s, err := vmguest.Dial(ctx, v.CommandSocket())
	if err != nil {
		return "", -1, err
	}
	defer s.Close()
	return s.Run(command, timeout)
}

// CheckVMPods checks every VM pod (see the file's comment). It returns an
// error only when the check itself could not run; failed checks are in the
// result.
func (l *Lab) CheckVMPods(ctx context.Context, timeout time.Duration) (*VMCheckResult, error) {
	t0 := time.Now()
	st := l.State()
	res := &VMCheckResult{}
	if len(st.VMPods) == 0 {
		return res, nil
	}
	kube, err := l.Kube()
	if err != nil {
		return nil, err
	}
	// The bypass, as the agent reports it, and its counters before the probes.
	type bypass struct {
		b      *vmbypass.Bypass
		uid    string
		before map[string]uint64
		err    error
	}
	bys := map[string]*bypass{}
	for _, v := range st.VMPods {
		c := VMCheck{VMPod: v.Name, What: "bypass"}
		state := vmBypassState(ctx, &st, v)
		c.OK, c.Detail = state == "bypassed", "agent: "+state
		res.Checks = append(res.Checks, c)
		by := &bypass{}
		bys[v.Name] = by
		pod, err := kube.CoreV1().Pods(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
		if err != nil {
			by.err = err
			continue
		}
		n, _ := st.Node(v.Node)
		by.uid = string(pod.UID)
		if by.b, by.err = vmbypass.New(vmbypass.Config{PinDir: n.PinDir}); by.err == nil {
			by.before, by.err = vmCounters(by.b, by.uid, v)
		}
	}
	// The probes, each source's in one prober run.
	plan := planVMProbes(&st)
	type key struct{ source, kind string }
	groups := map[key][]int{}
	var order []key
	results := make([]VMCheck, len(plan))
	for i, p := range plan {
		results[i] = VMCheck{VMPod: p.vm, What: p.what(), NA: p.na}
		if p.na != "" {
			continue
		}
		k := key{p.source, "pod"}
		if p.svc != nil {
			k.kind = "svc"
		}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	self := filepath.Join(st.BinDir, "axon")
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(order))
	// From inside each guest, alongside the probes to it.
	secs := max(1, int(timeout.Round(time.Second)/time.Second))
	noPodLB := map[string]string{}
	for _, v := range st.VMPods {
		noPodLB[v.Name] = vmPodLBMissing(ctx, &st, v)
	}
	gplan := planGuestProbes(&st, secs, noPodLB)
	gresults := make([]VMCheck, len(gplan))
	byVM := map[string][]int{}
	echo := map[string]bool{} // the guests' TCP targets: their echo servers
	for i, p := range gplan {
		gresults[i] = VMCheck{VMPod: p.vm, What: p.what, NA: p.na}
		if p.na != "" {
			continue
		}
		byVM[p.vm] = append(byVM[p.vm], i)
		switch {
		case p.echo != "":
			echo[p.echo] = true
		case p.service:
			for _, b := range demoBackends(&st) {
				echo[b.Name] = true
			}
		}
	}
	if len(echo) > 0 {
		names := slices.Sorted(maps.Keys(echo))
		stop, err := l.startServers(ctx, names, self, "lab", "_echo", "serve", "--port", strconv.Itoa(probe.EchoPort))
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	for _, v := range st.VMPods {
		idx := byVM[v.Name]
		if len(idx) == 0 {
			continue
		}
		probes := make([]guestProbe, len(idx))
		for j, i := range idx {
			probes[j] = gplan[i]
		}
		wg.Go(func() {
			runGuestProbes(ctx, v, probes, timeout, func(j int, ok bool, detail string) {
				mu.Lock()
				defer mu.Unlock()
				gresults[idx[j]].OK, gresults[idx[j]].Detail = ok, detail
			})
		})
	}
	for gi, k := range order {
		idx := groups[k]
		args := []string{self, "lab", "_echo", "probe", "--timeout", timeout.String()}
		if k.kind == "svc" {
			args = []string{self, "lab", "_probe", "--timeout", timeout.String()}
		}
		where := map[string][]int{}
		for _, i := range idx {
			var s string
			if plan[i].svc != nil {
				s = plan[i].svc.String()
			} else {
				s = plan[i].pod.String()
			}
			if len(where[s]) == 0 {
				args = append(args, s)
			}
			where[s] = append(where[s], i)
		}
		wg.Go(func() {
			record := func(s string, ok bool, detail string) {
				mu.Lock()
				defer mu.Unlock()
				for _, i := range where[s] {
					results[i].OK, results[i].Detail = ok, detail
				}
			}
			cmd := l.CommandInCgroup(ctx, k.source, args...)
			if k.kind == "svc" {
				errs[gi] = runProbes(cmd, "VM service probes in "+k.source, func(r probe.ServiceResult) {
					record(r.Service.String(), r.OK, firstNonEmpty(r.Err, "echoed by "+r.Peer+" in "+r.RTT.Round(time.Microsecond).String()))
				})
			} else {
				errs[gi] = runProbes(cmd, "VM probes in "+k.source, func(r probe.PodResult) {
					record(r.Pod.String(), r.OK, firstNonEmpty(r.Err, "answered in "+r.RTT.Round(time.Microsecond).String()))
				})
			}
		})
	}
	wg.Wait()
	for i := range results {
		if results[i].NA == "" && !results[i].OK && results[i].Detail == "" {
			results[i].Detail = "the prober printed no result"
		}
	}
	res.Checks = append(res.Checks, results...)
	res.Checks = append(res.Checks, gresults...)
	// The counters moved both ways: the probes' frames crossed the bypass.
	for _, v := range st.VMPods {
		by := bys[v.Name]
		c := VMCheck{VMPod: v.Name, What: "frames through the bypass"}
		if by.err == nil {
			var after map[string]uint64
			if after, by.err = vmCounters(by.b, by.uid, v); by.err == nil {
				toGuest, fromGuest := after["pod_frames"]-by.before["pod_frames"], after["tap_frames"]-by.before["tap_frames"]
				c.OK = toGuest > 0 && fromGuest > 0
				c.Detail = fmt.Sprintf("%d to the guest, %d from it during the probes (pod_frames, tap_frames)", toGuest, fromGuest)
			}
		}
		if by.err != nil {
			c.Detail = "bypass counters: " + by.err.Error()
		}
		res.Checks = append(res.Checks, c)
	}
	res.Elapsed = time.Since(t0)
	return res, errors.Join(errs...)
}

// vmCounters reads v's bypass counters from its node's pins.
func vmCounters(b *vmbypass.Bypass, uid string, v VMPod) (map[string]uint64, error) {
	s, err := b.Stats(uid, netnsutil.Path(v.Netns))
	if err != nil {
		return nil, err
	}
	if s.Problem != "" {
		return nil, errors.New(s.Problem)
	}
	return s.Counters, nil
}

func firstNonEmpty(a, b string) string {
	if strings.TrimSpace(a) != "" {
		return a
	}
	return b
}

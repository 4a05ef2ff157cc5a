// Package northsouth is the north-south forwarding benchmark (`axon lab
// bench northsouth`): an external client (the lab's axonlab-external namespace)
// sends new connections and bulk traffic to a NodePort on node2 whose only
// backend is a pod on node1, so every packet is forwarded by the entry node.
// Compared, one lab per configuration, configurations alternated inside
// every repetition (A B C D, A B C D, ...):
//
//	axon-tc              axon datapath, north-south LB at tc (--lb-acceleration disabled)
//	axon-xdp             the same LB at native XDP on the node uplink (veth) (--lb-acceleration native)
//	kube-proxy-iptables  reference CNI plugins (ptp) + real kube-proxy, iptables mode
//	kube-proxy-nftables  reference CNI plugins (ptp) + real kube-proxy, nftables mode
//	xdp-forwarder        the forwarding rate only: a trivial XDP forwarder in place of
//	                     any LB on node2's uplink (the floor an XDP LB is compared to)
//
// Metrics per sample: new connections/s (connect+request+response+close
// loop, `axon lab bench _connrate`, client on CPU 0, server on CPU 1),
// single-flow TCP throughput (iperf3), and softirq CPU per connection:
// /proc/stat softirq time (all CPUs, machine-wide) and /proc/softirqs
// NET_RX invocations during the connect loop, divided by the connections.
package northsouth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/bench/connrate"
	"github.com/axonhq/axon/internal/cpustat"
	labpkg "github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
)

// LabConfig is one configuration of the north-south benchmark.
type LabConfig struct {
	Name string
	Up   labpkg.UpOptions // Nodes, PodsPerNode, BinDir, Logger are filled in by the runner
	// WantXDP: the configuration is only meaningful with the LB at XDP; a
	// lab whose agents did not attach at XDP is recorded as skipped.
	WantXDP bool
	// Floor: no Service and no connection samples; the forwarding rate of
	// the trivial XDP forwarder (pktgen.Forwarder) on node2's uplink, sent
	// the LB's output (backend address and port, the LB's next hop) as its
	// input: the same wire, generator, sink and CPU as the LB rows.
	Floor bool
}

// Configs are the configurations, by name; the reference is kube-proxy-iptables.
func Configs() []LabConfig {
	return []LabConfig{
		{Name: "axon-tc", Up: labpkg.UpOptions{Datapath: labpkg.DatapathAxon, LBAcceleration: "disabled"}},
		{Name: XDP, Up: labpkg.UpOptions{Datapath: labpkg.DatapathAxon, LBAcceleration: "native"}, WantXDP: true},
		{Name: "kube-proxy-iptables", Up: labpkg.UpOptions{Datapath: labpkg.DatapathBaseline, KubeProxy: kubeproxy.IPTables}},
		{Name: "kube-proxy-nftables", Up: labpkg.UpOptions{Datapath: labpkg.DatapathBaseline, KubeProxy: kubeproxy.NFTables}},
		{Name: Floor, Up: labpkg.UpOptions{Datapath: labpkg.DatapathAxon, LBAcceleration: "disabled"}, Floor: true},
	}
}

// Reference is the configuration ratios are computed against.
const Reference = "kube-proxy-iptables"

// Floor is the trivial forwarder's configuration; XDP is the one compared
// to it, repetition by repetition.
const (
	Floor = "xdp-forwarder"
	XDP   = "axon-xdp"
)

// isFloor reports whether the named configuration is a forwarding floor.
func isFloor(name string) bool {
	for _, c := range Configs() {
		if c.Name == name {
			return c.Floor
		}
	}
	return false
}

// Ports of the benchmark Service.
const (
	nsService     = "bench-northsouth"
	nsConnPort    = 7000  // connrate server in the backend pod
	nsIperfPort   = 5201  // iperf3 server in the backend pod
	ConnNodePort  = 30090 // NodePort → nsConnPort
	IperfNodePort = 30091 // NodePort → nsIperfPort
)

// Config describes one run.
type Config struct {
	Configs  []string      // names from Configs, in interleaving order; default all
	Reps     int           // default 3
	Duration time.Duration // per connect-rate and per iperf3 sample; default 3s
	StateDir string        // lab state dir; default lab.DefaultStateDir
	BinDir   string        // axon, axon-agent, axon-cni
	OutDir   string
	Progress io.Writer
	Keep     bool // leave the last lab up
	// WaitFree: how long to wait for the lab slot when a lab is up (0 = fail at once).
	WaitFree time.Duration
}

// Sample is one configuration measured once.
type Sample struct {
	Rep      int     `json:"rep"`
	Config   string  `json:"config"`
	UpSec    float64 `json:"labUpSeconds"`
	Attach   string  `json:"attach,omitempty"` // axon: nodeport_lb status of the entry node
	Skipped  string  `json:"skipped,omitempty"`
	ConnRate float64 `json:"connPerSec"`
	Conns    int     `json:"conns"`
	ConnErrs int     `json:"connErrors"`
	FirstErr string  `json:"firstError,omitempty"`
	// connect(2) and whole-cycle latency of the connect loop, µs
	ConnectP50 float64 `json:"connectP50Us"`
	ConnectP99 float64 `json:"connectP99Us"`
	CycleP50   float64 `json:"cycleP50Us"`
	// softirq CPU during the connect loop (machine-wide), per connection
	SoftirqUsPerConn float64 `json:"softirqUsPerConn"`
	NetRxPerConn     float64 `json:"netRxPerConn"`
	Throughput       float64 `json:"throughputBps"`
	Retransmits      float64 `json:"retransmits"`
	// Forwarding rate (forward.go): 64-byte UDP frames to the NodePort, the
	// entry node's receive processing alone on one CPU.
	FwdPPS         float64  `json:"fwdPps"`         // packets forwarded toward the backend per second
	FwdNsPerPacket float64  `json:"fwdNsPerPacket"` // entry node CPU per forwarded packet
	FwdBusy        float64  `json:"fwdBusy"`        // entry node receive CPU / wall time
	FwdOfferedPPS  float64  `json:"fwdOfferedPps"`  // frames offered per second
	FwdRxPPS       float64  `json:"fwdRxPps"`       // frames the entry node took from its ring per second
	PSIBefore      float64  `json:"psiBefore"`
	PSIAfter       float64  `json:"psiAfter"`
	Commands       []string `json:"commands,omitempty"`
	Err            string   `json:"error,omitempty"`
}

// Run runs the benchmark. It needs the machine's lab slot: it
// refuses to start when a lab is up, and brings its own labs up and down.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Reps <= 0 {
		cfg.Reps = 3
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 3 * time.Second
	}
	if cfg.StateDir == "" {
		cfg.StateDir = labpkg.DefaultStateDir
	}
	all := map[string]LabConfig{}
	var names []string
	for _, c := range Configs() {
		all[c.Name] = c
		names = append(names, c.Name)
	}
	if len(cfg.Configs) == 0 {
		cfg.Configs = names
	}
	for _, c := range cfg.Configs {
		if _, ok := all[c]; !ok {
			return nil, fmt.Errorf("--configs: unknown configuration %q (have %s)", c, strings.Join(names, ", "))
		}
	}
	for deadline := time.Now().Add(cfg.WaitFree); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(cfg.StateDir, "lab.json")); err != nil {
			break
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "lab.json")); err == nil {
		return nil, fmt.Errorf("a lab is up in %s: the north-south benchmark brings up one lab per configuration itself; run `axon lab down` first", cfg.StateDir)
	}
	axon := filepath.Join(cfg.BinDir, "axon")
	rep := &Report{Started: time.Now().UTC(), Reps: cfg.Reps, Duration: cfg.Duration, Configs: cfg.Configs,
		Reference: Reference, Kernel: kernelRelease()}
	progress := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", args...)
		}
	}
	down := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := labpkg.Down(dctx, cfg.StateDir, nil); err != nil {
			progress("lab down: %v", err)
		}
	}
	var errs []error
	for r := 1; r <= cfg.Reps; r++ {
		for i, name := range cfg.Configs {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			s := measureNS(ctx, cfg, all[name], r, axon, progress)
			rep.Samples = append(rep.Samples, s)
			if s.Err != "" {
				errs = append(errs, fmt.Errorf("rep %d %s: %s", r, name, s.Err))
			}
			last := r == cfg.Reps && i == len(cfg.Configs)-1
			if !(last && cfg.Keep) {
				down()
			}
			if cfg.OutDir != "" {
				_ = rep.WriteFiles(cfg.OutDir)
			}
		}
	}
	rep.Finished = time.Now().UTC()
	return rep, errors.Join(errs...)
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// measureNS brings the configuration's lab up and takes one sample.
func measureNS(ctx context.Context, cfg Config, c LabConfig, rep int, axon string, progress func(string, ...any)) Sample {
	s := Sample{Rep: rep, Config: c.Name, ConnRate: math.NaN(), ConnectP50: math.NaN(), ConnectP99: math.NaN(), CycleP50: math.NaN(), SoftirqUsPerConn: math.NaN(), NetRxPerConn: math.NaN(),
		Throughput: math.NaN(), Retransmits: math.NaN(), PSIBefore: math.NaN(), PSIAfter: math.NaN(),
		FwdPPS: math.NaN(), FwdNsPerPacket: math.NaN(), FwdBusy: math.NaN(), FwdOfferedPPS: math.NaN(), FwdRxPPS: math.NaN()}
	o := c.Up
	o.Nodes, o.PodsPerNode, o.BinDir, o.NoDemo = 2, 1, cfg.BinDir, true
	t0 := time.Now()
	l, err := labpkg.Up(ctx, cfg.StateDir, o)
	s.UpSec = time.Since(t0).Seconds()
	if err != nil {
		s.Err = "lab up: " + err.Error()
		return s
	}
	st := l.State()
	entry := st.Nodes[1]
	var backend labpkg.Pod
	for _, p := range st.Pods {
		if p.Node == st.Nodes[0].Name {
			backend = p
		}
	}
	if st.Datapath == labpkg.DatapathAxon {
		v, reason, err := labpkg.NodePortDecision(ctx, entry.Socket, 30*time.Second)
		s.Attach = v + " — " + reason
		if err != nil {
			s.Attach = err.Error()
		}
		if c.WantXDP && !strings.HasPrefix(s.Attach, "xdp") {
			s.Skipped = "the north-south LB did not attach at XDP: " + s.Attach
			progress("rep %d %-20s skipped: %s", rep, c.Name, s.Skipped)
			return s
		}
	}
	if c.Floor {
		s.Attach = "trivial XDP forwarder (pktgen.Forwarder) on " + entry.Name + "'s " + labpkg.Uplink + ", no Service"
	} else {
		if err := ensureNSService(ctx, l, backend); err != nil {
			s.Err = err.Error()
			return s
		}
		if err := measureConns(ctx, cfg, l, entry, backend, axon, &s); err != nil {
			s.Err = err.Error()
			return s
		}
	}
	dst := netip.AddrPortFrom(entry.IP, FwdNodePort)
	if c.Floor {
		dst = netip.AddrPortFrom(backend.IP, nsFwdPort)
	}
	s.Commands = append(s.Commands, fmt.Sprintf("# forwarding rate: internal/pktgen from %s to %s/udp (%d flows), %s after a %s warm-up; %s's eth0 receive in threaded NAPI on CPU %d",
		labpkg.WirePort(entry.Name), dst, nsFwdFlows, cfg.Duration, nsFwdWarmup, entry.Name, nsFwdEntryCPU))
	if fw, err := measureForwarding(ctx, st, entry, backend, c.Floor, cfg.Duration); err != nil {
		if s.Err == "" {
			s.Err = "forwarding rate: " + err.Error()
		}
	} else {
		s.FwdPPS, s.FwdNsPerPacket, s.FwdBusy, s.FwdOfferedPPS, s.FwdRxPPS = fw.PPS, fw.NsPerPacket, fw.Busy, fw.OfferedPPS, fw.RxPPS
	}
	conns := fmt.Sprintf("%8.0f conn/s (%d errors)  %6.2f Gbit/s  softirq %5.1f µs/conn", s.ConnRate, s.ConnErrs, s.Throughput/1e9, s.SoftirqUsPerConn)
	if c.Floor {
		conns = fmt.Sprintf("%-63s", "forwarding rate only")
	}
	progress("rep %d %-20s up %4.1fs  %s  fwd %5.3f Mpps of %5.3f offered %5.0f ns/pkt (CPU %3.0f%%)  psi %.0f%%",
		rep, c.Name, s.UpSec, conns, s.FwdPPS/1e6, s.FwdOfferedPPS/1e6, s.FwdNsPerPacket, 100*s.FwdBusy, s.PSIAfter)
	return s
}

// measureConns takes the connection-rate and throughput samples of s
// through the benchmark's NodePort on entry (servers in backend). Errors of
// a sample's own tool are recorded in s; err is a setup failure.
func measureConns(ctx context.Context, cfg Config, l *labpkg.Lab, entry labpkg.Node, backend labpkg.Pod, axon string, s *Sample) error {
	// Servers in the backend pod, pinned to CPU 1.
	srvCtx, stopSrv := context.WithCancel(ctx)
	defer stopSrv()
	crSrv := l.Command(srvCtx, backend.Name, "taskset", "-c", "1", axon, "lab", "bench", "_connrate", "serve",
		"--listen", netip.AddrPortFrom(backend.IP, nsConnPort).String())
	// No async preemption signals in the server: an interrupted read(2)
	// (EINTR) made it close with the request unread, answered by a reset.
	crSrv.Env = append(os.Environ(), "GODEBUG=asyncpreemptoff=1")
	ipSrv := l.Command(srvCtx, backend.Name, "taskset", "-c", "1", "iperf3", "-s", "-B", backend.IP.String(), "-p", strconv.Itoa(nsIperfPort))
	for _, srv := range []*exec.Cmd{crSrv, ipSrv} {
		srv.Stdout, srv.Stderr = io.Discard, io.Discard
		if err := srv.Start(); err != nil {
			return fmt.Errorf("start server %v: %w", srv.Args, err)
		}
		defer func() { stopSrv(); _ = srv.Wait() }()
	}
	target := netip.AddrPortFrom(entry.IP, ConnNodePort)
	// Wait until the NodePort answers (Service programmed, servers listening).
	ready := false
	for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; {
		out, _ := l.Command(ctx, labpkg.ExternalName, axon, "lab", "bench", "_connrate", "client", "--target", target.String(), "--duration", "300ms").Output()
		if r, err := connrate.Parse(out); err == nil && r.Conns > 0 {
			ready = true
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if !ready {
		return fmt.Errorf("NodePort %s never answered within 45 s", target)
	}

	crArgv := []string{"taskset", "-c", "0", axon, "lab", "bench", "_connrate", "client", "--target", target.String(),
		"--duration", cfg.Duration.String()}
	s.Commands = append(s.Commands, "GODEBUG=asyncpreemptoff=1 nsenter --net=/run/netns/"+l.State().External.Netns+" -- "+strings.Join(crArgv, " "))
	before := bench.ReadPressure()
	sq0, nr0 := softirqTicks(), netRx()
	crCmd := l.Command(ctx, labpkg.ExternalName, crArgv...)
	// No async preemption signals: one landing in a blocking connect(2)
	// fails it with EINTR, which the loop would count as a failed connection.
	crCmd.Env = append(os.Environ(), "GODEBUG=asyncpreemptoff=1")
	out, err := crCmd.Output()
	sq1, nr1 := softirqTicks(), netRx()
	after := bench.ReadPressure()
	s.PSIBefore, s.PSIAfter = before.Avg10, after.Avg10
	cr, perr := connrate.Parse(out)
	switch {
	case err != nil:
		s.Err = fmt.Sprintf("connrate client: %v", err)
	case perr != nil:
		s.Err = perr.Error()
	default:
		s.ConnRate, s.Conns, s.ConnErrs, s.FirstErr = cr.Rate, cr.Conns, cr.Errors, cr.FirstError
		s.ConnectP50, s.ConnectP99, s.CycleP50 = cr.ConnectP50, cr.ConnectP99, cr.CycleP50
		if cr.Conns > 0 {
			s.SoftirqUsPerConn = float64(sq1-sq0) * 1e6 / float64(cpustat.TicksPerSecond) / float64(cr.Conns)
			s.NetRxPerConn = float64(nr1-nr0) / float64(cr.Conns)
		}
	}
	secs := max(1, int(math.Ceil(cfg.Duration.Seconds())))
	ipArgv := []string{"taskset", "-c", "0", "iperf3", "-c", entry.IP.String(), "-p", strconv.Itoa(IperfNodePort), "-t", strconv.Itoa(secs), "-J"}
	s.Commands = append(s.Commands, "nsenter --net=/run/netns/"+l.State().External.Netns+" -- "+strings.Join(ipArgv, " "))
	ictx, cancel := context.WithTimeout(ctx, cfg.Duration+30*time.Second)
	iout, ierr := l.Command(ictx, labpkg.ExternalName, ipArgv...).Output()
	cancel()
	if ir, err := bench.ParseIperfJSON(iout); err == nil {
		s.Throughput, s.Retransmits = ir.BitsPerSecond, float64(ir.Retransmits)
	} else if s.Err == "" {
		s.Err = fmt.Sprintf("iperf3: %v %v", err, ierr)
	}
	return nil
}

// softirqTicks sums the softirq column of /proc/stat's "cpu" line.
func softirqTicks() uint64 {
	stat, err := cpustat.Read()
	if err != nil {
		return 0
	}
	return parseStatSoftirq(stat)
}

func parseStatSoftirq(stat string) uint64 {
	c, err := cpustat.Parse(stat, "cpu")
	if err != nil {
		return 0
	}
	return c.SoftIRQ
}

// netRx sums the NET_RX row of /proc/softirqs over all CPUs.
func netRx() uint64 {
	b, err := os.ReadFile("/proc/softirqs")
	if err != nil {
		return 0
	}
	return parseSoftirqsRow(string(b), "NET_RX:")
}

func parseSoftirqsRow(data, row string) uint64 {
	for _, line := range strings.Split(data, "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[0] == row {
			var sum uint64
			for _, x := range f[1:] {
				v, _ := strconv.ParseUint(x, 10, 64)
				sum += v
			}
			return sum
		}
	}
	return 0
}

// ensureNSService creates the benchmark's NodePort Service (IPv4; TCP:
// ConnNodePort → 7000, IperfNodePort → 5201; UDP: FwdNodePort → 7001) with backend as its only
// endpoint (the lab runs no controller-manager: the EndpointSlice is ours).
func ensureNSService(ctx context.Context, l *labpkg.Lab, backend labpkg.Pod) error {
	kube, err := l.Kube()
	if err != nil {
		return err
	}
	ns := labpkg.DemoNamespace
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: nsService, Namespace: ns},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{
			{Name: "conn", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(nsConnPort), NodePort: ConnNodePort},
			{Name: "iperf", Protocol: corev1.ProtocolTCP, Port: 5201, TargetPort: intstr.FromInt32(nsIperfPort), NodePort: IperfNodePort},
			{Name: "fwd", Protocol: corev1.ProtocolUDP, Port: nsFwdPort, TargetPort: intstr.FromInt32(nsFwdPort), NodePort: FwdNodePort},
		}},
	}
	if _, err := kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Service %s: %w", nsService, err)
	}
	yes, node := true, backend.Node
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	conn, iperf, fwd := "conn", "iperf", "fwd"
	cp, ip, fp := int32(nsConnPort), int32(nsIperfPort), int32(nsFwdPort)
	eps := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: nsService + "-v4", Namespace: ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: nsService, discoveryv1.LabelManagedBy: "axon-bench"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: &conn, Protocol: &tcp, Port: &cp}, {Name: &iperf, Protocol: &tcp, Port: &ip},
			{Name: &fwd, Protocol: &udp, Port: &fp}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{backend.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: new(bool)}, NodeName: &node,
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: backend.Namespace, Name: backend.Name}}},
	}
	if _, err := kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, eps, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create EndpointSlice of %s: %w", nsService, err)
	}
	return nil
}

package lab_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/cpustat"
	"github.com/axonhq/axon/internal/testutil"
	"github.com/axonhq/axon/internal/vmtest"
)

// vmQperfSample is one qperf measurement of TestLabVMQperf.
type vmQperfSample struct {
	Round   int     `json:"round"`
	Client  string  `json:"client"` // same-node or cross-node
	Test    string  `json:"test"`   // udp_lat, tcp_lat, udp_bw, tcp_bw
	MsgSize int     `json:"msg_size"`
	Arm     string  `json:"arm"`   // bridge or bypass
	Value   float64 `json:"value"` // ns (_lat) or received bytes/s (_bw)
	QEMUCPU float64 `json:"qemu_cpu_s"`
	Ops     float64 `json:"ops"` // round trips (_lat) or messages received (_bw)
}

// TestLabVMQperf is the KubeVirt talk's benchmark on the lab's real path: qperf from an
// ordinary pod on the VM pod's node (same-node) and from one on the other node (cross-node,
// over the lab's wire) to the guest of node1-vm1 (qperf server in the guest), KubeVirt's
// bridge against axon's bypass on the same guest. The arm is switched with the pod's
// annotation (the agent attaches or removes the bypass, as in production); per round both
// arms run every client, test and size, their order alternating by round. Medians per arm
// and paired ratios bypass/bridge with 95 % intervals (bench.Pair, 8 rounds or more).
//
// AXON_LAB_VMQPERF=1 runs it (TCG: about 10 min at the defaults); AXON_LAB_VMQPERF_ROUNDS
// (8), AXON_LAB_VMQPERF_TIME (qperf -t seconds, 1), AXON_LAB_VMQPERF_SIZES (1,64,1024,16384),
// AXON_LAB_VMQPERF_OUT (a dir: results.md and results.json); AXON_LAB_VMQPERF_RENDER=<dir>
// only renders <dir>/results.md again from its results.json.
func TestLabVMQperf(t *testing.T) {
	if os.Getenv("AXON_LAB_VMQPERF") != "1" {
		t.Skip("benchmark: set AXON_LAB_VMQPERF=1 to run it (about 10 min under TCG)")
	}
	need(t, "axon", "axon-agent", "axon-cni")
	if _, err := exec.LookPath("qperf"); err != nil {
		t.Skip("qperf not found: `make packages`")
	}
	if _, err := exec.LookPath(vmtest.QEMUPath); err != nil {
		t.Skipf("no QEMU: `make vm-packages`: %v", err)
	}
	rounds := testutil.EnvInt(t, "AXON_LAB_VMQPERF_ROUNDS", 8)
	secs := testutil.EnvInt(t, "AXON_LAB_VMQPERF_TIME", 1)
	sizes := testutil.EnvSizes(t, "AXON_LAB_VMQPERF_SIZES", []int{1, 64, 1024, 16384})
	tests := []string{"udp_lat", "tcp_lat", "udp_bw", "tcp_bw"}
	clients := map[string]string{"same-node": "node1-pod1", "cross-node": "node2-pod1"}
	clientOrder := []string{"same-node", "cross-node"}
	if dir := os.Getenv("AXON_LAB_VMQPERF_RENDER"); dir != "" { // results.md again from results.json
		meta, samples, err := bench.ReadRun[vmQperfMeta, vmQperfSample](dir)
		if err != nil {
			t.Fatal(err)
		}
		var sizes []int
		for _, s := range samples {
			if !slices.Contains(sizes, s.MsgSize) {
				sizes = append(sizes, s.MsgSize)
			}
		}
		md := vmQperfMarkdown(meta, clientOrder, tests, sizes, samples)
		t.Log("\n" + md)
		if err := bench.WriteResultFiles(dir, bench.ResultFile{Name: "results.md", Data: []byte(md)}); err != nil {
			t.Fatal(err)
		}
		return
	}

	l := up(t, "--nodes", "2", "--pods-per-node", "1", "--vm-pods", "1", "--ready-timeout", "4m")
	vm := l.State().VMPods[0]
	if vm.Name != "node1-vm1" {
		t.Fatalf("first VM pod %s, want node1-vm1", vm.Name)
	}
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	agent, err := l.Agent(vm.Node)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	setArm := func(arm string) {
		t.Helper()
		v := map[string]string{"bypass": "enabled", "bridge": "disabled"}[arm]
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"axon.io/vm-bypass":%q}}}`, v)
		if _, err := kube.CoreV1().Pods(vm.Namespace).Patch(ctx, vm.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			eps, err := agent.Endpoints(ctx)
			state := "?"
			if err == nil {
				for _, ep := range eps {
					if ep.PodName == vm.Name {
						state = ep.VMBypass
					}
				}
			}
			if (arm == "bypass") == (state == "bypassed") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("arm %s: the agent reports the bypass %q after 1 min (%v)", arm, state, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	measure := func(client, test string, size int) (vmQperfSample, error) {
		s := vmQperfSample{Client: client, Test: test, MsgSize: size}
		cctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
		defer cancel()
		q0, _ := cpustat.ProcessSeconds(vm.QEMU.PID)
		cmd := l.CommandInCgroup(cctx, clients[client], "qperf", "-uu", vm.IP.String(), "-t", strconv.Itoa(secs), "-m", strconv.Itoa(size), test)
		out, err := cmd.CombinedOutput()
		q1, _ := cpustat.ProcessSeconds(vm.QEMU.PID)
		s.QEMUCPU = q1 - q0
		if err != nil {
			return s, fmt.Errorf("qperf %s from %s: %w: %s", test, clients[client], err, out)
		}
		res, err := bench.ParseQperf(out)
		if err != nil || len(res) != 1 {
			return s, fmt.Errorf("qperf %s: %d results, %v: %s", test, len(res), err, out)
		}
		s.Value, s.Ops = res[0].Measure(secs, size)
		return s, nil
	}

	load0, pres0 := bench.LoadAvg(), bench.ReadPressure()
	start := time.Now()
	var samples []vmQperfSample
	for r := range rounds {
		arms := []string{"bridge", "bypass"}
		if r%2 == 1 {
			arms[0], arms[1] = arms[1], arms[0]
		}
		for _, arm := range arms {
			setArm(arm)
			for _, client := range clientOrder {
				for _, test := range tests {
					for _, size := range sizes {
						s, err := measure(client, test, size)
						if err != nil {
							t.Fatalf("round %d, %s, %s: %v", r, arm, client, err)
						}
						s.Round, s.Arm = r, arm
						samples = append(samples, s)
					}
				}
			}
		}
		t.Logf("round %d of %d done after %s", r+1, rounds, time.Since(start).Round(time.Second))
	}
	meta := vmQperfMeta{
		Command: "AXON_LAB_VMQPERF=1 go test -count=1 -timeout 60m -run 'TestLabVMQperf$' -v ./internal/lab/",
		Accel:   vmAccel(), Rounds: rounds, QperfSeconds: secs, HostCPUs: runtime.NumCPU(),
		LoadStart: load0, LoadEnd: bench.LoadAvg(), PressureStart: pres0.Avg10, PressureEnd: bench.ReadPressure().Avg10,
		Took: time.Since(start).Round(time.Second).String(), GuestBoot: vm.Boot.String(),
	}
	md := vmQperfMarkdown(meta, clientOrder, tests, sizes, samples)
	t.Log("\n" + md)
	if dir := os.Getenv("AXON_LAB_VMQPERF_OUT"); dir != "" {
		if err := bench.WriteRun(dir, meta, samples, md); err != nil {
			t.Fatal(err)
		}
	}
}

type vmQperfMeta struct {
	Command       string  `json:"command"`
	Accel         string  `json:"accel"`
	Rounds        int     `json:"rounds"`
	QperfSeconds  int     `json:"qperf_seconds"`
	HostCPUs      int     `json:"host_cpus"`
	LoadStart     string  `json:"load_start"`
	LoadEnd       string  `json:"load_end"`
	PressureStart float64 `json:"cpu_pressure_avg10_start"`
	PressureEnd   float64 `json:"cpu_pressure_avg10_end"`
	Took          string  `json:"took"`
	GuestBoot     string  `json:"guest_boot"`
}

// vmQperfMarkdown renders the run: per client, test and size the medians of both arms, the
// paired ratio bypass/bridge with its 95 % interval, and the QEMU process's CPU per operation.
func vmQperfMarkdown(m vmQperfMeta, clients, tests []string, sizes []int, samples []vmQperfSample) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Guest %s, %d rounds × qperf -t %d s per client, test, size and arm, the arms' order alternating by round; took %s; host %d CPUs, load %s → %s, CPU pressure avg10 %.0f %% → %.0f %%.\n\n",
		m.Accel, m.Rounds, m.QperfSeconds, m.Took, m.HostCPUs, m.LoadStart, m.LoadEnd, m.PressureStart, m.PressureEnd)
	b.WriteString("| client | test | msg size | bridge median (min–max) | bypass median (min–max) | bypass / bridge, paired (95 % CI) | QEMU CPU µs per op, bridge → bypass |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|\n")
	pick := func(client, test string, size int, arm string, f func(vmQperfSample) float64) []float64 {
		var out []float64
		for _, s := range samples {
			if s.Client == client && s.Test == test && s.MsgSize == size && s.Arm == arm {
				out = append(out, f(s))
			}
		}
		return out
	}
	// qperf prints 0 when nothing came back in its time (a UDP exchange lost: it does not
	// retransmit): no measurement, counted apart
	val := func(s vmQperfSample) float64 {
		if s.Value == 0 {
			return math.NaN()
		}
		return s.Value
	}
	perOp := func(s vmQperfSample) float64 {
		if s.Ops == 0 {
			return math.NaN()
		}
		return s.QEMUCPU / s.Ops * 1e6
	}
	zeros := func(client, test string, size int) string {
		n, all := 0, 0
		for _, s := range samples {
			if s.Client == client && s.Test == test && s.MsgSize == size {
				all++
				if s.Value == 0 {
					n++
				}
			}
		}
		if n == 0 {
			return ""
		}
		return fmt.Sprintf(" ¹ %d of %d", n, all)
	}
	anyZero := false
	for _, client := range clients {
		for _, test := range tests {
			scale, unit, prec := 1e3, "µs", 1
			if !strings.HasSuffix(test, "_lat") {
				scale, unit, prec = 1e6/8, "Mbit/s", 2
			}
			for _, size := range sizes {
				br, by := pick(client, test, size, "bridge", val), pick(client, test, size, "bypass", val)
				z := zeros(client, test, size)
				anyZero = anyZero || z != ""
				fmt.Fprintf(&b, "| %s | %s | %d%s | %s %s | %s %s | %s | %s → %s |\n", client, test, size, z,
					bench.Cell(bench.Summarize(br), scale, prec), unit, bench.Cell(bench.Summarize(by), scale, prec), unit,
					bench.FormatPaired(bench.Pair(by, br)),
					bench.FormatNum(bench.Summarize(pick(client, test, size, "bridge", perOp)).Median, 1),
					bench.FormatNum(bench.Summarize(pick(client, test, size, "bypass", perOp)).Median, 1))
			}
		}
	}
	if anyZero {
		b.WriteString("\n¹ of the runs of both arms, qperf measured nothing (it printed 0: a UDP exchange lost, which it does not retransmit, or nothing received); left out of the medians and the pairs.\n")
	}
	return b.String()
}

func vmAccel() string {
	if vmtest.HardwareKVM() {
		return "KVM"
	}
	return "TCG (no hardware KVM)"
}

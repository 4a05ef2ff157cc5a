// Command agentscale measures the axon agent at N Services × M endpoints
// against a real kube-apiserver, outside the lab (the Services benchmark's control-plane
// targets): full sync of a freshly started agent process into its pinned
// BPF maps, EndpointSlice change → map latency, VmHWM. Several agent
// binaries (or flag sets) are interleaved round by round (A B, A B, ...) so
// they are compared under the same machine load.
//
//	go build -o /tmp/axt-svc/agent-new ./cmd/axon-agent
//	go run ./hack/svcbench/agentscale -services 10000 -rounds 3 \
//	    -agent new=/tmp/axt-svc/agent-new -agent old=/tmp/axt-svc/agent-old
//
// The control plane (etcd + kube-apiserver on 127.0.0.1:-api-port) lives in
// -dir and is reused by the next run (objects already there are kept);
// -stop stops it at the end. Needs root.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/scale"
	"github.com/axonhq/axon/internal/scale/agentrun"
)

type agents []string

func (a *agents) String() string     { return strings.Join(*a, ",") }
func (a *agents) Set(v string) error { *a = append(*a, v); return nil }

func main() {
	var ags agents
	flag.Var(&ags, "agent", "name=path[ flags...] of an agent binary; repeat to interleave several (the first is the reference)")
	services := flag.Int("services", 10000, "generated Services")
	endpoints := flag.Int("endpoints", 10, "endpoints per Service")
	rounds := flag.Int("rounds", 3, "rounds (each runs every agent once)")
	changes := flag.Int("changes", 20, "EndpointSlice changes per run (2 samples each)")
	dir := flag.String("dir", "/tmp/axt-svc/cp", "control-plane state dir (reused)")
	apiPort := flag.Int("api-port", 16593, "apiserver port on 127.0.0.1")
	etcdPort := flag.Int("etcd-port", 12529, "etcd client port on 127.0.0.1")
	stop := flag.Bool("stop", false, "stop the control plane at the end")
	out := flag.String("json", "", "write every result as JSON here")
	flag.StringVar(&logDir, "logs", "", "copy every agent log into this directory")
	flag.StringVar(&perfDir, "perf", "", "record each agent with perf (call graphs, 15 s from its start) into this directory")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if len(ags) == 0 {
		fmt.Fprintln(os.Stderr, "agentscale: give at least one -agent name=path")
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, log, ags, *services, *endpoints, *rounds, *changes, *dir, *apiPort, *etcdPort, *stop, *out); err != nil {
		fmt.Fprintln(os.Stderr, "agentscale:", err)
		os.Exit(1)
	}
}

var logDir, perfDir string

// startPerf records pid with perf for 15 s (CPU profile of the full sync).
func startPerf(ctx context.Context, dir, name string, round, pid int, log *slog.Logger) {
	cmd := exec.CommandContext(ctx, "perf", "record", "-q", "-g", "-F", "499", "-p", strconv.Itoa(pid),
		"-o", filepath.Join(dir, fmt.Sprintf("%s-%d.perf", name, round)), "--", "sleep", "15")
	if err := cmd.Start(); err != nil {
		log.Warn("perf not started", "error", err)
		return
	}
	go func() { _ = cmd.Wait() }()
}

type sample struct {
	Agent  string
	Round  int
	Result agentrun.Result
	Err    string `json:",omitempty"`
}

func run(ctx context.Context, log *slog.Logger, ags []string, services, endpoints, rounds, changes int, dir string, apiPort, etcdPort int, stop bool, out string) error {
	etcd, err := lab.DepPath("etcd")
	if err != nil {
		return err
	}
	apiserver, err := lab.DepPath("kube-apiserver")
	if err != nil {
		return err
	}
	cp, err := controlplane.Start(ctx, controlplane.Config{Dir: dir, APIPort: apiPort, EtcdPort: etcdPort, Logger: log,
		EtcdBinary: etcd, APIServerBinary: apiserver})
	if err != nil {
		return err
	}
	if stop {
		defer func() { _ = controlplane.Stop(dir) }()
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cp.AdminKubeconfig())
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 2000, 4000
	rc.ContentType = runtime.ContentTypeProtobuf
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if err := agentrun.EnsureNode(ctx, kube); err != nil {
		return err
	}
	spec := scale.Spec{Services: services, Endpoints: endpoints}
	t0 := time.Now()
	res, err := scale.Apply(ctx, kube, spec, 16, func(done, total int) {
		if done%5000 == 0 {
			log.Info("applying", "done", done, "total", total)
		}
	})
	if err != nil {
		return err
	}
	log.Info("services in place", "created", res.Created, "existing", res.Existing, "took", time.Since(t0).Round(time.Millisecond))
	ips := make([]netip.Addr, 0, services)
	for i := range services {
		ip, ok := res.ClusterIPs[i]
		if !ok {
			return fmt.Errorf("no ClusterIP for Service %d", i)
		}
		ips = append(ips, ip)
	}

	var all []sample
	for r := range rounds {
		for _, a := range ags {
			name, cmdline, ok := strings.Cut(a, "=")
			if !ok {
				return fmt.Errorf("-agent %q: want name=path", a)
			}
			argv := strings.Fields(cmdline)
			o := agentrun.Options{Argv: argv, Flags: true, CP: cp, Kube: kube, Spec: spec, IPs: ips,
				Changes: changes, Seed: uint64(r), Log: log}
			if logDir != "" {
				o.LogCopy = filepath.Join(logDir, fmt.Sprintf("%s-%d.log", name, r))
			}
			if perfDir != "" {
				o.Hook = func(pid int) { startPerf(ctx, perfDir, name, r, pid, log) }
			}
			res, err := agentrun.Run(ctx, o)
			s := sample{Agent: name, Round: r, Result: res}
			if err != nil {
				s.Err = err.Error()
				log.Error("run failed", "agent", name, "round", r, "error", err, "log", res.LogTail)
			} else {
				log.Info("run", "agent", name, "round", r, "fullSync", res.FullSync.Round(time.Millisecond), "logged", res.Logged, "settle", res.Settle.Round(time.Millisecond),
					"change_p50_ms", res.P(0.5), "change_p99_ms", res.P(0.99), "hwm_MiB", res.HWM>>20, "hwm_after_sync_MiB", res.HWMAfter>>20,
					"psi", fmt.Sprintf("%.0f→%.0f", res.PSI[0], res.PSI[1]))
			}
			all = append(all, s)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	report(os.Stdout, ags, all, services, endpoints)
	if out != "" {
		b, _ := json.MarshalIndent(all, "", "  ")
		if err := os.WriteFile(out, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func report(w *os.File, ags []string, all []sample, services, endpoints int) {
	fmt.Fprintf(w, "\n%d Services × %d endpoints, %d runs per agent, interleaved\n\n", services, endpoints, len(all)/len(ags))
	fmt.Fprintln(w, "| agent | full sync s median (min–max) | change p50 ms | change p99 ms | VmHWM MiB median (min–max) | CPU pressure avg10 % |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for _, a := range ags {
		name, _, _ := strings.Cut(a, "=")
		var fs, hwm, ch, psi []float64
		for _, s := range all {
			if s.Agent != name || s.Err != "" {
				continue
			}
			fs = append(fs, s.Result.FullSync.Seconds())
			hwm = append(hwm, float64(s.Result.HWM)/(1<<20))
			ch = append(ch, s.Result.ChangesMs...)
			psi = append(psi, s.Result.PSI[0], s.Result.PSI[1])
		}
		r := agentrun.Result{ChangesMs: ch}
		fmt.Fprintf(w, "| %s | %s | %.1f | %.1f | %s | %s |\n", name, mmm(fs, "%.2f"), r.P(0.5), r.P(0.99), mmm(hwm, "%.0f"), mmm(psi, "%.0f"))
	}
}

func mmm(xs []float64, f string) string {
	st := bench.Summarize(xs)
	if st.N == 0 {
		return "–"
	}
	return fmt.Sprintf(f+" ("+f+"–"+f+")", st.Median, st.Min, st.Max)
}

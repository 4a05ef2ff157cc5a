package services

// The Service benchmark runs real kube-proxies itself, one per chosen lab
// node and each in its own mode (nftables on one node, iptables on another),
// so that axon's socket LB and both kube-proxy modes are measured in ONE lab
// and one interleaved run. (`axon lab up --kube-proxy` runs one mode on every
// node; mixing modes per node is what this file adds.)

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/bench/clip"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/proc"
)

// kubeProxyMetricsAddr is the benchmark's kube-proxies' metrics server
// inside their node netns (loopback of that netns only): not kube-proxy's
// own port, which the node's axon agent holds.
var kubeProxyMetricsAddr = kubeproxy.BesideAxonPorts.Metrics

// KubeProxySpec describes one kube-proxy process of the benchmark.
type KubeProxySpec struct {
	Binary     string // kube-proxy v1.36.3 (lab.DepPath("kube-proxy"))
	Mode       string // "nftables" or "iptables"
	Node       string // Node name (--hostname-override)
	Netns      string // /run/netns/<node netns>
	Kubeconfig string // reaches the apiserver from inside the node netns
	Log        string // log file
}

// KubeProxyArgv is the exact command line (recorded in the report): the
// lab's (kubeproxy.Args, without --masquerade-all) run in the node netns,
// with a higher apiserver QPS for the churn. All conntrack flags are "leave
// as is": nf_conntrack_max is machine-wide and the benchmark never changes
// the root namespace.
func (s KubeProxySpec) KubeProxyArgv(nsenter string) []string {
	argv := []string{nsenter, "--net=" + s.Netns, "--"}
	argv = append(argv, kubeproxy.Args(s.Binary, s.Mode, s.Kubeconfig, s.Node, kubeproxy.BesideAxonPorts, false)...)
	return append(argv, "--kube-api-qps=100", "--kube-api-burst=200")
}

// KubeProxy is a running kube-proxy of the benchmark.
type KubeProxy struct {
	Spec    KubeProxySpec
	Argv    []string
	Proc    proc.Record
	Started time.Time
}

// StartKubeProxy starts kube-proxy detached; stop it with Stop.
func StartKubeProxy(s KubeProxySpec) (*KubeProxy, error) {
	if s.Mode != "nftables" && s.Mode != "iptables" {
		return nil, fmt.Errorf("kube-proxy mode %q: want nftables or iptables", s.Mode)
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return nil, fmt.Errorf("nsenter not found: install util-linux: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(s.Log), 0o755); err != nil {
		return nil, fmt.Errorf("kube-proxy log dir: %w", err)
	}
	argv := s.KubeProxyArgv(nsenter)
	kp := &KubeProxy{Spec: s, Argv: argv, Started: time.Now()}
	p, _, err := proc.Start(proc.Spec{Argv: argv, Env: os.Environ(), Log: s.Log,
		Banner: fmt.Sprintf("--- %s %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(argv, " "))})
	if err != nil {
		return nil, fmt.Errorf("start kube-proxy %s on %s: %w", s.Mode, s.Node, err)
	}
	kp.Proc = p
	return kp, nil
}

// Stop stops kube-proxy by PID (SIGTERM, then SIGKILL). Its rules stay in
// the node netns (they go with the netns at `axon lab down`); Cleanup removes
// them earlier.
func (k *KubeProxy) Stop() error {
	if k == nil {
		return nil
	}
	return k.Proc.Stop(10 * time.Second)
}

// Cleanup runs `kube-proxy --cleanup` in the node netns: it removes the
// rules of both modes from that netns only.
func (k *KubeProxy) Cleanup(ctx context.Context) error {
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, nsenter, "--net="+k.Spec.Netns, "--", k.Spec.Binary, "--cleanup",
		"--proxy-mode="+k.Spec.Mode).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kube-proxy --cleanup in %s: %w: %s", k.Spec.Netns, err, clip.String(strings.TrimSpace(string(out)), 400))
	}
	return nil
}

// KubeProxyMetrics are the kube-proxy metrics the benchmark reads.
type KubeProxyMetrics struct {
	LastSync         float64 // kubeproxy_sync_proxy_rules_last_timestamp_seconds (unix s, end of the last successful sync)
	LastQueued       float64 // kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds
	EndpointsPending float64 // kubeproxy_sync_proxy_rules_endpoint_changes_pending
	ServicesPending  float64 // kubeproxy_sync_proxy_rules_service_changes_pending
	SyncCount        float64 // kubeproxy_sync_proxy_rules_duration_seconds_count
	SyncSum          float64 // kubeproxy_sync_proxy_rules_duration_seconds_sum
	RSS              float64 // process_resident_memory_bytes
}

// Synced reports whether nothing is pending and the last sync ended after
// the last queued change and after t.
func (m KubeProxyMetrics) Synced(t time.Time) bool {
	ts := float64(t.UnixNano()) / 1e9
	return m.EndpointsPending == 0 && m.ServicesPending == 0 && m.LastSync >= m.LastQueued && m.LastSync > ts
}

// ParseKubeProxyMetrics reads the Prometheus text exposition of kube-proxy.
// Counters and gauges with labels are summed over their label sets; the
// sync timestamps are taken from the IPv4 proxier (dual-stack kube-proxy runs
// one per family) or from the unlabeled series.
func ParseKubeProxyMetrics(r io.Reader) (KubeProxyMetrics, error) {
	var m KubeProxyMetrics
	fams, err := bench.MetricFamilies(r)
	if err != nil {
		return m, err
	}
	seen := false
	sum := func(name string, p *float64) {
		if f := fams[name]; f != nil {
			seen = seen || name != "process_resident_memory_bytes"
			for _, x := range f.GetMetric() {
				*p += bench.MetricValue(x)
			}
		}
	}
	// One proxier per IP family; the benchmark's Services are IPv4.
	ipv4 := func(name string, p *float64) {
		if f := fams[name]; f != nil {
			seen = true
			for _, x := range f.GetMetric() {
				if len(x.GetLabel()) == 0 || bench.HasLabel(x, "ip_family", "IPv4") {
					*p = bench.MetricValue(x)
				}
			}
		}
	}
	ipv4("kubeproxy_sync_proxy_rules_last_timestamp_seconds", &m.LastSync)
	ipv4("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", &m.LastQueued)
	sum("kubeproxy_sync_proxy_rules_endpoint_changes_pending", &m.EndpointsPending)
	sum("kubeproxy_sync_proxy_rules_service_changes_pending", &m.ServicesPending)
	sum("process_resident_memory_bytes", &m.RSS)
	if f := fams["kubeproxy_sync_proxy_rules_duration_seconds"]; f != nil {
		seen = true
		for _, x := range f.GetMetric() {
			m.SyncCount += float64(x.GetHistogram().GetSampleCount())
			m.SyncSum += x.GetHistogram().GetSampleSum()
		}
	} else { // an exposition without the histogram's TYPE line
		sum("kubeproxy_sync_proxy_rules_duration_seconds_count", &m.SyncCount)
		sum("kubeproxy_sync_proxy_rules_duration_seconds_sum", &m.SyncSum)
	}
	if !seen {
		return m, fmt.Errorf("no kubeproxy_sync_proxy_rules metrics in the answer")
	}
	return m, nil
}

// Metrics fetches and parses kube-proxy's /metrics from inside its netns.
func (k *KubeProxy) Metrics(ctx context.Context) (KubeProxyMetrics, error) {
	body, err := kubeproxy.HTTPGetOK(ctx, k.Spec.Netns, kubeProxyMetricsAddr, "/metrics")
	if err != nil {
		return KubeProxyMetrics{}, fmt.Errorf("kube-proxy %s on %s metrics: %w", k.Spec.Mode, k.Spec.Node, err)
	}
	m, err := ParseKubeProxyMetrics(strings.NewReader(string(body)))
	if err != nil {
		return m, fmt.Errorf("kube-proxy %s on %s metrics: %w", k.Spec.Mode, k.Spec.Node, err)
	}
	return m, nil
}

// WaitSynced polls the metrics until kube-proxy has applied everything
// written before t (Synced(t)), or timeout. It returns the metrics seen last.
func (k *KubeProxy) WaitSynced(ctx context.Context, t time.Time, timeout, poll time.Duration) (KubeProxyMetrics, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last KubeProxyMetrics
	var lastErr error
	for {
		m, err := k.Metrics(ctx)
		if err == nil {
			last, lastErr = m, nil
			if m.Synced(t) {
				return m, nil
			}
		} else {
			lastErr = err
		}
		if !k.Proc.Alive() {
			return last, fmt.Errorf("kube-proxy %s on %s exited; see %s", k.Spec.Mode, k.Spec.Node, k.Spec.Log)
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return last, fmt.Errorf("kube-proxy %s on %s not synced after %s: %w", k.Spec.Mode, k.Spec.Node, timeout, lastErr)
			}
			return last, fmt.Errorf("kube-proxy %s on %s not synced after %s (pending: %g services, %g endpoints changes)",
				k.Spec.Mode, k.Spec.Node, timeout, last.ServicesPending, last.EndpointsPending)
		case <-time.After(poll):
		}
	}
}

// VmHWM returns the peak and current resident set size of pid in bytes
// (/proc/<pid>/status VmHWM and VmRSS).
func VmHWM(pid int) (hwm, rss uint64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseVmStatus(string(data))
}

func parseVmStatus(s string) (hwm, rss uint64, err error) {
	for _, l := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || (k != "VmHWM" && k != "VmRSS") {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("bad %s line %q", k, l)
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("bad %s line %q", k, l)
		}
		if k == "VmHWM" {
			hwm = n << 10
		} else {
			rss = n << 10
		}
	}
	if hwm == 0 {
		return 0, 0, fmt.Errorf("no VmHWM in /proc/<pid>/status (kernel thread or gone)")
	}
	return hwm, rss, nil
}

// Package kubeproxy is what the lab and the Service benchmark know about the
// real kube-proxy they run as the Service baseline: its modes, its command
// line, its health and metrics addresses inside a node's namespace, the sync
// times it logs and the rules it must have written for a Service.
package kubeproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/netnsutil"
)

// Modes of `axon lab up --kube-proxy`.
const (
	None     = "none"     // no kube-proxy (default): axon's socket LB serves Services, or nothing does (baseline)
	IPTables = "iptables" // kube-proxy --proxy-mode=iptables (iptables-nft here)
	NFTables = "nftables" // kube-proxy --proxy-mode=nftables
)

// Modes lists the accepted --kube-proxy values.
var Modes = []string{None, IPTables, NFTables}

// Addresses kube-proxy is told about (docs/lab.md "Lab topology").
const (
	// ServiceCIDRs is the apiserver's --service-cluster-ip-range (dual-stack).
	ServiceCIDRs = "10.96.0.0/16,fd00:10:96::/112"
	// ClusterCIDRs covers the axon (10.244/16, fd00:10:244::/48) and the
	// baseline (10.245/16, fd00:10:245::/48) pod ranges in one prefix per family.
	ClusterCIDRs = "10.244.0.0/15,fd00:10:244::/47"
	// kube-proxy's health and metrics servers, on the node netns' loopback
	// (kube-proxy's own ports; without --kube-proxy the node's agent
	// answers there).
	HealthzAddr = "127.0.0.1:10256"
	MetricsAddr = "127.0.0.1:10249"
)

// Ports are the addresses of kube-proxy's health and metrics servers.
type Ports struct{ Healthz, Metrics string }

var (
	// OwnPorts are kube-proxy's own: the lab's --kube-proxy runs it there.
	OwnPorts = Ports{Healthz: HealthzAddr, Metrics: MetricsAddr}
	// BesideAxonPorts are for a kube-proxy the Service benchmark runs
	// beside an axon agent, which holds kube-proxy's own ports on every
	// node of an axon lab.
	BesideAxonPorts = Ports{Healthz: "127.0.0.1:10356", Metrics: "127.0.0.1:10349"}
)

func ValidMode(m string) bool {
	for _, k := range Modes {
		if m == k {
			return true
		}
	}
	return false
}

// Tools are the binaries kube-proxy execs in each mode.
func Tools(mode string) []string {
	switch mode {
	case IPTables:
		return []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}
	case NFTables:
		return []string{"nft"}
	}
	return nil
}

// Args is kube-proxy's command line (binary first) for the node
// named node; the lab and the Service benchmark (internal/bench) both run
// kube-proxy with it, so the two cannot drift. The conntrack table's size
// flags are "leave as is": nf_conntrack_max and the hash size are
// machine-wide (root netns / module parameters), which the lab never
// changes. The TCP timeouts keep kube-proxy's defaults (established 24 h,
// CLOSE_WAIT 1 h): those sysctls are per network namespace, so kube-proxy
// sets them in the node's own netns, as on a real node (the e2e suite's
// KubeProxy CLOSE_WAIT spec checks it). What else kube-proxy writes
// (route_localnet in iptables mode, its own oom_score_adj) is per network
// namespace or per process.
//
// ports are where its health and metrics servers listen.
func Args(bin, mode, kubeconfig, node string, ports Ports, masqueradeAll bool) []string {
	args := []string{
		bin,
		"--proxy-mode=" + mode,
		"--kubeconfig=" + kubeconfig,
		"--hostname-override=" + node,
		"--cluster-cidr=" + ClusterCIDRs,
		"--detect-local-mode=ClusterCIDR",
		"--healthz-bind-address=" + ports.Healthz,
		"--metrics-bind-address=" + ports.Metrics,
		"--conntrack-max-per-core=0",
		"--conntrack-min=0",
		"--conntrack-udp-timeout=0",
		"--conntrack-udp-timeout-stream=0",
		"--oom-score-adj=0",
		"--v=2", // logs "SyncProxyRules complete" elapsed=... (KubeProxySyncTimes)
	}
	if masqueradeAll {
		// axon pods: replies from a local backend go pod-to-pod through
		// bpf_redirect_peer and would skip the conntrack entry that undoes
		// the DNAT. SNAT to the node makes every reply cross the stack.
		args = append(args, "--masquerade-all")
	}
	return args
}

// Health is kube-proxy's /healthz answer inside a node netns.
type Health struct {
	OK          bool      // HTTP 200
	Status      string    // HTTP status line or the error
	LastUpdated time.Time // last successful sync
}

// Healthz asks the kube-proxy in the named lab namespace for /healthz (3 s at most).
func Healthz(ctx context.Context, nsName string) (Health, error) {
	body, status, err := HTTPGet(ctx, netnsutil.Path(nsName), HealthzAddr, "/healthz", 3*time.Second)
	if err != nil {
		return Health{Status: err.Error()}, err
	}
	h := Health{Status: status, OK: strings.HasPrefix(status, "200 ")}
	var j struct {
		LastUpdated string `json:"lastUpdated"`
	}
	if json.Unmarshal(body, &j) == nil {
		h.LastUpdated, _ = time.Parse(time.RFC3339Nano, j.LastUpdated)
	}
	return h, nil
}

// SyncTime is one "SyncProxyRules complete" line of a kube-proxy log.
type SyncTime struct {
	At      time.Time     // when kube-proxy logged it (klog has no year: the log file's year)
	Family  string        // "IPv4" or "IPv6" (one proxier per family in dual-stack)
	Elapsed time.Duration // kube-proxy's own measurement of the sync
}

// klog text: I1122 06:50:00.123456 1234 proxier.go:812] "SyncProxyRules complete" ipFamily="IPv4" elapsed="3.45ms"
var (
	klogHeader  = regexp.MustCompile(`^[IWEF](\d{4} \d{2}:\d{2}:\d{2}\.\d{6})`)
	syncFamily  = regexp.MustCompile(`ipFamily="(IPv[46])"`)
	syncElapsed = regexp.MustCompile(`elapsed="([^"]+)"`)
)

// ParseSyncTimes reads every "SyncProxyRules complete" line of a
// kube-proxy (-v=2, text format) log; year is the year to give the timestamps.
func ParseSyncTimes(r io.Reader, year int) ([]SyncTime, error) {
	var out []SyncTime
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"SyncProxyRules complete"`) {
			continue
		}
		h := klogHeader.FindStringSubmatch(line)
		e := syncElapsed.FindStringSubmatch(line)
		if h == nil || e == nil {
			continue
		}
		at, err := time.Parse("0102 15:04:05.000000", h[1])
		if err != nil {
			continue
		}
		d, err := time.ParseDuration(e[1])
		if err != nil {
			continue
		}
		s := SyncTime{At: at.AddDate(year, 0, 0), Elapsed: d}
		if f := syncFamily.FindStringSubmatch(line); f != nil {
			s.Family = f[1]
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

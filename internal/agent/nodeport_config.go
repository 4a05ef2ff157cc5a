package agent

// Configuration of the north-south load balancer (flags of
// axon-agent). See nodeport.go for the wiring and docs/north-south-lb.md.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	flag "github.com/spf13/pflag"

	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/maglev"
)

// NodePortConfig configures the north-south (NodePort, LoadBalancer,
// externalIP, HostPort) load balancer on the uplink.
type NodePortConfig struct {
	Enabled bool // --nodeport: load and attach it (else only the socket LB translates Services)
	// Acceleration: native = XDP in the uplink's driver or fail; best-effort
	// = native XDP when the driver supports it, else tc; disabled = tc only.
	Acceleration string
	Mode         string       // snat | dsr: how remote backends are reached (ETP Cluster)
	Algorithm    lb.Algorithm // default for Services without the axon.io/lb-algorithm annotation
	MaglevSize   int          // Maglev table size M (prime)
	MaglevSeed   string       // hash seed, the same on every node
	CTMax        int          // conntrack entries
	CTTCPTimeout time.Duration
	CTTCPClose   time.Duration // after FIN/RST
	CTUDPTimeout time.Duration
	// CTTCPUnreplied, CTUDPUnreplied: idle timeouts of flows whose
	// backend has not answered yet (nodeport.CTTimeouts).
	CTTCPUnreplied, CTUDPUnreplied time.Duration
	// CTUnrepliedMax: entries of the unreplied-flow table
	// (nodeport.Options.CTUnrepliedMax), which a flood of new flows fills
	// instead of evicting established ones.
	CTUnrepliedMax int
	CTGCInterval   time.Duration // how often the agent removes expired CT entries
	// SNATPorts: source ports of SNAT flows to remote backends, "min-max"
	// (nodeport.DefaultSNATPortMin/Max). Keep it clear of the node's
	// ip_local_port_range and of the NodePort range (a warning says so).
	SNATPorts string
	// SNATTimeWait: how long a closed TCP flow's SNAT port stays reserved
	// (longer than the backends' TIME_WAIT, 60 s on Linux).
	SNATTimeWait time.Duration
	NATMax       int // reverse NAT entries (SNAT port reservations included)
}

// Values of --lb-acceleration and --nodeport-mode.
var (
	lbAccelerations = []string{"native", "best-effort", "disabled"}
	nodePortModes   = []string{"snat", "dsr"}
)

// DefaultNodePortConfig: tc only, SNAT, random selection, Cilium's table
// size and timeouts.
func DefaultNodePortConfig() NodePortConfig {
	return NodePortConfig{
		Enabled:        true,
		Acceleration:   "disabled",
		Mode:           "snat",
		Algorithm:      lb.AlgorithmRandom,
		MaglevSize:     maglev.DefaultSize,
		CTMax:          131072,
		CTTCPTimeout:   6 * time.Hour,
		CTTCPClose:     10 * time.Second,
		CTUDPTimeout:   60 * time.Second,
		CTTCPUnreplied: nodeport.DefaultCTTimeouts.TCPUnreplied,
		CTUDPUnreplied: nodeport.DefaultCTTimeouts.UDPUnreplied,
		CTUnrepliedMax: nodeport.DefaultCTUnrepliedMax,
		CTGCInterval:   10 * time.Second,
		SNATPorts:      fmt.Sprintf("%d-%d", nodeport.DefaultSNATPortMin, nodeport.DefaultSNATPortMax),
		SNATTimeWait:   nodeport.DefaultSNATTimeWait,
		NATMax:         nodeport.DefaultNATMax,
	}
}

// SNATPortRange parses SNATPorts ("min-max").
func (c NodePortConfig) SNATPortRange() (lo, hi uint16, err error) {
	a, b, ok := strings.Cut(c.SNATPorts, "-")
	x, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 16)
	y, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 16)
	if !ok || err1 != nil || err2 != nil || x < 1 || y < x {
		return 0, 0, fmt.Errorf("--nodeport-snat-ports %q is not a port range min-max with 1 <= min <= max <= 65535 (default %d-%d)",
			c.SNATPorts, nodeport.DefaultSNATPortMin, nodeport.DefaultSNATPortMax)
	}
	return uint16(x), uint16(y), nil
}

// algorithmFlag adapts lb.Algorithm to pflag.
type algorithmFlag struct{ a *lb.Algorithm }

func (f algorithmFlag) String() string { return string(*f.a) }
func (f algorithmFlag) Type() string   { return "algorithm" }
func (f algorithmFlag) Set(s string) error {
	a, err := lb.ParseAlgorithm(s)
	if err != nil {
		return err
	}
	*f.a = a
	return nil
}

// RegisterFlags adds the north-south LB flags to fs.
func (c *NodePortConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Enabled, "nodeport", c.Enabled, "load the north-south load balancer (NodePort, LoadBalancer, externalIPs, HostPort) on the uplink")
	fs.StringVar(&c.Acceleration, "lb-acceleration", c.Acceleration, "north-south LB hook: native (XDP in the driver, fail if unsupported), best-effort (native XDP if the driver supports it, else tc) or disabled (tc only)")
	fs.StringVar(&c.Mode, "nodeport-mode", c.Mode, "remote backends of externalTrafficPolicy=Cluster: snat (source NAT to the node, replies come back through it) or dsr (IPIP to the backend node, client address preserved, replies go direct)")
	fs.Var(algorithmFlag{&c.Algorithm}, "lb-algorithm", "backend selection for Services without the "+lb.AnnotationAlgorithm+" annotation: random or maglev")
	fs.IntVar(&c.MaglevSize, "maglev-table-size", c.MaglevSize, "Maglev lookup table size per frontend, a prime: "+fmt.Sprint(maglev.Sizes))
	fs.StringVar(&c.MaglevSeed, "maglev-hash-seed", c.MaglevSeed, "Maglev permutation seed; must be the same on every node")
	fs.IntVar(&c.CTMax, "ct-max", c.CTMax, "north-south conntrack entries (LRU: a full table evicts the least recently used flow)")
	fs.DurationVar(&c.CTTCPTimeout, "ct-tcp-timeout", c.CTTCPTimeout, "idle timeout of established TCP flows")
	fs.DurationVar(&c.CTTCPClose, "ct-tcp-close-timeout", c.CTTCPClose, "timeout of TCP flows after FIN or RST")
	fs.DurationVar(&c.CTUDPTimeout, "ct-udp-timeout", c.CTUDPTimeout, "idle timeout of UDP (and other non-TCP) flows")
	fs.DurationVar(&c.CTTCPUnreplied, "ct-tcp-unreplied-timeout", c.CTTCPUnreplied, "idle timeout of TCP flows whose backend has not answered yet (an unanswered SYN); at most --ct-tcp-timeout")
	fs.DurationVar(&c.CTUDPUnreplied, "ct-udp-unreplied-timeout", c.CTUDPUnreplied, "idle timeout of UDP flows without a reply yet; at most --ct-udp-timeout")
	fs.IntVar(&c.CTUnrepliedMax, "ct-unreplied-max", c.CTUnrepliedMax, "north-south conntrack entries for flows not answered yet (their own LRU table: a SYN flood evicts only those, never established flows); keep it well below the SNAT port range")
	fs.DurationVar(&c.CTGCInterval, "ct-gc-interval", c.CTGCInterval, "how often the agent removes expired conntrack entries")
	fs.StringVar(&c.SNATPorts, "nodeport-snat-ports", c.SNATPorts, "source ports of NodePort SNAT to remote backends, min-max (per node address and backend address:port); keep it clear of net.ipv4.ip_local_port_range and the NodePort range")
	fs.DurationVar(&c.SNATTimeWait, "nodeport-snat-timewait", c.SNATTimeWait, "how long a closed TCP flow's SNAT port stays reserved; must exceed the backends' TIME_WAIT (60s on Linux)")
	fs.IntVar(&c.NATMax, "nat-max", c.NATMax, "north-south reverse NAT entries, SNAT port reservations included (a full table drops new SNAT flows, metric axon_nodeport_snat_no_port_total)")
}

// Validate says what to fix.
func (c NodePortConfig) Validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if !oneOf(c.Acceleration, lbAccelerations) {
		errs = append(errs, fmt.Errorf("--lb-acceleration %q is invalid: use one of %s", c.Acceleration, strings.Join(lbAccelerations, "|")))
	}
	if !oneOf(c.Mode, nodePortModes) {
		errs = append(errs, fmt.Errorf("--nodeport-mode %q is invalid: use one of %s", c.Mode, strings.Join(nodePortModes, "|")))
	}
	if c.Algorithm != lb.AlgorithmRandom && c.Algorithm != lb.AlgorithmMaglev {
		errs = append(errs, fmt.Errorf("--lb-algorithm %q is invalid: use random or maglev", c.Algorithm))
	}
	if err := maglev.CheckSize(c.MaglevSize); err != nil {
		errs = append(errs, fmt.Errorf("--maglev-table-size: %w", err))
	}
	if c.CTMax < 1024 || c.CTMax > 1<<24 {
		errs = append(errs, fmt.Errorf("--ct-max %d is outside 1024..16777216", c.CTMax))
	}
	if c.CTUnrepliedMax < 64 || c.CTUnrepliedMax > c.CTMax {
		errs = append(errs, fmt.Errorf("--ct-unreplied-max %d is outside 64..--ct-max (%d)", c.CTUnrepliedMax, c.CTMax))
	}
	if c.NATMax < 1024 || c.NATMax > 1<<24 {
		errs = append(errs, fmt.Errorf("--nat-max %d is outside 1024..16777216", c.NATMax))
	}
	if _, _, err := c.SNATPortRange(); err != nil {
		errs = append(errs, err)
	}
	if c.SNATTimeWait < 60*time.Second {
		errs = append(errs, fmt.Errorf("--nodeport-snat-timewait %s is below Linux's TIME_WAIT of 60s: a reused port would meet the backend's old connection (default %s)", c.SNATTimeWait, nodeport.DefaultSNATTimeWait))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--ct-tcp-timeout", c.CTTCPTimeout}, {"--ct-tcp-close-timeout", c.CTTCPClose}, {"--ct-udp-timeout", c.CTUDPTimeout},
		{"--ct-tcp-unreplied-timeout", c.CTTCPUnreplied}, {"--ct-udp-unreplied-timeout", c.CTUDPUnreplied}, {"--ct-gc-interval", c.CTGCInterval}} {
		if d.v < time.Second {
			errs = append(errs, fmt.Errorf("%s %s is below 1s", d.name, d.v))
		}
	}
	return errors.Join(errs...)
}

// snatRangeWarning says why the SNAT port range lo-hi is risky on this node
// ("" if it is not): overlapping the node's ip_local_port_range, a reply to
// a node-local connection to a backend could be taken for a translated
// flow's (the LB does not see the node's own sockets).
func snatRangeWarning(lo, hi uint16) string {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return ""
	}
	elo, err1 := strconv.Atoi(f[0])
	ehi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return ""
	}
	if int(lo) <= ehi && elo <= int(hi) {
		return fmt.Sprintf("the SNAT port range %d-%d overlaps net.ipv4.ip_local_port_range %d-%d: the node's own connections to a backend may collide with translated flows; move one of them (--nodeport-snat-ports)", lo, hi, elo, ehi)
	}
	return ""
}

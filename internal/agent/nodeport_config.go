package agent

// Issue 7: configuration of the north-south load balancer (flags of
// axon-agent). See nodeport.go for the wiring and docs/nslb-control.md.

import (
	"errors"
	"fmt"
	"strings"
	"time"

	flag "github.com/spf13/pflag"

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
	CTGCInterval time.Duration // how often the agent removes expired CT entries
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
		Enabled:      true,
		Acceleration: "disabled",
		Mode:         "snat",
		Algorithm:    lb.AlgorithmRandom,
		MaglevSize:   maglev.DefaultSize,
		CTMax:        131072,
		CTTCPTimeout: 6 * time.Hour,
		CTTCPClose:   10 * time.Second,
		CTUDPTimeout: 60 * time.Second,
		CTGCInterval: 10 * time.Second,
	}
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

// RegisterFlags adds the issue-7 flags to fs.
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
	fs.DurationVar(&c.CTGCInterval, "ct-gc-interval", c.CTGCInterval, "how often the agent removes expired conntrack entries")
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
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--ct-tcp-timeout", c.CTTCPTimeout}, {"--ct-tcp-close-timeout", c.CTTCPClose}, {"--ct-udp-timeout", c.CTUDPTimeout}, {"--ct-gc-interval", c.CTGCInterval}} {
		if d.v < time.Second {
			errs = append(errs, fmt.Errorf("%s %s is below 1s", d.name, d.v))
		}
	}
	return errors.Join(errs...)
}

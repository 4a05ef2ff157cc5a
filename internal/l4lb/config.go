// Package l4lb is the standalone layer-4 load balancer (`axon lb --config
// lb.yaml`): the north-south XDP/tc load balancer of internal/datapath run
// without Kubernetes, like Katran or Cilium's standalone L4LB. A YAML file
// lists virtual IPs (VIPs) with their backends; the file is validated
// strictly (every error names the field and says what to do), programmed,
// and reloaded on SIGHUP or when it changes, applying only the difference:
// established flows keep their backend (conntrack), new flows see the new
// backend set, and Maglev keeps most flows of unchanged backends where they
// were. A config that fails validation is rejected and the old one keeps
// running.
package l4lb

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/maglev"
)

// Defaults of the optional settings.
const (
	DefaultBPFRoot    = "/sys/fs/bpf/axon-l4lb"
	DefaultSocket     = "/run/axon/l4lb.sock"
	DefaultXDPMode    = "best-effort"
	DefaultCTMax      = 262144
	DefaultTCPTimeout = 6 * time.Hour
	DefaultUDPTimeout = 60 * time.Second
)

// XDP modes, as --lb-acceleration of the agent: native = XDP in the driver or
// fail; best-effort = native XDP when the driver supports it, else tc;
// disabled = tc only.
var xdpModes = []string{"native", "best-effort", "disabled"}

// File is the YAML document as written by the user. Every field is
// documented in docs/l4lb.md.
type File struct {
	Interface     string     `yaml:"interface"`     // device the load balancer attaches to (required)
	XDPMode       string     `yaml:"xdpMode"`       // native | best-effort | disabled (default best-effort)
	SourceAddress string     `yaml:"sourceAddress"` // outer source of IPIP (DSR) and SNAT; default: the interface's first address
	BPFRoot       string     `yaml:"bpfRoot"`       // bpffs pin directory (default /sys/fs/bpf/axon-l4lb)
	Socket        string     `yaml:"socket"`        // status socket (default /run/axon/l4lb.sock)
	Maglev        MaglevFile `yaml:"maglev"`
	Conntrack     CTFile     `yaml:"conntrack"`
	VIPs          []VIPFile  `yaml:"vips"`
}

// MaglevFile is the maglev: section.
type MaglevFile struct {
	TableSize int    `yaml:"tableSize"` // prime, default 16381
	Seed      string `yaml:"seed"`      // hash seed; all load balancers of a VIP must share it
}

// CTFile is the conntrack: section.
type CTFile struct {
	Max        int    `yaml:"max"`        // entries (default 262144)
	TCPTimeout string `yaml:"tcpTimeout"` // idle timeout of established TCP flows (default 6h)
	UDPTimeout string `yaml:"udpTimeout"` // idle timeout of UDP flows (default 60s)
}

// VIPFile is one entry of vips:.
type VIPFile struct {
	Name       string        `yaml:"name"`       // optional label for status output
	Address    string        `yaml:"address"`    // the virtual IP (required)
	Port       int           `yaml:"port"`       // required
	Protocol   string        `yaml:"protocol"`   // tcp | udp (default tcp)
	Algorithm  string        `yaml:"algorithm"`  // maglev | random (default maglev)
	Forwarding string        `yaml:"forwarding"` // dsr (IPIP encapsulation, default) | snat
	Backends   []BackendFile `yaml:"backends"`
}

// BackendFile is one entry of a VIP's backends:.
type BackendFile struct {
	Address string `yaml:"address"` // required
	Port    int    `yaml:"port"`    // snat: target port (default: the VIP port); dsr: must be absent or equal to the VIP port
	Weight  *int   `yaml:"weight"`  // relative Maglev weight 0..65535 (default 1; 0 = drained: keeps its flows, gets no new ones)
}

// Config is a validated File.
type Config struct {
	Interface     string
	XDPMode       string
	SourceAddress netip.Addr // zero = the interface's first address of the family
	BPFRoot       string
	Socket        string
	MaglevSize    int
	MaglevSeed    string
	CTMax         int
	TCPTimeout    time.Duration
	UDPTimeout    time.Duration
	VIPs          []VIP // sorted by key
}

// VIP is one validated virtual IP.
type VIP struct {
	Name      string
	Key       lb.FrontendKey // Addr, Port, Proto; Scope is always ScopeCluster
	Algorithm lb.Algorithm   // maglev or random
	DSR       bool           // true: IPIP to the backend, which replies directly; false: SNAT
	Backends  []Backend      // sorted by address, port
}

// Backend is one validated backend.
type Backend struct {
	Addr   netip.Addr
	Port   uint16
	Weight uint32
}

// Name identifies a backend in Maglev tables and status: addr:port.
func (b Backend) Name() string { return netip.AddrPortFrom(b.Addr, b.Port).String() }

// ReadFile reads and validates a config file.
func ReadFile(path string) (*Config, []byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, b, fmt.Errorf("%s: %w", path, err)
	}
	return c, b, nil
}

// Parse decodes YAML strictly (unknown fields are errors) and validates it.
// The error lists every problem found, one per line, each naming its field.
func Parse(data []byte) (*Config, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the config is empty: it needs at least `interface:` and `vips:` (see docs/nslb-control.md)")
		}
		return nil, fmt.Errorf("not a valid config: %s (see docs/nslb-control.md for the fields)", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra File
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("the config holds more than one YAML document: keep one")
	}
	return f.Validate()
}

// Validate checks every field and returns the config with defaults filled in.
func (f *File) Validate() (*Config, error) {
	var errs []string
	bad := func(field, format string, args ...any) {
		errs = append(errs, field+": "+fmt.Sprintf(format, args...))
	}
	c := &Config{
		Interface: f.Interface, XDPMode: cmp.Or(f.XDPMode, DefaultXDPMode),
		BPFRoot: cmp.Or(f.BPFRoot, DefaultBPFRoot), Socket: cmp.Or(f.Socket, DefaultSocket),
		MaglevSize: cmp.Or(f.Maglev.TableSize, maglev.DefaultSize), MaglevSeed: f.Maglev.Seed,
		CTMax: cmp.Or(f.Conntrack.Max, DefaultCTMax), TCPTimeout: DefaultTCPTimeout, UDPTimeout: DefaultUDPTimeout,
	}
	switch {
	case f.Interface == "":
		bad("interface", "missing: name the device the load balancer attaches to, e.g. `interface: eth0`")
	case len(f.Interface) > 15 || strings.ContainsAny(f.Interface, "/ \t"):
		bad("interface", "%q is not a network device name (at most 15 characters, no '/' or spaces)", f.Interface)
	}
	if !slices.Contains(xdpModes, c.XDPMode) {
		bad("xdpMode", "%q is not one of %s", c.XDPMode, strings.Join(xdpModes, ", "))
	}
	if f.SourceAddress != "" {
		a, err := parseUnicast(f.SourceAddress)
		if err != nil {
			bad("sourceAddress", "%v", err)
		}
		c.SourceAddress = a
	}
	if !strings.HasPrefix(c.Socket, "/") {
		bad("socket", "%q is not an absolute path", c.Socket)
	}
	if !strings.HasPrefix(c.BPFRoot, "/") {
		bad("bpfRoot", "%q is not an absolute path on bpffs", c.BPFRoot)
	}
	if err := maglev.CheckSize(c.MaglevSize); err != nil {
		bad("maglev.tableSize", "%v", err)
	}
	if c.CTMax < 1024 || c.CTMax > 1<<24 {
		bad("conntrack.max", "%d is outside 1024..16777216", c.CTMax)
	}
	for _, d := range []struct {
		field, val string
		dst        *time.Duration
	}{{"conntrack.tcpTimeout", f.Conntrack.TCPTimeout, &c.TCPTimeout}, {"conntrack.udpTimeout", f.Conntrack.UDPTimeout, &c.UDPTimeout}} {
		if d.val == "" {
			continue
		}
		v, err := time.ParseDuration(d.val)
		if err != nil || v < time.Second {
			bad(d.field, "%q is not a duration of at least 1s, such as 30s or 2h", d.val)
			continue
		}
		*d.dst = v
	}

	seen := map[lb.FrontendKey]int{}
	names := map[string]int{}
	for i, vf := range f.VIPs {
		field := fmt.Sprintf("vips[%d]", i)
		v, ok := validateVIP(field, vf, bad)
		if !ok {
			continue
		}
		if j, dup := seen[v.Key]; dup {
			bad(field, "%s is the same VIP as vips[%d]: merge their backends into one entry", fmtKey(v.Key), j)
			continue
		}
		seen[v.Key] = i
		if v.Name != "" {
			if j, dup := names[v.Name]; dup {
				bad(field+".name", "%q is also the name of vips[%d]: names must be unique", v.Name, j)
			}
			names[v.Name] = i
		}
		if c.SourceAddress.IsValid() && c.SourceAddress.Is4() != v.Key.Addr.Is4() {
			bad("sourceAddress", "%s is not of the family of vips[%d] (%s): leave sourceAddress empty to use the interface's address of each family", c.SourceAddress, i, v.Key.Addr)
		}
		c.VIPs = append(c.VIPs, v)
	}
	if len(f.VIPs) == 0 {
		bad("vips", "missing: list at least one VIP with its backends")
	}
	if len(errs) > 0 {
		return nil, &ValidationError{Problems: errs}
	}
	slices.SortFunc(c.VIPs, func(a, b VIP) int { return lb.CompareKeys(a.Key, b.Key) })
	return c, nil
}

// ValidationError lists every problem of a config, one per field.
type ValidationError struct{ Problems []string }

func (e *ValidationError) Error() string {
	if len(e.Problems) == 1 {
		return "invalid config: " + e.Problems[0]
	}
	return fmt.Sprintf("invalid config (%d problems):\n  %s", len(e.Problems), strings.Join(e.Problems, "\n  "))
}

func validateVIP(field string, vf VIPFile, bad func(field, format string, args ...any)) (VIP, bool) {
	ok := true
	fail := func(f, format string, args ...any) {
		bad(f, format, args...)
		ok = false
	}
	v := VIP{Name: vf.Name, Algorithm: lb.AlgorithmMaglev, DSR: true}
	addr, err := parseUnicast(vf.Address)
	if err != nil {
		fail(field+".address", "%v", err)
	}
	if vf.Port < 1 || vf.Port > 65535 {
		fail(field+".port", "%d is outside 1..65535: every VIP needs its port", vf.Port)
	}
	var proto lb.Proto
	switch strings.ToLower(cmp.Or(vf.Protocol, "tcp")) {
	case "tcp":
		proto = lb.TCP
	case "udp":
		proto = lb.UDP
	default:
		fail(field+".protocol", "%q is not tcp or udp", vf.Protocol)
	}
	if vf.Algorithm != "" {
		a, err := lb.ParseAlgorithm(vf.Algorithm)
		if err != nil {
			fail(field+".algorithm", "%v", err)
		}
		v.Algorithm = a
	}
	switch strings.ToLower(cmp.Or(vf.Forwarding, "dsr")) {
	case "dsr":
	case "snat":
		v.DSR = false
	default:
		fail(field+".forwarding", "%q is not dsr or snat (dsr: IPIP to the backend, replies go straight to the client; snat: replies come back through the load balancer)", vf.Forwarding)
	}
	v.Key = lb.FrontendKey{Addr: addr, Port: uint16(vf.Port), Proto: proto, Scope: lb.ScopeCluster}
	if len(vf.Backends) == 0 {
		fail(field+".backends", "empty: list at least one backend (address and optional weight), or remove the VIP")
	}
	seen := map[netip.AddrPort]int{}
	var weight uint64
	for j, bf := range vf.Backends {
		bfield := fmt.Sprintf("%s.backends[%d]", field, j)
		a, err := parseUnicast(bf.Address)
		if err != nil {
			fail(bfield+".address", "%v", err)
			continue
		}
		if addr.IsValid() && a.Is4() != addr.Is4() {
			fail(bfield+".address", "%s is not of the VIP's family (%s): IPv4 VIPs need IPv4 backends, IPv6 VIPs IPv6 backends", a, addr)
			continue
		}
		port := bf.Port
		switch {
		case port == 0:
			port = vf.Port
		case port < 0 || port > 65535:
			fail(bfield+".port", "%d is outside 1..65535", port)
			continue
		case v.DSR && port != vf.Port:
			fail(bfield+".port", "%d differs from the VIP port %d: with DSR the backend receives the original packet (IPIP), so it must listen on the VIP port; remove the port or use `forwarding: snat`", port, vf.Port)
			continue
		}
		w := 1
		if bf.Weight != nil {
			w = *bf.Weight
		}
		if w < 0 || w > maglev.MaxWeight {
			fail(bfield+".weight", "%d is outside 0..%d", w, maglev.MaxWeight)
			continue
		}
		ap := netip.AddrPortFrom(a, uint16(port))
		if k, dup := seen[ap]; dup {
			fail(bfield, "%s is listed twice (also backends[%d]): remove one", ap, k)
			continue
		}
		seen[ap] = j
		weight += uint64(w)
		v.Backends = append(v.Backends, Backend{Addr: a, Port: uint16(port), Weight: uint32(w)})
	}
	if len(v.Backends) > 0 && weight == 0 {
		fail(field+".backends", "every backend has weight 0: give at least one a weight above 0")
	}
	slices.SortFunc(v.Backends, func(a, b Backend) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	return v, ok
}

func parseUnicast(s string) (netip.Addr, error) {
	if strings.TrimSpace(s) == "" {
		return netip.Addr{}, errors.New("missing: write an IPv4 or IPv6 address")
	}
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address: write an IPv4 or IPv6 address such as 198.18.0.100", s)
	}
	a = a.Unmap()
	if a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a.IsLinkLocalUnicast() {
		return netip.Addr{}, fmt.Errorf("%s is not a routable unicast address", a)
	}
	return a, nil
}

func fmtKey(k lb.FrontendKey) string {
	return netip.AddrPortFrom(k.Addr, k.Port).String() + "/" + k.Proto.String()
}

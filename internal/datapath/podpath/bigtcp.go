package podpath

import (
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
)

const (
	// BigTCPMaxSize is the GSO/GRO size axon asks for (192 KiB, Cilium's
	// default): large enough for the gain, small enough for socket buffers.
	BigTCPMaxSize = 196608
	// gsoLegacyMax is the kernel's default and the pre-BIG-TCP limit.
	gsoLegacyMax = 65536
)

// BigTCP is the BIG TCP decision for this node's pod devices.
type BigTCP struct {
	IPv4, IPv6 bool   // enabled per family
	Size       uint32 // GSO/GRO size for enabled families
	Reason     string
}

// apply fills the sizes of dev: Size for an enabled family, 0 (kernel
// default, not touched) otherwise. gso/gro_max_size are IPv6's (and the
// cap of IPv4's), gso/gro_ipv4_max_size IPv4's.
func (b BigTCP) apply(dev *api.DeviceConfig) {
	if b.IPv6 {
		dev.GSOMaxSize, dev.GROMaxSize = b.Size, b.Size
	}
	if b.IPv4 {
		dev.GSOIPv4MaxSize, dev.GROIPv4MaxSize = b.Size, b.Size
		if !b.IPv6 {
			// the kernel caps gso_ipv4_max_size at gso_max_size when the
			// latter is lowered; keep IPv6 at the legacy size explicitly
			dev.GSOMaxSize, dev.GROMaxSize = gsoLegacyMax, gsoLegacyMax
		}
	}
}

// Value is the decision's short form: "ipv4+ipv6 192KiB", "ipv6 ...", "off".
func (b BigTCP) Value() string {
	var fam []string
	if b.IPv4 {
		fam = append(fam, "ipv4")
	}
	if b.IPv6 {
		fam = append(fam, "ipv6")
	}
	if len(fam) == 0 {
		return "off"
	}
	return fmt.Sprintf("%s %d", strings.Join(fam, "+"), b.Size)
}

// UplinkLimits are the uplink's GSO limits as netlink reports them.
type UplinkLimits struct {
	TSOMaxSize     uint32 // IFLA_TSO_MAX_SIZE: what the driver can take
	GSOMaxSize     uint32 // IFLA_GSO_MAX_SIZE
	GSOIPv4MaxSize uint32 // IFLA_GSO_IPV4_MAX_SIZE, 0 on kernels < 6.3 (no IPv4 BIG TCP)
}

// ReadUplinkLimits reads the limits of device name in the current netns.
func ReadUplinkLimits(name string) (UplinkLimits, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return UplinkLimits{}, fmt.Errorf("read BIG TCP limits of uplink %s: %w", name, err)
	}
	a := l.Attrs()
	return UplinkLimits{TSOMaxSize: a.TSOMaxSize, GSOMaxSize: a.GSOMaxSize, GSOIPv4MaxSize: a.GSOIPv4MaxSize}, nil
}

// DecideBigTCP turns the per-family switches, the kernel probe and the
// uplink's limits into the sizes for pod devices: up to BigTCPMaxSize, never
// above what the uplink's driver takes (tso_max_size).
func DecideBigTCP(wantV4, wantV6 bool, probe datapath.Capability, uplink string, lim UplinkLimits) BigTCP {
	if !wantV4 && !wantV6 {
		return BigTCP{Reason: "off: --enable-ipv4-big-tcp=false and --enable-ipv6-big-tcp=false"}
	}
	if !probe.Available {
		return BigTCP{Reason: "off: " + probe.Reason}
	}
	if lim.TSOMaxSize <= gsoLegacyMax {
		return BigTCP{Reason: fmt.Sprintf("off: uplink %s has tso_max_size %d (its driver takes no GSO packets over 64 KiB)", uplink, lim.TSOMaxSize)}
	}
	size := min(uint32(BigTCPMaxSize), lim.TSOMaxSize)
	b := BigTCP{IPv6: wantV6, IPv4: wantV4, Size: size}
	var notes []string
	if wantV4 && lim.GSOIPv4MaxSize == 0 {
		b.IPv4 = false
		notes = append(notes, "ipv4 off: the kernel has no gso_ipv4_max_size (needs 6.3+)")
	}
	if !wantV4 {
		notes = append(notes, "ipv4 off by --enable-ipv4-big-tcp=false")
	}
	if !wantV6 {
		notes = append(notes, "ipv6 off by --enable-ipv6-big-tcp=false")
	}
	if !b.IPv4 && !b.IPv6 {
		return BigTCP{Reason: "off: " + strings.Join(notes, "; ")}
	}
	b.Reason = fmt.Sprintf("pod devices (both ends) get gso/gro max size %d: uplink %s tso_max_size %d, gso_max_size %d, gso_ipv4_max_size %d",
		size, uplink, lim.TSOMaxSize, lim.GSOMaxSize, lim.GSOIPv4MaxSize)
	if len(notes) > 0 {
		b.Reason += "; " + strings.Join(notes, "; ")
	}
	return b
}

// DecisionBigTCP names the BIG TCP decision in `axon status`.
const DecisionBigTCP = "big_tcp"

// decideBigTCP adds the "big_tcp" decision (called by decide).
func (d *Datapath) decideBigTCP() {
	var lim UplinkLimits
	var err error
	if d.cfg.Uplink != "" {
		lim, err = ReadUplinkLimits(d.cfg.Uplink)
	}
	switch {
	case err != nil:
		d.bigTCP = BigTCP{Reason: "off: " + err.Error()}
	default:
		d.bigTCP = DecideBigTCP(d.cfg.EnableIPv4BigTCP, d.cfg.EnableIPv6BigTCP, d.feats.BigTCP, d.cfg.Uplink, lim)
	}
	d.decisions = append(d.decisions, api.Decision{Name: DecisionBigTCP, Value: d.bigTCP.Value(), Reason: d.bigTCP.Reason})
}

// BigTCPState is the BIG TCP decision in effect.
func (d *Datapath) BigTCPState() BigTCP { return d.bigTCP }

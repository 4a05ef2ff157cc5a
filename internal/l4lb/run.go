package l4lb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/maglev"
	"github.com/axonhq/axon/internal/nodeportapi"
)

// npDatapath programs VIPs into a nodeport.LB.
type npDatapath struct{ np *nodeport.LB }

func (d npDatapath) UpsertVIP(f lb.Frontend, dsr bool, table []int) error {
	o := nodeport.FrontendOptions{Mode: nodeport.ModeSNAT}
	if dsr {
		o.Mode = nodeport.ModeDSR
	}
	if table != nil {
		o.Maglev = make([]uint32, len(table))
		for i, v := range table {
			o.Maglev[i] = uint32(v)
		}
	}
	return d.np.UpsertFrontendWith(f, o)
}

func (d npDatapath) DeleteVIP(k lb.FrontendKey) error { return d.np.DeleteFrontend(k) }

func (d npDatapath) Flows() (map[lb.FrontendKey]int, map[netip.AddrPort]int, int, int, error) {
	es, err := d.np.CT()
	if err != nil {
		return nil, nil, 0, 0, err
	}
	perVIP, perBE := map[lb.FrontendKey]int{}, map[netip.AddrPort]int{}
	for _, e := range es {
		perVIP[lb.FrontendKey{Addr: e.Flow.Dst.Addr(), Port: e.Flow.Dst.Port(), Proto: e.Flow.Proto}]++
		perBE[e.Backend]++
	}
	return perVIP, perBE, len(es), int(d.np.Options().CTMax), nil
}

func (d npDatapath) Packets() (map[string]uint64, error) {
	m, err := d.np.Metrics()
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, row := range m {
		for reason, v := range row {
			if v > 0 {
				out[reason] += v
			}
		}
	}
	return out, nil
}

// RunOptions tune Run.
type RunOptions struct {
	Log          *slog.Logger
	Reload       <-chan os.Signal // SIGHUP: reload now
	PollInterval time.Duration    // how often the file is checked for changes (default 1s)
	GCInterval   time.Duration    // conntrack garbage collection (default 10s)
	// Ready, if set, is called once the load balancer is programmed and attached.
	Ready func(*Runner)
}

// Run is `axon lb --config path`: it loads the north-south load balancer
// in the current network namespace, attaches it to the configured
// interface, programs the VIPs and serves the status socket until ctx is
// done. On return the programs stay attached and keep balancing with the
// last config (pins under bpfRoot); the next Run adopts them and its flows.
// Uninstall removes them.
func Run(ctx context.Context, path string, o RunOptions) error {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.GCInterval <= 0 {
		o.GCInterval = 10 * time.Second
	}
	cfg, raw, err := ReadFile(path)
	if err != nil {
		return err
	}
	addrs, err := sourceAddrs(cfg)
	if err != nil {
		return err
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err == nil && strings.TrimSpace(string(b)) != "1" {
		return fmt.Errorf("IPv4 forwarding is off in this network namespace: the load balancer forwards packets to backends after a FIB lookup, which the kernel refuses without it: run `sysctl -w net.ipv4.ip_forward=1` (and net.ipv6.conf.all.forwarding=1 for IPv6 VIPs)")
	}
	link, err := netlink.LinkByName(cfg.Interface)
	if err != nil {
		return fmt.Errorf("interface %s: %w", cfg.Interface, err)
	}
	np, err := nodeport.Load(nodeport.Options{
		UplinkMTU:       uint32(link.Attrs().MTU), // answer "too big" for what IPIP would push over it
		PinDir:          cfg.BPFRoot,
		NodeAddrs:       addrs,
		Mode:            nodeport.ModeDSR,
		CTMax:           uint32(cfg.CTMax),
		MaglevTableSize: uint32(cfg.MaglevSize),
		HashSeed:        maglev.HashSeed(cfg.MaglevSeed),
		Logger:          log.With("component", "nodeport"),
	})
	if err != nil {
		return fmt.Errorf("load the load balancer: %w", err)
	}
	defer np.Close()
	attach, err := attach(np, cfg.Interface, cfg.XDPMode)
	if err != nil {
		return err
	}
	log.Info("l4lb attached", "interface", cfg.Interface, "how", attach)
	dp := npDatapath{np}
	// Adopt a previous run's VIPs: delete those the config no longer has.
	if prev, err := np.Frontends(); err == nil {
		want := map[lb.FrontendKey]bool{}
		for _, v := range cfg.VIPs {
			want[v.Key] = true
		}
		for _, f := range prev {
			if !want[f.Key] {
				if err := np.DeleteFrontend(f.Key); err != nil {
					log.Warn("remove a VIP of a previous run", "vip", f.Key.String(), "error", err)
				}
			}
		}
	}
	r, err := NewRunner(path, cfg, raw, dp, log)
	if err != nil {
		return err
	}
	r.SetAttachInfo(attach)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- r.serve(ctx, cfg.Socket, log, nodeportapi.Handler{
			LB:      func() (*nodeport.LB, string) { return np, "" },
			Resolve: r.resolve,
		})
	}()
	go r.Watch(ctx, o.Reload, o.PollInterval)
	go func() {
		t := time.NewTicker(o.GCInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c := r.Config()
				if _, err := np.GC(nodeport.CTTimeouts{TCP: c.TCPTimeout, UDP: c.UDPTimeout}); err != nil {
					log.Warn("conntrack garbage collection", "error", err)
				}
			}
		}
	}()
	if o.Ready != nil {
		o.Ready(r)
	}
	select {
	case <-ctx.Done():
		log.Info("l4lb stopping; the programs stay attached and keep balancing with the last config", "pins", cfg.BPFRoot)
		<-errc
		return nil
	case err := <-errc:
		return err
	}
}

// Uninstall detaches the load balancer of the config at path and removes its pins.
func Uninstall(path string) error {
	cfg, _, err := ReadFile(path)
	if err != nil {
		return err
	}
	if err := nodeport.Uninstall(cfg.BPFRoot); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(cfg.BPFRoot, "links"))
	_ = os.Remove(cfg.BPFRoot)
	return nil
}

// resolve finds VIPs by name or address (for `axon bpf lb maglev get`).
func (r *Runner) resolve(name string) ([]lb.Frontend, error) {
	cfg := r.Config()
	var out []lb.Frontend
	for _, v := range cfg.VIPs {
		if v.Name == name || v.Key.Addr.String() == name || strings.EqualFold(fmtKey(v.Key), name) {
			out = append(out, lb.Frontend{Key: v.Key, Service: v.Name})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no VIP named %q in %s", name, r.path)
	}
	return out, nil
}

// attach attaches per xdpMode and describes the result.
func attach(np *nodeport.LB, ifname, mode string) (string, error) {
	how, err := np.AttachAccelerated(ifname, mode)
	if xe := (*nodeport.NativeXDPError)(nil); errors.As(err, &xe) {
		return "", fmt.Errorf("xdpMode native: %w (set xdpMode: best-effort to fall back to tc)", xe.Err)
	}
	if err != nil {
		return "", fmt.Errorf("attach to %s: %w", ifname, err)
	}
	return how, nil
}

// sourceAddrs is sourceAddress, else the interface's global addresses.
func sourceAddrs(cfg *Config) ([]netip.Addr, error) {
	if cfg.SourceAddress.IsValid() {
		return []netip.Addr{cfg.SourceAddress}, nil
	}
	l, err := netlink.LinkByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w: check `interface:` (devices are looked up in axon lb's network namespace)", cfg.Interface, err)
	}
	list, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", cfg.Interface, err)
	}
	var out []netip.Addr
	for _, a := range list {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.IsGlobalUnicast() && !ip.IsLinkLocalUnicast() {
			out = append(out, ip)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("interface %s has no global address to use as the IPIP/SNAT source: add one or set `sourceAddress:`", cfg.Interface)
	}
	return out, nil
}

// serve is Serve with the north-south routes (ct, nat, maglev, explain).
func (r *Runner) serve(ctx context.Context, path string, log *slog.Logger, ns api.NorthSouthHandler) error {
	return r.serveMux(ctx, path, log, func(mux *http.ServeMux) { api.MountNorthSouth(mux, ns, log) })
}

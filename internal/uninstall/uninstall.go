// Package uninstall removes everything axon-agent and axon-cni put on a
// node, so that another CNI plugin can take over: the BPF programs and
// links (tcx, legacy cls_bpf filters, XDP, netkit, the cgroup links of the
// socket LB and the same-node TCP bypass) and every pin under the pin
// directory, the pods' host-side devices, the agent's routes, the
// Bandwidth Manager's root qdisc, the CNI configuration file and binary,
// and the agent's state directory. It runs in the node's network
// namespace and refuses while an agent still runs for that node.
package uninstall

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/bwm"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/datapath/podlb"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/datapath/sockmap"
	"github.com/axonhq/axon/internal/datapath/vmbypass"
)

// Options say where the agent kept its state; the defaults are the agent's.
type Options struct {
	BPFRoot     string // the agent's --bpf-root
	StateDir    string // the agent's --state-dir
	Socket      string // the agent's --socket
	CgroupRoot  string // the agent's --cgroup-root (socket LB, bypass); "" = none checked
	CNIConfDir  string // where the configuration list is; "" = leave it
	CNIConfFile string // its name in CNIConfDir (05-axon.conflist)
	CNIBinDir   string // where axon-cni is; "" = leave it
	// RouteProtocol marks the agent's routes (every table, both families).
	RouteProtocol netlink.RouteProtocol
	// DevicePrefix is the alias prefix of the pods' host-side devices
	// ("axon-cni:"): exactly the devices axon-cni made.
	DevicePrefix string
	DryRun       bool
}

// Item is one thing found on the node, removed (or, with DryRun, to remove).
type Item struct {
	Kind string `json:"kind"` // bpf-link, bpf-pin, device, route, qdisc, file, dir
	What string `json:"what"`
}

func (i Item) String() string { return i.Kind + " " + i.What }

// stateEntries are the names the agent keeps in its state directory: only
// these are removed, and the directory only when nothing else is in it.
var stateEntries = []string{"ipam", "endpoints", "node.json"}

// CNIBinary is the plugin's file name in the CNI binary directory.
const CNIBinary = "axon-cni"

// ErrAgentRunning says that an agent still runs for the node.
var ErrAgentRunning = errors.New("axon-agent still runs")

// Run finds what axon left and removes it (or, with DryRun, only lists it).
// It returns what it found; an empty list means nothing was left. Errors
// say what could not be removed; Run removes as much as it can.
func Run(o Options, log *slog.Logger) ([]Item, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	unlock, err := o.lockOut()
	if err != nil {
		if !o.DryRun {
			return nil, err
		}
		log.Warn("uninstall would refuse now", "reason", err.Error())
	}
	defer unlock()
	found, err := o.find()
	if err != nil || o.DryRun {
		return found, err
	}
	return found, o.remove(found, log)
}

func (o Options) validate() error {
	for flag, p := range map[string]string{"--bpf-root": o.BPFRoot, "--state-dir": o.StateDir} {
		if p == "" || !filepath.IsAbs(p) || filepath.Clean(p) == "/" {
			return fmt.Errorf("%s %q: pass the agent's absolute directory (not /)", flag, p)
		}
	}
	if ok, err := datapath.IsBPFFS(filepath.Dir(o.BPFRoot)); err == nil && !ok {
		return fmt.Errorf("--bpf-root %s is not on a bpf filesystem: pass the agent's --bpf-root, e.g. %s", o.BPFRoot, "/sys/fs/bpf/axon")
	}
	return nil
}

// lockOut refuses while an agent runs for the node: the agent holds the
// lock of <state dir>/ipam for its lifetime, and serves --socket. The lock
// is then held until Run returns, so that no agent starts meanwhile.
func (o Options) lockOut() (func(), error) {
	nop := func() {}
	stop := "stop it first (kubectl -n kube-system delete daemonset axon-agent, or remove the node from the DaemonSet with a nodeSelector; outside Kubernetes: kill its PID) and run axon uninstall again"
	if o.Socket != "" {
		if c, err := net.DialTimeout("unix", o.Socket, time.Second); err == nil {
			c.Close()
			return nop, fmt.Errorf("%w: it serves %s: %s", ErrAgentRunning, o.Socket, stop)
		}
	}
	lockPath := filepath.Join(o.StateDir, "ipam", "lock")
	f, err := os.OpenFile(lockPath, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nop, nil
	}
	if err != nil {
		return nop, fmt.Errorf("open %s: %w", lockPath, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nop, fmt.Errorf("%w: it holds %s: %s", ErrAgentRunning, lockPath, stop)
		}
		return nop, fmt.Errorf("lock %s: %w", lockPath, err)
	}
	return func() { f.Close() }, nil
}

// find lists what is left, in the order remove takes it away.
func (o Options) find() ([]Item, error) {
	var items []Item
	var errs []error
	// BPF: every pin (links first), under the pin directory
	var links, pins []Item
	err := filepath.WalkDir(o.BPFRoot, func(p string, d os.DirEntry, err error) error {
		if errors.Is(err, os.ErrNotExist) && p == o.BPFRoot {
			return filepath.SkipDir
		}
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if filepath.Dir(p) == datapath.LinksDir(o.BPFRoot) {
			links = append(links, Item{"bpf-link", p})
		} else {
			pins = append(pins, Item{"bpf-pin", p})
		}
		return nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("list pins under %s: %w", o.BPFRoot, err))
	}
	items = append(append(items, links...), pins...)
	if _, err := os.Stat(o.BPFRoot); err == nil {
		items = append(items, Item{"dir", o.BPFRoot})
	}
	// devices axon-cni made (deleting one end of a pair deletes the pair)
	devs, err := netlink.LinkList()
	if err != nil {
		errs = append(errs, fmt.Errorf("list devices: %w", err))
	}
	for _, l := range devs {
		if a := l.Attrs(); o.DevicePrefix != "" && strings.HasPrefix(a.Alias, o.DevicePrefix) {
			items = append(items, Item{"device", fmt.Sprintf("%s (%s, %s)", a.Name, l.Type(), a.Alias)})
		}
	}
	// the agent's routes, every table
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Protocol: o.RouteProtocol, Table: unix.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			errs = append(errs, fmt.Errorf("list routes: %w", err))
		}
		for _, r := range rs {
			items = append(items, Item{"route", routeString(r)})
		}
	}
	// the Bandwidth Manager's root qdisc (handle a0:)
	for _, l := range devs {
		qs, err := netlink.QdiscList(l)
		if err != nil {
			continue
		}
		for _, q := range qs {
			if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Attrs().Handle == netlink.MakeHandle(0xa0, 0) {
				items = append(items, Item{"qdisc", fmt.Sprintf("%s root %s (Bandwidth Manager)", l.Attrs().Name, q.Type())})
			}
		}
	}
	// files
	if o.CNIConfDir != "" {
		items = appendIfExists(items, "file", filepath.Join(o.CNIConfDir, o.CNIConfFile))
	}
	if o.CNIBinDir != "" {
		items = appendIfExists(items, "file", filepath.Join(o.CNIBinDir, CNIBinary))
	}
	if o.Socket != "" {
		if fi, err := os.Lstat(o.Socket); err == nil && fi.Mode().Type() == os.ModeSocket {
			items = append(items, Item{"file", o.Socket})
		}
	}
	for _, e := range stateEntries {
		items = appendIfExists(items, "state", filepath.Join(o.StateDir, e))
	}
	if _, err := os.Stat(o.StateDir); err == nil {
		items = append(items, Item{"dir", o.StateDir})
	}
	return items, errors.Join(errs...)
}

func appendIfExists(items []Item, kind, p string) []Item {
	if _, err := os.Lstat(p); err == nil {
		items = append(items, Item{kind, p})
	}
	return items
}

func routeString(r netlink.Route) string {
	s := "default"
	if r.Dst != nil {
		s = r.Dst.String()
	}
	if r.Gw != nil {
		s += " via " + r.Gw.String()
	}
	if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
		s += " dev " + l.Attrs().Name
	}
	return fmt.Sprintf("%s table %d proto %d", s, r.Table, int(r.Protocol))
}

// remove takes away what find listed: first the programs (so no packet
// meets a half-removed datapath), then the pods' devices and the routes,
// then the files.
func (o Options) remove(found []Item, log *slog.Logger) error {
	var errs []error
	if slices.ContainsFunc(found, func(i Item) bool {
		return i.Kind == "bpf-link" || i.Kind == "bpf-pin" || i.Kind == "dir" && i.What == o.BPFRoot
	}) {
		errs = append(errs, o.removeBPF())
	}
	for _, it := range found {
		if it.Kind != "device" {
			continue
		}
		name, _, _ := strings.Cut(it.What, " ")
		if l, err := netlink.LinkByName(name); err == nil {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete device %s: %w", name, err))
			}
		}
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Protocol: o.RouteProtocol, Table: unix.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			errs = append(errs, fmt.Errorf("list routes: %w", err))
		}
		for _, r := range rs {
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("delete route %s: %w", routeString(r), err))
			}
		}
	}
	for _, it := range found {
		switch it.Kind {
		case "qdisc":
			dev, _, _ := strings.Cut(it.What, " ")
			h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, bwm.RemoveFQ(h, dev))
			h.Close()
		case "file", "state":
			if err := os.RemoveAll(it.What); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", it.What, err))
			}
		}
	}
	if ents, err := os.ReadDir(o.StateDir); err == nil {
		if len(ents) == 0 {
			errs = append(errs, os.Remove(o.StateDir))
		} else {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			log.Warn("state directory kept: it holds files the agent does not write", "dir", o.StateDir, "files", names)
		}
	}
	return errors.Join(errs...)
}

// podNetns lists the netns of the pods the agent registered (its endpoint
// files), where the VM-pod bridge bypass's legacy filters live.
func (o Options) podNetns() []string {
	files, _ := filepath.Glob(filepath.Join(o.StateDir, "endpoints", "*.json"))
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var ep struct {
			Netns string `json:"netns"`
		}
		if json.Unmarshal(b, &ep) == nil && ep.Netns != "" && !slices.Contains(out, ep.Netns) {
			out = append(out, ep.Netns)
		}
	}
	return out
}

// removeBPF detaches every attachment pinned under BPFRoot and removes the
// pins: the bypass first (its splice guard last), the socket LB's cgroup
// links, the north-south LB, the VM-pod bridge bypass and the pods'
// per-packet LBs (their legacy filters in the pods' netns too), then every remaining tcx/XDP/netkit link and
// legacy filter (pod, uplink, Bandwidth Manager), then the directory.
func (o Options) removeBPF() error {
	if _, err := os.Stat(o.BPFRoot); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	errs := []error{sockmap.Uninstall(o.BPFRoot), socklb.Uninstall(o.BPFRoot, o.CgroupRoot), nodeport.Uninstall(o.BPFRoot),
		vmbypass.Uninstall(o.BPFRoot, o.podNetns()), podlb.Uninstall(o.BPFRoot, o.podNetns())}
	pins, err := datapath.ListPins(o.BPFRoot, func(string, string) bool { return true })
	errs = append(errs, err)
	roles := map[string]bool{}
	for _, h := range datapath.TCHooks() {
		roles[h.Role] = true
	}
	for _, p := range pins {
		if p.Kind == datapath.PinTC {
			if !roles[p.Role] {
				errs = append(errs, fmt.Errorf("legacy filter pin %s: unknown role %q", p.Path, p.Role))
				continue
			}
			errs = append(errs, datapath.DetachPin(p, datapath.TCHook(p.Role, true)))
			continue
		}
		errs = append(errs, datapath.DetachLink(p))
	}
	errs = append(errs, podpath.Uninstall(o.BPFRoot)) // what is left, and the directory
	return errors.Join(errs...)
}

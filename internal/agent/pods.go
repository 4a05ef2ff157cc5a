package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/ipam"
)

// podDatapath is the pod datapath feature: the tc programs loaded on the
// uplink, the endpoint map, and the pod devices the pod program is
// attached to, kept in line with the endpoint registry by the reconcile
// (ensure, reconcileEndpoints) and by the endpoint handlers (put, remove,
// gc).
type podDatapath struct {
	load func(uplink string) (dataplane, error)
	nl   *netlink.Handle
	reg  *registry
	ipam *ipam.Allocator
	log  *slog.Logger
	// uplink is the node's uplink device in use ("" before it is known): an
	// endpoint may never name it
	uplink func() string
	// refused counts endpoint PUTs and GCs refused by the ownership checks
	refused refusals

	// mu serialises every write to the datapath, the endpoint map, the
	// registry and the release of a removed endpoint's addresses: the
	// reconcile and the endpoint handlers. It is held across BPF calls (the
	// load too) and taken before no other lock of the agent but the
	// registry's, the IPAM's and stMu; status and metrics read view and err.
	mu sync.Mutex
	dp dataplane // nil until loaded
	// attached: pod devices this process attached (name → ifindex); the
	// reconcile re-attaches only new or re-created devices.
	attached map[string]int

	// view publishes dp for lock-free read-only use (status, metrics, the
	// device answer of Allocate, the north-south LB's routing mode).
	view atomic.Pointer[dataplane]

	stMu sync.Mutex // guards err; nothing is called with it held
	err  string     // why the datapath is not loaded
}

func newPodDatapath(load func(uplink string) (dataplane, error), nl *netlink.Handle, reg *registry, ip *ipam.Allocator, uplink func() string, log *slog.Logger) *podDatapath {
	return &podDatapath{load: load, nl: nl, reg: reg, ipam: ip, uplink: uplink, log: log, attached: map[string]int{}}
}

// ensure loads the datapath once, on the uplink that uplink resolves;
// loaded reports that this call loaded it.
func (p *podDatapath) ensure(uplink func() (string, error)) (loaded bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dp != nil {
		return false, nil
	}
	up, err := uplink()
	if err == nil {
		var dp dataplane
		if dp, err = p.load(up); err == nil {
			p.dp = dp
			p.view.Store(&dp)
			p.setErr("")
			for _, d := range dp.Decisions() {
				p.log.Info("datapath decision", "name", d.Name, "value", d.Value, "reason", d.Reason)
			}
			return true, nil
		}
		err = fmt.Errorf("load datapath on uplink %s: %w", up, err)
	}
	p.setErr(err.Error())
	return false, err
}

func (p *podDatapath) setErr(msg string) {
	p.stMu.Lock()
	p.err = msg
	p.stMu.Unlock()
}

// state returns why the datapath is not loaded ("" when it is or no load
// was tried yet) and whether it is loaded, without waiting for mu.
func (p *podDatapath) state() (why string, loaded bool) {
	p.stMu.Lock()
	defer p.stMu.Unlock()
	return p.err, p.view.Load() != nil
}

// snapshot returns the loaded dataplane (read-only calls only), nil until
// loaded.
func (p *podDatapath) snapshot() dataplane {
	if v := p.view.Load(); v != nil {
		return *v
	}
	return nil
}

// routedByBPF reports whether the pod datapath is loaded with BPF host
// routing (axon_uplink_ingress on the uplink, its maps pinned under
// BPFRoot): the north-south LB then delivers pod-bound TCP and UDP itself
// (nodeport.Options.DeliverPods). Before the datapath is loaded it
// is false, and the uplink program delivers everything.
func (p *podDatapath) routedByBPF() bool {
	v := p.view.Load()
	return v != nil && (*v).HostRouting() == datapath.RoutingBPF
}

// close releases the datapath's file descriptors (pins and links stay).
func (p *podDatapath) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dp != nil {
		if err := p.dp.Close(); err != nil {
			p.log.Warn("close datapath", "error", err)
		}
		p.dp = nil
		p.view.Store(nil)
	}
}

// reconcileEndpoints makes the endpoint map match the registry once the
// datapath is loaded.
func (p *podDatapath) reconcileEndpoints() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dp == nil {
		return nil
	}
	eps := p.reg.List()
	var errs []error
	lookup := func(name string) (linkInfo, bool) { return lookupLink(p.nl, name) }
	for _, ep := range eps {
		li, ok := lookup(ep.HostIfName)
		if !ok || p.attached[ep.HostIfName] == li.Index {
			continue
		}
		if err := p.dp.AttachPod(ep.HostIfName); err != nil {
			errs = append(errs, fmt.Errorf("attach %s (%s/%s): %w", ep.HostIfName, ep.ContainerID, ep.IfName, err))
			continue
		}
		p.attached[ep.HostIfName] = li.Index
	}
	desired := DesiredEntries(eps, lookup)
	current, err := p.dp.Endpoints()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("read endpoint map: %w", err))...)
	}
	upsert, del := DiffEndpoints(desired, current)
	for _, e := range upsert {
		if err := p.dp.UpsertEndpoint(e); err != nil {
			errs = append(errs, fmt.Errorf("write endpoint %s: %w", e.IP, err))
			continue
		}
		p.log.Info("endpoint map entry written", "ip", e.IP, "ifindex", e.IfIndex)
	}
	for _, ip := range del {
		if err := p.dp.DeleteEndpoint(ip); err != nil {
			errs = append(errs, fmt.Errorf("delete endpoint %s: %w", ip, err))
			continue
		}
		p.log.Info("stale endpoint map entry deleted", "ip", ip)
	}
	return errors.Join(errs...)
}

// put persists a validated endpoint (IPs unmapped), then attaches the pod
// program and writes one map entry per IP; it returns the host device's
// ifindex.
func (p *podDatapath) put(ep api.Endpoint) (int, error) {
	k := key(ep.ContainerID, ep.IfName)
	p.mu.Lock() // also makes the IP conflict check atomic with the write
	defer p.mu.Unlock()
	for _, other := range p.reg.List() {
		if key(other.ContainerID, other.IfName) == k {
			continue
		}
		for _, ip := range ep.IPs {
			if slices.Contains(other.IPs, ip) {
				return 0, api.Errorf(http.StatusConflict, "IP %s already belongs to endpoint %s/%s (pod %s/%s): delete that endpoint first",
					ip, other.ContainerID, other.IfName, other.PodNamespace, other.PodName)
			}
		}
	}
	if err := p.checkOwner(ep); err != nil {
		return 0, err
	}
	li, ok := lookupLink(p.nl, ep.HostIfName)
	if !ok {
		return 0, api.Errorf(http.StatusBadRequest, "host device %s does not exist in the node's network namespace: create the pod veth before registering the endpoint", ep.HostIfName)
	}

	if p.dp == nil {
		why, _ := p.state()
		return 0, api.Errorf(http.StatusServiceUnavailable, "datapath not loaded (%s): retry when `axon status` is ready", why)
	}
	prev, hadPrev := p.reg.Get(k)
	ep.State = ""
	ep.HostIfIndex = li.Index
	ep.Created = time.Now().UTC().Truncate(time.Second)
	if hadPrev {
		ep.Created = prev.Created
	}
	if err := p.reg.Put(ep); err != nil {
		return 0, err
	}
	if err := p.dp.AttachPod(ep.HostIfName); err != nil {
		return 0, fmt.Errorf("attach pod program to %s: %w", ep.HostIfName, err)
	}
	p.attached[ep.HostIfName] = li.Index
	hostMAC := li.MAC
	if len(hostMAC) == 0 {
		hostMAC = ep.HostMAC
	}
	for _, ip := range ep.IPs {
		if err := p.dp.UpsertEndpoint(MapEntry{IP: ip, IfIndex: li.Index, PodMAC: ep.PodMAC, HostMAC: hostMAC}); err != nil {
			return 0, fmt.Errorf("write endpoint map entry %s: %w", ip, err)
		}
	}
	if hadPrev {
		for _, ip := range prev.IPs {
			if !slices.Contains(ep.IPs, ip) {
				if err := p.dp.DeleteEndpoint(ip); err != nil {
					return 0, fmt.Errorf("delete old endpoint map entry %s: %w", ip, err)
				}
			}
		}
		if prev.HostIfName != ep.HostIfName {
			p.detachLocked(prev.HostIfName)
		}
	}
	return li.Index, nil
}

// checkOwner runs the ownership checks of an endpoint PUT (ownership.go)
// with p.mu held; a refusal is logged and counted.
func (p *podDatapath) checkOwner(ep api.Endpoint) error {
	err := checkAddresses(p.ipam, ep)
	if err == nil {
		err = checkNotInUse(p.reg.List(), ep)
	}
	if err == nil {
		_, err = checkDevice(p.nl, p.uplink(), ep)
	}
	if r := reasonOf(err); r != "" {
		p.refused.add(r)
		p.log.Warn("endpoint refused", "reason", r, "containerID", ep.ContainerID, "ifName", ep.IfName,
			"device", ep.HostIfName, "netns", ep.Netns, "ips", ep.IPs, "error", err)
	}
	return err
}

// remove removes an endpoint's map entries, detaches its program, releases
// its IPs and removes its record. Removing an unknown endpoint succeeds.
func (p *podDatapath) remove(at api.Attachment) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.removeLocked(at)
}

func (p *podDatapath) removeLocked(at api.Attachment) error {
	k := key(at.ContainerID, at.IfName)
	if ep, ok := p.reg.Get(k); ok {
		if p.dp == nil {
			return api.Errorf(http.StatusServiceUnavailable, "datapath not loaded: cannot remove map entries of %s/%s yet; retry", at.ContainerID, at.IfName)
		}
		for _, ip := range ep.IPs {
			if err := p.dp.DeleteEndpoint(ip); err != nil {
				return fmt.Errorf("delete endpoint map entry %s: %w", ip, err)
			}
		}
		p.detachLocked(ep.HostIfName)
	}
	if err := p.ipam.Release(ipam.Owner{ContainerID: at.ContainerID, IfName: at.IfName}); err != nil {
		return fmt.Errorf("release addresses of %s/%s: %w", at.ContainerID, at.IfName, err)
	}
	if err := p.reg.Delete(k); err != nil {
		return err
	}
	p.log.Info("endpoint deleted", "containerID", at.ContainerID, "ifName", at.IfName)
	return nil
}

// detachLocked removes the pod program; a device that is already gone is
// fine.
func (p *podDatapath) detachLocked(ifname string) {
	delete(p.attached, ifname)
	if err := p.dp.DetachPod(ifname); err != nil {
		if _, exists := lookupLink(p.nl, ifname); exists {
			p.log.Warn("detach pod program", "device", ifname, "error", err)
		}
	}
}

// gc removes every endpoint and address not in r.Valid and the pod
// programs of devices no endpoint uses.
func (p *podDatapath) gc(r api.GCRequest) (api.GCResponse, error) {
	valid := map[api.Attachment]bool{}
	owners := map[ipam.Owner]bool{}
	for _, v := range r.Valid {
		valid[v] = true
		owners[ipam.Owner{ContainerID: v.ContainerID, IfName: v.IfName}] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var resp api.GCResponse
	var errs []error
	for _, ep := range p.reg.List() {
		at := key(ep.ContainerID, ep.IfName)
		if valid[at] {
			continue
		}
		if err := p.removeLocked(at); err != nil {
			errs = append(errs, err)
			continue
		}
		resp.Removed = append(resp.Removed, at)
	}
	released, err := p.ipam.GC(owners)
	if err != nil {
		errs = append(errs, fmt.Errorf("ipam gc: %w", err))
	}
	for _, o := range released {
		at := api.Attachment{ContainerID: o.ContainerID, IfName: o.IfName}
		if !slices.Contains(resp.Removed, at) {
			resp.Removed = append(resp.Removed, at)
		}
	}
	if p.dp != nil {
		keep := map[string]bool{}
		for _, ep := range p.reg.List() {
			keep[ep.HostIfName] = true
		}
		if err := p.dp.GCPodLinks(keep); err != nil {
			errs = append(errs, fmt.Errorf("gc pod links: %w", err))
		}
	}
	if len(resp.Removed) > 0 {
		p.log.Info("gc removed attachments", "removed", resp.Removed)
	}
	return resp, errors.Join(errs...)
}

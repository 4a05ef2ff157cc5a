package cni

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/api"
)

// Plugin implements the CNI commands. The zero value is usable.
type Plugin struct {
	Log     *slog.Logger
	Timeout time.Duration // per agent call; default 30s
}

func (p *Plugin) log() *slog.Logger {
	if p.Log == nil {
		return slog.Default()
	}
	return p.Log
}

func (p *Plugin) ctx() (context.Context, context.CancelFunc) {
	t := p.Timeout
	if t == 0 {
		t = 30 * time.Second
	}
	return context.WithTimeout(context.Background(), t)
}

// agentMissingHint ends every error for an agent that is not there (no socket, nothing
// listening): what to do, read in the pod's events by whoever sees its sandbox fail.
const agentMissingHint = "axon-cni needs this node's axon-agent, a pod of the axon-agent DaemonSet: " +
	"find it with `kubectl get pods -A -o wide -l app.kubernetes.io/name=axon-agent` and see why it is not running on this node; " +
	"the runtime retries, and pods start once the agent is back"

// agentErr turns an agent client error into a CNI error: unreachable or not
// ready → 11 (try again later), anything else keeps the agent's message.
func agentErr(what string, err error) error {
	if errors.Is(err, api.ErrUnreachable) {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s: %v; %s", what, err, agentMissingHint), "")
	}
	if api.IsStatus(err, http.StatusServiceUnavailable) {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s: %v", what, err), "")
	}
	if api.IsStatus(err, http.StatusBadRequest) {
		return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("%s: %v", what, err), "")
	}
	return types.NewError(types.ErrInternal, fmt.Sprintf("%s: %v", what, err), "")
}

func openNetNS(path string) (ns.NetNS, error) {
	n, err := ns.GetNS(path)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("open pod netns %q: %v", path, err), "")
	}
	return n, nil
}

// Add implements CNI ADD.
//
// Duplicate ADD of the same containerID/ifName is idempotent: when the
// node-side device already exists and its peer is CNI_IFNAME in CNI_NETNS,
// the plugin re-applies the configuration (same addresses, the agent's
// allocation is keyed by containerID/ifName) and returns the same result.
// When the device exists but is wired elsewhere, ADD fails and says to DEL first.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	k8s, err := ParseArgs(args.Args)
	if err != nil {
		return err
	}
	podNS, err := openNetNS(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()

	hostName := HostVethName(args.ContainerID, args.IfName)
	existing, err := p.existingWiring(hostName, args, podNS)
	if err != nil {
		return err
	}

	client := api.NewClient(conf.Socket)
	ctx, cancel := p.ctx()
	defer cancel()
	alloc, err := client.Allocate(ctx, api.AllocateRequest{
		ContainerID:  args.ContainerID,
		IfName:       args.IfName,
		PodName:      string(k8s.K8S_POD_NAME),
		PodNamespace: string(k8s.K8S_POD_NAMESPACE),
	})
	if err != nil {
		return agentErr("allocate pod addresses from axon-agent", err)
	}
	if len(alloc.Addresses) == 0 {
		return types.NewError(types.ErrInternal, "axon-agent returned no addresses", "")
	}
	ips := make([]netip.Addr, 0, len(alloc.Addresses))
	for _, a := range alloc.Addresses {
		ips = append(ips, a.IP)
	}

	created := existing == nil
	rollback := func(cause error) error {
		if !created {
			// Leave a previously working pod alone; the runtime will DEL it.
			return cause
		}
		if err := deleteHostVeth(hostName); err != nil {
			p.log().Error("rollback: delete veth", "dev", hostName, "err", err)
		}
		rctx, rcancel := p.ctx()
		defer rcancel()
		if err := client.Release(rctx, api.ReleaseRequest{ContainerID: args.ContainerID, IfName: args.IfName}); err != nil {
			p.log().Error("rollback: release addresses", "err", err)
		}
		return cause
	}

	dev := deviceFor(conf, alloc.Device)
	host := existing
	if host == nil {
		host, err = createDevice(dev, hostName, args.IfName, args.ContainerID, conf.MTU, podNS)
		if err != nil {
			return rollback(types.NewError(types.ErrInternal, err.Error(), ""))
		}
	} else {
		// a re-ADD keeps the device it has: a pod never changes type under it
		dev.Type, dev.NetkitMode = deviceTypeOf(host)
	}
	if err := applyBigTCP(host, dev); err != nil {
		return rollback(types.NewError(types.ErrInternal, "node side: "+err.Error(), ""))
	}
	if err := setupHost(host, ips); err != nil {
		return rollback(types.NewError(types.ErrInternal, err.Error(), ""))
	}
	pod, err := setupPod(podNS, args.IfName, ips, zeroMACIfNone(host.Attrs().HardwareAddr), dev)
	if err != nil {
		return rollback(types.NewError(types.ErrInternal, fmt.Sprintf("configure %s in %s: %v", args.IfName, args.Netns, err), ""))
	}
	ep := api.Endpoint{
		ContainerID:  args.ContainerID,
		IfName:       args.IfName,
		Netns:        args.Netns,
		PodName:      string(k8s.K8S_POD_NAME),
		PodNamespace: string(k8s.K8S_POD_NAMESPACE),
		IPs:          ips,
		HostIfName:   hostName,
		HostIfIndex:  host.Attrs().Index,
		HostMAC:      zeroMACIfNone(host.Attrs().HardwareAddr),
		PodMAC:       zeroMACIfNone(pod.MAC),
		DeviceType:   dev.Type,
		NetkitMode:   dev.NetkitMode,
	}
	if err := client.PutEndpoint(ctx, ep); err != nil {
		return rollback(agentErr("register endpoint with axon-agent", err))
	}

	result := buildResult(conf, args, host, pod, conf.MTU, alloc.Addresses)
	p.log().Info("ADD done", "container", args.ContainerID, "ifname", args.IfName, "dev", hostName, "type", dev.Type, "ips", ips, "reused", !created)
	return types.PrintResult(result, conf.CNIVersion)
}

// existingWiring returns the node-side link when a previous ADD already wired
// exactly this attachment, nil when nothing exists, and an error when the
// names are taken by something else.
func (p *Plugin) existingWiring(hostName string, args *skel.CmdArgs, podNS ns.NetNS) (netlink.Link, error) {
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, types.NewError(types.ErrInternal, fmt.Sprintf("look up %s: %v", hostName, err), "")
	}
	conflict := func(why string) error {
		return types.NewError(types.ErrInternal, fmt.Sprintf(
			"duplicate ADD for %s/%s: device %s already exists but %s; run DEL for this container first",
			args.ContainerID, args.IfName, hostName, why), "")
	}
	if !isPodDevice(host) || host.Attrs().Alias != hostAlias(args.ContainerID, args.IfName) {
		return nil, conflict("it was not created by axon-cni for this attachment")
	}
	peerIdx, err := peerIndex(host)
	if err != nil {
		return nil, conflict(fmt.Sprintf("its peer cannot be read (%v)", err))
	}
	var match bool
	_ = podNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(args.IfName)
		match = err == nil && l.Attrs().Index == peerIdx && l.Type() == host.Type()
		return nil
	})
	if !match {
		return nil, conflict(fmt.Sprintf("its peer is not %s in %s", args.IfName, args.Netns))
	}
	return host, nil
}

func buildResult(conf *NetConf, args *skel.CmdArgs, host netlink.Link, pod podLink, mtu int, addrs []api.Address) *types100.Result {
	podIdx := 1
	res := &types100.Result{
		CNIVersion: types100.ImplementedSpecVersion,
		Interfaces: []*types100.Interface{
			{Name: host.Attrs().Name, Mac: host.Attrs().HardwareAddr.String(), Mtu: mtu},
			{Name: args.IfName, Mac: pod.MAC.String(), Mtu: mtu, Sandbox: args.Netns},
		},
	}
	for _, a := range addrs {
		gw := GatewayV6
		if a.IP.Is4() {
			gw = GatewayV4
		}
		res.IPs = append(res.IPs, &types100.IPConfig{
			Interface: &podIdx,
			Address:   *hostPrefix(a.IP),
			Gateway:   gw.AsSlice(),
		})
		res.Routes = append(res.Routes, &types.Route{Dst: *defaultDst(gw), GW: gw.AsSlice()})
	}
	_ = conf
	return res
}

// Del implements CNI DEL. It is idempotent: a missing netns, device, or
// endpoint is fine. The veth is always deleted first (traffic stops); if the
// agent cannot be reached DEL then fails with code 11 so the runtime retries,
// because succeeding would leak the pod's addresses and map entries (the
// runtime forgets the container after a successful DEL).
func (p *Plugin) Del(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	hostName := HostVethName(args.ContainerID, args.IfName)
	client := api.NewClient(conf.Socket)
	ctx, cancel := p.ctx()
	defer cancel()
	// The agent removes the endpoint's map entries before the device goes:
	// an entry whose ifindex is stale (or reused by a new pod's veth) would
	// misdirect traffic for the old address. If the agent is down the veth is
	// still deleted, and the error (code 11) makes the runtime retry DEL.
	a := api.Attachment{ContainerID: args.ContainerID, IfName: args.IfName}
	var agentErrs error
	if err := client.DeleteEndpoint(ctx, a); err != nil && !api.IsStatus(err, http.StatusNotFound) {
		agentErrs = agentErr("remove endpoint from axon-agent", err)
	} else if err := client.Release(ctx, api.ReleaseRequest{ContainerID: args.ContainerID, IfName: args.IfName}); err != nil && !api.IsStatus(err, http.StatusNotFound) {
		// DeleteEndpoint releases the addresses; Release covers an ADD that
		// died between Allocate and PutEndpoint. Both are idempotent.
		agentErrs = agentErr("release addresses in axon-agent", err)
	}
	if err := deleteHostVeth(hostName); err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	if agentErrs != nil {
		return agentErrs
	}
	p.log().Info("DEL done", "container", args.ContainerID, "ifname", args.IfName, "dev", hostName)
	return nil
}

// Check implements CNI CHECK: the wiring of ADD is still in place and the
// agent still has the endpoint. The error lists every difference found.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	podNS, err := openNetNS(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()

	client := api.NewClient(conf.Socket)
	ctx, cancel := p.ctx()
	defer cancel()
	eps, err := client.Endpoints(ctx)
	if err != nil {
		return agentErr("list endpoints from axon-agent", err)
	}
	var problems []string
	var ep *api.Endpoint
	for i := range eps {
		if eps[i].ContainerID == args.ContainerID && eps[i].IfName == args.IfName {
			ep = &eps[i]
		}
	}
	var ips []netip.Addr
	if conf.PrevResult != nil {
		prev, err := types100.NewResultFromResult(conf.PrevResult)
		if err != nil {
			return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("convert prevResult: %v", err), "")
		}
		for _, ipc := range prev.IPs {
			if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok {
				ips = append(ips, a.Unmap())
			}
		}
	}
	if ep == nil {
		problems = append(problems, "axon-agent has no endpoint for this container")
	} else {
		if len(ips) == 0 {
			ips = ep.IPs
		} else if !sameAddrs(ips, ep.IPs) {
			problems = append(problems, fmt.Sprintf("axon-agent has addresses %v, prevResult says %v", ep.IPs, ips))
		}
	}

	hostName := HostVethName(args.ContainerID, args.IfName)
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		problems = append(problems, fmt.Sprintf("node device %s missing", hostName))
	} else {
		problems = append(problems, checkHost(host, ips)...)
		if t, m := deviceTypeOf(host); ep != nil && ep.DeviceType != "" && (ep.DeviceType != t || ep.NetkitMode != m) {
			problems = append(problems, fmt.Sprintf("axon-agent has %s as a %s %s device, it is a %s %s", hostName, ep.DeviceType, ep.NetkitMode, t, m))
		}
		if ep != nil && ep.HostIfIndex != host.Attrs().Index {
			problems = append(problems, fmt.Sprintf("axon-agent has %s as ifindex %d, the device is ifindex %d", hostName, ep.HostIfIndex, host.Attrs().Index))
		}
		problems = append(problems, checkPod(podNS, args.IfName, host, ips)...)
	}
	if len(problems) > 0 {
		return types.NewError(types.ErrInternal, fmt.Sprintf("CHECK %s/%s failed: %s", args.ContainerID, args.IfName, strings.Join(problems, "; ")), "")
	}
	return nil
}

func sameAddrs(a, b []netip.Addr) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, netip.Addr.Compare)
	slices.SortFunc(b, netip.Addr.Compare)
	return slices.Equal(a, b)
}

func checkHost(host netlink.Link, ips []netip.Addr) []string {
	var problems []string
	name := host.Attrs().Name
	if host.Attrs().Flags&net.FlagUp == 0 {
		problems = append(problems, fmt.Sprintf("node device %s is down", name))
	}
	if hasV6(ips) {
		addrs, err := netlink.AddrList(host, netlink.FAMILY_V6)
		if err != nil {
			problems = append(problems, fmt.Sprintf("list addresses of %s: %v", name, err))
		} else if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.Equal(GatewayV6.AsSlice()) }) {
			problems = append(problems, fmt.Sprintf("gateway %s missing on node device %s", GatewayV6, name))
		}
	}
	for _, ip := range ips {
		routes, err := netlink.RouteListFiltered(family(ip), &netlink.Route{Dst: hostPrefix(ip)}, netlink.RT_FILTER_DST)
		if err != nil {
			problems = append(problems, fmt.Sprintf("list node routes: %v", err))
			continue
		}
		if !slices.ContainsFunc(routes, func(r netlink.Route) bool { return r.LinkIndex == host.Attrs().Index }) {
			problems = append(problems, fmt.Sprintf("node route %s dev %s missing", hostPrefix(ip), name))
		}
	}
	return problems
}

func checkPod(podNS ns.NetNS, ifName string, host netlink.Link, ips []netip.Addr) []string {
	var problems []string
	peerIdx, perr := peerIndex(host)
	err := podNS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(ifName)
		if err != nil {
			problems = append(problems, fmt.Sprintf("pod device %s missing", ifName))
			return nil
		}
		if perr == nil && link.Attrs().Index != peerIdx {
			problems = append(problems, fmt.Sprintf("pod device %s is not the peer of %s", ifName, host.Attrs().Name))
		}
		if link.Attrs().Flags&net.FlagUp == 0 {
			problems = append(problems, fmt.Sprintf("pod device %s is down", ifName))
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			problems = append(problems, fmt.Sprintf("list pod addresses: %v", err))
		}
		for _, ip := range ips {
			want := hostPrefix(ip).String()
			if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IPNet.String() == want }) {
				problems = append(problems, fmt.Sprintf("pod address %s missing on %s", want, ifName))
			}
		}
		for _, gw := range gateways(ips) {
			routes, err := netlink.RouteListFiltered(family(gw), &netlink.Route{Dst: nil}, 0)
			if err != nil {
				problems = append(problems, fmt.Sprintf("list pod routes: %v", err))
				continue
			}
			ok := slices.ContainsFunc(routes, func(r netlink.Route) bool {
				return (r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask)) && r.Gw.Equal(gw.AsSlice()) && r.LinkIndex == link.Attrs().Index
			})
			if !ok {
				problems = append(problems, fmt.Sprintf("pod default route via %s dev %s missing", gw, ifName))
			}
			if noARP(link) {
				continue // L3 device (netkit l3): no neighbours to check
			}
			neighs, err := netlink.NeighList(link.Attrs().Index, family(gw))
			if err != nil {
				problems = append(problems, fmt.Sprintf("list pod neighbours: %v", err))
				continue
			}
			ok = slices.ContainsFunc(neighs, func(n netlink.Neigh) bool {
				return n.IP.Equal(gw.AsSlice()) && n.State&netlink.NUD_PERMANENT != 0 && n.HardwareAddr.String() == host.Attrs().HardwareAddr.String()
			})
			if !ok {
				problems = append(problems, fmt.Sprintf("pod neighbour %s lladdr %s PERMANENT missing", gw, host.Attrs().HardwareAddr))
			}
		}
		return nil
	})
	if err != nil {
		problems = append(problems, fmt.Sprintf("enter pod netns: %v", err))
	}
	return problems
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

// Status implements CNI STATUS: ready when the agent's /healthz says so.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := p.ctx()
	defer cancel()
	if err := api.NewClient(conf.Socket).Healthy(ctx); errors.Is(err, api.ErrUnreachable) {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("axon-agent is not ready: %v; %s", err, agentMissingHint), "")
	} else if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("axon-agent is not ready: %v", err), "")
	}
	return nil
}

// GC implements CNI GC: the agent drops every endpoint and allocation not in
// cni.dev/valid-attachments, then node-side devices created by axon-cni (marked
// with an "axon-cni:" alias) for attachments not in the list are deleted.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	// An empty cni.dev/valid-attachments is the runtime saying that no
	// attachment is valid: only then is the agent told to remove everything
	// (an absent list is not the same and the agent refuses it).
	req := api.GCRequest{Valid: []api.Attachment{}, All: conf.ValidAttachments != nil && len(conf.ValidAttachments) == 0}
	keep := map[string]bool{}
	for _, a := range conf.ValidAttachments {
		req.Valid = append(req.Valid, api.Attachment{ContainerID: a.ContainerID, IfName: a.IfName})
		keep[HostVethName(a.ContainerID, a.IfName)] = true
	}
	ctx, cancel := p.ctx()
	defer cancel()
	resp, err := api.NewClient(conf.Socket).GC(ctx, req)
	if err != nil {
		return agentErr("garbage-collect in axon-agent", err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("list node devices: %v", err), "")
	}
	var removed []string
	for _, l := range links {
		name := l.Attrs().Name
		if !isPodDevice(l) || !strings.HasPrefix(name, "lxc") || !strings.HasPrefix(l.Attrs().Alias, AliasPrefix) || keep[name] {
			continue
		}
		if err := deleteHostVeth(name); err != nil {
			return types.NewError(types.ErrInternal, fmt.Sprintf("GC: %v", err), "")
		}
		removed = append(removed, name)
	}
	p.log().Info("GC done", "agentRemoved", len(resp.Removed), "devicesRemoved", removed)
	return nil
}

package agent

// Ownership checks of PUT /v1/endpoints. The local API's caller is axon-cni
// running for the kubelet, but the socket is reachable by any local process
// allowed on it: an endpoint is written only for addresses the agent's IPAM
// allocated to that very attachment (ContainerID, IfName), and only on the
// node-side device axon-cni created for it (the peer of the pod's interface
// in the pod's netns) — never the uplink, lo, another pod's device or a
// device some other endpoint uses.

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/cni"
	"github.com/axonhq/axon/internal/ipam"
)

// Reasons an endpoint PUT is refused (label of axon_api_refused_total).
const (
	refusedAddress = "address_not_allocated" // an IP not allocated to this attachment
	refusedDevice  = "device_not_pod"        // not the pod-side peer axon-cni created
	refusedInUse   = "device_in_use"         // the device of another endpoint
	refusedGCEmpty = "gc_empty_list"         // GC with an empty keep-list and no "all"
	refusedCaller  = "caller"                // a caller that may not change state
)

// cniAliasPrefix is the IFLA_IFALIAS axon-cni gives the node-side device of
// a pod ("axon-cni:<containerID>/<ifName>", internal/cni/link.go).
const cniAliasPrefix = cni.AliasPrefix

// refusals counts refused API calls by reason.
type refusals struct {
	mu sync.Mutex
	n  map[string]uint64
}

func (r *refusals) add(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]uint64{}
	}
	r.n[reason]++
}

func (r *refusals) counts() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]uint64, len(r.n))
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// refusedError is an ownership refusal: the HTTP status, what to do, and
// the reason it is counted under.
type refusedError struct {
	reason string
	*api.StatusError
}

func (e *refusedError) Unwrap() error { return e.StatusError }

func refuse(reason string, code int, format string, args ...any) error {
	return &refusedError{reason: reason, StatusError: api.Errorf(code, format, args...)}
}

// checkAddresses refuses an IP that IPAM has not allocated to ep's attachment.
func checkAddresses(al *ipam.Allocator, ep api.Endpoint) error {
	owned := al.Lookup(ipam.Owner{ContainerID: ep.ContainerID, IfName: ep.IfName})
	for _, ip := range ep.IPs {
		if !slices.Contains(owned, ip) {
			return refuse(refusedAddress, http.StatusForbidden,
				"address %s is not allocated to %s/%s (it holds %s): register only the addresses POST /v1/ipam/allocate returned for this attachment",
				ip, ep.ContainerID, ep.IfName, addrList(owned))
		}
	}
	return nil
}

func addrList(ips []netip.Addr) string {
	if len(ips) == 0 {
		return "none"
	}
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ", ")
}

// checkDevice refuses a host device that is not the one axon-cni created for
// ep: it must be a veth or netkit named ep.HostIfName in the node netns (nl),
// not the uplink, marked with ep's attachment, and its peer must be
// ep.IfName inside the netns at ep.Netns. It returns the host link.
func checkDevice(nl *netlink.Handle, uplink string, ep api.Endpoint) (netlink.Link, error) {
	bad := func(format string, args ...any) (netlink.Link, error) {
		return nil, refuse(refusedDevice, http.StatusForbidden, "host device %s for %s/%s: %s: register only the node-side device axon-cni created for this pod",
			ep.HostIfName, ep.ContainerID, ep.IfName, fmt.Sprintf(format, args...))
	}
	if ep.HostIfName == uplink {
		return bad("it is the node's uplink")
	}
	host, err := nl.LinkByName(ep.HostIfName)
	if err != nil {
		return nil, api.Errorf(http.StatusBadRequest, "host device %s does not exist in the node's network namespace: create the pod veth before registering the endpoint", ep.HostIfName)
	}
	if t := host.Type(); t != "veth" && t != "netkit" {
		return bad("it is a %s, not a veth or netkit pod device", t)
	}
	if want := cniAliasPrefix + ep.ContainerID + "/" + ep.IfName; host.Attrs().Alias != want {
		return bad("its alias is %q, not %q (axon-cni marks the device it creates for an attachment)", host.Attrs().Alias, want)
	}
	if ep.Netns == "" {
		return bad("netns is empty: name the pod's network namespace (CNI_NETNS)")
	}
	if !strings.HasPrefix(ep.Netns, "/") {
		return bad("netns %q is not an absolute path", ep.Netns)
	}
	podNS, err := netns.GetFromPath(ep.Netns)
	if err != nil {
		return bad("cannot open netns %s: %v", ep.Netns, err)
	}
	defer podNS.Close()
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(podNS), &fs); err != nil || fs.Type != unix.NSFS_MAGIC {
		return bad("%s is not a network namespace (CNI_NETNS names one, e.g. /var/run/netns/cni-...)", ep.Netns)
	}
	var podSt, nodeSt unix.Stat_t
	if err := unix.Fstat(int(podNS), &podSt); err != nil {
		return bad("stat netns %s: %v", ep.Netns, err)
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &nodeSt); err == nil && podSt.Ino == nodeSt.Ino && podSt.Dev == nodeSt.Dev {
		return bad("netns %s is the node's own network namespace", ep.Netns)
	}
	ph, err := netlink.NewHandleAt(podNS, unix.NETLINK_ROUTE)
	if err != nil {
		return bad("open netlink in netns %s: %v", ep.Netns, err)
	}
	defer ph.Close()
	pod, err := ph.LinkByName(ep.IfName)
	if err != nil {
		return bad("netns %s has no device %s", ep.Netns, ep.IfName)
	}
	// veth and netkit report their peer's ifindex as IFLA_LINK and the
	// peer's netns as IFLA_LINK_NETNSID (relative to the reporting netns)
	if pod.Type() != host.Type() || host.Attrs().ParentIndex != pod.Attrs().Index || pod.Attrs().ParentIndex != host.Attrs().Index {
		return bad("it is not the peer of %s in %s (%s #%d peer #%d; %s #%d peer #%d)", ep.IfName, ep.Netns,
			host.Type(), host.Attrs().Index, host.Attrs().ParentIndex, pod.Type(), pod.Attrs().Index, pod.Attrs().ParentIndex)
	}
	nsid, err := nl.GetNetNsIdByFd(int(podNS))
	if err != nil || nsid < 0 || host.Attrs().NetNsID != nsid {
		return bad("its peer is not in netns %s (peer netns id %d, that netns %d)", ep.Netns, host.Attrs().NetNsID, nsid)
	}
	return host, nil
}

// checkNotInUse refuses a device that another endpoint of reg uses.
func checkNotInUse(eps []api.Endpoint, ep api.Endpoint) error {
	for _, o := range eps {
		if o.HostIfName == ep.HostIfName && key(o.ContainerID, o.IfName) != key(ep.ContainerID, ep.IfName) {
			return refuse(refusedInUse, http.StatusConflict, "host device %s already belongs to endpoint %s/%s (pod %s/%s): delete that endpoint first",
				ep.HostIfName, o.ContainerID, o.IfName, o.PodNamespace, o.PodName)
		}
	}
	return nil
}

// reasonOf returns the refusal reason of err, "" for other errors.
func reasonOf(err error) string {
	var re *refusedError
	if errors.As(err, &re) {
		return re.reason
	}
	return ""
}

package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/ipam"
	"github.com/axonhq/axon/internal/unixsock"
)

var (
	_ api.Handler              = (*Agent)(nil)
	_ api.CallerRefusedCounter = (*Agent)(nil)
)

// CallerRefused implements api.CallerRefusedCounter: a caller that may not
// change state was refused (counted as axon_api_refused_total{reason="caller"}).
func (a *Agent) CallerRefused() { a.pods.refused.add(refusedCaller) }

// apiAccess is who may use the local API (Config.APIGroup, Config.APIUser).
func (c Config) apiAccess() unixsock.Options {
	o := unixsock.Options{Group: unixsock.NoGroup}
	if c.APIGroup >= 0 {
		o.Group = c.APIGroup
		o.WriterGIDs = []uint32{uint32(c.APIGroup)}
	}
	if c.APIUser >= 0 {
		o.WriterUIDs = []uint32{uint32(c.APIUser)}
	}
	return o
}

// notReady returns why the agent is not ready, "" when it is.
func (a *Agent) notReady() string {
	var why []string
	if a.cfg.bypassOnly() { // no pod datapath, no podCIDRs: the bypass reports its own state
		if k := a.st.kubeClient(); k == nil {
			return "kube-apiserver client not started"
		} else if st := k.status(); !st.Synced {
			return st.Message
		}
		return ""
	}
	if dpErr, loaded := a.pods.state(); dpErr != "" {
		why = append(why, "datapath not loaded: "+dpErr)
	} else if !loaded {
		why = append(why, "datapath not loaded yet")
	}
	if pools, cidrErr := a.st.cidrs(); cidrErr != "" {
		why = append(why, cidrErr)
	} else if len(pools) == 0 {
		why = append(why, fmt.Sprintf("podCIDRs of node %s not known yet", a.cfg.NodeName))
	}
	if k := a.st.kubeClient(); k == nil {
		why = append(why, "kube-apiserver client not started")
	} else if st := k.status(); !st.Synced {
		why = append(why, st.Message)
	}
	return strings.Join(why, "; ")
}

// Healthy implements api.Handler: ready = datapath loaded, podCIDR known, caches synced.
func (a *Agent) Healthy(context.Context) error {
	if why := a.notReady(); why != "" {
		return errors.New(why)
	}
	return nil
}

// Status implements api.Handler.
func (a *Agent) Status(context.Context) (api.Status, error) {
	why := a.notReady()
	st := api.Status{
		Node:      a.cfg.NodeName,
		Ready:     why == "",
		Message:   why,
		Version:   Version,
		Endpoints: len(a.reg.List()),
	}
	st.PodCIDRs, _ = a.st.cidrs()
	st.Uplink = a.st.uplinkInUse()
	st.Routes = a.rt.routes()
	if k := a.st.kubeClient(); k != nil {
		ks := k.status()
		st.APIServer = api.APIServerStatus{Connected: ks.Connected, Synced: ks.Synced, Message: ks.Message}
	}
	if a.cfg.bypassOnly() {
		st.Sockmap = a.sm.status()
		st.Datapath = []api.Decision{{Name: DecisionMode, Value: ModeBypassOnly,
			Reason: "another CNI plugin networks this node's pods: the agent runs only the same-node TCP bypass (no tc/XDP programs, socket LB, IPAM or routes)"},
			a.sm.decision(st.Sockmap)}
		st.PodCIDRs = []netip.Prefix{}
		return st, nil
	}
	if dp := a.pods.snapshot(); dp != nil {
		st.Datapath = dp.Decisions()
		st.Features = dp.Features()
	}
	st.Datapath = append(st.Datapath, a.sock.decision())
	st.Datapath = append(st.Datapath, a.nport.decision())
	st.Datapath = append(st.Datapath, a.kubeProxyDecision())
	st.Datapath = append(st.Datapath, a.bw.decision())
	st.Datapath = append(st.Datapath, withBigTCPNote(a.vm.decision(), a.vm.vmPods(), st.Datapath))
	st.Bandwidth = a.bw.status()
	st.Sockmap = a.sm.status()
	st.Datapath = append(st.Datapath, a.sm.decision(st.Sockmap))
	st.Datapath = append(st.Datapath, a.podDevicesDecision())
	if st.PodCIDRs == nil {
		st.PodCIDRs = []netip.Prefix{}
	}
	return st, nil
}

// Endpoints implements api.Handler: the registry with State filled in.
func (a *Agent) Endpoints(context.Context) ([]api.Endpoint, error) {
	eps := a.reg.List()
	k := a.st.kubeClient()
	for i := range eps {
		eps[i].State = a.endpointState(k, eps[i])
		eps[i].VMBypass = a.vm.podState(eps[i].PodNamespace + "/" + eps[i].PodName)
		eps[i].PodLB = a.sock.podLBState(eps[i])
	}
	return eps, nil
}

func (a *Agent) endpointState(k *kube, ep api.Endpoint) string {
	if k == nil || !k.isSynced() {
		return "pending"
	}
	if ep.PodName == "" || ep.PodNamespace == "" {
		return "orphan"
	}
	p, err := k.pods.Pods(ep.PodNamespace).Get(ep.PodName)
	if err != nil || p.Spec.NodeName != a.cfg.NodeName {
		return "orphan"
	}
	return "ready"
}

// Allocate implements api.Handler.
func (a *Agent) Allocate(_ context.Context, r api.AllocateRequest) (api.AllocateResponse, error) {
	if a.cfg.bypassOnly() {
		return api.AllocateResponse{}, api.Errorf(http.StatusConflict, "%v", errBypassOnly)
	}
	pools, why := a.st.cidrs()
	known := len(pools) > 0
	if why != "" {
		return api.AllocateResponse{}, api.Errorf(http.StatusServiceUnavailable, "%s", why)
	}
	if !known {
		return api.AllocateResponse{}, api.Errorf(http.StatusServiceUnavailable,
			"podCIDRs of node %s not known yet: the agent is waiting for kube-apiserver; retry shortly", a.cfg.NodeName)
	}
	addrs, err := a.ipam.Allocate(ipam.Owner{ContainerID: r.ContainerID, IfName: r.IfName})
	var ex *ipam.ExhaustedError
	switch {
	case errors.Is(err, ipam.ErrNoPools):
		return api.AllocateResponse{}, api.Errorf(http.StatusServiceUnavailable, "%v", err)
	case errors.As(err, &ex):
		return api.AllocateResponse{}, api.Errorf(http.StatusServiceUnavailable, "allocate for %s/%s: %v: delete unused pods or give the node a larger podCIDR", r.ContainerID, r.IfName, err)
	case err != nil:
		return api.AllocateResponse{}, fmt.Errorf("allocate for %s/%s: %w", r.ContainerID, r.IfName, err)
	}
	a.log.Info("addresses allocated", "containerID", r.ContainerID, "ifName", r.IfName, "pod", r.PodNamespace+"/"+r.PodName, "addresses", addrs)
	return api.AllocateResponse{Addresses: addrs, Device: a.podDevice()}, nil
}

// Release implements api.Handler. Idempotent.
func (a *Agent) Release(_ context.Context, r api.ReleaseRequest) error {
	if a.cfg.bypassOnly() {
		return api.Errorf(http.StatusConflict, "%v", errBypassOnly)
	}
	if err := a.ipam.Release(ipam.Owner{ContainerID: r.ContainerID, IfName: r.IfName}); err != nil {
		return fmt.Errorf("release %s/%s: %w", r.ContainerID, r.IfName, err)
	}
	return nil
}

// PutEndpoint implements api.Handler: persist first, then attach the pod
// program and write one map entry per IP.
func (a *Agent) PutEndpoint(_ context.Context, ep api.Endpoint) error {
	if a.cfg.bypassOnly() {
		return api.Errorf(http.StatusConflict, "%v", errBypassOnly)
	}
	if err := validateEndpoint(ep); err != nil {
		return api.Errorf(http.StatusBadRequest, "invalid endpoint: %v", err)
	}
	for i, ip := range ep.IPs {
		ep.IPs[i] = ip.Unmap()
	}
	ifindex, err := a.pods.put(ep)
	if err != nil {
		return err
	}
	// a pod that opted out of socket LB must be skipped from its first
	// connect, not from the next reconcile
	a.sock.syncOptOut()
	// and a pod admitted to the same-node TCP bypass from its first
	// connection
	a.sm.sync()
	a.log.Info("endpoint registered", "containerID", ep.ContainerID, "ifName", ep.IfName,
		"pod", ep.PodNamespace+"/"+ep.PodName, "ips", ep.IPs, "device", ep.HostIfName, "ifindex", ifindex)
	return nil
}

// DeleteEndpoint implements api.Handler: remove map entries, detach, release
// IPs, remove the record. Deleting an unknown endpoint succeeds.
func (a *Agent) DeleteEndpoint(_ context.Context, at api.Attachment) error {
	if a.cfg.bypassOnly() {
		return api.Errorf(http.StatusConflict, "%v", errBypassOnly)
	}
	if err := a.pods.remove(at); err != nil {
		return err
	}
	a.sm.sync() // the pod's addresses leave the bypass's admitted pods now
	// The bandwidth and socket-LB opt-out maps are written by the reconcile
	// pass: without one now, the pod's entries would stay until the next
	// periodic pass (up to --reconcile-interval), ready to apply to the next
	// pod given the same address.
	a.kick()
	return nil
}

// GC implements api.Handler: everything not in r.Valid is removed. An
// empty r.Valid removes everything only with r.All: a request that lost its
// list (or a caller that never sent one) must not wipe every pod of the node.
func (a *Agent) GC(_ context.Context, r api.GCRequest) (api.GCResponse, error) {
	if a.cfg.bypassOnly() {
		return api.GCResponse{}, api.Errorf(http.StatusConflict, "%v", errBypassOnly)
	}
	switch {
	case len(r.Valid) == 0 && !r.All:
		a.pods.refused.add(refusedGCEmpty)
		a.log.Warn("gc refused: empty keep-list without \"all\"", "endpoints", len(a.reg.List()))
		return api.GCResponse{}, api.Errorf(http.StatusBadRequest,
			"gc with an empty \"valid\" list would remove all %d endpoints and every allocation: list the valid attachments, or send \"all\": true to remove everything", len(a.reg.List()))
	case len(r.Valid) > 0 && r.All:
		return api.GCResponse{}, api.Errorf(http.StatusBadRequest, "gc with \"all\": true and %d valid attachments: send one or the other", len(r.Valid))
	}
	resp, err := a.pods.gc(r)
	a.kick() // as after a DEL: the reconciled maps follow the removed endpoints now
	return resp, err
}

// BandwidthMaps implements api.BandwidthHandler.
func (a *Agent) BandwidthMaps(context.Context) (api.BandwidthReply, error) { return a.bw.maps() }

// SockmapConns implements api.SockmapHandler.
func (a *Agent) SockmapConns(context.Context) (api.SockmapReply, error) { return a.sm.conns() }

package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/ipam"
)

var _ api.Handler = (*Agent)(nil)

// notReady returns why the agent is not ready, "" when it is.
func (a *Agent) notReady() string {
	a.stMu.Lock()
	defer a.stMu.Unlock()
	var why []string
	if a.dpErr != "" {
		why = append(why, "datapath not loaded: "+a.dpErr)
	} else if !a.dpLoaded() {
		why = append(why, "datapath not loaded yet")
	}
	if a.cidrErr != "" {
		why = append(why, a.cidrErr)
	} else if len(a.podCIDRs) == 0 {
		why = append(why, fmt.Sprintf("podCIDRs of node %s not known yet", a.cfg.NodeName))
	}
	if a.kube == nil {
		why = append(why, "kube-apiserver client not started")
	} else if st := a.kube.status(); !st.Synced {
		why = append(why, st.Message)
	}
	return strings.Join(why, "; ")
}

// dpLoaded reads a.dp without holding dpMu (which a reconcile may hold for a while).
func (a *Agent) dpLoaded() bool {
	return a.dpView.Load() != nil
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
	a.stMu.Lock()
	st.PodCIDRs = slices.Clone(a.podCIDRs)
	st.Uplink = a.uplink
	st.Routes = a.routes
	k := a.kube
	a.stMu.Unlock()
	if k != nil {
		ks := k.status()
		st.APIServer = api.APIServerStatus{Connected: ks.Connected, Synced: ks.Synced, Message: ks.Message}
	}
	if dp := a.dataplaneSnapshot(); dp != nil {
		st.Datapath = dp.Decisions()
		st.Features = dp.Features()
	}
	st.Datapath = append(st.Datapath, a.sock.decision())
	st.Datapath = append(st.Datapath, a.nport.decision())
	st.Datapath = append(st.Datapath, a.bw.decision())
	st.Bandwidth = a.bw.status()
	st.Datapath = append(st.Datapath, a.podDevicesDecision()) // issue 5: device.go
	if st.PodCIDRs == nil {
		st.PodCIDRs = []netip.Prefix{}
	}
	return st, nil
}

// dataplaneSnapshot returns the loaded dataplane (read-only calls only).
func (a *Agent) dataplaneSnapshot() dataplane {
	if v := a.dpView.Load(); v != nil {
		return *v
	}
	return nil
}

// Endpoints implements api.Handler: the registry with State filled in.
func (a *Agent) Endpoints(context.Context) ([]api.Endpoint, error) {
	eps := a.reg.List()
	k := a.kubeClient()
	for i := range eps {
		eps[i].State = a.endpointState(k, eps[i])
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
	a.stMu.Lock()
	why, known := a.cidrErr, len(a.podCIDRs) > 0
	a.stMu.Unlock()
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
	return api.AllocateResponse{Addresses: addrs, Device: a.podDevice()}, nil // issue 5: device.go
}

// Release implements api.Handler. Idempotent.
func (a *Agent) Release(_ context.Context, r api.ReleaseRequest) error {
	if err := a.ipam.Release(ipam.Owner{ContainerID: r.ContainerID, IfName: r.IfName}); err != nil {
		return fmt.Errorf("release %s/%s: %w", r.ContainerID, r.IfName, err)
	}
	return nil
}

// PutEndpoint implements api.Handler: persist first, then attach the pod
// program and write one map entry per IP.
func (a *Agent) PutEndpoint(_ context.Context, ep api.Endpoint) error {
	if err := validateEndpoint(ep); err != nil {
		return api.Errorf(http.StatusBadRequest, "invalid endpoint: %v", err)
	}
	for i, ip := range ep.IPs {
		ep.IPs[i] = ip.Unmap()
	}
	k := key(ep.ContainerID, ep.IfName)
	a.dpMu.Lock() // also makes the IP conflict check atomic with the write
	defer a.dpMu.Unlock()
	for _, other := range a.reg.List() {
		if key(other.ContainerID, other.IfName) == k {
			continue
		}
		for _, ip := range ep.IPs {
			if slices.Contains(other.IPs, ip) {
				return api.Errorf(http.StatusConflict, "IP %s already belongs to endpoint %s/%s (pod %s/%s): delete that endpoint first",
					ip, other.ContainerID, other.IfName, other.PodNamespace, other.PodName)
			}
		}
	}
	li, ok := lookupLink(a.nl, ep.HostIfName)
	if !ok {
		return api.Errorf(http.StatusBadRequest, "host device %s does not exist in the node's network namespace: create the pod veth before registering the endpoint", ep.HostIfName)
	}

	if a.dp == nil {
		a.stMu.Lock()
		why := a.dpErr
		a.stMu.Unlock()
		return api.Errorf(http.StatusServiceUnavailable, "datapath not loaded (%s): retry when `axon status` is ready", why)
	}
	prev, hadPrev := a.reg.Get(k)
	ep.State = ""
	ep.HostIfIndex = li.Index
	ep.Created = time.Now().UTC().Truncate(time.Second)
	if hadPrev {
		ep.Created = prev.Created
	}
	if err := a.reg.Put(ep); err != nil {
		return err
	}
	if err := a.dp.AttachPod(ep.HostIfName); err != nil {
		return fmt.Errorf("attach pod program to %s: %w", ep.HostIfName, err)
	}
	a.attached[ep.HostIfName] = li.Index
	hostMAC := li.MAC
	if len(hostMAC) == 0 {
		hostMAC = ep.HostMAC
	}
	for _, ip := range ep.IPs {
		if err := a.dp.UpsertEndpoint(MapEntry{IP: ip, IfIndex: li.Index, PodMAC: ep.PodMAC, HostMAC: hostMAC}); err != nil {
			return fmt.Errorf("write endpoint map entry %s: %w", ip, err)
		}
	}
	if hadPrev {
		for _, ip := range prev.IPs {
			if !slices.Contains(ep.IPs, ip) {
				if err := a.dp.DeleteEndpoint(ip); err != nil {
					return fmt.Errorf("delete old endpoint map entry %s: %w", ip, err)
				}
			}
		}
		if prev.HostIfName != ep.HostIfName {
			a.detach(prev.HostIfName)
		}
	}
	// a pod that opted out of socket LB must be skipped from its first
	// connect, not from the next reconcile
	a.sock.syncOptOut()
	a.log.Info("endpoint registered", "containerID", ep.ContainerID, "ifName", ep.IfName,
		"pod", ep.PodNamespace+"/"+ep.PodName, "ips", ep.IPs, "device", ep.HostIfName, "ifindex", li.Index)
	return nil
}

// DeleteEndpoint implements api.Handler: remove map entries, detach, release
// IPs, remove the record. Deleting an unknown endpoint succeeds.
func (a *Agent) DeleteEndpoint(_ context.Context, at api.Attachment) error {
	a.dpMu.Lock()
	defer a.dpMu.Unlock()
	return a.deleteLocked(at)
}

func (a *Agent) deleteLocked(at api.Attachment) error {
	k := key(at.ContainerID, at.IfName)
	if ep, ok := a.reg.Get(k); ok {
		if a.dp == nil {
			return api.Errorf(http.StatusServiceUnavailable, "datapath not loaded: cannot remove map entries of %s/%s yet; retry", at.ContainerID, at.IfName)
		}
		for _, ip := range ep.IPs {
			if err := a.dp.DeleteEndpoint(ip); err != nil {
				return fmt.Errorf("delete endpoint map entry %s: %w", ip, err)
			}
		}
		a.detach(ep.HostIfName)
	}
	if err := a.ipam.Release(ipam.Owner{ContainerID: at.ContainerID, IfName: at.IfName}); err != nil {
		return fmt.Errorf("release addresses of %s/%s: %w", at.ContainerID, at.IfName, err)
	}
	if err := a.reg.Delete(k); err != nil {
		return err
	}
	a.log.Info("endpoint deleted", "containerID", at.ContainerID, "ifName", at.IfName)
	return nil
}

// detach removes the pod program; a device that is already gone is fine.
func (a *Agent) detach(ifname string) {
	delete(a.attached, ifname)
	if err := a.dp.DetachPod(ifname); err != nil {
		if _, exists := lookupLink(a.nl, ifname); exists {
			a.log.Warn("detach pod program", "device", ifname, "error", err)
		}
	}
}

// GC implements api.Handler: everything not in r.Valid is removed.
func (a *Agent) GC(_ context.Context, r api.GCRequest) (api.GCResponse, error) {
	valid := map[api.Attachment]bool{}
	owners := map[ipam.Owner]bool{}
	for _, v := range r.Valid {
		valid[v] = true
		owners[ipam.Owner{ContainerID: v.ContainerID, IfName: v.IfName}] = true
	}
	a.dpMu.Lock()
	defer a.dpMu.Unlock()
	var resp api.GCResponse
	var errs []error
	for _, ep := range a.reg.List() {
		at := key(ep.ContainerID, ep.IfName)
		if valid[at] {
			continue
		}
		if err := a.deleteLocked(at); err != nil {
			errs = append(errs, err)
			continue
		}
		resp.Removed = append(resp.Removed, at)
	}
	released, err := a.ipam.GC(owners)
	if err != nil {
		errs = append(errs, fmt.Errorf("ipam gc: %w", err))
	}
	for _, o := range released {
		at := api.Attachment{ContainerID: o.ContainerID, IfName: o.IfName}
		if !slices.Contains(resp.Removed, at) {
			resp.Removed = append(resp.Removed, at)
		}
	}
	if a.dp != nil {
		keep := map[string]bool{}
		for _, ep := range a.reg.List() {
			keep[ep.HostIfName] = true
		}
		if err := a.dp.GCPodLinks(keep); err != nil {
			errs = append(errs, fmt.Errorf("gc pod links: %w", err))
		}
	}
	if len(resp.Removed) > 0 {
		a.log.Info("gc removed attachments", "removed", resp.Removed)
	}
	return resp, errors.Join(errs...)
}

// BandwidthMaps implements api.BandwidthHandler.
func (a *Agent) BandwidthMaps(context.Context) (api.BandwidthReply, error) { return a.bw.maps() }

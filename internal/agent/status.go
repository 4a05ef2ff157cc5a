package agent

import (
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// nodeStatus is what the reconcile learns about this node and the status
// reports: the kube client, the uplink, the podCIDRs and the count of
// reconcile passes. Its mutex is a leaf: held only to read or write these
// fields, never across a call.
type nodeStatus struct {
	mu          sync.Mutex
	kube        *kube             // nil until the kube client is built
	uplink      string            // in use; "" until resolved
	savedUplink string            // from node.json, used only while kube-apiserver is not synced
	podCIDRs    []netip.Prefix    // this node's pools
	cidrErr     string            // why podCIDRs are unknown
	reconciles  map[string]uint64 // result → count
	lastPass    time.Time         // end of the last reconcile pass, failed or not (liveness)
}

func (s *nodeStatus) kubeClient() *kube {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kube
}

func (s *nodeStatus) setKube(k *kube) {
	s.mu.Lock()
	s.kube = k
	s.mu.Unlock()
}

// uplinks returns the uplink in use ("" until resolved) and the one saved
// by the previous run.
func (s *nodeStatus) uplinks() (inUse, saved string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.uplink, s.savedUplink
}

func (s *nodeStatus) uplinkInUse() string {
	up, _ := s.uplinks()
	return up
}

func (s *nodeStatus) setUplink(up string) {
	s.mu.Lock()
	s.uplink = up
	s.mu.Unlock()
}

// setCIDRs records the pools or why they are unknown. changed: they
// changed; newWhy: why is a problem not recorded before (to log once).
// A Node that loses its podCIDRs keeps the old pools in IPAM (existing pods
// keep their addresses) but the agent reports not ready.
func (s *nodeStatus) setCIDRs(cidrs []netip.Prefix, why string) (changed, newWhy bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed = !slices.Equal(cidrs, s.podCIDRs) || why != s.cidrErr
	newWhy = why != "" && why != s.cidrErr
	if cidrs != nil || why != "" {
		s.podCIDRs = cidrs
	}
	s.cidrErr = why
	return changed, newWhy
}

// cidrs returns the pools (a copy) and why they are unknown.
func (s *nodeStatus) cidrs() (pools []netip.Prefix, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.podCIDRs), s.cidrErr
}

// saved is what node.json keeps of the status.
func (s *nodeStatus) saved() nodeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return nodeState{PodCIDRs: s.podCIDRs, Uplink: s.uplink}
}

// countReconcile counts a pass by its result.
func (s *nodeStatus) countReconcile(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reconciles == nil {
		s.reconciles = map[string]uint64{}
	}
	s.lastPass = time.Now()
	if err == nil {
		s.reconciles["ok"]++
	} else {
		s.reconciles["error"]++
	}
}

// lastReconcile is when the last reconcile pass ended (zero before the first).
func (s *nodeStatus) lastReconcile() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastPass
}

// reconcileCounts returns a copy of the pass counts by result.
func (s *nodeStatus) reconcileCounts() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.reconciles)
}

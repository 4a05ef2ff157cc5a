package agent

// The per-packet pod LB (internal/datapath/podlb) for the pods whose sockets
// the socket LB leaves alone: opted-out pods (optout.go), with
// --socket-lb-mode hostns-only every pod, and the VM pods with the VM bypass
// (their guests' sockets are not the node's; the replies are translated at
// the VM's tap). Without it their packets to a
// ClusterIP would leave the pod untranslated and nothing on the node would
// serve them. It reads the socket LB's maps, so it follows the socket LB:
// attached from the same sync as the opt-out set, never without it.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/podlb"
)

// podLBer is what the agent needs of *podlb.LB.
type podLBer interface {
	Attach(id, netnsPath string, target podlb.Target) error
	Detach(id, netnsPath string) error
}

// podLBState is the pod LB's bookkeeping (guarded by socketLB.mu; what
// status shows is in socketLB.plbPods and plbFail).
type podLBState struct {
	lb       podLBer
	loadErr  string
	attached map[string]string // id → netns path
	tapOf    map[string]string // id → the VM tap its replies are translated at ("" on the pod interface)
	swept    bool              // pins of a previous run checked against the registry
}

// podLBID names an endpoint's pod LB (its pin dir): stable across agent
// restarts, valid whatever the runtime's container IDs look like.
func podLBID(ep api.Endpoint) string {
	h := sha256.Sum256([]byte(ep.ContainerID + "/" + ep.IfName))
	return "ep-" + hex.EncodeToString(h[:10])
}

// syncPodLBLocked attaches the pod LB to the endpoints in want (their
// sockets are not translated) and to the VM pods with the VM bypass (taps:
// endpoint → tap; their guests' sockets are never the node's), and removes it
// from every other endpoint and from pins whose endpoint is gone. s.mu is
// held.
func (s *socketLB) syncPodLBLocked(eps, want []api.Endpoint, taps map[string]string) {
	st := &s.plb
	if st.lb == nil && st.loadErr == "" {
		l, err := s.newPodLB()
		if err != nil {
			st.loadErr = err.Error()
			s.log.Warn("pod LB unavailable: pods whose sockets the socket LB skips reach no ClusterIP", "error", err)
		} else {
			st.lb = l
		}
	}
	wantIDs := map[string]api.Endpoint{}
	for _, ep := range want {
		wantIDs[podLBID(ep)] = ep
	}
	for _, ep := range eps {
		if _, ok := taps[cookieKey(ep)]; ok {
			wantIDs[podLBID(ep)] = ep
		}
	}
	if st.lb == nil {
		byEP := map[string]string{}
		for _, ep := range wantIDs {
			byEP[cookieKey(ep)] = "not attached: the pod LB is unavailable: " + st.loadErr
		}
		s.setPodLBStatus(nil, map[string]string{"*": st.loadErr}, byEP)
		return
	}
	if st.attached == nil {
		st.attached, st.tapOf = map[string]string{}, map[string]string{}
	}
	byID := map[string]api.Endpoint{}
	for _, ep := range eps {
		byID[podLBID(ep)] = ep
	}
	if !st.swept { // a previous run's pins: keep what is still wanted (re-attached below)
		st.swept = true
		ids, err := podlb.Attached(s.cfg.BPFRoot)
		if err != nil {
			s.log.Warn("pod LB: list pins of a previous run", "error", err)
		}
		for _, id := range ids {
			st.attached[id] = byID[id].Netns // "" when the endpoint is gone
		}
	}
	for id, netns := range st.attached {
		if _, ok := wantIDs[id]; ok {
			continue
		}
		if err := st.lb.Detach(id, netns); err != nil {
			s.log.Warn("pod LB: detach", "id", id, "netns", netns, "error", err)
			continue
		}
		delete(st.attached, id)
		delete(st.tapOf, id)
	}
	var pods []string
	fail := map[string]string{}
	byEP := map[string]string{}
	for id, ep := range wantIDs {
		name := ep.PodNamespace + "/" + ep.PodName
		tap := taps[cookieKey(ep)]
		if ns, ok := st.attached[id]; !ok || ns != ep.Netns || st.tapOf[id] != tap {
			if err := st.lb.Attach(id, ep.Netns, podlb.Target{Ifname: ep.IfName, Tap: tap}); err != nil {
				fail[name] = err.Error()
				byEP[cookieKey(ep)] = "not attached: " + err.Error()
				s.log.Warn("pod LB: attach failed; the pod reaches no ClusterIP", "pod", name, "error", err)
				continue
			}
			st.attached[id], st.tapOf[id] = ep.Netns, tap
		}
		pods = append(pods, name)
		byEP[cookieKey(ep)] = "attached"
		if tap != "" {
			byEP[cookieKey(ep)] = "attached, replies at " + tap
		}
	}
	slices.Sort(pods)
	s.setPodLBStatus(pods, fail, byEP)
}

// podLBState is ep's pod LB for `axon endpoint list` (api.Endpoint.PodLB):
// "attached", "attached, replies at <tap>", "not attached: <why>", or "" for
// a pod whose sockets the socket LB translates.
func (s *socketLB) podLBState(ep api.Endpoint) string {
	if s == nil { // an Agent built by hand (tests)
		return ""
	}
	s.stMu.Lock()
	defer s.stMu.Unlock()
	return s.plbByEP[cookieKey(ep)]
}

// setPodLBStatus publishes what status and the endpoint list show.
func (s *socketLB) setPodLBStatus(pods []string, fail, byEP map[string]string) {
	s.stMu.Lock()
	s.plbPods, s.plbFail, s.plbByEP = pods, fail, byEP
	s.stMu.Unlock()
}

// podLBReason is the pod LB's part of the socket_lb status line.
func (s *socketLB) podLBReason() string {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	if why, ok := s.plbFail["*"]; ok {
		return "per-packet pod LB unavailable (" + why + ")"
	}
	r := fmt.Sprintf("per-packet pod LB on %d pod%s", len(s.plbPods), plural(len(s.plbPods)))
	if len(s.plbFail) > 0 {
		var f []string
		for pod, why := range s.plbFail {
			f = append(f, pod+": "+why)
		}
		slices.Sort(f)
		r += ", failed on " + strings.Join(f, "; ")
	}
	return r
}

// podLBPods lists the pods the pod LB serves (namespace/name), sorted.
func (s *socketLB) podLBPods() []string {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	return slices.Clone(s.plbPods)
}

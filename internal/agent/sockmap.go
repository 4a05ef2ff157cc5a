package agent

// The same-node TCP bypass ("sockmap"). sock_ops on --cgroup-root puts
// established TCP sockets between two local pods (and loopback sockets inside
// a pod) into a SOCKHASH; sk_msg moves each write straight into the peer
// socket's receive queue, skipping the TCP/IP stack (docs/sockmap.md). The
// programs admit only what the agent writes into two maps: the local pods'
// addresses with the netns that owns each, and the pod netns whose loopback
// is admitted.
//
// A pod is admitted unless
//
//	axon.io/sockmap: "disabled"
//
// is on the Pod, or on its Namespace and the Pod does not say "enabled"; or
// the pod has a bandwidth annotation (kubernetes.io/egress-bandwidth or
// kubernetes.io/ingress-bandwidth): the Bandwidth Manager enforces limits on
// the stack path, which the bypass skips. Any other annotation value gets an
// Event on the object and changes nothing: the pod keeps its previous
// decision (what the maps hold), a new pod stays out.
//
// Taking a pod out only stops its new connections from entering the
// SOCKHASH: the agent never deletes a live socket's entry (queued data
// would be dropped); sockets leave when they close. Nothing here fails the
// agent: a failed self-test or load leaves the bypass off with the reason in
// `axon status`, and every connection takes the stack as before.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/bwm"
	"github.com/axonhq/axon/internal/datapath/sockmap"
	"github.com/axonhq/axon/internal/netnsutil"
)

// DecisionSockmap names the same-node TCP bypass line of `axon status`.
const DecisionSockmap = "sockmap"

// AnnotationSockmap is the opt-out annotation (Pod or Namespace).
const AnnotationSockmap = "axon.io/sockmap"

// Values of --sockmap and of AnnotationSockmap.
const (
	SockmapEnabled  = "enabled"
	SockmapDisabled = "disabled"
)

// validateSockmap checks --sockmap.
func (c Config) validateSockmap() error {
	switch c.Sockmap {
	case SockmapEnabled, SockmapDisabled, "": // "" (a Config built by hand) = disabled
		return nil
	}
	return fmt.Errorf("--sockmap %q is invalid: use %s (TCP between local pods skips the TCP/IP stack) or %s",
		c.Sockmap, SockmapEnabled, SockmapDisabled)
}

// sockmapPending is the status reason before the first reconcile.
const sockmapPending = "pending: the kernel self-test and the load run at the first reconcile"

// sockmapOn reports whether --sockmap asks for the bypass.
func (c Config) sockmapOn() bool { return c.Sockmap == SockmapEnabled }

// bypassMaps is what the agent needs of the loaded bypass (*sockmap.Bypass).
type bypassMaps interface {
	SetPod(ip netip.Addr, netns uint64) error
	DeletePod(ip netip.Addr) error
	SetNetns(netns uint64) error
	DeleteNetns(netns uint64) error
	Pods() (map[netip.Addr]uint64, error)
	Netns() ([]uint64, error)
	Metrics() (map[string]uint64, error)
	Conns() ([]bypassConn, error)
	Close() error
}

// sockBypass is the same-node TCP bypass feature: the kernel self-test,
// the loaded programs and the admission of local pods.
type sockBypass struct {
	cfg      Config
	log      *slog.Logger
	reg      *registry
	kube     func() *kube                                         // the agent's kube client, nil until built
	selfTest func(context.Context) sockmap.Result                 // the kernel self-test
	load     func(streamVerdict bool) (bypassMaps, string, error) // loads and attaches; the cgroup
	cookie   func(netnsPath string) (uint64, error)               // netns cookie of a pod's netns
	pinned   func() bool                                          // a previous run's bypass is pinned
	scan     func() ([]netnsutil.Namespace, error)                // the node's netns and their addresses (bypass-only)
	svc      *serviceSync                                         // Namespaces and Events; nil until the agent runs it

	// mu serialises the self-test, the load and the map writes and guards
	// the fields up to stMu. It is held across BPF calls; status readers do
	// not take it. It is taken after no other lock of the agent.
	mu        sync.Mutex
	offDone   bool // --sockmap=disabled: a previous run's pods withdrawn
	tested    bool // the self-test ran
	passed    bool // and passed
	verdict   bool // the kernel needs the no-op stream verdict (sockmap.Result.StreamVerdict)
	bp        bypassMaps
	cookies   map[string]uint64 // cookieKey(endpoint) → netns cookie
	scanErr   string            // the last error of scan, logged once
	conflicts map[string]string // pod → its address conflict, logged once

	// stMu guards the fields below, what status and the API read. Nothing
	// is called with it held.
	stMu        sync.Mutex
	loaded      bypassMaps // = bp, for readers
	off         string     // why the bypass is off ("" = on or pending)
	cgroup      string
	selfTestMsg string
	checks      []string              // the self-test's checks, "name: ok|FAILED: detail"
	admitted    []string              // admitted pods (namespace/name), sorted
	notAdmitted map[string]string     // pod → why not
	netnsOwner  map[uint64]string     // netns cookie → pod, for the connection list
	ipOwner     map[netip.Addr]string // pod address → pod, for the connection list
}

func newSockBypass(cfg Config, log *slog.Logger, reg *registry, kube func() *kube) *sockBypass {
	return &sockBypass{cfg: cfg, log: log.With("component", "sockmap"), reg: reg, kube: kube,
		selfTest: sockmapSelfTest, load: loadSockmapFunc(cfg, sockmap.Config{}, log), cookie: netnsCookie, pinned: sockmapPinned(cfg), scan: scanNetns,
		cookies: map[string]uint64{}}
}

// ensure runs the self-test and the load once, then admits the local pods.
// Called by the reconcile; never fails the pass.
func (s *sockBypass) ensure(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.cfg.sockmapOn() {
		if msg := s.disableOnceLocked(); msg != "" {
			s.stMu.Lock()
			s.off = msg
			s.stMu.Unlock()
		}
		return
	}
	if !s.tested {
		res := s.selfTest(ctx)
		ok, reason := res.OK, res.Reason
		s.tested, s.passed, s.verdict = true, ok, res.StreamVerdict
		var checks []string
		for _, c := range res.Checks {
			v := "ok"
			if !c.OK {
				v = "FAILED"
			}
			checks = append(checks, c.Name+": "+v+": "+c.Detail)
		}
		s.stMu.Lock()
		s.checks = checks
		if ok {
			s.selfTestMsg = "passed"
		}
		s.stMu.Unlock()
		if !ok {
			s.log.Warn("same-node TCP bypass off: the kernel self-test did not pass; connections take the TCP/IP stack", "reason", reason)
			// a previous run's bypass must not keep admitting on this kernel
			off := "the kernel self-test did not pass, every connection takes the TCP/IP stack: " + reason
			if msg := s.disableOnceLocked(); msg != "" {
				off += "; " + msg
			}
			s.stMu.Lock()
			s.selfTestMsg, s.off = "did not pass: "+reason, off
			s.stMu.Unlock()
			return
		}
		s.log.Info("same-node TCP bypass: kernel self-test passed", "streamVerdict", res.StreamVerdict, "checks", len(res.Checks))
	}
	if !s.passed {
		return
	}
	if s.bp == nil {
		bp, cgroup, err := s.load(s.verdict)
		if err != nil {
			msg := fmt.Sprintf("load failed, every connection takes the TCP/IP stack: %v", err)
			s.stMu.Lock()
			changed := s.off != msg
			s.off = msg
			s.stMu.Unlock()
			if changed {
				s.log.Warn("same-node TCP bypass off; the agent keeps running without it", "cgroup", s.cfg.CgroupRoot, "error", err)
			}
			return
		}
		s.bp = bp
		s.stMu.Lock()
		s.loaded, s.off, s.cgroup = bp, "", cgroup
		s.stMu.Unlock()
		s.log.Info("same-node TCP bypass enabled", "cgroup", cgroup)
	}
	s.admitLocked()
}

// disableOnceLocked withdraws every pod a previous run with the bypass
// admitted, so that --sockmap=disabled (or a kernel that fails the
// self-test) stops new connections from entering. It keeps the SOCKHASH and
// its sockets: removing them would drop the bytes queued for their readers;
// they leave as they close. It returns what it did for status, "" when there
// was nothing to withdraw.
func (s *sockBypass) disableOnceLocked() string {
	if s.offDone {
		return ""
	}
	s.offDone = true
	if !s.pinned() {
		return ""
	}
	bp, _, err := s.load(false) // no socket enters any more: the verdict does not matter
	if err != nil {
		s.log.Warn("bypass off: could not open the bypass of a previous run to withdraw its pods; their new connections may still be bypassed", "error", err)
		return "the bypass of a previous run could not be opened to withdraw its pods: " + err.Error()
	}
	defer bp.Close()
	var errs []error
	pods, err := bp.Pods()
	errs = append(errs, err)
	for ip := range pods {
		errs = append(errs, bp.DeletePod(ip))
	}
	netns, err := bp.Netns()
	errs = append(errs, err)
	for _, c := range netns {
		errs = append(errs, bp.DeleteNetns(c))
	}
	conns, err := bp.Conns()
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		s.log.Warn("bypass off: withdraw the pods of a previous run", "error", err)
		return "withdrawing the pods of a previous run failed: " + err.Error()
	}
	msg := fmt.Sprintf("%d pod addresses of a previous run withdrawn: their new connections take the TCP/IP stack; %d sockets already bypassed stay so until they close", len(pods), len(conns))
	s.log.Info("same-node TCP bypass off: " + msg)
	return msg
}

// sync admits the local pods now: PutEndpoint calls it so that a new pod's
// first connection is bypassed, not only those after the next reconcile.
func (s *sockBypass) sync() {
	// not loaded (yet): return without waiting for mu, which the self-test
	// and the load may hold for a while
	s.stMu.Lock()
	loaded := s.loaded != nil
	s.stMu.Unlock()
	if !loaded {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bp != nil {
		s.admitLocked()
	}
}

// verdict is what the annotations say about one pod.
type verdict int

const (
	verdictAdmit verdict = iota
	verdictDeny
	verdictKeep // an invalid annotation decides: the previous decision stays
)

// annotationError is an invalid AnnotationSockmap value on the Pod or on
// its Namespace: reported by Event on that object.
type annotationError struct {
	onNamespace bool
	err         error
}

// parseSockmapAnnotation reads AnnotationSockmap; a malformed value gives
// an error (and optUnset).
func parseSockmapAnnotation(annotations map[string]string) (optState, error) {
	v, ok := annotations[AnnotationSockmap]
	if !ok {
		return optUnset, nil
	}
	switch strings.TrimSpace(v) {
	case SockmapDisabled:
		return optOut, nil
	case SockmapEnabled:
		return optIn, nil
	}
	return optUnset, fmt.Errorf("annotation %s=%q is invalid and changes nothing (the pod keeps its current same-node TCP bypass decision; a new pod is not bypassed): use %q (connections take the TCP/IP stack) or %q",
		AnnotationSockmap, v, SockmapDisabled, SockmapEnabled)
}

// decideSockmap applies the admission rule to a pod's and its Namespace's
// annotations (nsAnn nil: the Namespace is not known). why says what
// decided, for status; errs are the invalid annotations to report.
func decideSockmap(podAnn, nsAnn map[string]string) (v verdict, why string, errs []annotationError) {
	podSt, podErr := parseSockmapAnnotation(podAnn)
	if podErr != nil {
		errs = append(errs, annotationError{err: podErr})
	}
	nsSt, nsErr := parseSockmapAnnotation(nsAnn)
	if nsErr != nil {
		errs = append(errs, annotationError{onNamespace: true, err: nsErr})
	}
	for _, a := range []string{bwm.EgressAnnotation, bwm.IngressAnnotation} {
		if _, ok := podAnn[a]; ok {
			return verdictDeny, "bandwidth limit (" + a + ") is enforced on the TCP/IP stack path", errs
		}
	}
	switch {
	case podErr != nil:
		return verdictKeep, "invalid pod annotation " + AnnotationSockmap, errs
	case podSt == optOut:
		return verdictDeny, "pod annotation " + AnnotationSockmap + "=" + SockmapDisabled, errs
	case podSt == optIn:
		return verdictAdmit, "", errs
	case nsErr != nil:
		return verdictKeep, "invalid namespace annotation " + AnnotationSockmap, errs
	case nsSt == optOut:
		return verdictDeny, "namespace annotation " + AnnotationSockmap + "=" + SockmapDisabled, errs
	}
	return verdictAdmit, "", errs
}

// admitLocked writes the admitted pods' addresses and netns into the maps
// and removes the others (s.mu held, s.bp loaded). It waits for the Pod and
// Namespace caches: an empty cache must not take every pod out. What the
// maps hold is the previous decision, so an agent restart keeps it.
func (s *sockBypass) admitLocked() {
	svc := s.svc
	if svc == nil || svc.nsSynced == nil || !svc.nsSynced() {
		return
	}
	k := s.kube()
	if k == nil || !k.isSynced() {
		return
	}
	havePods, err := s.bp.Pods()
	if err != nil {
		s.log.Warn("read the admitted pods", "error", err)
		return
	}
	haveNetns, err := s.bp.Netns()
	if err != nil {
		s.log.Warn("read the admitted pod netns", "error", err)
		return
	}
	wantPods := map[netip.Addr]uint64{}
	wantNetns := map[uint64]bool{}
	var admitted []string
	notAdmitted := map[string]string{}
	owners := map[uint64]string{}
	var local []localPod
	if s.cfg.bypassOnly() {
		local = s.discoverPodsLocked(k, svc, notAdmitted)
	} else {
		local = s.registryPodsLocked(k, notAdmitted)
	}
	ipOwners := map[netip.Addr]string{}
	for _, lp := range local {
		name, pod := lp.name, lp.pod
		for _, ip := range lp.ips {
			ipOwners[ip.Unmap()] = name
		}
		var nsAnn map[string]string
		ns, err := svc.namespaces.Get(pod.Namespace)
		if err == nil {
			nsAnn = ns.Annotations
		}
		v, why, errs := decideSockmap(pod.Annotations, nsAnn)
		for _, e := range errs {
			if e.onNamespace {
				svc.ev.emit(ns, "namespace "+ns.Name, corev1.EventTypeWarning, ReasonInvalidAnnotation, e.err.Error())
			} else {
				svc.ev.emit(pod, "pod "+name, corev1.EventTypeWarning, ReasonInvalidAnnotation, e.err.Error())
			}
		}
		c := lp.cookie
		owners[c] = name
		if v == verdictKeep {
			v = verdictDeny
			if len(lp.ips) > 0 && allAdmitted(havePods, lp.ips, c) {
				v = verdictAdmit
			}
			why += ", previous decision kept"
		}
		if v != verdictAdmit {
			notAdmitted[name] = why
			continue
		}
		for _, ip := range lp.ips {
			wantPods[ip.Unmap()] = c
		}
		wantNetns[c] = true
		admitted = append(admitted, name)
	}
	var errs []error
	for ip, c := range wantPods {
		if have, ok := havePods[ip]; !ok || have != c {
			if err := s.bp.SetPod(ip, c); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for ip := range havePods {
		if _, ok := wantPods[ip]; !ok {
			if err := s.bp.DeletePod(ip); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for c := range wantNetns {
		if !slices.Contains(haveNetns, c) {
			if err := s.bp.SetNetns(c); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, c := range haveNetns {
		if !wantNetns[c] {
			if err := s.bp.DeleteNetns(c); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Warn("write the admitted pods", "error", err)
	}
	slices.Sort(admitted)
	admitted = slices.Compact(admitted) // a pod with several interfaces
	s.stMu.Lock()
	changed := !slices.Equal(admitted, s.admitted)
	s.admitted, s.notAdmitted, s.netnsOwner, s.ipOwner = admitted, notAdmitted, owners, ipOwners
	s.stMu.Unlock()
	if changed {
		s.log.Info("same-node TCP bypass: admitted pods", "pods", admitted)
	}
}

// localPod is one local pod the bypass decides about: its addresses and
// the netns (cookie) that holds them.
type localPod struct {
	name   string // namespace/name
	pod    *corev1.Pod
	ips    []netip.Addr
	cookie uint64
}

// registryPodsLocked lists the local pods axon-cni registered (the endpoint
// registry: addresses and netns path); those it cannot use go to
// notAdmitted with the reason.
func (s *sockBypass) registryPodsLocked(k *kube, notAdmitted map[string]string) []localPod {
	var out []localPod
	live := map[string]bool{}
	for _, ep := range s.reg.List() {
		if ep.PodName == "" || ep.PodNamespace == "" || ep.Netns == "" {
			continue
		}
		name := ep.PodNamespace + "/" + ep.PodName
		pod, err := k.pods.Pods(ep.PodNamespace).Get(ep.PodName)
		if err != nil {
			notAdmitted[name] = "Pod not in the agent's cache"
			continue
		}
		ck := cookieKey(ep)
		live[ck] = true
		c, ok := s.cookies[ck]
		if !ok {
			if c, err = s.cookie(ep.Netns); err != nil {
				s.log.Warn("cannot read the pod's netns cookie; its connections take the TCP/IP stack", "pod", name, "error", err)
				notAdmitted[name] = "netns cookie unreadable: " + err.Error()
				continue
			}
			s.cookies[ck] = c
		}
		out = append(out, localPod{name: name, pod: pod, ips: ep.IPs, cookie: c})
	}
	for ck := range s.cookies {
		if !live[ck] {
			delete(s.cookies, ck)
		}
	}
	return out
}

// allAdmitted reports whether every address is admitted with netns c.
func allAdmitted(have map[netip.Addr]uint64, ips []netip.Addr, c uint64) bool {
	for _, ip := range ips {
		if got, ok := have[ip.Unmap()]; !ok || got != c {
			return false
		}
	}
	return true
}

// close releases the bypass's file descriptors (pins and the cgroup link
// stay: bypassed connections keep flowing while the agent is down).
func (s *sockBypass) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bp == nil {
		return
	}
	if err := s.bp.Close(); err != nil {
		s.log.Warn("close the same-node TCP bypass", "error", err)
	}
	s.bp = nil
	s.stMu.Lock()
	s.loaded = nil
	s.stMu.Unlock()
}

// state is what status reads: the loaded bypass (nil when off) and why it is off.
func (s *sockBypass) state() (bp bypassMaps, off, cgroup, selfTest string, admitted []string, notAdmitted []string) {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	for p, why := range s.notAdmitted {
		notAdmitted = append(notAdmitted, p+": "+why)
	}
	slices.Sort(notAdmitted)
	return s.loaded, s.off, s.cgroup, s.selfTestMsg, slices.Clone(s.admitted), notAdmitted
}

// status is the sockmap part of `axon status`.
func (s *sockBypass) status() *api.SockmapStatus {
	st := &api.SockmapStatus{}
	if !s.cfg.sockmapOn() {
		st.Reason = "--sockmap=" + SockmapDisabled
		if s.cfg.Sockmap == "" {
			st.Reason = "--sockmap not set"
		}
		if _, off, _, _, _, _ := s.state(); off != "" {
			st.Reason += "; " + off
		}
		return st
	}
	bp, off, cgroup, selfTest, admitted, notAdmitted := s.state()
	st.SelfTest, st.NotAdmitted = selfTest, notAdmitted
	s.stMu.Lock()
	st.SelfTestChecks = slices.Clone(s.checks)
	s.stMu.Unlock()
	switch {
	case bp != nil:
		st.Enabled, st.Cgroup, st.PodsAdmitted = true, cgroup, len(admitted)
		st.Connections = -1
		if conns, err := bp.Conns(); err == nil {
			st.Connections = len(conns)
		}
	case off != "":
		st.Reason = off
	default:
		st.Reason = sockmapPending
	}
	return st
}

// decision is the sockmap line of `axon status`.
func (s *sockBypass) decision(st *api.SockmapStatus) api.Decision {
	d := api.Decision{Name: DecisionSockmap, Value: "off", Reason: st.Reason}
	if !st.Enabled {
		if strings.HasPrefix(st.Reason, "pending") {
			d.Value = "pending"
		}
		return d
	}
	d.Value = "enabled"
	conns := fmt.Sprint(st.Connections)
	if st.Connections < 0 {
		conns = "unreadable"
	}
	d.Reason = fmt.Sprintf("TCP between local pods skips the TCP/IP stack (sock_ops on cgroup %s); %d pod%s admitted, %s socket%s bypassed",
		st.Cgroup, st.PodsAdmitted, plural(st.PodsAdmitted), conns, plural(st.Connections))
	if n := len(st.NotAdmitted); n > 0 {
		d.Reason += fmt.Sprintf("; not admitted: %s", strings.Join(st.NotAdmitted, "; "))
	}
	return d
}

// conns is the reply of api.SockmapHandler: the SOCKHASH's sockets with the
// pods that own them (addresses and netns cookies from the registry).
func (s *sockBypass) conns() (api.SockmapReply, error) {
	rep := api.SockmapReply{Conns: []api.SockmapConn{}}
	if !s.cfg.sockmapOn() {
		rep.Reason = s.status().Reason
		return rep, nil
	}
	s.stMu.Lock()
	bp, off, byNetns, byIP := s.loaded, s.off, maps.Clone(s.netnsOwner), maps.Clone(s.ipOwner)
	s.stMu.Unlock()
	if bp == nil {
		rep.Reason = cmp.Or(off, sockmapPending)
		return rep, nil
	}
	rep.Enabled = true
	conns, err := bp.Conns()
	if err != nil {
		return rep, fmt.Errorf("read the bypassed connections: %w", err)
	}
	for _, c := range conns {
		row := api.SockmapConn{Local: unmapAddrPort(c.Local), Remote: unmapAddrPort(c.Remote), Netns: c.Netns,
			Mode: c.Mode, Alias: c.Alias, RedirectedMsgs: c.RedirectedMsgs, RedirectedBytes: c.RedirectedBytes, PassedBytes: c.PassedBytes}
		if c.Netns != 0 {
			row.LocalPod, row.RemotePod = byNetns[c.Netns], byNetns[c.Netns]
		} else {
			row.LocalPod, row.RemotePod = byIP[row.Local.Addr()], byIP[row.Remote.Addr()]
		}
		rep.Conns = append(rep.Conns, row)
	}
	slices.SortFunc(rep.Conns, func(a, b api.SockmapConn) int {
		if c := a.Local.Compare(b.Local); c != 0 {
			return c
		}
		return a.Remote.Compare(b.Remote)
	})
	if rep.Counters, err = bp.Metrics(); err != nil {
		return rep, fmt.Errorf("read the bypass counters: %w", err)
	}
	return rep, nil
}

func unmapAddrPort(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

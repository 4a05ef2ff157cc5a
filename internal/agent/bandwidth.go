package agent

// The Bandwidth Manager. Pod annotations kubernetes.io/egress-
// bandwidth and kubernetes.io/ingress-bandwidth become per-pod limits in BPF
// maps (EDT at the uplink egress, a token bucket before the redirect into the
// pod); fq on the uplink gives the EDT stamps their meaning and is put back
// when someone removes it; --bandwidth-manager-bbr sets BBR in pod netns.
// Nothing here fails the agent's reconcile: problems show in `axon status`.

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	dpbw "github.com/axonhq/axon/internal/datapath/bandwidth"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/bwm"
)

// DefaultBandwidthHorizon is fq's default drop horizon for EDT stamps.
const DefaultBandwidthHorizon = 2 * time.Second

// DecisionBandwidth names the Bandwidth Manager line of `axon status`.
const DecisionBandwidth = "bandwidth_manager"

// bandwidthCheckEvery is how often the fq qdisc on the uplink is checked
// (and put back) between reconciles.
const bandwidthCheckEvery = 2 * time.Second

// bwLoader loads the BPF side; tests may replace it.
type bwLoader func(uplink string) (*dpbw.Manager, error)

// bandwidth is the Bandwidth Manager: its BPF maps and programs, the fq
// qdisc on the uplink, the pods' GSO caps and BBR. The reconcile calls
// reconcile, loop keeps fq in place between passes, and status, decision
// and maps answer the API.
type bandwidth struct {
	cfg  Config
	log  *slog.Logger
	load bwLoader
	reg  *registry
	kube func() *kube // the agent's kube client, nil until it is built

	// mu guards every field below. It is held across the BPF and netlink
	// calls of a pass (the loader, the qdisc, the pods' netns) and taken
	// after no other lock of the agent.
	mu         sync.Mutex
	bpf        *dpbw.Manager
	nl         *netlink.Handle
	uplink     string
	loadErr    string
	offDone    bool
	qdisc      string // installed layout
	qdiscErr   string
	repairs    int
	lastRepair string
	limited    int
	problems   map[string]string // pod key → problem text (current)
	reported   map[string]string // pod UID/annotation → value already reported by Event
	bbrDone    map[string]bool   // netns path → BBR set
	bbrErr     string
	gsoOrig    map[string]uint32 // "netns|ifname" → gso_max_size before the agent capped it
	recorder   record.EventRecorder
	broadcast  record.EventBroadcaster
}

func newBandwidth(cfg Config, log *slog.Logger, reg *registry, kube func() *kube) *bandwidth {
	b := &bandwidth{cfg: cfg, log: log.With("component", "bandwidth"), reg: reg, kube: kube, problems: map[string]string{},
		reported: map[string]string{}, bbrDone: map[string]bool{}, gsoOrig: map[string]uint32{}}
	b.load = func(uplink string) (*dpbw.Manager, error) {
		m, err := dpbw.Load(dpbw.Config{PinDir: cfg.BPFRoot, Uplink: uplink, AttachMode: cfg.AttachMode,
			Logger: b.log})
		if err == nil {
			m.SetEgressSlack(bwm.EgressSlack) // catch-up credit after late packets (docs/bandwidth.md)
		}
		return m, err
	}
	return b
}

// eventRecorder builds the Event recorder once the kube client exists.
func (b *bandwidth) eventRecorder(k *kube) record.EventRecorder {
	if b.recorder != nil || k == nil {
		return b.recorder
	}
	b.broadcast = record.NewBroadcaster()
	b.broadcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: k.client.CoreV1().Events("")})
	b.recorder = b.broadcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "axon-agent", Host: b.cfg.NodeName})
	return b.recorder
}

// reconcile brings the limit maps, the uplink qdisc and BBR to the
// desired state. Called by the agent's reconcile once the tc datapath is
// loaded on uplink; never fails the pass.
func (b *bandwidth) reconcile(uplink string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.cfg.BandwidthManager {
		if !b.offDone {
			b.offDone = true
			if err := dpbw.Uninstall(b.cfg.BPFRoot, uplink); err != nil {
				b.log.Warn("--bandwidth-manager=false: could not remove the limits of a previous run", "error", err)
			}
		}
		return
	}
	if b.bpf == nil {
		if uplink == "" {
			return
		}
		bpf, err := b.load(uplink)
		if err != nil {
			msg := fmt.Sprintf("load failed, pod bandwidth is not enforced: %v", err)
			if msg != b.loadErr {
				b.log.Warn("bandwidth manager disabled; the agent keeps running without it", "error", err)
			}
			b.loadErr = msg
			return
		}
		nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			bpf.Close()
			b.loadErr = fmt.Sprintf("open netlink: %v", err)
			return
		}
		b.bpf, b.nl, b.uplink, b.loadErr = bpf, nl, uplink, ""
		b.log.Info("bandwidth manager enabled", "uplink", uplink, "attach", bpf.AttachMode(), "horizon", b.cfg.BandwidthHorizon)
	}
	if !b.bpf.Attached() {
		if err := b.bpf.Attach(); err != nil {
			b.log.Warn("re-attach the EDT program", "error", err)
		}
	}
	b.ensureQdiscLocked()
	want := b.desiredLocked()
	if err := b.bpf.Apply(want, b.cfg.BandwidthHorizon); err != nil {
		b.log.Warn("write bandwidth limits", "error", err)
	}
	b.ensurePodGSOLocked(b.reg.List(), want)
	if b.cfg.BandwidthBBR {
		b.ensureBBRLocked(b.reg.List())
	}
}

// desiredLocked reads every registered endpoint's Pod annotations.
// Invalid values leave their direction unlimited, log a line and raise one
// Warning Event per pod and value.
func (b *bandwidth) desiredLocked() []dpbw.Limit {
	k := b.kube()
	if k == nil || !k.isSynced() {
		// unknown annotations: keep what the maps hold (no flush on restart)
		var keep []dpbw.Limit
		if rows, err := b.bpf.List(); err == nil {
			byID := map[uint32]*dpbw.Limit{}
			for _, r := range rows {
				l := byID[r.ID]
				if l == nil {
					l = &dpbw.Limit{Addrs: r.Addrs}
					byID[r.ID] = l
				}
				if r.Dir == "egress" {
					l.EgressBits = r.Bits
				} else {
					l.IngressBits = r.Bits
				}
			}
			for _, l := range byID {
				keep = append(keep, *l)
			}
		}
		return keep
	}
	rec := b.eventRecorder(k)
	var want []dpbw.Limit
	problems := map[string]string{}
	seen := map[string]bool{}
	for _, ep := range b.reg.List() {
		if ep.PodName == "" || ep.PodNamespace == "" {
			continue
		}
		pod, err := k.pods.Pods(ep.PodNamespace).Get(ep.PodName)
		if err != nil {
			continue
		}
		key := ep.PodNamespace + "/" + ep.PodName
		lim, probs := bwm.ParseAnnotations(pod.Annotations)
		for _, p := range probs {
			problems[key] = joinProblem(problems[key], p.Error())
			rk := string(pod.UID) + "/" + p.Annotation
			seen[rk] = true
			if b.reported[rk] == p.Value {
				continue
			}
			b.reported[rk] = p.Value
			b.log.Warn("invalid bandwidth annotation: that direction stays unlimited", "pod", key, "annotation", p.Annotation, "value", p.Value, "reason", p.Reason)
			if rec != nil {
				rec.Eventf(pod, corev1.EventTypeWarning, "InvalidBandwidth", "%s", p.Error())
			}
		}
		if !lim.Limited() {
			continue
		}
		want = append(want, dpbw.Limit{Addrs: slices.Clone(ep.IPs), EgressBits: lim.Egress, IngressBits: lim.Ingress})
	}
	for rk := range b.reported {
		if !seen[rk] {
			delete(b.reported, rk) // fixed or gone: a new bad value reports again
		}
	}
	b.problems = problems
	b.limited = len(want)
	return want
}

func joinProblem(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// ensureQdiscLocked installs fq (mq + fq) on the uplink when it is missing.
func (b *bandwidth) ensureQdiscLocked() {
	if b.nl == nil {
		return
	}
	st, err := bwm.EnsureFQ(b.nl, b.uplink, b.cfg.BandwidthHorizon)
	if err != nil {
		msg := err.Error()
		if msg != b.qdiscErr {
			b.log.Warn("fq cannot be installed on the uplink: egress limits are not enforced (ingress limits are)", "uplink", b.uplink, "error", err)
		}
		b.qdiscErr, b.qdisc = msg, ""
		return
	}
	if st.Applied {
		if b.qdisc != "" || b.qdiscErr != "" || b.repairs > 0 {
			b.repairs++
			b.lastRepair = fmt.Sprintf("%s found %q at %s", b.uplink, st.Found, time.Now().UTC().Format(time.RFC3339))
			b.log.Warn("fq was missing on the uplink; re-applied", "uplink", b.uplink, "found", st.Found, "installed", st.Layout)
		} else {
			b.log.Info("fq installed on the uplink", "uplink", b.uplink, "replaced", st.Found, "layout", st.Layout, "txQueues", st.Queues)
		}
	}
	b.qdisc, b.qdiscErr = st.Layout, ""
}

// ensurePodGSOLocked caps the GSO size of pods with an egress limit to
// bwm.PodGSOCapTime of their rate (bwm.PodGSOMaxSize): with sub-512 µs RTTs TCP otherwise
// sends 64 KiB GSO packets, each 52 ms of link time at 10 Mbit/s, and every
// other packet of the pod waits behind them on the shared EDT clock
// (docs/bandwidth.md: p99 under load 171 ms -> 40-58 ms at 10M). A pod whose
// limit goes away gets its previous size back.
func (b *bandwidth) ensurePodGSOLocked(eps []api.Endpoint, want []dpbw.Limit) {
	egress := map[netip.Addr]uint64{}
	for _, w := range want {
		for _, ip := range w.Addrs {
			egress[ip.Unmap()] = w.EgressBits
		}
	}
	live := map[string]bool{}
	for _, ep := range eps {
		if ep.Netns == "" || ep.IfName == "" || len(ep.IPs) == 0 {
			continue
		}
		key := ep.Netns + "|" + ep.IfName
		live[key] = true
		bits := egress[ep.IPs[0].Unmap()]
		orig, capped := b.gsoOrig[key]
		switch {
		case bits > 0:
			prev, err := bwm.SetPodGSOMaxSize(ep.Netns, ep.IfName, bwm.PodGSOMaxSize(bits))
			if err != nil {
				b.log.Warn("cap the GSO size of a limited pod", "pod", ep.PodNamespace+"/"+ep.PodName, "error", err)
				continue
			}
			if !capped {
				if prev == bwm.PodGSOMaxSize(bits) {
					prev = 64 << 10 // capped by a previous agent run: the original is unknown, assume the kernel default
				}
				b.gsoOrig[key] = prev
			}
		case capped:
			if _, err := bwm.SetPodGSOMaxSize(ep.Netns, ep.IfName, orig); err != nil {
				b.log.Warn("restore the GSO size of a pod without egress limit", "pod", ep.PodNamespace+"/"+ep.PodName, "error", err)
				continue
			}
			delete(b.gsoOrig, key)
		}
	}
	for k := range b.gsoOrig {
		if !live[k] {
			delete(b.gsoOrig, k)
		}
	}
}

// ensureBBRLocked sets BBR in every endpoint's netns once.
func (b *bandwidth) ensureBBRLocked(eps []api.Endpoint) {
	if err := bwm.CheckCongestionControl("bbr"); err != nil {
		if err.Error() != b.bbrErr {
			b.log.Warn("--bandwidth-manager-bbr: BBR cannot be set in pod netns", "error", err)
		}
		b.bbrErr = err.Error()
		return
	}
	b.bbrErr = ""
	live := map[string]bool{}
	for _, ep := range eps {
		if ep.Netns == "" {
			continue
		}
		live[ep.Netns] = true
		if b.bbrDone[ep.Netns] {
			continue
		}
		prev, err := bwm.SetCongestionControl(ep.Netns, "bbr")
		if err != nil {
			b.log.Warn("set BBR in pod netns", "pod", ep.PodNamespace+"/"+ep.PodName, "error", err)
			continue
		}
		b.bbrDone[ep.Netns] = true
		b.log.Info("BBR set in pod netns", "pod", ep.PodNamespace+"/"+ep.PodName, "previous", prev)
	}
	for ns := range b.bbrDone {
		if !live[ns] {
			delete(b.bbrDone, ns)
		}
	}
}

// loop re-checks the uplink qdisc every few seconds so a removed fq comes
// back long before the next full reconcile, and releases the Bandwidth
// Manager's handles when ctx is done.
func (b *bandwidth) loop(ctx context.Context) {
	if !b.cfg.BandwidthManager {
		return
	}
	t := time.NewTicker(bandwidthCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			b.mu.Lock()
			if b.broadcast != nil {
				b.broadcast.Shutdown()
			}
			if b.bpf != nil {
				b.bpf.Close()
				b.nl.Close()
				b.bpf = nil
			}
			b.mu.Unlock()
			return
		case <-t.C:
		}
		b.mu.Lock()
		if b.bpf != nil {
			if !b.bpf.Attached() {
				if err := b.bpf.Attach(); err == nil {
					b.log.Warn("EDT program was detached from the uplink; re-attached", "uplink", b.uplink)
				}
			}
			b.ensureQdiscLocked()
		}
		b.mu.Unlock()
	}
}

// status is the Bandwidth Manager part of `axon status`.
func (b *bandwidth) status() *api.BandwidthStatus {
	st := &api.BandwidthStatus{Enabled: b.cfg.BandwidthManager, HorizonMillis: b.cfg.BandwidthHorizon.Milliseconds()}
	if !b.cfg.BandwidthManager {
		st.Reason = "--bandwidth-manager=false"
		return st
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bpf != nil {
		st.Uplink = b.uplink
	} else {
		st.Enabled, st.Reason = false, b.notLoadedLocked()
	}
	st.Qdisc, st.QdiscError, st.QdiscRepairs, st.LastRepair = b.qdisc, b.qdiscErr, b.repairs, b.lastRepair
	st.LimitedPods = b.limited
	switch {
	case !b.cfg.BandwidthBBR:
		st.BBR = "off"
	case b.bbrErr != "":
		st.BBR = "not set: " + b.bbrErr
	default:
		st.BBR = fmt.Sprintf("on (%d pod netns)", len(b.bbrDone))
	}
	keys := make([]string, 0, len(b.problems))
	for k := range b.problems {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		st.Problems = append(st.Problems, k+": "+b.problems[k])
	}
	return st
}

// notLoadedLocked says why the BPF side is not loaded (while it is not).
func (b *bandwidth) notLoadedLocked() string {
	return cmp.Or(b.loadErr, "pending: loads after the tc datapath")
}

// decision is the bandwidth_manager line of `axon status`.
func (b *bandwidth) decision() api.Decision {
	st := b.status()
	d := api.Decision{Name: DecisionBandwidth, Value: "disabled", Reason: st.Reason}
	if !st.Enabled {
		return d
	}
	d.Value = "enabled"
	egress := "egress EDT on " + st.Uplink + " with " + st.Qdisc
	if st.QdiscError != "" {
		d.Value = "degraded"
		egress = "egress NOT enforced: " + st.QdiscError
	}
	d.Reason = fmt.Sprintf("%s, horizon %dms; ingress token bucket before redirect; %d limited pod(s); BBR %s",
		egress, st.HorizonMillis, st.LimitedPods, st.BBR)
	if st.QdiscRepairs > 0 {
		d.Reason += fmt.Sprintf("; fq re-applied %d time(s), last: %s", st.QdiscRepairs, st.LastRepair)
	}
	if n := len(st.Problems); n > 0 {
		d.Reason += fmt.Sprintf("; %d pod(s) with invalid annotations (see axon status -o json)", n)
	}
	return d
}

// maps is the reply of api.BandwidthHandler: the limits in the maps, with
// the owning pod from the endpoint registry.
func (b *bandwidth) maps() (api.BandwidthReply, error) {
	rep := api.BandwidthReply{Enabled: b.cfg.BandwidthManager, Rows: []api.BandwidthRow{}}
	if !b.cfg.BandwidthManager {
		rep.Reason = "--bandwidth-manager=false"
		return rep, nil
	}
	b.mu.Lock()
	bpf, why := b.bpf, b.notLoadedLocked()
	b.mu.Unlock()
	if bpf == nil {
		rep.Enabled, rep.Reason = false, why
		return rep, nil
	}
	rows, err := bpf.List()
	if err != nil {
		return rep, err
	}
	owner := map[netip.Addr]string{}
	for _, ep := range b.reg.List() {
		for _, ip := range ep.IPs {
			if ep.PodName != "" {
				owner[ip.Unmap()] = ep.PodNamespace + "/" + ep.PodName
			}
		}
	}
	for _, r := range rows {
		row := api.BandwidthRow{ID: r.ID, Addrs: r.Addrs, Direction: r.Dir, Bits: r.Bits, Rate: bwm.FormatBits(r.Bits), Burst: r.Burst, Drops: r.Drops}
		if r.Horizon > 0 {
			row.Horizon = r.Horizon.String()
		}
		for _, ip := range r.Addrs {
			if p := owner[ip]; p != "" {
				row.Pod = p
				break
			}
		}
		rep.Rows = append(rep.Rows, row)
	}
	if rep.Counters, err = bpf.Stats(); err != nil {
		return rep, err
	}
	return rep, nil
}

// validateBandwidth checks the Bandwidth Manager flags.
func (c Config) validateBandwidth() error {
	if c.BandwidthBBR && !c.BandwidthManager {
		return fmt.Errorf("--bandwidth-manager-bbr needs --bandwidth-manager: BBR's pacing is only kept to the wire with the EDT datapath")
	}
	if c.BandwidthManager && c.BandwidthHorizon <= 0 {
		return fmt.Errorf("--bandwidth-horizon %s must be positive (fq's default is 2s)", c.BandwidthHorizon)
	}
	return nil
}

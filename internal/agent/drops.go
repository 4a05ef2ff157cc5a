package agent

// Drop counters and drop events of the node's BPF programs (bpf/lib/drop.h,
// internal/datapath/drops): the Prometheus counters axon_drop_count_total
// and axon_drop_bytes_total read at scrape time, the socket LB's map
// pressure, and the GET /v1/monitor stream behind `axon monitor`.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/drops"
	"github.com/axonhq/axon/internal/datapath/socklb"
)

// dropMonitor opens the pinned drop maps on first use (the programs that
// pin them load after the agent starts) and owns the event hub.
type dropMonitor struct {
	pinDir string
	log    *slog.Logger

	mu      sync.Mutex
	maps    *drops.Maps
	hub     *drops.Hub
	streams int
}

func newDropMonitor(pinDir string, log *slog.Logger) *dropMonitor {
	return &dropMonitor{pinDir: pinDir, log: log}
}

// open returns the maps and hub, opening them the first time they exist.
func (m *dropMonitor) open() (*drops.Maps, *drops.Hub, error) {
	if m == nil { // an Agent built without one (tests)
		return nil, nil, drops.ErrNotLoaded
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.maps != nil {
		return m.maps, m.hub, nil
	}
	mp, err := drops.Open(m.pinDir)
	if err != nil {
		return nil, nil, err
	}
	hub, err := drops.NewHub(mp, m.log)
	if err != nil {
		mp.Close()
		return nil, nil, err
	}
	m.maps, m.hub = mp, hub
	return mp, hub, nil
}

func (m *dropMonitor) close() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hub != nil {
		m.hub.Close() // the programs stop writing events
		m.maps.Close()
		m.maps, m.hub = nil, nil
	}
}

// stream reserves one of the api.MaxMonitorStreams slots.
func (m *dropMonitor) stream() (release func(), ok bool) {
	if m == nil {
		return func() {}, true // open fails next: no maps
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.streams >= api.MaxMonitorStreams {
		return nil, false
	}
	m.streams++
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			m.streams--
			m.mu.Unlock()
		})
	}, true
}

// podMatch is what a --pod filter and the pod column know of local pods.
type podMatch struct {
	byAddr    map[netip.Addr]string
	byIfindex map[uint32]string
}

func (a *Agent) localPods() podMatch {
	pm := podMatch{byAddr: map[netip.Addr]string{}, byIfindex: map[uint32]string{}}
	for _, ep := range a.reg.List() {
		if ep.PodName == "" {
			continue
		}
		name := ep.PodNamespace + "/" + ep.PodName
		for _, ip := range ep.IPs {
			pm.byAddr[ip.Unmap()] = name
		}
		if ep.HostIfIndex > 0 {
			pm.byIfindex[uint32(ep.HostIfIndex)] = name
		}
	}
	return pm
}

// podOf names the local pod an event is about: its source, else its
// destination, else the pod device it was seen on.
func (pm podMatch) podOf(e drops.Event) string {
	if p, ok := pm.byAddr[e.Src.Unmap()]; ok && e.Src.IsValid() {
		return p
	}
	if p, ok := pm.byAddr[e.Dst.Unmap()]; ok && e.Dst.IsValid() {
		return p
	}
	return pm.byIfindex[e.Ifindex]
}

// Monitor implements api.MonitorHandler.
func (a *Agent) Monitor(ctx context.Context, f api.MonitorFilter, send func(api.MonitorMessage) error) error {
	reasons := map[string]bool{}
	for _, r := range f.Reasons {
		if !drops.ValidReason(r) {
			return api.Errorf(http.StatusBadRequest, "reason %q is not a drop reason: use one of %v", r, drops.ReasonNames())
		}
		reasons[r] = true
	}
	pods := a.localPods()
	if f.Pod != "" {
		found := false
		for _, p := range pods.byAddr {
			found = found || p == f.Pod
		}
		if !found {
			return api.Errorf(http.StatusNotFound, "pod %s has no endpoint on this node: run axon monitor on the pod's node (kubectl get pod -o wide)", f.Pod)
		}
	}
	release, ok := a.drops.stream()
	if !ok {
		return api.Errorf(http.StatusServiceUnavailable, "%d monitor streams are open already: close one", api.MaxMonitorStreams)
	}
	defer release()
	mp, hub, err := a.drops.open()
	if errors.Is(err, drops.ErrNotLoaded) {
		return api.Errorf(http.StatusServiceUnavailable, "%v: wait until the datapath is loaded (axon status)", err)
	}
	if err != nil {
		return err
	}
	ring0, err := mp.ReadRingStats()
	if err != nil {
		return err
	}
	sub, cancel, err := hub.Subscribe(1024)
	if err != nil {
		return err
	}
	defer cancel()
	// the header goes out now, before the first drop: the client knows it
	// is listening
	if err := send(api.MonitorMessage{Lost: &api.MonitorLost{}}); err != nil {
		return nil
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last api.MonitorLost
	refresh := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-sub.C:
			if !ok {
				return nil
			}
			if time.Since(refresh) > 5*time.Second {
				pods, refresh = a.localPods(), time.Now()
			}
			pod := pods.podOf(ev)
			if (len(reasons) > 0 && !reasons[ev.Reason]) || (f.Protocol != "" && ev.Proto != f.Protocol) || (f.Pod != "" && pod != f.Pod) {
				continue
			}
			if err := send(api.MonitorMessage{Event: &api.DropEvent{Time: ev.Time, Prog: ev.Prog, Reason: ev.Reason,
				Direction: ev.Direction, Ifindex: ev.Ifindex, Len: ev.Len, Proto: ev.Proto, Src: ev.Src, Dst: ev.Dst,
				SrcPort: ev.SrcPort, DstPort: ev.DstPort, Pod: pod}}); err != nil {
				return nil // the client went away
			}
		case <-tick.C:
			rs, err := mp.ReadRingStats()
			if err != nil {
				return fmt.Errorf("monitor: %w", err)
			}
			now := api.MonitorLost{Stream: sub.Lost(), Ring: rs.Lost - ring0.Lost}
			if now != last {
				last = now
				if err := send(api.MonitorMessage{Lost: &now}); err != nil {
					return nil
				}
			}
		}
	}
}

var (
	descDropPackets = prometheus.NewDesc("axon_drop_count_total",
		"Packets the node's BPF programs dropped (and socket connects the socket LB refused), by reason and direction of the hook (docs/operate.md lists the reasons).",
		[]string{"reason", "direction"}, nil)
	descDropBytes = prometheus.NewDesc("axon_drop_bytes_total",
		"Bytes of the packets counted in axon_drop_count_total.", []string{"reason", "direction"}, nil)
	descDropEvents = prometheus.NewDesc("axon_drop_events_total",
		"Drop events written to the ring buffer while `axon monitor` streamed (result emitted), and lost because it was full (result lost).",
		[]string{"result"}, nil)
	descSockLBEntries = prometheus.NewDesc("axon_socklb_map_entries",
		"Entries in use in the socket LB's maps (map axon_lb_svc: frontends and their backend slots; axon_lb_be: backends).", []string{"map"}, nil)
	descSockLBMax = prometheus.NewDesc("axon_socklb_map_max_entries",
		"Size of the socket LB's maps (--lb-service-map-size, --lb-backend-map-size): writes fail beyond it.", []string{"map"}, nil)
)

// dropCollector reads the drop counters and the socket LB's map fill at
// scrape time.
type dropCollector struct{ a *Agent }

func (c dropCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDropPackets, descDropBytes, descDropEvents, descSockLBEntries, descSockLBMax} {
		ch <- d
	}
}

func (c dropCollector) Collect(ch chan<- prometheus.Metric) {
	if c.a.sock != nil {
		c.a.sock.mu.Lock()
		l := c.a.sock.lb
		c.a.sock.mu.Unlock()
		if p, ok := l.(interface{ MapPressure() []socklb.MapUsage }); ok {
			for _, u := range p.MapPressure() {
				ch <- prometheus.MustNewConstMetric(descSockLBEntries, prometheus.GaugeValue, float64(u.Entries), u.Map)
				ch <- prometheus.MustNewConstMetric(descSockLBMax, prometheus.GaugeValue, float64(u.Max), u.Map)
			}
		}
	}
	mp, _, err := c.a.drops.open()
	if err != nil {
		return // not pinned yet: no series rather than zeros that are not true
	}
	counts, err := mp.ReadCounts()
	if err != nil {
		c.a.log.Warn("metrics: drop counters not read", "err", err)
		return
	}
	for _, x := range counts {
		ch <- prometheus.MustNewConstMetric(descDropPackets, prometheus.CounterValue, float64(x.Packets), x.Reason, x.Direction)
		ch <- prometheus.MustNewConstMetric(descDropBytes, prometheus.CounterValue, float64(x.Bytes), x.Reason, x.Direction)
	}
	if rs, err := mp.ReadRingStats(); err == nil {
		ch <- prometheus.MustNewConstMetric(descDropEvents, prometheus.CounterValue, float64(rs.Emitted), "emitted")
		ch <- prometheus.MustNewConstMetric(descDropEvents, prometheus.CounterValue, float64(rs.Lost), "lost")
	}
}

package nodeport

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

// np_ct.flags and np_nat.flags (bpf/lib/ct.h, nat.h).
const (
	npCTLocal   = 0x01
	npCTSNAT    = 0x02
	npCTDSR     = 0x04
	npCTClosing = 0x08
	npCTReplied = 0x10 // unreplied table, TCP: the backend answered, the client's ACK is awaited
	npCTXDP     = 0x20 // local DNAT: the last packet was translated at XDP
	npNATSNAT   = 0x01
	npNATLocal  = 0x02
	npNATDSR    = 0x04 // with npNATLocal: a DSR request of another node's LB
	// npNATUnreplied: the flow is in axon_np_ct_new (not answered yet)
	npNATUnreplied = 0x08
)

// Tuple is one direction of a flow.
type Tuple struct {
	Proto lb.Proto
	Src   netip.AddrPort
	Dst   netip.AddrPort
}

func (t Tuple) String() string {
	p := map[lb.Proto]string{lb.TCP: "tcp", lb.UDP: "udp", lb.SCTP: "sctp"}[t.Proto]
	if p == "" {
		p = fmt.Sprintf("proto%d", t.Proto)
	}
	return fmt.Sprintf("%s %s -> %s", p, t.Src, t.Dst)
}

func npTuple(t Tuple) lbTCNpTuple {
	return lbTCNpTuple{
		Saddr: lbmap.Addr16(t.Src.Addr()), Daddr: lbmap.Addr16(t.Dst.Addr()),
		Sport: lbmap.Port(t.Src.Port()), Dport: lbmap.Port(t.Dst.Port()), Proto: uint8(t.Proto),
	}
}

func fromNPTuple(k lbTCNpTuple) Tuple {
	return Tuple{
		Proto: lb.Proto(k.Proto),
		Src:   netip.AddrPortFrom(lbmap.FromAddr16(k.Saddr), lbmap.PortHost(k.Sport)),
		Dst:   netip.AddrPortFrom(lbmap.FromAddr16(k.Daddr), lbmap.PortHost(k.Dport)),
	}
}

// CTEntry is one tracked flow (axon_np_ct).
type CTEntry struct {
	Flow    Tuple          // as the client sent it: client -> frontend
	Backend netip.AddrPort // where it goes
	NATPort uint16         // SNAT source port (Mode snat)
	Mode    string         // "local", "snat" or "dsr"
	Closing bool           // TCP FIN/RST seen
	// Unreplied: no reply seen yet (axon_np_ct_new; for DSR: no second
	// packet of the client yet). GC removes it after the short unreplied
	// timeout.
	Unreplied bool
	// Replied: an unreplied TCP flow whose backend answered; the client's
	// next packet makes it established.
	Replied    bool
	FrontendID uint32
	BackendID  uint32
	Age        time.Duration // since creation
	Idle       time.Duration // since the last refresh (refreshed at most once a second)
	// NextHop is the next hop kept in the entry (np_nh: "<MAC> on ifindex
	// <N>") while it was stored under the LB's current neighbour
	// generation; "" when none is kept or it is stale. A route change
	// since (the kernel's rt_genid, not read here) also makes it stale:
	// the next packet looks it up again.
	NextHop string
}

// NATEntry is one reverse translation (axon_np_nat).
type NATEntry struct {
	Reply  Tuple          // a reply as it is seen on the wire
	NewSrc netip.AddrPort // its source becomes (the frontend)
	NewDst netip.AddrPort // its destination becomes (the client)
	Kind   string         // "snat" (uplink ingress), "local" (uplink egress, source only), "local-dsr" (local, came by DSR)
	Idle   time.Duration
}

// monoCoarse is bpf_ktime_get_coarse_ns's clock.
func monoCoarse() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
	return uint64(ts.Nano())
}

func since(now, t uint64) time.Duration {
	if t > now {
		return 0
	}
	return time.Duration(now - t)
}

func ctMode(flags uint8) string {
	switch {
	case flags&npCTLocal != 0:
		return "local"
	case flags&npCTDSR != 0:
		return "dsr"
	case flags&npCTSNAT != 0:
		return "snat"
	}
	return "none"
}

func ctEntry(k lbTCNpTuple, v lbTCNpCt, now uint64, unreplied bool, neighGen uint32) CTEntry {
	var nh string
	if neighGen != 0 && v.Nh.NeighGen == neighGen {
		nh = fmt.Sprintf("%s on ifindex %d", net.HardwareAddr(v.Nh.Dmac[:]), v.Nh.Oif)
	}
	return CTEntry{
		NextHop:    nh,
		Unreplied:  unreplied,
		Replied:    unreplied && v.Flags&npCTReplied != 0,
		Flow:       fromNPTuple(k),
		Backend:    netip.AddrPortFrom(lbmap.FromAddr16(v.BeAddr), lbmap.PortHost(v.BePort)),
		NATPort:    lbmap.PortHost(v.NatPort),
		Mode:       ctMode(v.Flags),
		Closing:    v.Flags&npCTClosing != 0,
		FrontendID: v.FrontendId,
		BackendID:  v.BackendId,
		Age:        since(now, v.Created),
		Idle:       since(now, v.LastSeen),
	}
}

// CT lists the conntrack tables (`axon bpf ct list`): established flows,
// then those not answered yet (Unreplied).
func (n *LB) CT() ([]CTEntry, error) {
	now := monoCoarse()
	var gen uint32 // 0 (no next hop shown) where the generation cannot be read
	_ = n.tc.AxonNpNeighGen.Lookup(uint32(0), &gen)
	var out []CTEntry
	for _, m := range []struct {
		m         *ebpf.Map
		name      string
		unreplied bool
	}{{n.tc.AxonNpCt, MapCT, false}, {n.tc.AxonNpCtNew, MapCTNew, true}} {
		var k lbTCNpTuple
		var v lbTCNpCt
		it := m.m.Iterate()
		for it.Next(&k, &v) {
			out = append(out, ctEntry(k, v, now, m.unreplied, gen))
		}
		if err := it.Err(); err != nil {
			return nil, fmt.Errorf("read %s: %w", m.name, err)
		}
	}
	return out, nil
}

// NAT lists the reverse translations (`axon bpf nat list`).
func (n *LB) NAT() ([]NATEntry, error) {
	now := monoCoarse()
	var out []NATEntry
	var k lbTCNpTuple
	var v lbTCNpNat
	it := n.tc.AxonNpNat.Iterate()
	for it.Next(&k, &v) {
		kind := "snat"
		if v.Flags&npNATLocal != 0 {
			kind = "local"
			if v.Flags&npNATDSR != 0 {
				kind = "local-dsr"
			}
		}
		out = append(out, NATEntry{
			Reply:  fromNPTuple(k),
			NewSrc: netip.AddrPortFrom(lbmap.FromAddr16(v.Saddr), lbmap.PortHost(v.Sport)),
			NewDst: netip.AddrPortFrom(lbmap.FromAddr16(v.Daddr), lbmap.PortHost(v.Dport)),
			Kind:   kind,
			Idle:   since(now, v.LastSeen),
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", MapNAT, err)
	}
	return out, nil
}

// CTTimeouts are the idle times after which GC removes a flow.
type CTTimeouts struct {
	TCP        time.Duration // established TCP (default 6 h... kube-proxy/conntrack use 24 h; Cilium 6 h)
	TCPClosing time.Duration // after FIN/RST (default 10 s)
	UDP        time.Duration // (default 60 s)
	// TCPUnreplied, UDPUnreplied: idle timeouts of flows whose backend has
	// not answered yet (axon_np_ct_new; DSR: no second client packet yet),
	// at most TCP / UDP. Linux's conntrack keeps SYN_SENT 120 s and an
	// unreplied UDP flow 30 s; 60 s outlasts a client's SYN retransmissions
	// (1+2+4+8+16 s, each refreshing the entry) while an unanswered SYN
	// holds its SNAT port for a minute, not six hours. Defaults 60 s, 30 s.
	TCPUnreplied, UDPUnreplied time.Duration
	// SNATTimeWait: how long the SNAT port of a TCP flow stays reserved
	// after the flow's last packet once nothing uses it (default
	// DefaultSNATTimeWait). It must outlast the backend's TIME_WAIT: a port
	// given to another client earlier reaches the backend on a 4-tuple it
	// still holds, and a SYN the TIME_WAIT socket does not accept is
	// answered with an ACK, reset by the client and retransmitted 1 s later.
	SNATTimeWait time.Duration
}

// DefaultSNATTimeWait is Linux's TIME_WAIT (TCP_TIMEWAIT_LEN, 60 s) plus the
// 1 s granularity of last_seen (cfg_ct_refresh_ns) and some slack.
const DefaultSNATTimeWait = 65 * time.Second

// DefaultCTTimeouts follow Cilium's defaults.
var DefaultCTTimeouts = CTTimeouts{TCP: 6 * time.Hour, TCPClosing: 10 * time.Second, UDP: 60 * time.Second,
	TCPUnreplied: 60 * time.Second, UDPUnreplied: 30 * time.Second, SNATTimeWait: DefaultSNATTimeWait}

// GCStats is what one GC pass did.
type GCStats struct {
	CTEntries, CTDeleted   int
	NATEntries, NATDeleted int
}

// GC removes CT entries idle longer than their timeout (unreplied ones:
// TCPUnreplied / UDPUnreplied), and those whose
// backend is gone once they are closing or idle for TCPClosing (a flow
// still moving keeps its backend: graceful termination must not cut a
// connection whose SYN raced the backend's removal) — a UDP flow's at once,
// moving or not, as kube-proxy clears the conntrack entries of a removed UDP
// endpoint: its client keeps its socket, and only a new entry sends its next
// datagram to a backend that is there (a server pod that was replaced), then reverse entries
// idle longer than the longest timeout or without a flow: a local one after
// TCPClosing, an SNAT one (its port reservation) after SNATTimeWait for TCP,
// TCPClosing for UDP; the reservation of a flow that was never answered
// after TCPClosing too (the backend never answered, so it holds no
// TIME_WAIT for the port). An entry is re-read right before it is deleted and
// kept if a packet touched it meanwhile. Safe to run while traffic flows
// (the agent calls it periodically).
func (n *LB) GC(to CTTimeouts) (GCStats, error) {
	return n.gcAt(to, monoCoarse())
}

// gcAt is GC at the time now (bpf_ktime_get_coarse_ns's clock): tests
// pass a later time to age entries without waiting.
func (n *LB) gcAt(to CTTimeouts, now uint64) (GCStats, error) {
	if to.TCP == 0 {
		to.TCP = DefaultCTTimeouts.TCP
	}
	if to.TCPClosing == 0 {
		to.TCPClosing = DefaultCTTimeouts.TCPClosing
	}
	if to.UDP == 0 {
		to.UDP = DefaultCTTimeouts.UDP
	}
	if to.SNATTimeWait == 0 {
		to.SNATTimeWait = DefaultCTTimeouts.SNATTimeWait
	}
	if to.TCPUnreplied == 0 {
		to.TCPUnreplied = DefaultCTTimeouts.TCPUnreplied
	}
	if to.UDPUnreplied == 0 {
		to.UDPUnreplied = DefaultCTTimeouts.UDPUnreplied
	}
	to.TCPUnreplied, to.UDPUnreplied = min(to.TCPUnreplied, to.TCP), min(to.UDPUnreplied, to.UDP)
	var st GCStats
	n.mu.Lock()
	liveBE := map[uint32]bool{}
	for _, fe := range n.fe {
		for _, be := range fe.backends {
			liveBE[be.ID] = true
		}
	}
	n.mu.Unlock()
	var k lbTCNpTuple
	var v lbTCNpCt
	live := map[lbTCNpTuple]bool{} // local reverse keys still in use
	// SNAT reverse keys still in use: backend, backend port, SNAT port
	// (the SNAT address is the node's own, one per family).
	type snatKey struct {
		be     [16]uint8
		bePort uint16
		port   uint16
		proto  uint8
	}
	liveSNAT := map[snatKey]bool{}
	for _, tbl := range []struct {
		m         *ebpf.Map
		name      string
		unreplied bool
	}{{n.tc.AxonNpCt, MapCT, false}, {n.tc.AxonNpCtNew, MapCTNew, true}} {
		var dead []lbTCNpTuple
		ctSeen := map[lbTCNpTuple]uint64{} // last_seen of dead entries at the scan
		udpGone := map[lbTCNpTuple]bool{}  // UDP entries of a gone backend: deleted even if touched since
		it := tbl.m.Iterate()
		for it.Next(&k, &v) {
			st.CTEntries++
			to1 := to.UDP
			if tbl.unreplied {
				to1 = to.UDPUnreplied
			}
			if k.Proto == uint8(lb.TCP) {
				to1 = to.TCP
				if tbl.unreplied {
					to1 = to.TCPUnreplied
				}
				if v.Flags&npCTClosing != 0 {
					to1 = min(to1, to.TCPClosing)
				}
			}
			idle := since(now, v.LastSeen)
			gone := !liveBE[v.BackendId]
			if idle > to1 || (gone && (k.Proto == uint8(lb.UDP) || v.Flags&npCTClosing != 0 || idle > to.TCPClosing)) {
				dead = append(dead, k)
				ctSeen[k] = v.LastSeen
				udpGone[k] = gone && k.Proto == uint8(lb.UDP)
				continue
			}
			live[lbTCNpTuple{Saddr: v.BeAddr, Sport: v.BePort, Proto: k.Proto, Daddr: k.Saddr, Dport: k.Sport}] = true
			if v.Flags&npCTSNAT != 0 {
				liveSNAT[snatKey{be: v.BeAddr, bePort: v.BePort, port: v.NatPort, proto: k.Proto}] = true
			}
		}
		if err := it.Err(); err != nil {
			return st, fmt.Errorf("gc: read %s: %w", tbl.name, err)
		}
		for i := range dead {
			// re-read: a SYN may have reopened the flow since the scan
			var cur lbTCNpCt
			if err := tbl.m.Lookup(&dead[i], &cur); err != nil {
				continue
			}
			if cur.LastSeen != ctSeen[dead[i]] && !(udpGone[dead[i]] && !liveBE[cur.BackendId]) {
				continue
			}
			if err := tbl.m.Delete(&dead[i]); err == nil {
				st.CTDeleted++
			}
		}
	}
	maxTO := max(to.TCP, to.UDP)
	var nk lbTCNpTuple
	var nv lbTCNpNat
	var deadNAT []lbTCNpTuple
	natSeen := map[lbTCNpTuple]uint64{}
	it := n.tc.AxonNpNat.Iterate()
	for it.Next(&nk, &nv) {
		st.NATEntries++
		// A reverse entry goes with its flow: once no CT entry uses it (and
		// it has been idle for the closing timeout) its SNAT port is free
		// again. Without this, SNAT ports stayed taken for hours and a
		// busy NodePort ran out of them.
		inUse := live[nk]
		hold := to.TCPClosing
		if nv.Flags&npNATSNAT != 0 {
			inUse = liveSNAT[snatKey{be: nk.Saddr, bePort: nk.Sport, port: nk.Dport, proto: nk.Proto}]
			if nk.Proto == uint8(lb.TCP) && nv.Flags&npNATUnreplied == 0 {
				// the port stays reserved while the backend may hold the
				// 4-tuple in TIME_WAIT (one that never answered holds
				// nothing)
				hold = max(to.SNATTimeWait, to.TCPClosing)
			}
		}
		if idle := since(now, nv.LastSeen); idle > maxTO || (!inUse && idle > hold) {
			deadNAT = append(deadNAT, nk)
			natSeen[nk] = nv.LastSeen
		}
	}
	if err := it.Err(); err != nil {
		return st, fmt.Errorf("gc: read %s: %w", MapNAT, err)
	}
	for i := range deadNAT {
		// re-read: a new flow may have taken the entry over since the scan
		var cur lbTCNpNat
		if err := n.tc.AxonNpNat.Lookup(&deadNAT[i], &cur); err != nil || cur.LastSeen != natSeen[deadNAT[i]] {
			continue
		}
		if err := n.tc.AxonNpNat.Delete(&deadNAT[i]); err == nil {
			st.NATDeleted++
		}
	}
	return st, nil
}

// CTStats says how full the conntrack table is.
type CTStats struct {
	Entries int    // established flows in axon_np_ct now
	Max     uint32 // its size (Options.CTMax)
	// Unreplied / UnrepliedMax: flows not answered yet in axon_np_ct_new
	// and its size (Options.CTUnrepliedMax). A flood of new flows fills
	// and evicts only this table.
	Unreplied    int
	UnrepliedMax uint32
	Created      uint64 // flows created since the maps were made (ct_new)
	// InsertFailed counts CT updates that failed (the packet was still
	// translated). A full LRU table evicts the least recently used flow
	// instead: Created - deleted by GC - Entries is the number evicted.
	InsertFailed uint64
	// NATEntries / NATMax: reverse entries (SNAT port reservations
	// included) in axon_np_nat and its size. The NAT map never evicts: when
	// full, new SNAT flows fail (SNATNoPort) until GC frees entries.
	NATEntries int
	NATMax     uint32
	// SNATNoPort counts new SNAT flows dropped because no port was free for
	// their backend (NP_SNAT_TRIES candidates taken) or the NAT map was
	// full; the client retransmits its SYN. Widen the SNAT port range or
	// raise NATMax when it grows.
	SNATNoPort uint64
}

// CTStats counts the entries of the CT table and reads the counters.
func (n *LB) CTStats() (CTStats, error) {
	st := CTStats{Max: n.tc.AxonNpCt.MaxEntries(), UnrepliedMax: n.tc.AxonNpCtNew.MaxEntries()}
	var k lbTCNpTuple
	var v lbTCNpCt
	for _, tbl := range []struct {
		m    *ebpf.Map
		name string
		n    *int
	}{{n.tc.AxonNpCt, MapCT, &st.Entries}, {n.tc.AxonNpCtNew, MapCTNew, &st.Unreplied}} {
		it := tbl.m.Iterate()
		for it.Next(&k, &v) {
			*tbl.n++
		}
		if err := it.Err(); err != nil {
			return st, fmt.Errorf("read %s: %w", tbl.name, err)
		}
	}
	st.NATMax = n.tc.AxonNpNat.MaxEntries()
	var nk lbTCNpTuple
	var nv lbTCNpNat
	it := n.tc.AxonNpNat.Iterate()
	for it.Next(&nk, &nv) {
		st.NATEntries++
	}
	if err := it.Err(); err != nil {
		return st, fmt.Errorf("read %s: %w", MapNAT, err)
	}
	m, err := n.Metrics()
	if err != nil {
		return st, err
	}
	for hook := range m {
		st.Created += m[hook]["ct_new"]
		st.InsertFailed += m[hook]["ct_insert_fail"]
		st.SNATNoPort += m[hook]["snat_no_port"]
	}
	return st, nil
}

// ReasonNames lists the LB's counter / verdict names in enum order.
func ReasonNames() []string { return append([]string(nil), npReasonNames...) }

// Metrics returns the LB's packet counters summed over CPUs, keyed by hook
// ("tc", "xdp", "egress") and reason (ReasonNames).
func (n *LB) Metrics() (map[string]map[string]uint64, error) { return metricsOf(n.tc.AxonNpMetrics) }

// PinnedMetrics is Metrics of the LB pinned under pinDir, read without
// loading it (axon lab check compares them around its probes).
func PinnedMetrics(pinDir string) (map[string]map[string]uint64, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, MapMetrics), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open the north-south LB's counters under %s: %w", pinDir, err)
	}
	defer m.Close()
	return metricsOf(m)
}

func metricsOf(m *ebpf.Map) (map[string]map[string]uint64, error) {
	out := map[string]map[string]uint64{}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		ncpu = runtime.NumCPU()
	}
	for hi, hook := range npHookNames {
		row := map[string]uint64{}
		for ri, r := range npReasonNames {
			idx := uint32(hi*len(npReasonNames) + ri)
			vals := make([]uint64, ncpu)
			if err := m.Lookup(&idx, &vals); err != nil {
				return nil, fmt.Errorf("read %s[%d]: %w", MapMetrics, idx, err)
			}
			var sum uint64
			for _, v := range vals {
				sum += v
			}
			row[r] = sum
		}
		out[hook] = row
	}
	return out, nil
}

// ParseTuple parses "<proto> <src addr:port> <dst addr:port>" (the
// arguments of `axon lb explain`); proto is tcp or udp.
func ParseTuple(proto, src, dst string) (Tuple, error) {
	var t Tuple
	switch strings.ToLower(proto) {
	case "tcp":
		t.Proto = lb.TCP
	case "udp":
		t.Proto = lb.UDP
	default:
		return t, fmt.Errorf("protocol %q: use tcp or udp", proto)
	}
	var err error
	if t.Src, err = netip.ParseAddrPort(src); err != nil {
		return t, fmt.Errorf("source %q: %w (write 203.0.113.7:40000 or [2001:db8::7]:40000)", src, err)
	}
	if t.Dst, err = netip.ParseAddrPort(dst); err != nil {
		return t, fmt.Errorf("destination %q: %w (write 198.18.0.11:30080 or [fd00::11]:30080)", dst, err)
	}
	t.Src = netip.AddrPortFrom(t.Src.Addr().Unmap(), t.Src.Port())
	t.Dst = netip.AddrPortFrom(t.Dst.Addr().Unmap(), t.Dst.Port())
	if t.Src.Addr().Is4() != t.Dst.Addr().Is4() {
		return t, errors.New("source and destination are of different address families")
	}
	return t, nil
}

// npMetricsMigration unpins an axon_np_metrics of another size than spec
// (an older object with fewer np_reason rows): counters are not worth an
// agent that cannot start. They restart from zero, which Prometheus counters
// handle as a reset.
func npMetricsMigration(pinDir string, spec *ebpf.MapSpec, log *slog.Logger) error {
	if spec == nil {
		return nil
	}
	path := filepath.Join(pinDir, MapMetrics)
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned %s: %w", MapMetrics, err)
	}
	size := old.MaxEntries()
	old.Close()
	if size == spec.MaxEntries {
		return nil
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("migrate %s: unpin the old counters: %w", MapMetrics, err)
	}
	log.Info("nodeport LB: packet counters restart from zero (their layout changed)", "map", MapMetrics, "old_entries", size, "entries", spec.MaxEntries)
	return nil
}

// npNATMigration moves the entries of an axon_np_nat pinned by an older
// axon, an LRU hash (which could evict a live flow's reverse entry or free a
// reserved SNAT port), into the plain hash the programs now use: the old pin
// is read and removed before the load creates the new map, and restore
// writes the entries back after it. Nothing to do (nil restore) when the pin
// is missing or already a hash.
func npNATMigration(pinDir string) (restore func(*ebpf.Map) error, err error) {
	old, err := npUnpinOld(pinDir, MapNAT, func(m *ebpf.Map) bool { return m.Type() == ebpf.LRUHash })
	if old == nil || err != nil {
		return nil, err
	}
	return old.restore, nil
}

// npGrownMigration carries the entries of maps pinned by an older axon
// whose value layout has grown at its end since (np_ct: the next hop kept
// in the entry) over to the maps the programs use now. Each old pin is
// read and removed before the load creates the new map; restore writes the
// entries back after it, the new fields zero (a flow's next hop is then
// looked up again). Only a longer value with the same map type and key size
// is migrated: any other difference stays the load's error
// (npIncompatibleHint). Nothing to do (nil restore) when no pin has an
// older size.
func npGrownMigration(pinDir string, specs ...*ebpf.MapSpec) (restore func(maps map[string]*ebpf.Map) error, err error) {
	var grown []*npPinned
	for _, spec := range specs {
		old, err := npUnpinOld(pinDir, spec.Name, func(m *ebpf.Map) bool {
			return m.Type() == spec.Type && m.KeySize() == spec.KeySize && m.ValueSize() < spec.ValueSize
		})
		if err != nil {
			return nil, err
		}
		if old != nil {
			grown = append(grown, old)
		}
	}
	if len(grown) == 0 {
		return nil, nil
	}
	return func(maps map[string]*ebpf.Map) error {
		var errs []error
		for _, old := range grown {
			m := maps[old.name]
			if m == nil {
				return fmt.Errorf("migrate %s: no such map after the load", old.name)
			}
			errs = append(errs, old.restore(m))
		}
		return errors.Join(errs...)
	}, nil
}

// npPinned is a map pinned by an older axon, read and unpinned before the
// load creates the map the programs use now (npUnpinOld).
type npPinned struct {
	name       string
	keys, vals [][]byte
}

// npUnpinOld reads the entries of the map pinned as name under pinDir and
// removes its pin when migrate says its layout changed; nil when there is
// no pin or it stays.
func npUnpinOld(pinDir, name string, migrate func(old *ebpf.Map) bool) (*npPinned, error) {
	path := filepath.Join(pinDir, name)
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open pinned %s: %w", name, err)
	}
	defer old.Close()
	if !migrate(old) {
		return nil, nil
	}
	p := &npPinned{name: name}
	var k, v []byte
	it := old.Iterate()
	for it.Next(&k, &v) {
		p.keys, p.vals = append(p.keys, k), append(p.vals, v)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("migrate %s: read the old map: %w", name, err)
	}
	if err := os.Remove(path); err != nil {
		return nil, fmt.Errorf("migrate %s: unpin the old map: %w", name, err)
	}
	return p, nil
}

// restore writes the old entries into m, the map that replaces the old
// one; a value shorter than m's gets zeros at its end. An entry the
// programs created since is kept.
func (p *npPinned) restore(m *ebpf.Map) error {
	var errs []error
	v := make([]byte, m.ValueSize()) // the old values are all one size: the tail stays zero
	for i := range p.keys {
		copy(v, p.vals[i])
		if err := m.Update(p.keys[i], v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("migrate %s: %d of %d entries not copied: %w", p.name, len(errs), len(p.keys), errs[0])
	}
	return nil
}

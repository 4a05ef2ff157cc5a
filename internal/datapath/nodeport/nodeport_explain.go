package nodeport

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/inetcsum"
	"github.com/axonhq/axon/internal/lb"
)

// Explanation answers "which backend would this flow hit" (`axon lb explain`).
type Explanation struct {
	Flow       Tuple
	Verdict    string         // np_reason name: dnat_local, snat_fwd, dsr_encap, drop_*, not_service, ...
	Existing   bool           // an existing CT entry decided (the flow is established)
	Mode       string         // "local", "snat", "dsr" ("" when not translated)
	Frontend   lb.FrontendKey // the frontend that matched (zero when none)
	FrontendID uint32
	BackendID  uint32
	Backend    netip.AddrPort // zero when dropped / not a service
	// NATPort is the SNAT source port of an existing flow (a new one shows
	// the first port of the range: the real pick depends on what is free).
	NATPort uint16
}

// npExplainer is a second instance of the tc ingress program loaded with
// cfg_dry_run=1 on the same maps: it writes nothing but axon_np_explain.
type npExplainer struct {
	objs lbTCObjects
}

func (e *npExplainer) close() error { return e.objs.Close() }

func (n *LB) explainerLocked() (*npExplainer, error) {
	if n.explain != nil {
		return n.explain, nil
	}
	spec, err := loadLbTC()
	if err != nil {
		return nil, fmt.Errorf("parse lb_tc object: %w", err)
	}
	if err := n.opts.setVariables(spec, true); err != nil {
		return nil, err
	}
	e := &npExplainer{}
	opts := &ebpf.CollectionOptions{MapReplacements: n.sharedMaps()}
	if err := spec.LoadAndAssign(&e.objs, opts); err != nil {
		return nil, fmt.Errorf("load dry-run instance: %w", datapath.VerifierDetail(err))
	}
	n.explain = e
	return e, nil
}

// Explain runs a synthetic first packet of flow t (a TCP SYN or a UDP
// datagram) through a dry-run instance of the ingress program sharing the
// live maps: conntrack, affinity and NAT are read, never written, and
// nothing is sent. A random pick is one possible answer; Maglev, affinity
// and existing flows answer exactly.
func (n *LB) Explain(t Tuple) (Explanation, error) {
	ex := Explanation{Flow: t}
	if t.Proto != lb.TCP && t.Proto != lb.UDP {
		return ex, fmt.Errorf("explain %s: only tcp and udp flows are balanced", t)
	}
	if !t.Src.IsValid() || !t.Dst.IsValid() || t.Src.Addr().Unmap().Is4() != t.Dst.Addr().Unmap().Is4() {
		return ex, fmt.Errorf("explain %s: give a source and a destination address:port of one family", t)
	}
	pkt := npPacket(t, npSYN)
	n.mu.Lock()
	defer n.mu.Unlock()
	e, err := n.explainerLocked()
	if err != nil {
		return ex, fmt.Errorf("explain %s: %w", t, err)
	}
	zero := uint32(0)
	var res lbTCNpExplain
	if err := e.objs.AxonNpExplain.Put(&zero, &res); err != nil {
		return ex, fmt.Errorf("explain %s: reset result: %w", t, err)
	}
	if _, err := e.objs.AxonLbIngress.Run(&ebpf.RunOptions{Data: pkt}); err != nil {
		return ex, fmt.Errorf("explain %s: run dry-run program: %w", t, err)
	}
	if err := e.objs.AxonNpExplain.Lookup(&zero, &res); err != nil {
		return ex, fmt.Errorf("explain %s: read result: %w", t, err)
	}
	if int(res.Reason) < len(npReasonNames) {
		ex.Verdict = npReasonNames[res.Reason]
	} else {
		ex.Verdict = fmt.Sprintf("reason%d", res.Reason)
	}
	ex.Existing = res.CtHit != 0
	ex.FrontendID, ex.BackendID = res.FrontendId, res.BackendId
	if res.BackendId != 0 {
		ex.Backend = netip.AddrPortFrom(lbmap.FromAddr16(res.BeAddr), lbmap.PortHost(res.BePort))
		ex.Mode = ctMode(res.CtFlags)
		ex.NATPort = lbmap.PortHost(res.NatPort)
	}
	for k, st := range n.fe {
		if st.id == res.FrontendId && res.FrontendId != 0 {
			ex.Frontend = k
		}
	}
	return ex, nil
}

// TCP flags for npPacket.
const (
	npFIN = 0x01
	npSYN = 0x02
	npRST = 0x04
	npACK = 0x10
)

// npPacket builds an ethernet frame of flow t: a TCP segment with flags, or
// a UDP datagram with 8 bytes of payload. Checksums are correct.
func npPacket(t Tuple, tcpFlags uint8) []byte {
	return npPacketPayload(t, tcpFlags, make([]byte, 8))
}

func npPacketPayload(t Tuple, tcpFlags uint8, payload []byte) []byte {
	src, dst := t.Src.Addr().Unmap(), t.Dst.Addr().Unmap()
	var l4 []byte
	if t.Proto == lb.TCP {
		l4 = make([]byte, 20+len(payload))
		l4[12] = 5 << 4
		l4[13] = tcpFlags
		binary.BigEndian.PutUint16(l4[14:], 64240)
	} else {
		l4 = make([]byte, 8+len(payload))
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	}
	copy(l4[len(l4)-len(payload):], payload)
	binary.BigEndian.PutUint16(l4[0:], t.Src.Port())
	binary.BigEndian.PutUint16(l4[2:], t.Dst.Port())
	return npFrame(src, dst, uint8(t.Proto), l4, true)
}

// npFrame wraps an L4 message into IPv4/IPv6 + ethernet, filling the L4
// checksum (TCP, UDP, ICMPv6 via pseudo header; ICMPv4 without) when fill.
func npFrame(src, dst netip.Addr, proto uint8, l4 []byte, fill bool) []byte {
	eth := []byte{0x02, 0, 0, 0, 0, 0xee, 0x02, 0, 0, 0, 0, 0xcc, 0x08, 0x00}
	var ip []byte
	var pseudo []byte
	if src.Is4() {
		ip = make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		ip[8] = 64
		ip[9] = proto
		s, d := src.As4(), dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], inetcsum.Checksum(ip, 0))
		pseudo = append(append(append([]byte{}, s[:]...), d[:]...), 0, proto, byte(len(l4)>>8), byte(len(l4)))
	} else {
		eth[12], eth[13] = 0x86, 0xdd
		ip = make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6] = proto
		ip[7] = 64
		s, d := src.As16(), dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		pseudo = append(append(append([]byte{}, s[:]...), d[:]...), 0, 0, byte(len(l4)>>8), byte(len(l4)), 0, 0, 0, proto)
	}
	if fill {
		switch proto {
		case uint8(lb.TCP):
			binary.BigEndian.PutUint16(l4[16:], inetcsum.Checksum(append(pseudo, l4...), 0))
		case uint8(lb.UDP):
			c := inetcsum.Checksum(append(pseudo, l4...), 0)
			if c == 0 {
				c = 0xffff
			}
			binary.BigEndian.PutUint16(l4[6:], c)
		case 1: // ICMPv4: no pseudo header
			binary.BigEndian.PutUint16(l4[2:], inetcsum.Checksum(l4, 0))
		case 58:
			binary.BigEndian.PutUint16(l4[2:], inetcsum.Checksum(append(pseudo, l4...), 0))
		}
	}
	return append(append(eth, ip...), l4...)
}

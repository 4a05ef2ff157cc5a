// Package clusterdns is the real-kubelet lab's cluster DNS: the records of the Kubernetes DNS
// specification that pods and the e2e suite resolve, served from the apiserver's Services and
// EndpointSlices, on UDP and TCP port 53 of every node netns (kubelet's clusterDNS is the
// node's own IP). It answers only names in its cluster domain (REFUSED otherwise: the lab
// has no upstream resolver).
//
//	<svc>.<ns>.svc.<domain>               A/AAAA: the ClusterIPs; headless: the ready endpoints
//	<hostname>.<svc>.<ns>.svc.<domain>    A/AAAA: the endpoint with that hostname (headless)
//	<svc>.<ns>.svc.<domain>  (ExternalName)  CNAME to the external name
//	<a-b-c-d>.<ns>.pod.<domain>           A: the address written in the name
//	_<port>._<proto>.<svc>.<ns>.svc.<domain>  SRV: the named port (headless: per endpoint)
//	<d.c.b.a>.in-addr.arpa                PTR: a Service's ClusterIP → <svc>.<ns>.svc.<domain>
package clusterdns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"

	"github.com/axonhq/axon/internal/netnsutil"
)

// DefaultDomain is the cluster domain (kubelet's clusterDomain).
const DefaultDomain = "cluster.local"

// ttl of every answer: short, Services change during a test.
const ttl = 5

// Source is what the server answers from.
type Source interface {
	Service(ns, name string) (*corev1.Service, error)
	Services() ([]*corev1.Service, error)
	EndpointSlices(ns, svc string) ([]*discoveryv1.EndpointSlice, error)
}

// Server answers DNS queries for one cluster domain.
type Server struct {
	domain string // "cluster.local." (lowercase, trailing dot)
	src    Source
	log    *slog.Logger
}

// New returns a server for domain (default DefaultDomain) answering from src.
func New(domain string, src Source, log *slog.Logger) *Server {
	if domain == "" {
		domain = DefaultDomain
	}
	if log == nil {
		log = slog.Default()
	}
	return &Server{domain: strings.ToLower(strings.TrimSuffix(domain, ".")) + ".", src: src, log: log.With("component", "cluster-dns")}
}

// Answer builds the response to one query message (nil when the query is not parseable).
func (s *Server) Answer(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, Authoritative: true}
	answers, rcode := s.resolve(q)
	rh.RCode = rcode
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), rh)
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	for _, a := range answers {
		hdr := dnsmessage.ResourceHeader{Name: a.name, Class: dnsmessage.ClassINET, TTL: ttl}
		switch {
		case a.srv != "":
			if t, err := dnsmessage.NewName(a.srv); err == nil {
				_ = b.SRVResource(hdr, dnsmessage.SRVResource{Priority: 0, Weight: 100, Port: a.port, Target: t})
			}
		case a.ptr != "":
			if t, err := dnsmessage.NewName(a.ptr); err == nil {
				_ = b.PTRResource(hdr, dnsmessage.PTRResource{PTR: t})
			}
		case a.cname != "":
			cn, err := dnsmessage.NewName(a.cname)
			if err == nil {
				_ = b.CNAMEResource(hdr, dnsmessage.CNAMEResource{CNAME: cn})
			}
		case a.ip.Is4():
			_ = b.AResource(hdr, dnsmessage.AResource{A: a.ip.As4()})
		default:
			_ = b.AAAAResource(hdr, dnsmessage.AAAAResource{AAAA: a.ip.As16()})
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

type answer struct {
	name  dnsmessage.Name
	ip    netip.Addr
	cname string // CNAME target
	ptr   string // PTR target
	srv   string // SRV target, with port
	port  uint16
}

// resolve answers q: records of the matching family, NXDOMAIN for a name in the domain that
// does not exist, REFUSED outside the domain.
func (s *Server) resolve(q dnsmessage.Question) ([]answer, dnsmessage.RCode) {
	name := strings.ToLower(q.Name.String())
	if q.Class == dnsmessage.ClassINET && strings.HasSuffix(name, ".in-addr.arpa.") {
		return s.reverse(q, name)
	}
	if q.Class != dnsmessage.ClassINET || !strings.HasSuffix(name, "."+s.domain) {
		return nil, dnsmessage.RCodeRefused
	}
	labels := strings.Split(strings.TrimSuffix(name, "."+s.domain), ".")
	if len(labels) == 5 && labels[4] == "svc" && strings.HasPrefix(labels[0], "_") && strings.HasPrefix(labels[1], "_") {
		return s.srv(q, labels[3], labels[2], labels[0][1:], labels[1][1:])
	}
	var ips []netip.Addr
	cname := ""
	found := false
	switch {
	case len(labels) == 3 && labels[2] == "svc":
		ips, cname, found = s.service(labels[1], labels[0], "")
	case len(labels) == 4 && labels[3] == "svc":
		ips, _, found = s.service(labels[2], labels[1], labels[0])
	case len(labels) == 3 && labels[2] == "pod":
		ip, err := netip.ParseAddr(strings.ReplaceAll(labels[0], "-", "."))
		if err != nil {
			ip, err = netip.ParseAddr(strings.ReplaceAll(labels[0], "-", ":"))
		}
		if err == nil {
			ips, found = []netip.Addr{ip}, true
		}
	case len(labels) == 2 && labels[1] == "svc", len(labels) == 1 && (labels[0] == "svc" || labels[0] == "pod"):
		return nil, dnsmessage.RCodeSuccess // empty non-terminals exist
	}
	if !found {
		return nil, dnsmessage.RCodeNameError
	}
	var out []answer
	if cname != "" {
		if q.Type == dnsmessage.TypeCNAME || q.Type == dnsmessage.TypeA || q.Type == dnsmessage.TypeAAAA || q.Type == dnsmessage.TypeALL {
			out = append(out, answer{name: q.Name, cname: strings.TrimSuffix(cname, ".") + "."})
		}
		return out, dnsmessage.RCodeSuccess
	}
	for _, ip := range ips {
		if (q.Type == dnsmessage.TypeA && ip.Is4()) || (q.Type == dnsmessage.TypeAAAA && ip.Is6()) || q.Type == dnsmessage.TypeALL {
			out = append(out, answer{name: q.Name, ip: ip})
		}
	}
	return out, dnsmessage.RCodeSuccess // NOERROR with no answer for the other family
}

// srv answers _<port>._<proto>.<svc>.<ns>.svc: the named port of the Service, its target the
// Service's name (ClusterIP) or each ready endpoint's name (headless: <hostname> or the
// address with dashes, below the Service's name).
func (s *Server) srv(q dnsmessage.Question, ns, name, port, proto string) ([]answer, dnsmessage.RCode) {
	svc, err := s.src.Service(ns, name)
	if err != nil || svc == nil {
		return nil, dnsmessage.RCodeNameError
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if strings.EqualFold(svc.Spec.Ports[i].Name, port) && strings.EqualFold(string(svc.Spec.Ports[i].Protocol), proto) {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		return nil, dnsmessage.RCodeNameError
	}
	if q.Type != dnsmessage.TypeSRV && q.Type != dnsmessage.TypeALL {
		return nil, dnsmessage.RCodeSuccess
	}
	base := name + "." + ns + ".svc." + s.domain
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		return []answer{{name: q.Name, srv: base, port: uint16(sp.Port)}}, dnsmessage.RCodeSuccess
	}
	slices, err := s.src.EndpointSlices(ns, name)
	if err != nil {
		return nil, dnsmessage.RCodeServerFailure
	}
	var out []answer
	for _, sl := range slices {
		var epPort int32
		for _, p := range sl.Ports {
			if p.Name != nil && strings.EqualFold(*p.Name, port) && p.Port != nil {
				epPort = *p.Port
			}
		}
		if epPort == 0 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready && !svc.Spec.PublishNotReadyAddresses {
				continue
			}
			for _, a := range ep.Addresses {
				host := strings.NewReplacer(".", "-", ":", "-").Replace(a)
				if ep.Hostname != nil && *ep.Hostname != "" {
					host = *ep.Hostname
				}
				out = append(out, answer{name: q.Name, srv: host + "." + base, port: uint16(epPort)})
			}
		}
	}
	return out, dnsmessage.RCodeSuccess
}

// reverse answers d.c.b.a.in-addr.arpa PTR for the Services' ClusterIPs (REFUSED for other
// addresses: the lab has no upstream resolver).
func (s *Server) reverse(q dnsmessage.Question, name string) ([]answer, dnsmessage.RCode) {
	parts := strings.Split(strings.TrimSuffix(name, ".in-addr.arpa."), ".")
	if len(parts) != 4 {
		return nil, dnsmessage.RCodeRefused
	}
	ip, err := netip.ParseAddr(parts[3] + "." + parts[2] + "." + parts[1] + "." + parts[0])
	if err != nil {
		return nil, dnsmessage.RCodeRefused
	}
	svcs, err := s.src.Services()
	if err != nil {
		return nil, dnsmessage.RCodeServerFailure
	}
	for _, svc := range svcs {
		for _, c := range svc.Spec.ClusterIPs {
			if c == ip.String() {
				if q.Type != dnsmessage.TypePTR && q.Type != dnsmessage.TypeALL {
					return nil, dnsmessage.RCodeSuccess
				}
				return []answer{{name: q.Name, ptr: svc.Name + "." + svc.Namespace + ".svc." + s.domain}}, dnsmessage.RCodeSuccess
			}
		}
	}
	return nil, dnsmessage.RCodeRefused
}

// service looks up Service ns/name: its ClusterIPs, its ready endpoints when headless (only the
// one with hostname host when host is set), or its ExternalName.
func (s *Server) service(ns, name, host string) (ips []netip.Addr, cname string, found bool) {
	svc, err := s.src.Service(ns, name)
	if err != nil || svc == nil {
		return nil, "", false
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil, svc.Spec.ExternalName, host == ""
	}
	headless := svc.Spec.ClusterIP == corev1.ClusterIPNone
	if !headless && host == "" {
		for _, c := range svc.Spec.ClusterIPs {
			if ip, err := netip.ParseAddr(c); err == nil {
				ips = append(ips, ip)
			}
		}
		return ips, "", true
	}
	slices, err := s.src.EndpointSlices(ns, name)
	if err != nil {
		return nil, "", false
	}
	for _, sl := range slices {
		for _, ep := range sl.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			if !ready && !svc.Spec.PublishNotReadyAddresses {
				continue
			}
			if host != "" && (ep.Hostname == nil || *ep.Hostname != host) {
				continue
			}
			for _, a := range ep.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil {
					ips = append(ips, ip)
				}
			}
		}
	}
	return ips, "", host == "" || len(ips) > 0
}

// informerSource answers from shared informers of Services and EndpointSlices.
type informerSource struct {
	svcs   corelisters.ServiceLister
	slices discoverylisters.EndpointSliceLister
}

func (i informerSource) Service(ns, name string) (*corev1.Service, error) {
	return i.svcs.Services(ns).Get(name)
}

func (i informerSource) Services() ([]*corev1.Service, error) {
	return i.svcs.List(labels.Everything())
}

func (i informerSource) EndpointSlices(ns, svc string) ([]*discoveryv1.EndpointSlice, error) {
	return i.slices.EndpointSlices(ns).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc}))
}

// WatchCluster starts informers on c and returns a Source once they have synced.
func WatchCluster(ctx context.Context, c kubernetes.Interface) (Source, error) {
	f := informers.NewSharedInformerFactory(c, 0)
	src := informerSource{svcs: f.Core().V1().Services().Lister(), slices: f.Discovery().V1().EndpointSlices().Lister()}
	f.Start(ctx.Done())
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for t, ok := range f.WaitForCacheSync(sctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("cluster DNS: informer %v did not sync", t)
		}
	}
	return src, nil
}

// ServeInNetns listens on UDP and TCP listen (e.g. "0.0.0.0:53") inside each netns and answers
// until ctx is cancelled.
func (s *Server) ServeInNetns(ctx context.Context, netnsPaths []string, listen string) error {
	var pcs []net.PacketConn
	var ls []net.Listener
	closeAll := func() {
		for _, p := range pcs {
			p.Close()
		}
		for _, l := range ls {
			l.Close()
		}
	}
	for _, path := range netnsPaths {
		err := netnsutil.DoAt(path, func() error {
			pc, err := net.ListenPacket(udpNetwork(listen), listen)
			if err != nil {
				return fmt.Errorf("cluster DNS: listen udp %s in %s: %w", listen, path, err)
			}
			pcs = append(pcs, pc)
			l, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("cluster DNS: listen tcp %s in %s: %w", listen, path, err)
			}
			ls = append(ls, l)
			return nil
		})
		if err != nil {
			closeAll()
			return err
		}
	}
	var wg sync.WaitGroup
	for _, pc := range pcs {
		wg.Add(1)
		go func() { defer wg.Done(); s.serveUDP(pc) }()
	}
	for _, l := range ls {
		wg.Add(1)
		go func() { defer wg.Done(); s.serveTCP(l) }()
	}
	<-ctx.Done()
	closeAll()
	wg.Wait()
	return nil
}

// udpNetwork is "udp4" for an IPv4 listen address: Go would open 0.0.0.0 as a dual-stack
// IPv6 socket, where IPv4 packet info (serveUDP) is not delivered.
func udpNetwork(listen string) string {
	if host, _, err := net.SplitHostPort(listen); err == nil {
		if a, err := netip.ParseAddr(host); err == nil && a.Is4() {
			return "udp4"
		}
	}
	return "udp"
}

// serveUDP answers the queries that reach pc. Each answer leaves from the address its query
// was sent to (IP_PKTINFO / IPV6_PKTINFO), as DNS servers on a wildcard address must: the
// kernel would otherwise pick the source of the route back, e.g. the host-side address of a
// ptp pod's veth instead of the node IP the pod asked, and the pod's resolver would drop it.
func (s *Server) serveUDP(pc net.PacketConn) {
	replyFrom := newReplyConn(pc)
	buf := make([]byte, 1500)
	for {
		n, dst, from, err := replyFrom.read(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn("udp read", "err", err)
			}
			return
		}
		if resp := s.Answer(buf[:n]); resp != nil {
			if len(resp) > 512 { // truncate: the client retries over TCP
				resp = truncated(buf[:n])
			}
			_ = replyFrom.write(resp, dst, from)
		}
	}
}

// replyConn reads a UDP socket's datagrams with their destination address and writes answers
// from it.
type replyConn struct {
	p4 *ipv4.PacketConn // an IPv4 socket, else
	p6 *ipv6.PacketConn
}

func newReplyConn(pc net.PacketConn) replyConn {
	if a, ok := pc.LocalAddr().(*net.UDPAddr); ok && a.IP.To4() != nil {
		p := ipv4.NewPacketConn(pc)
		_ = p.SetControlMessage(ipv4.FlagDst, true) // unsupported: answers leave as the kernel routes them
		return replyConn{p4: p}
	}
	p := ipv6.NewPacketConn(pc)
	_ = p.SetControlMessage(ipv6.FlagDst, true)
	return replyConn{p6: p}
}

func (c replyConn) read(b []byte) (n int, dst net.IP, from net.Addr, err error) {
	if c.p4 != nil {
		var cm *ipv4.ControlMessage
		n, cm, from, err = c.p4.ReadFrom(b)
		if cm != nil {
			dst = cm.Dst
		}
		return n, dst, from, err
	}
	var cm *ipv6.ControlMessage
	n, cm, from, err = c.p6.ReadFrom(b)
	if cm != nil {
		dst = cm.Dst
	}
	return n, dst, from, err
}

func (c replyConn) write(b []byte, src net.IP, to net.Addr) error {
	if c.p4 != nil {
		var cm *ipv4.ControlMessage
		if src != nil {
			cm = &ipv4.ControlMessage{Src: src}
		}
		_, err := c.p4.WriteTo(b, cm, to)
		return err
	}
	var cm *ipv6.ControlMessage
	if src != nil {
		cm = &ipv6.ControlMessage{Src: src}
	}
	_, err := c.p6.WriteTo(b, cm, to)
	return err
}

// truncated is an empty response with TC set.
func truncated(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Truncated: true, RecursionDesired: h.RecursionDesired})
	_ = b.StartQuestions()
	_ = b.Question(q)
	out, _ := b.Finish()
	return out
}

func (s *Server) serveTCP(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			for {
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				var lb [2]byte
				if _, err := ioReadFull(c, lb[:]); err != nil {
					return
				}
				q := make([]byte, int(lb[0])<<8|int(lb[1]))
				if _, err := ioReadFull(c, q); err != nil {
					return
				}
				resp := s.Answer(q)
				if resp == nil {
					return
				}
				if _, err := c.Write(append([]byte{byte(len(resp) >> 8), byte(len(resp))}, resp...)); err != nil {
					return
				}
			}
		}()
	}
}

func ioReadFull(c net.Conn, b []byte) (int, error) { return io.ReadFull(c, b) }

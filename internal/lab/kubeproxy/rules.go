package kubeproxy

// What a kube-proxy has programmed, read from its rules: the lab waits for
// the demo Services to be in every node's iptables or nftables rules before
// it probes them. kube-proxy's /metrics cannot say that: its "changes
// pending" gauges are shared by the IPv4 and IPv6 proxiers (a sync of one
// family zeroes the other's count), and "last sync" is stamped when a sync
// ends, so a sync that started before a write still counts as after it.

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/axonhq/axon/internal/netnsutil"
)

// Want is what one Service port must look like in a kube-proxy's
// rules: every frontend address, its node port, and a DNAT to every ready
// endpoint.
type Want struct {
	Service   string // namespace/name
	Port      string // the Service port's name
	Proto     string // tcp, udp or sctp
	NodePort  int32  // 0: none
	Frontends []netip.Addr
	Endpoints []netip.AddrPort
}

// Wants lists what svc (with its status) and slices ask of every
// kube-proxy.
func Wants(svc *corev1.Service, slices []*discoveryv1.EndpointSlice) []Want {
	var fronts []netip.Addr
	ips := append(append([]string{}, svc.Spec.ClusterIPs...), svc.Spec.ExternalIPs...)
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		ips = append(ips, ing.IP)
	}
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil {
			fronts = append(fronts, a)
		}
	}
	var out []Want
	for _, sp := range svc.Spec.Ports {
		w := Want{Service: svc.Namespace + "/" + svc.Name, Port: sp.Name,
			Proto: strings.ToLower(string(sp.Protocol)), NodePort: sp.NodePort, Frontends: fronts}
		for _, sl := range slices {
			var port int32
			for _, p := range sl.Ports {
				if p.Name != nil && *p.Name == sp.Name && p.Port != nil {
					port = *p.Port
				}
			}
			if port == 0 {
				continue
			}
			for _, e := range sl.Endpoints {
				if e.Conditions.Ready != nil && !*e.Conditions.Ready {
					continue
				}
				for _, s := range e.Addresses {
					if a, err := netip.ParseAddr(s); err == nil {
						w.Endpoints = append(w.Endpoints, netip.AddrPortFrom(a, uint16(port)))
					}
				}
			}
		}
		out = append(out, w)
	}
	return out
}

// rules is one family's rules of one kube-proxy, parsed just enough
// to compare with Wants.
type rules struct {
	text      string                             // the whole dump (frontend addresses are looked up in it)
	endpoints map[string]map[netip.AddrPort]bool // "namespace/name:port" -> DNAT targets
	nodePorts []string                           // lines that map a node port to a Service port
}

var (
	iptComment  = regexp.MustCompile(`--comment (?:"([^"]*)"|(\S+))`)
	iptDNAT     = regexp.MustCompile(`-j DNAT --to-destination (\S+)`)
	nftChain    = regexp.MustCompile(`^\s*chain (?:service|local)-[A-Z0-9]+-(\S+)/(tcp|udp|sctp)/(\S+) \{`)
	nftAnyChain = regexp.MustCompile(`^\s*chain \S+ \{`)
	nftEndpoint = regexp.MustCompile(`([0-9a-fA-F:.]+) \. ([0-9]+)`)
	nftDNATOne  = regexp.MustCompile(`dnat (?:ip6? )?to (\S+)`)
)

// parseRules reads iptables-save -t nat output (mode iptables) or
// `nft list table <family> kube-proxy` output (mode nftables).
func parseRules(mode, text string) rules {
	r := rules{text: text, endpoints: map[string]map[netip.AddrPort]bool{}}
	add := func(key string, ap netip.AddrPort) {
		if r.endpoints[key] == nil {
			r.endpoints[key] = map[netip.AddrPort]bool{}
		}
		r.endpoints[key][ap] = true
	}
	chain := "" // nftables: the Service port of the chain being read
	for _, line := range strings.Split(text, "\n") {
		if mode == IPTables {
			c := iptComment.FindStringSubmatch(line)
			if c == nil {
				continue
			}
			key := c[1] + c[2]
			if strings.Contains(line, "--dport ") {
				r.nodePorts = append(r.nodePorts, line)
			}
			if d := iptDNAT.FindStringSubmatch(line); d != nil {
				if ap, err := netip.ParseAddrPort(d[1]); err == nil {
					add(key, ap)
				}
			}
			continue
		}
		if m := nftChain.FindStringSubmatch(line); m != nil {
			chain = m[1] + ":" + m[3]
			continue
		}
		if nftAnyChain.MatchString(line) {
			chain = ""
			continue
		}
		if strings.Contains(line, " : goto ") {
			r.nodePorts = append(r.nodePorts, line)
		}
		if chain == "" || !strings.Contains(line, "dnat ") {
			continue
		}
		if m := nftDNATOne.FindStringSubmatch(line); m != nil {
			if ap, err := netip.ParseAddrPort(m[1]); err == nil {
				add(chain, ap)
				continue
			}
		}
		for _, m := range nftEndpoint.FindAllStringSubmatch(line, -1) {
			a, err1 := netip.ParseAddr(m[1])
			p, err2 := strconv.ParseUint(m[2], 10, 16)
			if err1 == nil && err2 == nil {
				add(chain, netip.AddrPortFrom(a, uint16(p)))
			}
		}
	}
	return r
}

// hasAddr reports whether a appears in the rules as a whole address.
func (r rules) hasAddr(a netip.Addr) bool {
	s := a.String()
	for i := 0; ; {
		j := strings.Index(r.text[i:], s)
		if j < 0 {
			return false
		}
		j += i
		end := j + len(s)
		if (j == 0 || !isAddrChar(r.text[j-1])) && (end == len(r.text) || !isAddrChar(r.text[end])) {
			return true
		}
		i = j + 1
	}
}

func isAddrChar(c byte) bool {
	return c == '.' || c == ':' || c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// missing says what of w (for the family v6) the rules lack, or "".
func (w Want) missing(mode string, r rules, v6 bool) string {
	key := w.Service + ":" + w.Port
	for _, a := range w.Frontends {
		if a.Is6() == v6 && !r.hasAddr(a) {
			return fmt.Sprintf("%s: no rule for frontend %s", key, a)
		}
	}
	for _, ep := range w.Endpoints {
		if ep.Addr().Is6() == v6 && !r.endpoints[key][ep] {
			return fmt.Sprintf("%s: no DNAT to endpoint %s", key, ep)
		}
	}
	if w.NodePort == 0 {
		return ""
	}
	a, b := "\""+key+"\"", fmt.Sprintf("--dport %d ", w.NodePort) // iptables
	if mode == NFTables {
		a, b = fmt.Sprintf("-%s/%s/%s", w.Service, w.Proto, w.Port), fmt.Sprintf("%s . %d : goto ", w.Proto, w.NodePort)
	}
	for _, line := range r.nodePorts {
		if strings.Contains(line, a) && strings.Contains(line, b) {
			return ""
		}
	}
	return fmt.Sprintf("%s: no rule for node port %d", key, w.NodePort)
}

// readRules dumps the rules kube-proxy (mode) wrote in netns for
// one family.
func readRules(ctx context.Context, netns, mode string, v6 bool) (rules, error) {
	var argv []string
	switch {
	case mode == NFTables && v6:
		argv = []string{"nft", "list", "table", "ip6", "kube-proxy"}
	case mode == NFTables:
		argv = []string{"nft", "list", "table", "ip", "kube-proxy"}
	case v6:
		argv = []string{"ip6tables-save", "-t", "nat"}
	default:
		argv = []string{"iptables-save", "-t", "nat"}
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + netnsutil.Path(netns), "--"}, argv...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return rules{}, fmt.Errorf("%s in %s: %w: %s", strings.Join(argv, " "), netns, err, strings.TrimSpace(stderr.String()))
	}
	return parseRules(mode, stdout.String()), nil
}

// Lacks says what of wants the kube-proxy in netns has not
// programmed yet (both families), or "".
func Lacks(ctx context.Context, netns, mode string, wants []Want) (string, error) {
	for _, v6 := range []bool{false, true} {
		r, err := readRules(ctx, netns, mode, v6)
		if err != nil {
			return "", err
		}
		for _, w := range wants {
			if why := w.missing(mode, r, v6); why != "" {
				return why, nil
			}
		}
	}
	return "", nil
}

// Package nodeportapi serves the north-south load balancer's maps over the
// local API (api.NorthSouthHandler): conntrack, reverse NAT, Maglev tables
// and the explain simulator, read from a loaded nodeport.LB. The
// agent and the standalone `axon lb` both use it, so `axon bpf ct list`,
// `axon bpf nat list`, `axon bpf lb maglev get` and `axon lb explain` work
// the same against either.
package nodeportapi

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/lb"
)

// Handler implements api.NorthSouthHandler.
type Handler struct {
	// LB returns the loaded load balancer, or nil and why it is not loaded.
	LB func() (*nodeport.LB, string)
	// Resolve maps a service name (namespace/name, or a VIP name) to its
	// programmed frontends with their display names; nil = only frontend=.
	Resolve func(service string) ([]lb.Frontend, error)
}

var _ api.NorthSouthHandler = Handler{}

func protoName(p lb.Proto) string { return strings.ToLower(p.String()) }

// CT implements api.NorthSouthHandler.
func (h Handler) CT(context.Context) (api.CTReply, error) {
	np, why := h.LB()
	if np == nil {
		return api.CTReply{Reason: why}, nil
	}
	es, err := np.CT()
	if err != nil {
		return api.CTReply{}, err
	}
	rep := api.CTReply{Enabled: true, Max: int(np.Options().CTMax)}
	for _, e := range es {
		rep.Entries = append(rep.Entries, api.CTEntry{
			Proto: protoName(e.Flow.Proto), Client: e.Flow.Src.String(), Frontend: e.Flow.Dst.String(),
			Backend: e.Backend.String(), NATPort: e.NATPort, Mode: e.Mode, Closing: e.Closing,
			Unreplied: e.Unreplied, AgeSec: e.Age.Seconds(), IdleSec: e.Idle.Seconds(), NextHop: e.NextHop,
		})
	}
	slices.SortFunc(rep.Entries, func(a, b api.CTEntry) int {
		return cmp.Or(strings.Compare(a.Frontend, b.Frontend), strings.Compare(a.Client, b.Client), strings.Compare(a.Proto, b.Proto))
	})
	return rep, nil
}

// NAT implements api.NorthSouthHandler.
func (h Handler) NAT(context.Context) (api.NATReply, error) {
	np, why := h.LB()
	if np == nil {
		return api.NATReply{Reason: why}, nil
	}
	es, err := np.NAT()
	if err != nil {
		return api.NATReply{}, err
	}
	rep := api.NATReply{Enabled: true}
	for _, e := range es {
		rep.Entries = append(rep.Entries, api.NATEntry{
			Proto: protoName(e.Reply.Proto), ReplySrc: e.Reply.Src.String(), ReplyDst: e.Reply.Dst.String(),
			NewSrc: e.NewSrc.String(), NewDst: e.NewDst.String(), Kind: e.Kind, IdleSec: e.Idle.Seconds(),
		})
	}
	slices.SortFunc(rep.Entries, func(a, b api.NATEntry) int {
		return cmp.Or(strings.Compare(a.ReplySrc, b.ReplySrc), strings.Compare(a.ReplyDst, b.ReplyDst))
	})
	return rep, nil
}

// ParseFrontend parses addr:port/proto (proto tcp or udp, default tcp).
// NodePort frontends are written with the unspecified address (0.0.0.0:30080/tcp).
func ParseFrontend(s string) (lb.FrontendKey, error) {
	ap, proto, _ := strings.Cut(s, "/")
	a, err := netip.ParseAddrPort(ap)
	if err != nil {
		return lb.FrontendKey{}, fmt.Errorf("frontend %q: write addr:port/proto such as 198.18.0.100:80/tcp, [2001:db8::1]:53/udp or 0.0.0.0:30080/tcp for a NodePort", s)
	}
	k := lb.FrontendKey{Addr: a.Addr().Unmap(), Port: a.Port(), Proto: lb.TCP}
	switch strings.ToLower(proto) {
	case "", "tcp":
	case "udp":
		k.Proto = lb.UDP
	default:
		return k, fmt.Errorf("frontend %q: protocol %q is not tcp or udp", s, proto)
	}
	if k.Addr.IsUnspecified() {
		k.Scope = lb.ScopeNodePort
	}
	return k, nil
}

// Maglev implements api.NorthSouthHandler.
func (h Handler) Maglev(_ context.Context, service, frontend string, slots bool) (api.MaglevReply, error) {
	np, why := h.LB()
	if np == nil {
		return api.MaglevReply{}, api.Errorf(http.StatusServiceUnavailable, "north-south load balancer not loaded: %s", why)
	}
	var fs []lb.Frontend
	if frontend != "" {
		k, err := ParseFrontend(frontend)
		if err != nil {
			return api.MaglevReply{}, api.Errorf(http.StatusBadRequest, "%v", err)
		}
		fs = []lb.Frontend{{Key: k}}
	} else {
		if h.Resolve == nil {
			return api.MaglevReply{}, api.Errorf(http.StatusBadRequest, "select by frontend=addr:port/proto")
		}
		var err error
		if fs, err = h.Resolve(service); err != nil {
			return api.MaglevReply{}, api.Errorf(http.StatusNotFound, "%v", err)
		}
	}
	var rep api.MaglevReply
	for _, f := range fs {
		tab, err := np.MaglevTable(f.Key)
		if err != nil {
			return api.MaglevReply{}, api.Errorf(http.StatusNotFound, "%v", err)
		}
		mt := api.MaglevTable{Frontend: f.Key.String(), Service: f.Service, Size: len(tab), Random: tab == nil}
		count := map[netip.AddrPort]int{}
		for _, ap := range tab {
			count[ap]++
			if slots {
				mt.Slots = append(mt.Slots, ap.String())
			}
		}
		for ap, n := range count {
			mt.Backends = append(mt.Backends, api.MaglevShare{Backend: ap.String(), Slots: n})
		}
		slices.SortFunc(mt.Backends, func(a, b api.MaglevShare) int { return strings.Compare(a.Backend, b.Backend) })
		rep.Tables = append(rep.Tables, mt)
	}
	return rep, nil
}

// Explain implements api.NorthSouthHandler.
func (h Handler) Explain(_ context.Context, proto, src, dst string) (api.ExplainReply, error) {
	np, why := h.LB()
	if np == nil {
		return api.ExplainReply{}, api.Errorf(http.StatusServiceUnavailable, "north-south load balancer not loaded: %s", why)
	}
	t, err := nodeport.ParseTuple(proto, src, dst)
	if err != nil {
		return api.ExplainReply{}, api.Errorf(http.StatusBadRequest, "%v", err)
	}
	ex, err := np.Explain(t)
	if err != nil {
		return api.ExplainReply{}, err
	}
	return Reply(ex), nil
}

// Reply renders an Explanation for the API.
func Reply(ex nodeport.Explanation) api.ExplainReply {
	rep := api.ExplainReply{Flow: ex.Flow.String(), Verdict: ex.Verdict, Mode: ex.Mode}
	if ex.Frontend.Addr.IsValid() {
		rep.Frontend = ex.Frontend.String()
		rep.Steps = append(rep.Steps, fmt.Sprintf("frontend %s matched (id %d)", rep.Frontend, ex.FrontendID))
	} else {
		rep.Steps = append(rep.Steps, "no frontend matches the destination: passed to the stack untouched")
	}
	if ex.Existing {
		rep.Steps = append(rep.Steps, "an established flow (conntrack entry) decides the backend")
	} else if ex.Frontend.Addr.IsValid() {
		rep.Steps = append(rep.Steps, "new flow: backend selected by the frontend's algorithm (a random pick is one possible answer; Maglev and affinity are exact)")
	}
	if ex.Backend.IsValid() {
		rep.Backend = ex.Backend.String()
		line := fmt.Sprintf("backend %s (id %d), %s", rep.Backend, ex.BackendID, ex.Mode)
		if ex.NATPort != 0 {
			line += fmt.Sprintf(", SNAT source port %d", ex.NATPort)
		}
		rep.Steps = append(rep.Steps, line)
	}
	rep.Steps = append(rep.Steps, "verdict "+ex.Verdict)
	return rep
}

package agent

// The local API routes of the north-south LB (api.NorthSouthHandler:
// /v1/bpf/ct, /v1/bpf/nat, /v1/bpf/maglev, /v1/lb/explain).

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/nodeportapi"
)

var _ api.NorthSouthHandler = (*Agent)(nil)

// api serves the north-south routes from the loaded LB.
func (n *nodePort) api() nodeportapi.Handler {
	return nodeportapi.Handler{
		LB: func() (*nodeport.LB, string) {
			if !n.cfg.NodePortLB.Enabled {
				return nil, "--nodeport=false"
			}
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.np == nil {
				return nil, cmp.Or(n.err, "not loaded yet (loads after the tc datapath and the first Service sync)")
			}
			return n.np, ""
		},
		Resolve: n.resolveService,
	}
}

// resolveService returns the north-south frontends of a Service
// (namespace/name; "default/" is assumed without a slash).
func (n *nodePort) resolveService(name string) ([]lb.Frontend, error) {
	if n.svc == nil {
		return nil, fmt.Errorf("the Service watch is not running")
	}
	if !strings.Contains(name, "/") {
		name = "default/" + name
	}
	var out []lb.Frontend
	for _, f := range n.svc.frontends() {
		if f.Service == name && northSouth(f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("service %s has no NodePort, LoadBalancer, externalIP or HostPort frontend on this node (ClusterIPs are balanced by the socket LB: see `axon bpf lb list`)", name)
	}
	return out, nil
}

// CT implements api.NorthSouthHandler.
func (a *Agent) CT(ctx context.Context) (api.CTReply, error) { return a.nport.api().CT(ctx) }

// NAT implements api.NorthSouthHandler.
func (a *Agent) NAT(ctx context.Context) (api.NATReply, error) { return a.nport.api().NAT(ctx) }

// Maglev implements api.NorthSouthHandler.
func (a *Agent) Maglev(ctx context.Context, service, frontend string, slots bool) (api.MaglevReply, error) {
	return a.nport.api().Maglev(ctx, service, frontend, slots)
}

// Explain implements api.NorthSouthHandler.
func (a *Agent) Explain(ctx context.Context, proto, src, dst string) (api.ExplainReply, error) {
	return a.nport.explain(ctx, proto, src, dst)
}

// explain is the reply of Explain, with the Service of the frontend.
func (n *nodePort) explain(ctx context.Context, proto, src, dst string) (api.ExplainReply, error) {
	rep, err := n.api().Explain(ctx, proto, src, dst)
	if err == nil && rep.Frontend != "" && n.svc != nil {
		for _, f := range n.svc.frontends() {
			if f.Key.String() == rep.Frontend {
				rep.Service = f.Service
			}
		}
	}
	return rep, err
}

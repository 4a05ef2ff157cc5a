package lb

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto%d", uint8(p))
}

func (s Scope) String() string {
	switch s {
	case ScopeCluster:
		return "cluster"
	case ScopeNodePort:
		return "nodeport"
	case ScopeHostPort:
		return "hostport"
	}
	return fmt.Sprintf("scope%d", uint8(s))
}

func (s BackendState) String() string {
	switch s {
	case Active:
		return "active"
	case Terminating:
		return "terminating"
	case Quarantined:
		return "quarantined"
	}
	return fmt.Sprintf("state%d", uint8(s))
}

func (k FrontendKey) String() string { return fmtKey(k) }

// fmtKey prints addr:port/PROTO, IPv6 in brackets; a NodePort frontend shows
// the unspecified address of its family (0.0.0.0 or [::]).
func fmtKey(k FrontendKey) string {
	return netip.AddrPortFrom(k.Addr, k.Port).String() + "/" + k.Proto.String()
}

// Render prints frontends in the text format shared by `axon service list`,
// `axon bpf lb list` and the golden tests: one line per frontend, then one
// indented line per backend. Frontends are sorted by key and backends by
// address, so the output is stable whatever order the input has:
//
//	10.96.0.10:53/UDP           ClusterIP     kube-system/kube-dns:dns  affinity=none
//	  -> 10.244.1.5:53            active       node1
//	  -> 10.244.2.7:53            terminating  node2
//
// A frontend without backends shows "(no backends: connections refused)".
func Render(fs []Frontend) string {
	fs = slices.Clone(fs)
	slices.SortStableFunc(fs, func(a, b Frontend) int { return CompareKeys(a.Key, b.Key) })
	var b strings.Builder
	for _, f := range fs {
		name := f.Service
		if f.PortName != "" {
			name += ":" + f.PortName
		}
		aff := "none"
		if f.Affinity > 0 {
			aff = fmt.Sprintf("ClientIP/%ds", int64(f.Affinity.Seconds()))
		}
		line := fmt.Sprintf("%-27s %-13s %s  affinity=%s", fmtKey(f.Key), f.Kind, name, aff)
		if f.LocalOnly {
			line += " policy=Local"
		}
		b.WriteString(line + "\n")
		if len(f.Backends) == 0 {
			b.WriteString("  (no backends: connections refused)\n")
			continue
		}
		bs := slices.Clone(f.Backends)
		slices.SortStableFunc(bs, CompareBackends)
		for _, be := range bs {
			node := be.NodeName
			if node == "" {
				node = "-"
			}
			line := fmt.Sprintf("  -> %-24s %-12s %s", netip.AddrPortFrom(be.Addr, be.Port), be.State, node)
			if be.Zone != "" {
				line += " zone=" + be.Zone
			}
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

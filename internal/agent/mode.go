package agent

// --mode: what the agent runs on its node.
//
// full (the default): axon is the node's CNI: the pod datapath, routes,
// IPAM, the socket LB, the north-south LB, the Bandwidth Manager and,
// when asked for, the same-node TCP bypass.
//
// bypass-only: another CNI plugin networks the node's pods (any plugin that
// gives each pod its own network namespace holding its addresses). The
// agent runs only the same-node TCP bypass: no tc or XDP program, no socket
// LB, no IPAM, no route, no sysctl, no change to the Node; the CNI part of
// the local API refuses. It learns the node's pods from the kube-apiserver
// (their status.podIPs) and finds each pod's network namespace itself: the
// one namespace of the node that holds the pod's addresses
// (sockmap_discover.go).

import (
	"errors"
	"fmt"
)

// Values of --mode.
const (
	ModeFull       = "full"
	ModeBypassOnly = "bypass-only"
)

// DecisionMode names the `axon status` line of --mode=bypass-only.
const DecisionMode = "mode"

// validateMode checks --mode (and that bypass-only has a bypass to run).
func (c Config) validateMode() error {
	switch c.Mode {
	case ModeFull, "":
		return nil
	case ModeBypassOnly:
		if !c.sockmapOn() {
			return fmt.Errorf("--mode=%s runs only the same-node TCP bypass, but --sockmap=%s: drop --sockmap (the mode turns it on) or pass --sockmap=%s",
				ModeBypassOnly, c.Sockmap, SockmapEnabled)
		}
		return nil
	}
	return fmt.Errorf("--mode %q is invalid: use %s (axon networks the node's pods) or %s (another CNI plugin does; the agent runs only the same-node TCP bypass)",
		c.Mode, ModeFull, ModeBypassOnly)
}

// bypassOnly reports whether the agent runs only the same-node TCP bypass.
func (c Config) bypassOnly() bool { return c.Mode == ModeBypassOnly }

// errBypassOnly is what the CNI part of the local API answers in bypass-only mode.
var errBypassOnly = errors.New("this axon-agent runs --mode=" + ModeBypassOnly +
	": another CNI plugin networks this node's pods; remove axon-cni from the node's CNI configuration, or run the agent with --mode=" + ModeFull)

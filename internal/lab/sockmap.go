package lab

// sockmapAgentArgs is the agents' --sockmap for `axon lab up --sockmap
// on|off` (the same-node TCP bypass; on is the agent's default, so a lab.json
// written before the switch existed keeps it on).
//
// On a baseline lab (pods wired by the reference ptp plugin, Services by
// kube-proxy) the agents run only the bypass (--mode=bypass-only): they
// find the pods' netns by address, with no axon-cni on the node.
func sockmapAgentArgs(st *State) []string {
	if st.Datapath == DatapathBaseline {
		return []string{"--mode=bypass-only", "--sockmap=enabled"}
	}
	if st.NoSockmap {
		return []string{"--sockmap=disabled"}
	}
	return []string{"--sockmap=enabled"}
}

// SockmapMode is the lab's same-node TCP bypass switch as `axon lab up`
// spells it: on or off.
// DaemonSetAgents reports whether the nodes' agents are the axon DaemonSet's (--kubelet with
// the axon datapath, the chart's settings) rather than processes of the lab's (Node.Agent).
func (st *State) DaemonSetAgents() bool { return st.Kubelet && st.Datapath == DatapathAxon }

// RunsAgent reports whether node n runs an axon-agent, the lab's or the DaemonSet's: its API
// answers on n.Socket.
func (st *State) RunsAgent(n Node) bool { return n.Agent != nil || st.DaemonSetAgents() }

func (st *State) SockmapMode() string {
	if st.NoSockmap {
		return "off"
	}
	return "on"
}

// runsAgents reports whether a lab of this datapath runs an axon-agent on
// each node: always with the axon datapath; with the baseline only for the
// same-node TCP bypass (--sockmap on), in bypass-only mode.
func runsAgents(datapath string, noSockmap bool) bool {
	return datapath == DatapathAxon || (datapath == DatapathBaseline && !noSockmap)
}

package lab

// sockmapAgentArgs is the agents' --sockmap for `axon lab up --sockmap
// on|off` (the same-node TCP bypass; on is the agent's default, so a lab.json
// written before the switch existed keeps it on).
func sockmapAgentArgs(st *State) []string {
	if st.NoSockmap {
		return []string{"--sockmap=disabled"}
	}
	return []string{"--sockmap=enabled"}
}

// SockmapMode is the lab's same-node TCP bypass switch as `axon lab up`
// spells it: on or off.
func (st *State) SockmapMode() string {
	if st.NoSockmap {
		return "off"
	}
	return "on"
}

package lab

// Issue 6: `axon lab up --bandwidth-manager on|off` runs the axon agents
// with (or without) the Bandwidth Manager. The TBF baseline (the reference
// bandwidth CNI plugin) is measured in the 6.12 VM by internal/bwm's
// TestEDTLatencyVsTBF: this machine's kernel has no sch_fq, so EDT cannot
// pace in a lab here (the ingress policer and the maps work).

import "fmt"

// Bandwidth Manager modes of the lab.
const (
	BandwidthOff = "off"
	BandwidthOn  = "on"
)

func validateBandwidthMode(m string) error {
	switch m {
	case "", BandwidthOff, BandwidthOn:
		return nil
	case "cni-plugin":
		return fmt.Errorf("--bandwidth-manager cni-plugin is not available in the lab yet: the TBF baseline (reference bandwidth plugin) runs in the 6.12 VM benchmark, see docs/bandwidth.md; use on or off")
	}
	return fmt.Errorf("--bandwidth-manager %q: want on or off", m)
}

// bandwidthAgentArgs are the agent flags for the lab's Bandwidth Manager mode.
func bandwidthAgentArgs(st *State) []string {
	if st.BandwidthManager == BandwidthOn {
		return []string{"--bandwidth-manager"}
	}
	return nil
}

package agent

import (
	"os"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/datapath"
)

// TestDeviceModeValidate: an unknown --device-mode is a start-up error that
// lists the valid ones; a forced netkit mode on a kernel without netkit makes
// the agent refuse to start with the probe's reason (the 6.18 host), and is
// accepted where netkit exists (the 6.12 VM).
func TestDeviceModeValidate(t *testing.T) {
	base := Defaults()
	base.NodeName = "n1"
	base.SocketLB = false
	for _, mode := range []string{"veth", "auto"} {
		c := base
		c.DeviceMode = mode
		if err := c.Validate(); err != nil {
			t.Errorf("--device-mode=%s: %v", mode, err)
		}
	}
	c := base
	c.DeviceMode = "netkitt"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `--device-mode "netkitt" is invalid: use one of veth|netkit|netkit-l2|auto`) {
		t.Errorf("unknown mode: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for the netkit probe")
	}
	have := datapath.ProbeNetkit().Available
	for _, mode := range []string{"netkit", "netkit-l2"} {
		c := base
		c.DeviceMode = mode
		err := c.Validate()
		switch {
		case have && err != nil:
			t.Errorf("--device-mode=%s on a kernel with netkit: %v", mode, err)
		case !have && (err == nil || !strings.Contains(err.Error(), "cannot create netkit devices") || !strings.Contains(err.Error(), "CONFIG_NETKIT")):
			t.Errorf("--device-mode=%s on a kernel without netkit: %v, want a refusal with the reason", mode, err)
		}
		if err != nil {
			t.Logf("%s: %v", mode, err)
		}
	}
}

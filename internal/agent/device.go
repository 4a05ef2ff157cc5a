package agent

import (
	"fmt"
	"slices"
	"strings"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/podpath"
)

// DefaultDeviceMode is --device-mode's default: veth, the device every kernel
// has. auto picks netkit where the kernel has it (see docs/pod-networking.md).
const DefaultDeviceMode = podpath.DeviceModeVeth

// validateDevice checks --device-mode. A forced netkit mode is probed here,
// so an agent on a kernel without netkit refuses to start with the reason
// instead of failing every pod later.
func (c Config) validateDevice() error {
	if !slices.Contains(podpath.DeviceModes, c.DeviceMode) {
		return fmt.Errorf("--device-mode %q is invalid: use one of %s", c.DeviceMode, strings.Join(podpath.DeviceModes, "|"))
	}
	if c.DeviceMode != podpath.DeviceModeNetkit && c.DeviceMode != podpath.DeviceModeNetkitL2 {
		return nil
	}
	_, _, _, err := podpath.DeviceDecision(c.DeviceMode, datapath.ProbeNetkit())
	return err
}

// deviceSource is implemented by the real datapath (not by test fakes).
type deviceSource interface {
	Device() api.DeviceConfig
}

var _ deviceSource = dpAdapter{} // the agent's datapath answers Allocate with the pod device

// podDevice is the device new pods get (Allocate's answer to axon-cni): the
// datapath's operational mode and BIG TCP sizes. nil until the datapath is
// loaded: axon-cni then builds a veth with kernel defaults, and the
// PutEndpoint that follows fails until the datapath is ready (the CNI ADD is
// rolled back and retried by the runtime).
func (a *Agent) podDevice() *api.DeviceConfig {
	ds, ok := a.pods.snapshot().(deviceSource)
	if !ok {
		return nil
	}
	d := ds.Device()
	return &d
}

// podDevicesDecision counts the registered endpoints per device type: after a
// --device-mode change old pods keep their device until they are recreated.
func (a *Agent) podDevicesDecision() api.Decision {
	count := map[string]int{}
	for _, ep := range a.reg.List() {
		t := ep.DeviceType
		if t == "" {
			t = api.DeviceVeth
		}
		if ep.NetkitMode != "" {
			t += "-" + ep.NetkitMode
		}
		count[t]++
	}
	keys := make([]string, 0, len(count))
	for k := range count {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", count[k], k))
	}
	v := strings.Join(parts, ", ")
	if v == "" {
		v = "none"
	}
	return api.Decision{Name: "pod_devices", Value: v,
		Reason: fmt.Sprintf("--device-mode=%s applies to new pods; existing pods keep their device until recreated (delete the pod to migrate it)", a.cfg.DeviceMode)}
}

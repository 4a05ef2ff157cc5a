package lab

import (
	"slices"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/testutil"
)

func TestDeviceAgentArgs(t *testing.T) {
	tests := []struct {
		st   State
		want []string
	}{
		{State{}, []string{"--device-mode=veth", "--enable-ipv4-big-tcp=false", "--enable-ipv6-big-tcp=false"}},
		{State{Device: DeviceNetkit, BigTCP: true}, []string{"--device-mode=netkit", "--enable-ipv4-big-tcp=true", "--enable-ipv6-big-tcp=true"}},
		{State{BigTCP: true, NoFibCache: true}, []string{"--device-mode=veth", "--enable-ipv4-big-tcp=true", "--enable-ipv6-big-tcp=true", "--fib-cache=false"}},
	}
	for _, tc := range tests {
		if got := deviceAgentArgs(&tc.st); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.st, got, tc.want)
		}
	}
}

func TestValidateDevice(t *testing.T) {
	if err := validateDevice("vEth"); err == nil || !strings.Contains(err.Error(), "want one of auto, veth, netkit") {
		t.Errorf("bad --device: %v", err)
	}
	for _, d := range []string{DeviceVeth, DeviceAuto} {
		if err := validateDevice(d); err != nil {
			t.Error(err)
		}
	}
	testutil.RequireRoot(t, "the netkit probe")
	err := validateDevice(DeviceNetkit)
	if have := datapath.ProbeNetkit().Available; have != (err == nil) {
		t.Errorf("--device netkit with netkit %v: %v", have, err)
	}
	if err != nil && !strings.Contains(err.Error(), "use --device veth") {
		t.Errorf("refusal does not say what to do: %v", err)
	}
}

package vmtest

import (
	"strconv"
	"strings"
)

// The lab subset's pod device. `axon lab up --device auto` gives the
// pods netkit devices where the kernel has netkit (debian-6.12) and veth
// elsewhere (debian-6.1), so the matrix runs a full lab with netkit pods at no
// extra cost; the LabDevice step checks that the agent's decision, the pods'
// devices and the kernel's netkit probe agree.

// labDevice is the --device of the lab subset.
func (r *Runner) labDevice() string {
	if r.LabDevice != "" {
		return r.LabDevice
	}
	return "auto"
}

// labSubsetScript is labScript with the lab's device and node count filled in.
func (r *Runner) labSubsetScript() string {
	nodes := r.LabNodes
	if nodes < 1 {
		nodes = 1
	}
	return strings.NewReplacer("@DEVICE@", shellQuote(r.labDevice()), "@NODES@", strconv.Itoa(nodes)).Replace(labScript)
}

// labDeviceFunc defines the shell function labdevice DEVICE NODES, run as
// the lab step LabDevice: for node1..nodeNODES it prints the agent's device
// lines of `axon status` and fails unless the agent decided the expected
// device (for auto: netkit when its netkit probe says yes, else veth) and
// every pod of the node has that device. AXON_BIN overrides the axon binary (tests).
const labDeviceFunc = `labdevice() {
	i=1
	while [ $i -le ${2:-1} ]; do
		node=node$i; i=$((i + 1))
		st=$(${AXON_BIN:-/run/axon-vm/bin/axon} status --node $node) || { echo "$st"; return 1; }
		echo "$node:"
		echo "$st" | grep -E '^ *(device|pod_devices|netkit) '
		want=$1
		case $want in
		auto) want=veth; if echo "$st" | grep -Eq '^ *netkit +yes'; then want=netkit; fi ;;
		netkit-l2) want=netkit ;;
		esac
		if ! echo "$st" | grep -Eq "^ *device +$want"; then echo "FAIL: $node: the agent's device decision is not $want"; return 1; fi
		if ! echo "$st" | grep -Eq "^ *pod_devices +[0-9]+ $want[^, ]* +--device-mode"; then echo "FAIL: $node: not every pod has a $want device"; return 1; fi
		echo "ok: $node: the agent decided $want and every pod has a $want device"
	done
}
`

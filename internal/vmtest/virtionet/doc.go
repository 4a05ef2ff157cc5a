// Package virtionet holds tests that need real virtio_net NICs: they run inside the
// kernel-matrix VMs (internal/vmtest), whose two virtio-net NICs are wired back to back
// through QEMU's UDP socket netdev and announced in $AXON_VM_NIC_MACS. Elsewhere they skip.
//
//	make test-vm KERNEL=debian-6.12 VM_PKGS=./internal/vmtest/virtionet VM_LAB=0
package virtionet

// EnvNICMACs names the variable the VM runner sets: the MACs of the two back-to-back
// virtio-net NICs, comma-separated.
const EnvNICMACs = "AXON_VM_NIC_MACS"

// Package vmguest boots a VM pod's guest: a Debian kernel from the kernel matrix's cache
// (internal/vmtest) with a small initramfs of its own (busybox, qperf and its libraries,
// the NIC's modules) under QEMU, its one virtio-net NIC on a tap device that lives in a
// "virt-launcher" pod netns, wired the way KubeVirt's bridge binding wires it. The guest
// takes the pod's address by DHCP (StartDHCP stands in for virt-launcher's server), runs
// a qperf server, and runs shell commands given on its serial console (Running.Run).
// QEMU is stopped by its PID.
package vmguest

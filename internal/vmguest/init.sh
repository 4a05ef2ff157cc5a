#!/bin/busybox sh
# PID 1 of a VM-pod guest (internal/vmguest): no root filesystem beyond the initramfs.
# Loads the NIC's modules, takes the pod's address by DHCP on eth0 (as a KubeVirt guest
# does from virt-launcher's DHCP server on the bridge k6t-eth0), starts a qperf server and
# a TCP echo (busybox nc), runs the host's commands from a second serial port when QEMU has one,
# and leaves an unechoed shell on the serial console for the host's commands. Console
# markers: AXON-GUEST-BOOTED, AXON-GUEST-NET <ip/len> (or AXON-GUEST-ERROR <why>),
# AXON-GUEST-READY.
B=/bin/busybox
export PATH=/bin:/usr/bin

$B mount -t proc proc /proc
$B mount -t sysfs sysfs /sys
$B mount -t devtmpfs devtmpfs /dev
$B echo "AXON-GUEST-BOOTED $($B uname -r) uptime=$($B cut -d' ' -f1 /proc/uptime)"

REL=$($B uname -r)
while read -r path; do
	[ -n "$path" ] || continue
	$B insmod "/lib/modules/$REL/$path" || $B echo "AXON-GUEST-WARN insmod $path failed"
done </etc/axon-vm/modules

$B ip link set lo up
n=0
until $B ip link show eth0 >/dev/null 2>&1; do
	n=$((n + 1))
	[ $n -lt 50 ] || break
	$B usleep 100000
done
# No IPv6 DAD: the link-local address is usable at once (a tentative one cannot send).
$B echo 0 >/proc/sys/net/ipv6/conf/eth0/accept_dad
$B ip link set eth0 up
# DHCP: -n fail if no lease, -q quit once bound, -t tries, -T seconds between tries.
if $B udhcpc -i eth0 -s /etc/udhcpc.sh -n -q -t 20 -T 1 -A 1 >/tmp/udhcpc.log 2>&1; then
	$B echo "AXON-GUEST-NET $($B ip -4 -o addr show dev eth0 | $B awk '{print $4}')"
else
	$B echo "AXON-GUEST-ERROR no DHCP lease on eth0: $($B tail -n 3 /tmp/udhcpc.log | $B tr '\n' ' ')"
fi
/usr/bin/qperf >/tmp/qperf.log 2>&1 &
# A TCP echo on EchoPort (guest.go), one cat per connection: what the lab's checks probe.
$B nc -ll -p 5657 -e /bin/cat >/dev/null 2>&1 &
# The host's commands on the second serial port (ttyS1), when QEMU has one (the lab's VM pods:
# a unix socket, vmguest.Dial): every line read there runs in a shell, stdin /dev/null, its
# output and the host's exit-code marker written back; a shell that ends is started again.
# Without the port, stty fails.
if $B stty -F /dev/ttyS1 -echo -onlcr 2>/dev/null; then
	(
		exec </dev/ttyS1 >/dev/ttyS1 2>&1
		while :; do
			$B sh -c 'while read -r line; do eval "$line" </dev/null; done'
			$B sleep 1
		done
	) &
fi
$B stty -echo -onlcr 2>/dev/null
$B echo "AXON-GUEST-READY uptime=$($B cut -d' ' -f1 /proc/uptime)"
$B sh
$B poweroff -f

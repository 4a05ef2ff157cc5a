#!/bin/busybox sh
# axon VM init (PID 1 of the initramfs built by internal/vmtest).
# Mounts the basics, loads the modules listed in /etc/axon-vm/modules, mounts the host's root
# read-only (9p tag "hostroot") as /newroot with fresh proc/sys/dev/run/tmp/bpffs/cgroup2,
# mounts the writable run share (9p tag "axonrun") at /newroot/run/axon-vm, runs
# /run/axon-vm/run.sh (or the script named by axon.script= on the kernel command line, so two
# VMs can share one run dir) chrooted there, and powers off. Markers on the console let the host
# follow along: AXON-VM-BOOTED, AXON-VM-BEGIN, AXON-VM-END rc=N.
B=/bin/busybox
export PATH=/bin

$B mount -t proc proc /proc
$B mount -t sysfs sysfs /sys
$B mount -t devtmpfs devtmpfs /dev
$B echo "AXON-VM-BOOTED $($B uname -r) uptime=$($B cut -d' ' -f1 /proc/uptime)"

fail() {
	$B echo "AXON-VM-ERROR $*"
	$B echo "AXON-VM-END rc=125"
	$B sync
	$B poweroff -f
	$B reboot -f
}

SCRIPT=run.sh
EXITFILE=exit-code
for arg in $($B cat /proc/cmdline); do
	case "$arg" in
	axon.script=*) SCRIPT=${arg#axon.script=} ;;
	esac
done
[ "$SCRIPT" = run.sh ] || EXITFILE=exit-code.$SCRIPT

REL=$($B uname -r)
while read -r path; do
	[ -n "$path" ] || continue
	$B insmod "/lib/modules/$REL/$path" || $B echo "AXON-VM-WARN insmod $path failed"
done </etc/axon-vm/modules
# Modules not preloaded are loaded on demand by busybox modprobe from the same tree.
$B echo /bin/modprobe >/proc/sys/kernel/modprobe

$B mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000,cache=loose hostroot /newroot ||
	fail "mount 9p hostroot"
$B mount -t proc proc /newroot/proc
$B mount -t sysfs sysfs /newroot/sys
$B mount -t devtmpfs devtmpfs /newroot/dev
$B mkdir -p /newroot/dev/pts /newroot/dev/shm 2>/dev/null
$B mount -t devpts devpts /newroot/dev/pts
$B mount -t tmpfs tmpfs /newroot/dev/shm
$B mount -t tmpfs -o mode=0755 tmpfs /newroot/run
$B mount -t bpf bpf /newroot/sys/fs/bpf || fail "mount bpffs"
$B mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup || fail "mount cgroup2"
$B mount -t debugfs debugfs /newroot/sys/kernel/debug 2>/dev/null
$B mount -t tracefs tracefs /newroot/sys/kernel/tracing 2>/dev/null
$B mkdir -p /newroot/run/axon-vm /newroot/run/tmp /newroot/run/netns
$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 axonrun /newroot/run/axon-vm ||
	fail "mount 9p axonrun"
# /tmp: a fresh tmpfs unless the run asks to keep the host's (its checkout lives there).
[ -e /newroot/run/axon-vm/keep-host-tmp ] || $B mount -t tmpfs tmpfs /newroot/tmp
$B ip link set lo up 2>/dev/null
$B hostname axon-vm

$B echo "AXON-VM-BEGIN uptime=$($B cut -d' ' -f1 /proc/uptime)"
$B chroot /newroot /bin/sh "/run/axon-vm/$SCRIPT"
rc=$?
$B echo "$rc" >"/newroot/run/axon-vm/$EXITFILE"
$B sync
$B echo "AXON-VM-END rc=$rc uptime=$($B cut -d' ' -f1 /proc/uptime)"
$B umount /newroot/run/axon-vm
$B poweroff -f
# QEMU runs with -no-reboot: a reboot ends it too.
$B reboot -f

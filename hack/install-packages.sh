#!/usr/bin/env bash
# Install the Debian/Ubuntu packages axon needs to build and run its lab, if missing.
# Idempotent: does nothing (and never runs `apt-get update`) when everything is present.
# Usage: hack/install-packages.sh      (as root)   build, test and lab packages
#        hack/install-packages.sh vm   (as root)   plus the kernel-matrix VM packages (make test-vm)
set -euo pipefail

# iptables + nftables: the real kube-proxy baseline in the lab (axon lab up --kube-proxy ...).
# qperf: the same-node bypass's message-size sweep (tcp_bw/tcp_lat); haproxy: a real splicing proxy
# in front of bypassed sockets. gcc + libc6-dev: the pause image
# (make images); libseccomp2: Debian's runc that hack/deps.sh unpacks links it.
PACKAGES=(clang-19 llvm-19 libbpf-dev bpftool iperf3 sockperf qperf haproxy iproute2 iputils-ping util-linux zstd ca-certificates iptables nftables gcc libc6-dev libseccomp2)
# Only for the kernel matrix (hack/vm, internal/vmtest); `make test` never installs these.
VM_PACKAGES=(qemu-system-x86 qemu-system-data busybox-static cpio xz-utils zstd kmod dpkg apt debian-archive-keyring)
case "${1:-}" in
"") ;;
vm) PACKAGES+=("${VM_PACKAGES[@]}") ;;
*) echo "usage: $0 [vm]" >&2; exit 2 ;;
esac

installed() {
	[[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null)" == ii* ]]
}

missing=()
for p in "${PACKAGES[@]}"; do
	installed "$p" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
	echo "packages: all present (${PACKAGES[*]})"
	exit 0
fi

if [[ "$(id -u)" -ne 0 ]]; then
	echo "packages: missing: ${missing[*]}" >&2
	echo "packages: installing them needs root: run \`sudo make packages\` (hack/install-packages.sh)" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null; then
	echo "packages: missing: ${missing[*]}; apt-get not found: install them with your distribution's package manager" >&2
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "packages: installing ${missing[*]}"
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for p in "${missing[@]}"; do
	installed "$p" || { echo "packages: $p still not installed after apt-get install" >&2; exit 1; }
	echo "packages: installed $p $(dpkg-query -W -f='${Version}' "$p")"
done

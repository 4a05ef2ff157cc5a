#!/usr/bin/env bash
# Build the lab's pinned external binaries (kube-apiserver, kubectl, kube-proxy, etcd, the
# reference CNI plugins, and helm for deploy/helm) into a cache outside the checkout, keyed by version:
#
#   ${AXON_CACHE:-$HOME/.cache/axon}/k8s-$K8S_VERSION/{kube-apiserver,kubectl,kube-proxy}
#   ${AXON_CACHE:-$HOME/.cache/axon}/etcd-$ETCD_VERSION/etcd
#   ${AXON_CACHE:-$HOME/.cache/axon}/cni-plugins-$CNI_PLUGINS_VERSION/{ptp,host-local,bandwidth,portmap}
#   ${AXON_CACHE:-$HOME/.cache/axon}/helm-$HELM_VERSION/helm
#
# and for real-kubelet lab nodes (kubelet, kube-scheduler and kube-controller-manager are in k8s-*):
#
#   ${AXON_CACHE:-$HOME/.cache/axon}/containerd-$CONTAINERD_VERSION/{containerd,containerd-shim-runc-v2,ctr}
#   ${AXON_CACHE:-$HOME/.cache/axon}/runc-debian-$RUNC_DEBIAN_VERSION/runc      (Debian's package, unpacked; the lab's runc)
#
# Usage: hack/deps.sh               build what is missing (one line per artifact: cached / built in Ns)
#        hack/deps.sh --check       exit 1 and list what is missing; builds nothing
#        hack/deps.sh --conformance only the upstream e2e test binary (make conformance-deps):
#                                   k8s-$K8S_VERSION/e2e.test, `go test -c k8s.io/kubernetes/test/e2e`
#
# Binaries are built into a temporary directory inside the cache and renamed into place, so a
# killed build never leaves a half-written binary. The Go build cache stays where `go env GOCACHE`
# says (never inside $AXON_CACHE). Cold build: ~9 min on 2 cores (helm ~3), ~2.3 GB peak RSS per compile,
# before the real-kubelet binaries were added (not measured cold since). With a GOCACHE that already
# holds their packages, on a busy host with AXON_BUILD_P=1 GOMAXPROCS=1: kubelet + kube-scheduler +
# kube-controller-manager 46 s, containerd 10 s, Debian's runc 2 s.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$HACK_DIR/versions.env"

CACHE="${AXON_CACHE:-$HOME/.cache/axon}"
K8S_DIR="$CACHE/k8s-$K8S_VERSION"
ETCD_DIR="$CACHE/etcd-$ETCD_VERSION"
CNI_DIR="$CACHE/cni-plugins-$CNI_PLUGINS_VERSION"
HELM_DIR="$CACHE/helm-$HELM_VERSION"
CONTAINERD_DIR="$CACHE/containerd-$CONTAINERD_VERSION"
RUNC_DEBIAN_DIR="$CACHE/runc-debian-$RUNC_DEBIAN_VERSION"

K8S_BINS=(kube-apiserver kubectl kube-proxy kubelet kube-scheduler kube-controller-manager)
CNI_BINS=(ptp host-local bandwidth portmap)
CONTAINERD_BINS=(containerd containerd-shim-runc-v2 ctr)

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

# missing prints one cache-relative path per missing artifact.
missing() {
	local b
	for b in "${K8S_BINS[@]}"; do [[ -x "$K8S_DIR/$b" ]] || echo "k8s-$K8S_VERSION/$b"; done
	[[ -x "$ETCD_DIR/etcd" ]] || echo "etcd-$ETCD_VERSION/etcd"
	for b in "${CNI_BINS[@]}"; do [[ -x "$CNI_DIR/$b" ]] || echo "cni-plugins-$CNI_PLUGINS_VERSION/$b"; done
	[[ -x "$HELM_DIR/helm" ]] || echo "helm-$HELM_VERSION/helm"
	for b in "${CONTAINERD_BINS[@]}"; do [[ -x "$CONTAINERD_DIR/$b" ]] || echo "containerd-$CONTAINERD_VERSION/$b"; done
	[[ -x "$RUNC_DEBIAN_DIR/runc" ]] || echo "runc-debian-$RUNC_DEBIAN_VERSION/runc"
}

check() {
	local miss=()
	mapfile -t miss < <(missing)
	if ((${#miss[@]})); then
		echo "deps: missing in $CACHE:" >&2
		printf '  %s\n' "${miss[@]}" >&2
		echo "deps: run \`make deps\` (hack/deps.sh) to build them (~9 min cold)" >&2
		return 1
	fi
	echo "deps: all present in $CACHE"
}

MODE=deps
case "${1:-}" in
	--check) check; exit $? ;;
	--conformance) MODE=conformance ;;
	-h|--help) usage; exit 0 ;;
	"") ;;
	*) echo "deps: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
esac

command -v go >/dev/null || { echo "deps: 'go' not found in PATH; install Go 1.26+" >&2; exit 1; }

mkdir -p "$CACHE"
# One build at a time per cache (two test runs or `make -j` may call us together).
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
	echo "deps: another hack/deps.sh holds $CACHE/.lock; waiting" >&2
	flock 9
fi

# Leftovers of a build killed with SIGKILL (no other build runs: we hold the lock).
rm -rf "$CACHE"/.tmp.*
TMP="$(mktemp -d "$CACHE/.tmp.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

# Each build step runs in its own process group, so an interrupted deps.sh stops the
# compilers it started (and nothing else) instead of leaving them running.
CHILD=""
on_signal() {
	[[ -n "$CHILD" ]] && kill -TERM -- "-$CHILD" 2>/dev/null
	wait 2>/dev/null || true
	echo "deps: interrupted; nothing half-built was left in $CACHE" >&2
	exit 130
}
trap on_signal INT TERM
run() {
	local rc=0
	set -m
	"$@" &
	CHILD=$!
	set +m
	wait "$CHILD" || rc=$?
	CHILD=""
	return "$rc"
}

# 2 cores / 24 GiB: two compiles at a time keep peak RSS near 5 GB.
# On a busy machine: AXON_BUILD_P=1 GOMAXPROCS=1 make deps (one compile at a time).
export GOMAXPROCS="${GOMAXPROCS:-2}"
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
export GOWORK=off
export CGO_ENABLED=0
BUILD_P="${AXON_BUILD_P:-2}"
BUILD_FLAGS=(-p "$BUILD_P" -trimpath)

# install_bins DIR NAME... moves $TMP/out/NAME into DIR atomically (rename on the same filesystem).
install_bins() {
	local dir="$1" b
	shift
	mkdir -p "$dir"
	for b in "$@"; do
		chmod 0755 "$TMP/out/$b"
		mv -f "$TMP/out/$b" "$dir/$b"
	done
}

# need DIR NAME... prints the names not yet in DIR and reports the cached ones on fd 3 (the
# script's stdout; need's own stdout is captured by its caller).
exec 3>&1
need() {
	local dir="$1" b
	shift
	for b in "$@"; do
		if [[ -x "$dir/$b" ]]; then
			echo "cached  ${dir#"$CACHE"/}/$b" >&3
		else
			echo "$b"
		fi
	done
}

# k8s_ldflags stamps the version the way Kubernetes' own build does (kubectl version, the e2e
# framework's server/client version checks).
k8s_ldflags() {
	local v="${K8S_VERSION#v}" pkg=k8s.io/component-base/version
	local ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=${v%%.*}"
	ldflags+=" -X $pkg.gitMinor=$(cut -d. -f2 <<<"$v") -X $pkg.gitTreeState=clean"
	ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
	ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
	echo "$ldflags"
}

build_k8s() {
	local todo=() pkgs=() b start
	mapfile -t todo < <(need "$K8S_DIR" "${K8S_BINS[@]}")
	((${#todo[@]})) || return 0
	for b in "${todo[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
	start=$SECONDS
	rm -rf "$TMP/out" && mkdir -p "$TMP/out"
	run go build -C "$HACK_DIR/k8s" "${BUILD_FLAGS[@]}" -ldflags "$(k8s_ldflags)" -o "$TMP/out/" "${pkgs[@]}"
	install_bins "$K8S_DIR" "${todo[@]}"
	for b in "${todo[@]}"; do echo "built   k8s-$K8S_VERSION/$b in $((SECONDS - start))s"; done
}

build_etcd() {
	local todo=() start
	mapfile -t todo < <(need "$ETCD_DIR" etcd)
	((${#todo[@]})) || return 0
	start=$SECONDS
	rm -rf "$TMP/out" && mkdir -p "$TMP/out"
	run go build -C "$HACK_DIR/etcd" "${BUILD_FLAGS[@]}" -ldflags "-s -w" -o "$TMP/out/etcd" go.etcd.io/etcd/server/v3
	install_bins "$ETCD_DIR" etcd
	echo "built   etcd-$ETCD_VERSION/etcd in $((SECONDS - start))s"
}

build_cni() {
	local todo=() pkgs=() b start base=github.com/containernetworking/plugins/plugins
	declare -A path=([ptp]=main/ptp [host-local]=ipam/host-local [bandwidth]=meta/bandwidth [portmap]=meta/portmap)
	mapfile -t todo < <(need "$CNI_DIR" "${CNI_BINS[@]}")
	((${#todo[@]})) || return 0
	for b in "${todo[@]}"; do pkgs+=("$base/${path[$b]}@$CNI_PLUGINS_VERSION"); done
	start=$SECONDS
	rm -rf "$TMP/out" && mkdir -p "$TMP/out"
	# `go install pkg@version` works for the plugins (their go.mod has no replace directives).
	run env GOFLAGS="${GOFLAGS/-mod=readonly/}" GOBIN="$TMP/out" \
		go install -C "$TMP" -p "$BUILD_P" -trimpath -ldflags "-s -w" "${pkgs[@]}"
	install_bins "$CNI_DIR" "${todo[@]}"
	for b in "${todo[@]}"; do echo "built   cni-plugins-$CNI_PLUGINS_VERSION/$b in $((SECONDS - start))s"; done
}

# helm renders deploy/helm/axon (make manifests, go test ./deploy). Its go.mod has no replace
# directives, so `go install pkg@version` builds exactly the pinned module graph.
build_helm() {
	local todo=() start
	mapfile -t todo < <(need "$HELM_DIR" helm)
	((${#todo[@]})) || return 0
	start=$SECONDS
	rm -rf "$TMP/out" && mkdir -p "$TMP/out"
	run env GOFLAGS="${GOFLAGS/-mod=readonly/}" GOBIN="$TMP/out" \
		go install -C "$TMP" -p "$BUILD_P" -trimpath \
		-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
		"helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
	install_bins "$HELM_DIR" helm
	echo "built   helm-$HELM_VERSION/helm in $((SECONDS - start))s"
}

# containerd for real-kubelet lab nodes. Pure Go (CGO_ENABLED=0 like everything above); the
# wrapper module hack/containerd pins the version and its go.sum.
build_containerd() {
	local todo=() pkgs=() b start
	mapfile -t todo < <(need "$CONTAINERD_DIR" "${CONTAINERD_BINS[@]}")
	((${#todo[@]})) || return 0
	for b in "${todo[@]}"; do pkgs+=("github.com/containerd/containerd/v2/cmd/$b"); done
	local pkg=github.com/containerd/containerd/v2/version
	start=$SECONDS
	rm -rf "$TMP/out" && mkdir -p "$TMP/out"
	run go build -C "$HACK_DIR/containerd" "${BUILD_FLAGS[@]}" \
		-ldflags "-s -w -X $pkg.Version=$CONTAINERD_VERSION -X $pkg.Package=github.com/containerd/containerd/v2" \
		-o "$TMP/out/" "${pkgs[@]}"
	install_bins "$CONTAINERD_DIR" "${todo[@]}"
	for b in "${todo[@]}"; do echo "built   containerd-$CONTAINERD_VERSION/$b in $((SECONDS - start))s"; done
}

# Debian's runc package, the lab's runc: `apt-get download` + `dpkg -x` into the cache, nothing
# installed system-wide. It has seccomp, which kubelet asks for on every pod sandboxes (a runc built
# without the seccomp tag fails them all). Its binary links libseccomp.so.2 (libseccomp2, present on
# Debian). The exact package version is pinned; apt's lists are refreshed once if they lack it.
fetch_runc_debian() {
	local todo=() start deb
	mapfile -t todo < <(need "$RUNC_DEBIAN_DIR" runc)
	((${#todo[@]})) || return 0
	command -v apt-get >/dev/null || { echo "deps: Debian's runc needs apt-get and dpkg" >&2; return 1; }
	start=$SECONDS
	# apt downloads as root here (its _apt user cannot write into $TMP): the warning saying so is expected.
	rm -rf "$TMP/deb" && mkdir -p "$TMP/deb/root"
	if ! (cd "$TMP/deb" && apt-get download -qq "runc=$RUNC_DEBIAN_VERSION" 2>/dev/null); then
		echo "deps: runc=$RUNC_DEBIAN_VERSION not in apt's lists; running apt-get update" >&2
		apt-get update -qq
		(cd "$TMP/deb" && apt-get download -qq "runc=$RUNC_DEBIAN_VERSION") ||
			{ echo "deps: apt-get download runc=$RUNC_DEBIAN_VERSION failed: set RUNC_DEBIAN_VERSION in hack/versions.env to a version \`apt-cache policy runc\` lists" >&2; return 1; }
	fi
	deb=("$TMP"/deb/runc_*.deb)
	dpkg -x "${deb[0]}" "$TMP/deb/root"
	rm -rf "$TMP/out" && mkdir -p "$TMP/out"
	cp "$TMP/deb/root/usr/sbin/runc" "$TMP/out/runc"
	install_bins "$RUNC_DEBIAN_DIR" runc
	echo "fetched runc-debian-$RUNC_DEBIAN_VERSION/runc in $((SECONDS - start))s"
}

# The upstream e2e suite as one binary (sig-network conformance, make conformance). It runs
# alone: ./e2e.test --kubeconfig=... --ginkgo.focus=... ; the ginkgo CLI (same version as the
# suite's) runs it in parallel processes (make conformance uses it when it is there). Big: not
# part of `make deps`.
build_e2e() {
	local todo=() start
	mapfile -t todo < <(need "$K8S_DIR" e2e.test ginkgo)
	((${#todo[@]})) || return 0
	start=$SECONDS
	rm -rf "$TMP/out" && mkdir -p "$TMP/out"
	run go test -C "$HACK_DIR/k8s" -c "${BUILD_FLAGS[@]}" -ldflags "$(k8s_ldflags)" -o "$TMP/out/e2e.test" k8s.io/kubernetes/test/e2e
	run go build -C "$HACK_DIR/k8s" "${BUILD_FLAGS[@]}" -o "$TMP/out/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
	install_bins "$K8S_DIR" e2e.test ginkgo
	echo "built   k8s-$K8S_VERSION/e2e.test and ginkgo in $((SECONDS - start))s"
}

total=$SECONDS
if [[ "$MODE" == conformance ]]; then
	build_e2e
	echo "deps: conformance binaries ready in $CACHE ($((SECONDS - total))s)"
	exit 0
fi
build_cni
build_helm
build_etcd
build_k8s
build_containerd
fetch_runc_debian
echo "deps: ready in $CACHE ($((SECONDS - total))s)"

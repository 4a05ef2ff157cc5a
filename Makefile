# axon — the two commands a newcomer needs:
#   make lab    install what is missing, build, bring up a 2-node lab and show it working
#   make test   install what is missing, build, run every test layer (unit, BPF, control plane, lab e2e)

SHELL        := /bin/bash
GO           ?= go
BIN          := bin
VERSION      ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS      := -X main.version=$(VERSION) -X github.com/axonhq/axon/internal/agent.Version=$(VERSION)
NODES        ?= 2
PODS         ?= 2
# Test packages run one at a time: the lab and control-plane tests own fixed
# namespaces and ports; parallel packages would only fight over 2 cores.
TEST_FLAGS   ?= -count=1 -p 1 -timeout 40m
TEST_PKGS    ?= ./...
# ...except the kernel matrix's package, which runs beside them (hack/teststreams): its QEMU
# VMs, under nice 19, take the CPU the host packages leave idle (docs/testing.md, "CI time").
TEST_BESIDE  ?= ./internal/vmtest
# The kernel matrix and the small VM tests (their boots, a hang's timeout) at once.
TEST_BESIDE_FLAGS ?= -parallel 4
RESULTS      ?= results

.PHONY: all build generate deps packages lab lab-down test test-kubelet-ops test-unit bench bench-vm clean help image images conformance-deps conformance fuzz manifests

all: build

help:
	@echo "make lab      bring up a $(NODES)-node lab (axon datapath) and run its connectivity check"
	@echo "make test     run all tests (needs root; installs packages and builds cached deps first)"
	@echo "make test-kubelet-ops  TestKubeletLab with the axon DaemonSet's rolling update, agent kills and pod churn under traffic (~2.5 min)"
	@echo "make bench    run the interleaved benchmark in the lab (results/ folder)"
	@echo "make bench-vm qperf between a real QEMU guest in a VM pod and a pod, KubeVirt's bridge vs the bypass (results/vm-bypass-qperf/)"
	@echo "make fuzz     1 000 000 random and mutated packets through every tc/XDP program (FUZZ_SEED=1)"
	@echo "make build    build bin/axon, bin/axon-agent, bin/axon-cni (BPF objects from source)"
	@echo "make deps     install apt packages and build kube-apiserver/etcd/kubectl/CNI plugins, kubelet/containerd (+ Debian's runc) into ~/.cache/axon"
	@echo "make lab-down remove the lab"
	@echo "make manifests render deploy/kubernetes/axon.yaml from the Helm chart deploy/helm/axon"
	@echo "make images   the e2e suite's images (pause, agnhost, busybox, ...) as tarballs for real-kubelet lab nodes into ~/.cache/axon"
	@echo "make conformance-deps  the upstream e2e test binary (e2e.test, ~8 min) into ~/.cache/axon"
	@echo "make conformance       sig-network conformance on axon lab up --kubelet (results/conformance-<date>/)"

packages:
	@hack/install-packages.sh

deps: packages
	@hack/deps.sh

include bpf/Makefile.inc

# BPF objects are compiled from bpf/*.c by bpf2go (clang-19) whenever a source changes.
generate: packages bpf

# The three binaries run on the host (axon-cni is copied into /opt/cni/bin of every node) and in a
# base-less image: static, without cgo (nothing in them needs it), so no glibc version is assumed.
# deploy/image's TestBinariesStatic checks that bin/axon-cni has no interpreter or dynamic section.
build: generate
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/axon ./cmd/axon-agent ./cmd/axon-cni

# deploy/kubernetes/axon.yaml is rendered from the Helm chart (go test ./deploy/ checks it is current).
manifests: deps
	@hack/manifests.sh

# Container image without a container runtime (deploy/image, hack/image): an OCI layout in
# bin/image/oci and a docker/podman-loadable tarball bin/image/axon-image.tar, from scratch with
# the static binaries. Same binaries and commit time, same digest (make test checks it). Named
# after the chart's image.repository and tagged $(VERSION) and the chart's appVersion: the
# reference deploy/kubernetes/axon.yaml runs (deploy/image's TestImageNameMatchesManifest).
# Push with any OCI tool, e.g. skopeo copy oci:bin/image/oci docker://<registry>/axon:$(VERSION)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
image: build
	$(GO) run ./hack/image -bin $(BIN) -out $(BIN)/image -version $(VERSION) -created $(SOURCE_DATE_EPOCH)

# The images real-kubelet lab nodes import into containerd (hack/images, deploy/image/e2eref):
# pause, agnhost (+ CoreDNS, hack/coredns), glibc-dns-testing, busybox, regression-issue-74839
# and distroless-iptables, under the names the e2e suite of K8S_VERSION pulls; the Debian ones
# (the e2e tools: sh, curl, nc, dig, ...; busybox; conntrack, iptables) fetched with apt-get
# download; cached in ~/.cache/axon/images-k8s-<version>/ and ~/.cache/axon/debroot/ (cold
# about 1 min: agnhost and CoreDNS are Go builds; cached 4-8 s).
images:
	$(GO) run ./hack/images

# The upstream e2e test binary for `make conformance` (k8s.io/kubernetes/test/e2e at
# K8S_VERSION): ~/.cache/axon/k8s-<version>/e2e.test. Big (~8 min on a busy 2-core host with a
# warm Go build cache): not part of make deps.
conformance-deps: packages
	@hack/deps.sh --conformance

# The upstream sig-network conformance tests against `axon lab up --kubelet` (brought up unless
# it runs; left up afterwards): skips with their reasons in hack/conformance/skips.txt, JUnit +
# results.md in results/conformance-<date>/. About 2 min of specs (the e2e build ~8 min once): not part of make test.
CONFORMANCE_ARGS ?=
conformance: deps conformance-deps build image images
	go run ./hack/conformance --bin-dir $(BIN) $(CONFORMANCE_ARGS)

lab: deps build
	$(BIN)/axon lab up --nodes $(NODES) --pods-per-node $(PODS)
	$(BIN)/axon lab status
	$(BIN)/axon lab check

lab-down:
	$(BIN)/axon lab down

# The kernel-matrix part of make test (internal/vmtest: TestVMBoot, TestKernelMatrix) boots
# Debian 6.12 and 6.1 in QEMU: install QEMU and fetch the kernels into the cache first (about
# 25 s cold from the Debian mirror of the machine's apt sources, nothing when ~/.cache/axon/kernels
# is warm).
vm-kernels: vm-packages
	$(GO) run ./hack/vm -fetch-only -kernels debian-6.12,debian-6.1

test: deps build image images vm-kernels
	@mkdir -p $(RESULTS)
	@set -o pipefail; $(GO) run ./hack/teststreams -go $(GO) -flags '$(TEST_FLAGS)' -beside '$(TEST_BESIDE)' \
		-beside-flags '$(TEST_BESIDE_FLAGS)' $(TEST_PKGS) \
		| tee $(RESULTS)/test.json | $(GO) run ./hack/testsummary

# Pure-logic tests only (no root, no kernel features, no cached binaries).
# TestKubeletLab with the operations (docs/kubelet.md "Operating"): the axon DaemonSet's rolling
# update and agent kills under traffic (zero failed requests, zero resets), 50 pods through kubelet
# across agent kills (no leak). About 2.5 minutes; uses the lab's fixed names (no lab may be up).
test-kubelet-ops: deps build image images
	AXON_LAB_KUBELET_OPS=1 $(GO) test -count=1 -p 1 -timeout 15m -run '^TestKubeletLab$$' -v ./internal/lab/

test-unit:
	$(GO) test -count=1 ./internal/ipam/... ./internal/api/... ./hack/...

bench: deps build
	$(BIN)/axon lab bench

# The VM-pod bridge bypass with a real QEMU guest (internal/vmguest, docs/vm-bypass.md): qperf
# bridge vs bypass, interleaved, into $(RESULTS)/vm-bypass-qperf/ (about 15 min under TCG).
VMB_ROUNDS ?= 10
bench-vm: packages vm-kernels generate
	AXON_VMB_QPERF=1 AXON_VMB_QPERF_ROUNDS=$(VMB_ROUNDS) AXON_VMB_QPERF_OUT=$(abspath $(RESULTS))/vm-bypass-qperf \
		$(GO) test -count=1 -timeout 90m -run '^TestQperfBench$$' -v ./internal/vmguest

# Fuzzing (internal/datapath/fuzz, docs/reliability.md#fuzzing): every tc and XDP program
# gets FUZZ_PACKETS random and mutated packets through BPF_PROG_TEST_RUN, the same ones for
# the same FUZZ_SEED; a failure prints the packet and how to replay it. make test runs
# 20 000 per program. About 2 minutes on the 2-core development machine.
FUZZ_PACKETS ?= 1000000
FUZZ_SEED    ?= 1
fuzz: generate
	AXON_FUZZ_PACKETS=$(FUZZ_PACKETS) AXON_FUZZ_SEED=$(FUZZ_SEED) $(GO) test -count=1 -timeout 60m -run '^TestFuzzDatapath$$' -v ./internal/datapath/fuzz

clean: bpf-clean
	rm -rf $(BIN) $(RESULTS)

# ---- kernel matrix (owner: hack/vm, internal/vmtest) -------------------------------
# Runs the same test binaries on the host kernel and on Debian kernels booted in QEMU (TCG, or
# KVM when kvm_intel/kvm_amd is loaded). Kernels are cached in ${AXON_CACHE:-~/.cache/axon}/kernels.
# `make test` runs a part of it (internal/vmtest's TestKernelMatrix: datapath, verifier and
# virtio-net tests on 6.12 and 6.1, the two-VM subset on 6.12). VM_LAB=1 adds the single-node
# lab subset inside each VM, VM_TWOVM=1 the two-VM subset (one axon node per VM over virtio-net);
# both use `make deps`. Example: make test-vm KERNEL=debian-6.1 VM_RUN=TestAttach VM_LAB=0
# (see hack/vm/README.md)
KERNEL       ?= debian-6.12
VM_PKGS      ?= ./internal/datapath/...,./internal/verifier,./internal/vmtest/virtionet
VM_RUN       ?=
VM_LAB       ?= 1
VM_TWOVM     ?= 0
KERNELS_TWOVM ?= 1
VM_FLAGS     ?=
VM_KERNELS   ?= host,debian-6.12,debian-6.1
VM_ARGS       = -pkgs $(VM_PKGS) -run '$(VM_RUN)' -lab=$(if $(filter 1,$(VM_LAB)),true,false) -out $(RESULTS)/kernels $(VM_FLAGS)

.PHONY: vm-packages vm-kernels test-vm test-kernels

vm-packages:
	@hack/install-packages.sh vm

test-vm: vm-packages deps generate
	$(GO) run ./hack/vm -kernels $(KERNEL) $(VM_ARGS) -twovm=$(if $(filter 1,$(VM_TWOVM)),true,false)

# The full matrix: every kernel, the lab subset and the two-VM subset (KERNELS_TWOVM=0: without it).
test-kernels: vm-packages deps generate
	$(GO) run ./hack/vm -kernels $(VM_KERNELS) $(VM_ARGS) -twovm=$(if $(filter 0,$(KERNELS_TWOVM)),false,true)
# ---- end kernel matrix ----------------------------------------------------------------------

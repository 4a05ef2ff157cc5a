#!/bin/bash
# The 2026-11-29 breakdown of the conntrack hit: one nplbbench binary per cut point
# (variants.py), then 7 interleaved repetitions of all of them. Run from the repository root,
# as root, on a quiet machine.
set -euo pipefail
out=${1:-/tmp/nplb-breakdown}
mkdir -p "$out"
for pt in P1 P2 P3 P4 P5 P6 P6b P7 full; do
	git checkout -q bpf/lib/nodeport.h
	python3 docs/bench/2026-11-29-nplb-breakdown/variants.py "$pt"
	go generate ./internal/datapath/nodeport/ >/dev/null
	go build -o "$out/nplb.$pt" ./hack/nplbbench
done
git checkout -q bpf/lib/nodeport.h
go generate ./internal/datapath/nodeport/ >/dev/null
for r in 1 2 3 4 5 6 7; do
	for pt in P1 P2 P3 P4 P5 P6 P6b P7 full; do
		"$out/nplb.$pt" -rounds 15 -only ct_hit >"$out/run.$pt.$r.md"
	done
done
go run ./hack/ctkeybench -rounds 15 >"$out/ctkey.md"

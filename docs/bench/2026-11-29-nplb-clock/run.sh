#!/bin/bash
# The 2026-11-29 clock change of the north-south LB (np_now: the coarse clock read once per tick
# and CPU): the bench binary of the commit before and of the commit with it, alternated 10 times,
# then compared pair by pair. Run from the repository root, as root, on a quiet machine;
# BEFORE is the commit before the change.
set -euo pipefail
out=${1:-/tmp/nplb-clock}
before=${BEFORE:?set BEFORE to the commit before the change}
mkdir -p "$out"
git worktree add -q "$out/src.before" "$before"
(cd "$out/src.before" && go generate ./internal/datapath/nodeport/ >/dev/null && go build -o "$out/nplb.before" ./hack/nplbbench)
git worktree remove --force "$out/src.before"
go generate ./internal/datapath/nodeport/ >/dev/null
go build -o "$out/nplb.after" ./hack/nplbbench
for r in 1 2 3 4 5 6 7 8 9 10; do
	"$out/nplb.before" -rounds 15 >"$out/before.$r.md"
	"$out/nplb.after" -rounds 15 >"$out/after.$r.md"
done
go run ./hack/nplbbench -compare "$out" -builds before,after -csv "$out/results.csv"

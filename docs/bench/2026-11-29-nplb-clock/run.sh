#!/bin/bash
# A paired nplbbench run of two commits: the bench binary of BEFORE and of AFTER (default HEAD),
# alternated 10 times, -rounds 15 each, then compared pair by pair. Run from the repository
# root, as root, on a quiet machine. Used for the 2026-11-29 clock change (BEFORE=bfcbc69,
# AFTER=11bceda) and the next hop in the CT entry (BEFORE=11bceda).
set -euo pipefail
out=${1:-/tmp/nplb-pair}
before=${BEFORE:?set BEFORE to the commit before the change}
after=${AFTER:-HEAD}
mkdir -p "$out"
for b in before after; do
	rev=$before
	[ "$b" = after ] && rev=$after
	git worktree add -q --detach "$out/src.$b" "$rev"
	(cd "$out/src.$b" && go generate ./internal/datapath/nodeport/ >/dev/null && go build -o "$out/nplb.$b" ./hack/nplbbench)
	git worktree remove --force "$out/src.$b"
done
for r in 1 2 3 4 5 6 7 8 9 10; do
	"$out/nplb.before" -rounds 15 >"$out/before.$r.md"
	"$out/nplb.after" -rounds 15 >"$out/after.$r.md"
done
go run ./hack/nplbbench -compare "$out" -builds before,after -csv "$out/results.csv"

#!/bin/sh
# The run of record: nplbbench binaries of three commits, alternated.
# Build them first, each at its commit (the BPF objects are embedded):
#   git checkout <commit> && make bpf && go build -o nplb-<name> ./hack/nplbbench
# base = c0c300c (before), A = 0adfdbb (inline checksums), B = 9199723 (next-hop cache)
set -e
for i in 1 2 3 4 5 6; do
	for v in base A B; do
		./nplb-$v -rounds 15 > $v.$i.md
	done
done
python3 stats.py . base A; python3 stats.py . A B; python3 stats.py . base B

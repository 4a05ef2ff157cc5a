#!/bin/sh
# The run of record: three nplbbench binaries alternated 20 times, then
# compared in Go (paired ratios, internal/bench.Pair). Build them first, all
# with this commit's hack/nplbbench (the BPF objects are embedded):
#   landed = 027d9fd's LB: Load sets cfg_fib_cache 0 in the XDP object
#            (its internal/datapath/nodeport/nodeport.go)
#   inline = the cache on at XDP, np_fib's probe and fill inlined (787ee88's LB)
#   split  = the cache on at XDP, probe and fill as BPF subprograms (this commit)
#   make bpf && go build -o nplb-<name> ./hack/nplbbench
set -e
for i in $(seq 1 20); do
	for v in landed inline split; do
		./nplb-$v -rounds 15 > $v.$i.md
	done
done
go run ./hack/nplbbench -compare . -builds landed,inline,split -csv results.csv
go run ./hack/nplbbench -compare . -builds inline,split

#!/bin/bash
# Throw-away A/B: axon pod-to-pod / host-to-host with the route cache on vs off.
# Blocks alternate the agents' --fib-cache; inside a block host and pod runs alternate.
set -u
cd "$(git rev-parse --show-toplevel)"   # run from the repository, with bin/ built
mkdir -p /tmp/ab; OUT=/tmp/ab/results.tsv
: > $OUT
BLOCKS=${BLOCKS:-8}; REPS=${REPS:-4}
one() { # ns dst -> Gbit/s
  ip netns exec $1 taskset -c 0 iperf3 -c $2 -p 5399 -t 3 -C bbr -J 2>/dev/null | python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'
}
for b in $(seq 1 $BLOCKS); do
  if [ $((b % 2)) -eq 1 ]; then order="on off"; else order="off on"; fi
  for cfg in $order; do
    bin/axon lab down >/dev/null 2>&1
    bin/axon lab up --nodes 2 --pods-per-node 1 --big-tcp on --no-demo --fib-cache $cfg >/tmp/ab/up.log 2>&1 || { echo "lab up failed"; cat /tmp/ab/up.log; exit 1; }
    ip netns exec axonlab-node2 taskset -c 1 iperf3 -s -B 198.18.0.12 -p 5399 -D -I /tmp/ab/srv-host.pid
    ip netns exec axonlab-node2-pod1 taskset -c 1 iperf3 -s -B 10.244.2.1 -p 5399 -D -I /tmp/ab/srv-pod.pid
    sleep 1
    for r in $(seq 1 $REPS); do
      if [ $((r % 2)) -eq 1 ]; then
        h=$(one axonlab-node1 198.18.0.12); p=$(one axonlab-node1-pod1 10.244.2.1)
      else
        p=$(one axonlab-node1-pod1 10.244.2.1); h=$(one axonlab-node1 198.18.0.12)
      fi
      echo -e "$b\t$cfg\t$r\t$h\t$p" | tee -a $OUT
    done
    kill $(cat /tmp/ab/srv-host.pid) $(cat /tmp/ab/srv-pod.pid) 2>/dev/null
    sleep 0.5
  done
done
bin/axon lab down >/dev/null 2>&1
echo done

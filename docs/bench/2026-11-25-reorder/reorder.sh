#!/bin/bash
# The experiment behind docs/pod-networking.md "Reordering": single-flow iperf3
# host-to-host and axon pod-to-pod cross-node, with the lab wire's ports in their
# default state (RPS off) and with RPS over both CPUs (rps_cpus=3), interleaved in
# every repetition. Prints throughput, iperf3's retransmits and the DSACK'd
# segments the sender's netns counted (nstat TcpExtTCPDSACKRecvSegs).
#
# Needs a lab: axon lab up --nodes 2 --pods-per-node 1 --big-tcp on --no-demo
# Usage: reorder.sh <repetitions>   (ran with 10 on 2026-11-25: results.md)
# The pod addresses are those of that lab (node1-pod1 -> node2-pod1).
set -u
setrps() {
	ip netns exec axonlab-wire sh -c "echo $1 > /sys/class/net/w-node1/queues/rx-0/rps_cpus; echo $1 > /sys/class/net/w-node2/queues/rx-0/rps_cpus"
}
# one <client netns> <server netns> <server ip> <label>: one 3 s transfer,
# client on CPU 0, one-shot server on CPU 1.
one() {
	local cns=$1 sns=$2 sip=$3 label=$4 json
	ip netns exec "$cns" nstat -n
	ip netns exec "$sns" taskset -c 1 iperf3 -s -B "$sip" -p 5301 -1 -D --pidfile "/tmp/reorder-iperf-s.pid"
	sleep 0.3
	json=$(ip netns exec "$cns" taskset -c 0 iperf3 -c "$sip" -p 5301 -t 3 -J)
	python3 -c "import json,sys; e=json.loads(sys.argv[1])['end']; print('$label', round(e['sum_received']['bits_per_second']/1e9, 2), 'Gbit/s retr', e['sum_sent'].get('retransmits'), end=' ')" "$json"
	ip netns exec "$cns" nstat | awk '/DSACKRecvSegs/{printf "dsack %s", $2}'
	echo
}
for _ in $(seq 1 "$1"); do
	setrps 3; one axonlab-node1 axonlab-node2 198.18.0.12 host-rps
	setrps 3; one axonlab-node1-pod1 axonlab-node2-pod1 10.244.2.1 pod-rps
	setrps 0; one axonlab-node1 axonlab-node2 198.18.0.12 host-norps
	setrps 0; one axonlab-node1-pod1 axonlab-node2-pod1 10.244.2.1 pod-norps
done
setrps 0

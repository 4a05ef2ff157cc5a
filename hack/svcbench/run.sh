#!/usr/bin/env bash
# Run the Service benchmark on a lab of its own: wait until no lab
# is up (the lab is one per machine and shared), bring up 4 axon nodes with no
# lab-wide kube-proxy, run `axon lab bench services "$@"`, bring the lab down.
#
#   hack/svcbench/run.sh                                  # 10, 1 000, 10 000 Services
#   hack/svcbench/run.sh --services 10,1000 --reps 3      # quicker
#
# BIN_DIR (default bin/) holds axon, axon-agent and axon-cni (`make build`).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN_DIR=${BIN_DIR:-bin}
AXON="$BIN_DIR/axon"
WAIT=${WAIT:-1800} # seconds to wait for a free lab

lab_busy() { [ -e /run/axon-lab/lab.json ] || ip netns list 2>/dev/null | grep -q '^axonlab-'; }

deadline=$((SECONDS + WAIT))
while :; do
	while lab_busy; do
		if [ "$SECONDS" -ge "$deadline" ]; then
			echo "svcbench: a lab is still up after ${WAIT}s; not touching it (axon lab down frees it)" >&2
			exit 1
		fi
		sleep 2
	done
	if "$AXON" lab up --nodes 4 --no-demo --bin-dir "$BIN_DIR"; then
		break
	fi
	echo "svcbench: lab up failed (someone else took the lab?); waiting again" >&2
	sleep 2
done
trap '"$AXON" lab down' EXIT
"$AXON" lab bench services --leave-objects "$@" # the lab goes down next

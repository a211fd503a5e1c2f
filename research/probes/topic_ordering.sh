#!/bin/bash
# runs against the current package. What the cuda-ipc topic's GPU ordering between processes
# costs: bench/topics.py (1080p NV12, every, N = 1 and 8, with the CUDA IPC ring) as shipped, then
# with the publisher's waits on subscribers' done events removed, then with subscribers never
# recording one (both unsafe, diagnostics only: topic_ordering/*/sitecustomize.py). Usage:
#   research/probes/topic_ordering.sh [ROUNDS]     (from the repository root, on a GPU machine)
set -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
B="--subscribers 1,8 --sizes 1080p-nv12 --duration 1.5 --qos every"
run() {  # label, extra PYTHONPATH entry, transport
  out=$(PYTHONPATH="$2${PYTHONPATH:+:$PYTHONPATH}" python3 "$root/bench/topics.py" $B --transports "$3" \
        --out "$(mktemp -d)" 2>&1)
  status=$?
  if [ "$status" = 2 ]; then echo "$out" | tail -1; exit 2; fi  # the bench's one line: what is missing
  echo "$out" | grep "N=" | grep -v SUMMARY | sed "s/^/$1 /"
}
for round in $(seq 1 "${1:-2}"); do
  run "shipped$round" "" cuda-ipc
  run "no-publisher-wait$round" "$here/topic_ordering/no_publisher_wait" cuda-ipc
  run "no-done-event$round" "$here/topic_ordering/no_done_event" cuda-ipc
  run "ring$round" "" ipc-ring
done

#!/bin/bash
# Run 2026-11-28 on one H200 at 262f8fe: the UCX engine's two progress modes (EGLCUDA_UCX_PROGRESS: loop, the engine thread
# progresses UCX itself; thread, UCXX's C++ progress thread does and a notifier tells the loop), one remote
# subscriber flat out (1080p NV12), alternating, three rounds beside the raw engine, with the relay's and the
# remote subscriber's threads sampled (research/remote_runs/_threads45.py); before that the GPU remote tier and the remote
# sample (loop mode), and the GPU remote tests again in thread mode. From the repository root, after the set-up
# _remote_setup.sh names (research/README.md):
#   bash research/remote_runs/remote-threaded.sh [OUT_DIR]     (or OUT=...; default research-out/remote-threaded)
# The logs end up in OUT_DIR/logs.tgz.
set -u
OUT=${1:-${OUT:-research-out/remote-threaded}}; mkdir -p "$OUT"
ROOT=$PWD; L=/tmp/logs; mkdir -p $L
source research/remote_runs/_remote_setup.sh $L
echo "setup $(( $(date +%s) - T0 )) s; HEAD $(git rev-parse --short HEAD) + working tree; $(nproc) cores"
EGLCUDA_REQUIRE_GPU=1 timeout 200 python3 -m pytest tests/gpu/test_remote.py tests/unit/remote -q -ra -p no:cacheprovider > $L/tests.log 2>&1
echo "remote tests (loop) rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(FAILED|ERROR)|^SKIPPED" $L/tests.log | cut -c1-200 | head; tail -1 $L/tests.log
timeout 40 python3 samples/remote_subscriber.py --frames 300 > $L/sample-remote.log 2>&1; echo "remote sample rc=$?"; tail -2 $L/sample-remote.log
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
one() {  # label, variants, progress mode
  local label=$1 variants=$2 mode=$3
  python3 research/remote_runs/_threads45.py 2.5 2 $L/th-$label.json > /dev/null 2>&1 &
  local sampler=$!
  EGLCUDA_UCX_PROGRESS=$mode timeout 60 python3 bench/remote.py --out $L/$label --sizes 1080p-nv12 --duration 3 --subscribers 1 \
    --rates max --variants $variants --engine-modes blocking --ucx-env $U --no-plots > $L/bench-$label.log 2>&1
  local rc=$?; sleep 0.2; kill $sampler 2> /dev/null; wait $sampler 2> /dev/null
  [ $rc = 0 ] || echo "$label rc=$rc: $(tail -1 $L/bench-$label.log | cut -c1-150)"
  python3 research/remote_runs/_knobs_summary.py $label $L/$label $L/th-$label.json 2>&1 | cut -c1-230
}
for round in 1 2 3; do
  echo "== round $round ($(( $(date +%s) - T0 )) s)"
  one raw$round ucx-raw loop
  one loop$round eglcuda loop
  one thread$round eglcuda thread
done
EGLCUDA_UCX_PROGRESS=thread EGLCUDA_REQUIRE_GPU=1 timeout 120 python3 -m pytest tests/gpu/test_remote.py -q -ra -p no:cacheprovider \
  > $L/tests-thread.log 2>&1
echo "GPU remote tests (thread) rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(FAILED|ERROR)" $L/tests-thread.log | cut -c1-200 | head -5; tail -1 $L/tests-thread.log
tar czf "$OUT/logs.tgz" -C /tmp logs
echo "total $(( $(date +%s) - T0 )) s"

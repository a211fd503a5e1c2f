#!/bin/bash
# Session 6 final H200 run on main after the merges (frame ring + UCX core-API engine): the GPU remote tier,
# the remote and fan-out samples, bench/remote.py 1080p (1 and 8 remotes, max and 60/s) with the raw engine,
# then a diagnosis: the same single-remote row with a window of 6 (LATEST_WINDOW and SEND_AHEAD patched here only).
set -u
command -v nvidia-smi > /dev/null || { echo "$0: needs an NVIDIA GPU machine (nvidia-smi not found); see bench/runs/README.md"; exit 2; }
[ -f .device/setup.sh ] || { echo "$0: needs .device/ staged in the repository root (bench/runs/README.md)"; exit 2; }
ls .wheels/*.whl > /dev/null 2>&1 || { echo "$0: needs the UCXX wheels in .wheels/ (bench/runs/README.md says how to get them)"; exit 2; }
T0=$(date +%s)
source .device/setup.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ucxx .wheels/*.whl > $OUT/ucxx-install.log 2>&1 || tail -3 $OUT/ucxx-install.log
export PYTHONPATH=/tmp/ucxx${PYTHONPATH:+:$PYTHONPATH}
echo "setup $(( $(date +%s) - T0 )) s; HEAD $(git rev-parse --short HEAD 2>/dev/null)"
EGLCUDA_REQUIRE_GPU=1 timeout 150 python3 -m pytest tests/gpu/test_remote.py tests/unit/remote/test_remote.py -q -ra -p no:cacheprovider --durations=5 > $OUT/tests.log 2>&1
echo "remote tests rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(FAILED|ERROR)|^SKIPPED" $OUT/tests.log | cut -c1-200 | head; tail -1 $OUT/tests.log
timeout 40 python3 samples/remote_subscriber.py --frames 300 > $OUT/sample-remote.log 2>&1; echo "remote sample rc=$?"; tail -3 $OUT/sample-remote.log
timeout 40 python3 samples/topic_fanout.py > $OUT/sample-fanout.log 2>&1; echo "fanout sample rc=$?"; tail -4 $OUT/sample-fanout.log
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
timeout 90 python3 bench/remote.py --out $OUT/r1 --sizes 1080p-nv12 --duration 1 --subscribers 1,8 --rates max,60 \
  --variants eglcuda,ucx-raw --engine-modes blocking --ucx-env $U --no-plots > $OUT/bench-1080p.log 2>&1
echo "bench 1080p rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE '^(PASS|FAIL|INFO)' $OUT/bench-1080p.log; grep -h '^|' $OUT/r1/results.md | cut -c1-200
sed -i 's/^LATEST_WINDOW = 3\b/LATEST_WINDOW = 6/; s/^SEND_AHEAD = 3\b/SEND_AHEAD = 6/' eglcuda/remote/wire.py; grep -nE "^(LATEST_WINDOW|SEND_AHEAD) =" eglcuda/remote/wire.py
timeout 60 python3 bench/remote.py --out $OUT/r6 --sizes 1080p-nv12 --duration 1 --subscribers 1 --rates max \
  --variants eglcuda,ucx-raw --engine-modes blocking --ucx-env $U --no-plots > $OUT/bench-w6.log 2>&1
echo "bench window 6 rc=$? ($(( $(date +%s) - T0 )) s)"; grep -hE '^(PASS|FAIL)' $OUT/bench-w6.log; grep -h '^|' $OUT/r6/results.md | grep -v "^| size\|^|--" | cut -c1-200
git checkout eglcuda/remote/wire.py 2>/dev/null
echo "total $(( $(date +%s) - T0 )) s"

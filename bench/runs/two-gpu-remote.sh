#!/bin/bash
# Session 6, on nvidia-h200-x2, the merge of shm43 (frame ring) + core44 (UCX core API): the two-GPU tests,
# the remote GPU tier, the remote sample, and bench/remote.py 1080p NV12 + 4K ARGB.
set -u
command -v nvidia-smi > /dev/null || { echo "$0: needs an NVIDIA GPU machine (nvidia-smi not found); see bench/runs/README.md"; exit 2; }
[ -f .device/setup.sh ] || { echo "$0: needs .device/ staged in the repository root (bench/runs/README.md)"; exit 2; }
ls .wheels/*.whl > /dev/null 2>&1 || { echo "$0: needs the UCXX wheels in .wheels/ (bench/runs/README.md says how to get them)"; exit 2; }
T0=$(date +%s)
source .device/setup.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ucxx .wheels/*.whl > $OUT/ucxx-install.log 2>&1 || tail -3 $OUT/ucxx-install.log
export PYTHONPATH=/tmp/ucxx${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
echo "setup $(( $(date +%s) - T0 )) s"
EGLCUDA_REQUIRE_GPU=1 timeout 200 python3 -m pytest tests/gpu/test_remote.py tests/gpu/test_cross_gpu.py "tests/gpu/test_topics.py::test_subscriber_on_another_gpu" \
  -v -ra -p no:cacheprovider --durations=6 > $OUT/tests.log 2>&1
echo "tests rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "(PASSED|FAILED|ERROR|SKIPPED)" $OUT/tests.log | grep "::" | sed -E 's/ +\[ *[0-9]+%\]//' | cut -c1-170 | head -40; tail -1 $OUT/tests.log
timeout 40 python3 samples/remote_subscriber.py --frames 300 > $OUT/sample-remote.log 2>&1; echo "remote sample rc=$?"; tail -3 $OUT/sample-remote.log
timeout 30 python3 samples/cross_gpu.py > $OUT/sample-cross.log 2>&1; echo "cross_gpu sample rc=$?"; tail -2 $OUT/sample-cross.log
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
timeout 130 python3 bench/remote.py --out $OUT/remote-1080p --sizes 1080p-nv12 --duration 1 --subscribers 1,4,8 \
  --ucx-env $U --no-plots > $OUT/bench-1080p.log 2>&1
echo "bench 1080p rc=$? ($(( $(date +%s) - T0 )) s)"
left=$(( 535 - ($(date +%s) - T0) )); [ $left -gt 110 ] && left=110
timeout $left python3 bench/remote.py --out $OUT/remote-4k --sizes 4k-argb --rates max --duration 1 --subscribers 1,4,8 \
  --ucx-env $U --no-plots > $OUT/bench-4k.log 2>&1
echo "bench 4K rc=$? ($(( $(date +%s) - T0 )) s)"
echo "== results"
grep -hE '^(PASS|FAIL|INFO)' $OUT/bench-1080p.log $OUT/bench-4k.log
grep -h '^|' $OUT/remote-1080p/results.md 2>/dev/null | cut -c1-220 | head -40
grep -h '^|' $OUT/remote-4k/results.md 2>/dev/null | grep -v -- '^| size\|^|---' | cut -c1-220 | head -20

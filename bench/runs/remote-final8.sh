#!/bin/bash
# Session 8's last H200 run, the UCX engine in thread mode (the default from this session): the GPU remote tier
# and the CPU remote tests in thread mode, the GPU remote tests again in loop mode, the remote sample, then
# bench/remote.py 1080p NV12 (1 remote flat out, two rounds each against its own raw engine; 8 remotes at 60/s)
# and 4K ARGB (1 remote). Everything under $OUT goes back as one archive.
set -u
L=/tmp/logs; mkdir -p $L
source bench/runs/_remote_setup.sh $L
echo "setup $(( $(date +%s) - T0 )) s; HEAD $(git rev-parse --short HEAD) + working tree"
remote_tier $L/tests-thread.log 170
EGLCUDA_UCX_PROGRESS=loop EGLCUDA_REQUIRE_GPU=1 timeout 80 python3 -m pytest tests/gpu/test_remote.py -q -ra -p no:cacheprovider > $L/tests-loop.log 2>&1
echo "GPU remote tests (loop) rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(FAILED|ERROR)" $L/tests-loop.log | cut -c1-200 | head -5; tail -1 $L/tests-loop.log
timeout 40 python3 samples/remote_subscriber.py --frames 300 > $L/sample-remote.log 2>&1; echo "remote sample rc=$?"; tail -2 $L/sample-remote.log
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
bench_row r1080 100 --sizes 1080p-nv12 --duration 2 --rounds 2 --subscribers 1 --rates max --variants eglcuda,ucx-raw \
  --engine-modes blocking
bench_row r8 60 --sizes 1080p-nv12 --duration 1 --subscribers 8 --rates 60 --variants eglcuda
bench_row r4k 60 --sizes 4k-argb --duration 1 --subscribers 1 --rates max --variants eglcuda,ucx-raw --engine-modes blocking
tar czf $OUT/logs.tgz -C /tmp logs
echo "total $(( $(date +%s) - T0 )) s"

#!/bin/bash
# Session 7 H200 run of the callback frame path (a staged frame reserved until dispatched; UCX completions by
# callback, no task or future per message; progress rounds in one pass): the GPU remote tier and the remote and
# fan-out samples, then bench/remote.py 1080p (1 and 8 remotes; the publisher flat out, at 2,000/s (more than
# the link carries) and at 60/s; the raw engine w3 from one buffer and from a ring of 12, w1; zmq) and 4K ARGB
# (1 remote, flat out). Everything under $OUT goes back as one archive (the device tool returns few files).
set -u
L=/tmp/logs; mkdir -p $L
source bench/runs/_remote_setup.sh $L
echo "setup $(( $(date +%s) - T0 )) s; HEAD $(git rev-parse --short HEAD) + working tree; $(lscpu | grep -E '^(Thread|Core|Socket)' | tr -s ' ' | tr '\n' ';')"
EGLCUDA_REQUIRE_GPU=1 timeout 200 python3 -m pytest tests/gpu/test_remote.py tests/unit/remote -q -ra -p no:cacheprovider --durations=5 > $L/tests.log 2>&1
echo "remote tests rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(FAILED|ERROR)|^SKIPPED" $L/tests.log | cut -c1-200 | head; tail -1 $L/tests.log
timeout 40 python3 samples/remote_subscriber.py --frames 300 > $L/sample-remote.log 2>&1; echo "remote sample rc=$?"; tail -2 $L/sample-remote.log
timeout 40 python3 samples/topic_fanout.py > $L/sample-fanout.log 2>&1; echo "fanout sample rc=$?"; tail -2 $L/sample-fanout.log
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
bench_row r1080 200 --sizes 1080p-nv12 --duration 1 --subscribers 1,8 --rates max,2000,60 --variants eglcuda,ucx-raw,zmq \
  --engine-modes blocking --raw-rings 12
bench_row r4k 90 --sizes 4k-argb --duration 1 --subscribers 1 --rates max --variants eglcuda,ucx-raw --engine-modes blocking
tar czf $OUT/logs.tgz -C /tmp logs
echo "total $(( $(date +%s) - T0 )) s"

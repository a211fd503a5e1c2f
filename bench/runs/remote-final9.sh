#!/bin/bash
# Session 9's last H200 run (after remote-window.sh; the 'latest' window stays 3): the GPU remote tier and the CPU
# remote tests (thread mode), the remote sample, bench/remote.py 1080p NV12 (1 remote flat out, three rounds, each
# against the raw engine of its own round, and the raw engine taking each frame through the GPU as the relay and a
# remote subscriber do: --raw-gpu), a small frame (320x240 NV12: the per-frame cost), 8 remotes at 60/s, 4K ARGB
# (1 remote). Everything under $OUT goes back as one archive.
set -u
L=/tmp/logs; mkdir -p $L
source bench/runs/_remote_setup.sh $L
echo "setup $(( $(date +%s) - T0 )) s; HEAD $(git rev-parse --short HEAD) + working tree"
remote_tier $L/tests-thread.log 170
timeout 40 python3 samples/remote_subscriber.py --frames 300 > $L/sample-remote.log 2>&1; echo "remote sample rc=$?"; tail -2 $L/sample-remote.log
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
bench_row r1080 200 --sizes 1080p-nv12 --duration 2 --rounds 3 --subscribers 1 --rates max --variants eglcuda,ucx-raw \
  --engine-modes blocking --raw-gpu
bench_row r320 60 --width 320 --height 240 --duration 2 --subscribers 1 --rates max --variants eglcuda,ucx-raw --engine-modes blocking
bench_row r8 60 --sizes 1080p-nv12 --duration 1 --subscribers 8 --rates 60 --variants eglcuda
bench_row r4k 60 --sizes 4k-argb --duration 1 --subscribers 1 --rates max --variants eglcuda,ucx-raw --engine-modes blocking --raw-gpu
tar czf $OUT/logs.tgz -C /tmp logs
echo "total $(( $(date +%s) - T0 )) s"

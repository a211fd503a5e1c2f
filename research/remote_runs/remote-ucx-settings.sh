#!/bin/bash
# Run 2026-11-28 at a007545: which UCX setting moves one remote subscriber toward the raw engine (1080p NV12, TCP
# loopback, publisher flat out, 1 s each); the raw engine (core API, w3/w1) in the same settings each time. From the
# repository root, after the set-up _remote_setup.sh names (research/README.md):
#   bash research/remote_runs/remote-ucx-settings.sh [OUT_DIR]     (or OUT=...; default research-out/remote-ucx-settings)
set -u
OUT=${1:-${OUT:-research-out/remote-ucx-settings}}
source research/remote_runs/_remote_setup.sh "$OUT"
S="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
i=0
for U in "$S" "$S,UCX_RNDV_THRESH=inf" "$S,UCX_TCP_SNDBUF=16M,UCX_TCP_RCVBUF=16M" "UCX_TCP_TX_SEG_SIZE=1M,UCX_TCP_RX_SEG_SIZE=4M" "$S,UCX_PROTO_ENABLE=n" "$S"; do
  i=$((i+1))
  timeout 40 python3 bench/remote.py --out $OUT/k$i --sizes 1080p-nv12 --duration 1 --subscribers 1 --rates max \
    --variants eglcuda,ucx-raw --engine-modes blocking --ucx-env "$U" --no-plots > $OUT/k$i.log 2>&1
  echo "== $i [$U] rc=$? ($(( $(date +%s) - T0 )) s)"
  grep -h '^| 1080p' $OUT/k$i/results.md 2>/dev/null | awk -F'|' '{printf "   %-26s %8s %10s  p50 %s p99 %s local %s\n", $3, $7, $8, $9, $10, $11}'
done
echo "total $(( $(date +%s) - T0 )) s"

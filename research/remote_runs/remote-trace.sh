#!/bin/bash
# Run 2026-11-29 on one H200 at 305389b: where one remote subscriber's time goes a frame (research/remote_runs/_trace46.py's marks on a copy
# of this checkout; summary: _trace_summary.py), flat out at 320x240 NV12 (the per-frame cost alone) and at 1080p
# NV12, thread mode, two rounds each; the raw engine beside each size once. From the repository root, after the
# set-up _remote_setup.sh names (research/README.md):
#   bash research/remote_runs/remote-trace.sh [OUT_DIR]     (or OUT=...; default research-out/remote-trace)
# The logs end up in OUT_DIR/logs.tgz.
set -u
OUT=${1:-${OUT:-research-out/remote-trace}}; mkdir -p "$OUT"
ROOT=$PWD; L=/tmp/logs; mkdir -p $L
source research/remote_runs/_remote_setup.sh $L
patched_copy /tmp/tr research/remote_runs/_trace46.py > /dev/null
echo "setup $(( $(date +%s) - T0 )) s; HEAD $(git rev-parse --short HEAD) + working tree"
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
for size in "--width 320 --height 240" "--sizes 1080p-nv12"; do
  tag=$(echo $size | tr -cd '0-9a-z'); variants=eglcuda,ucx-raw
  for round in 1 2; do
    mkdir -p $L/tr-$tag-$round
    (cd /tmp/tr && EGLX_TRACE_DIR=$L/tr-$tag-$round PYTHONPATH=/tmp/tr${PYTHONPATH:+:$PYTHONPATH} timeout 60 python3 $ROOT/bench/remote.py \
      --out $L/b-$tag-$round $size --duration 2 --subscribers 1 --rates max --variants $variants --engine-modes blocking \
      --ucx-env $U --no-plots > $L/bench-$tag-$round.log 2>&1) || echo "$tag $round failed: $(tail -1 $L/bench-$tag-$round.log | cut -c1-150)"
    grep -h '^|' $L/b-$tag-$round/results.md | grep -v "^| size\|^|--" | cut -c1-150
    python3 research/remote_runs/_trace_summary.py $L/tr-$tag-$round
    variants=eglcuda
  done
done
tar czf "$OUT/logs.tgz" -C /tmp logs
echo "total $(( $(date +%s) - T0 )) s"

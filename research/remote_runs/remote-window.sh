#!/bin/bash
# Run 2026-11-29 on one H200 at 103e370, thread mode (the default): does a deeper window move one remote subscriber (1080p NV12,
# flat out) towards the raw engine now that no thread of the path is saturated? Alternating, three rounds, each
# configuration 3 s with the relay's and the remote subscriber's threads sampled (research/remote_runs/_threads45.py); the
# knobs (research/remote_runs/_knobs45.py) on a copy of this checkout: the latest window and the sends in flight (3/3: 6/3,
# 6/6), staging buffers reused last-freed-first (EGLX_LIFO), both; the raw engine at windows 3 and 6 in each
# round (bench/remote.py gives the raw engine the relay's window). From the repository root, after the set-up
# _remote_setup.sh names (research/README.md):
#   bash research/remote_runs/remote-window.sh [OUT_DIR]     (or OUT=...; default research-out/remote-window)
# The logs end up in OUT_DIR/logs.tgz.
set -u
OUT=${1:-${OUT:-research-out/remote-window}}; mkdir -p "$OUT"
ROOT=$PWD; L=/tmp/logs; mkdir -p $L
source research/remote_runs/_remote_setup.sh $L
patched_copy /tmp/kt research/remote_runs/_knobs45.py
echo "setup $(( $(date +%s) - T0 )) s; HEAD $(git rev-parse --short HEAD) + working tree; $(nproc) cores; $(lscpu | grep -m1 'Model name' | cut -c1-80)"
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
KNOB_UNTIL_S=530
one() { local label=$1 variants=$2; shift 2; knob_one $label $variants $U "$@"; }  # label, variants, knobs...
for round in 1 2 3; do
  echo "== round $round ($(( $(date +%s) - T0 )) s)"
  one raw3-$round ucx-raw X=0
  one raw6-$round ucx-raw EGLX_WINDOW=6
  one base$round eglcuda X=0
  one w6a3-$round eglcuda EGLX_WINDOW=6
  one w6a6-$round eglcuda EGLX_WINDOW=6 EGLX_AHEAD=6
  one lifo$round eglcuda EGLX_LIFO=1
  one w6a6lifo$round eglcuda EGLX_WINDOW=6 EGLX_AHEAD=6 EGLX_LIFO=1
done
tar czf "$OUT/logs.tgz" -C /tmp logs
echo "total $(( $(date +%s) - T0 )) s"

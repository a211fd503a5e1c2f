#!/bin/bash
# Session 6: which UCX setting moves one remote subscriber toward the raw engine (1080p NV12, TCP loopback,
# publisher flat out, 1 s each); the raw engine (core API, w3/w1) in the same settings each time.
set -u
command -v nvidia-smi > /dev/null || { echo "$0: needs an NVIDIA GPU machine (nvidia-smi not found); see research/README.md"; exit 2; }
[ -f .device/setup.sh ] || { echo "$0: needs .device/ staged in the repository root (research/README.md)"; exit 2; }
ls .wheels/*.whl > /dev/null 2>&1 || { echo "$0: needs the UCXX wheels in .wheels/ (research/README.md says how to get them)"; exit 2; }
T0=$(date +%s)
source .device/setup.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ucxx .wheels/*.whl > $OUT/ucxx-install.log 2>&1 || tail -3 $OUT/ucxx-install.log
export PYTHONPATH=/tmp/ucxx${PYTHONPATH:+:$PYTHONPATH}
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

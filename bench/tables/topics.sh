#!/usr/bin/env bash
# The frame-topics tables of docs/topics.md, on a machine with an NVIDIA GPU:
#   bash bench/tables/topics.sh [OUT]            (OUT: where the results go, default bench-tables/topics)
# bench/topics.py twice, without and under a private MPS daemon: 1080p NV12, 1 and 8 subscriber
# processes, qos every, eglcuda's cuda-ipc transport against a hand-written CUDA IPC ring (the C-style
# baseline), three rounds, the tables giving the medians. A few minutes.
# Needs eglcuda installed from this checkout with the bench extra (pip install -e '.[bench]') and,
# for the MPS half, the NVIDIA driver's nvidia-cuda-mps-control. What both halves need (MPS's too)
# is checked first (bench/topics.py --check): one line and exit status 2 when something is missing.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  -*) echo "usage: bash $0 [OUT] (--help: what it runs)" >&2; exit 2 ;;  # not a folder name: an option
esac
if [ $# -gt 1 ]; then echo "usage: bash $0 [OUT] (--help: what it runs)" >&2; exit 2; fi
OUT=${1:-bench-tables/topics}
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac  # (relative to where it was run, before the cd)
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
COMMON=(--sizes 1080p-nv12 --subscribers 1,8 --duration 1 --transports cuda-ipc,ipc-ring --rounds 3 --qos every)
if ! command -v "$PYTHON" >/dev/null; then
  echo "bench/tables/topics.sh: no $PYTHON here: set PYTHON to the Python that has eglcuda installed" >&2; exit 2
fi
"$PYTHON" bench/topics.py "${COMMON[@]}" --mps --check  # (both halves' needs, MPS's too, before either: one line)

echo "== without MPS"
"$PYTHON" bench/topics.py "${COMMON[@]}" --out "$OUT/no-mps"
echo "== under a private MPS daemon"
"$PYTHON" bench/topics.py "${COMMON[@]}" --mps --out "$OUT/mps"
echo "results: $OUT/no-mps, $OUT/mps (results.json, results.md)"

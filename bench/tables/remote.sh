#!/usr/bin/env bash
# The remote-subscriber tables of docs/remote.md, on a machine with an NVIDIA GPU (relay and remote
# subscribers on one host, UCX over TCP loopback):
#   bash bench/tables/remote.sh [OUT]            (OUT: where the results go, default bench-tables/remote)
# bench/remote.py four times:
#   1080p  1080p NV12, one remote subscriber flat out, three rounds, against UCXX's raw rate from one
#          host buffer and through the GPU as the relay and a remote subscriber go (--raw-gpu);
#   320    320x240 NV12, the same: what a frame costs apart from its bytes;
#   fanout 1080p NV12, eight remote subscribers of a 60 frames/s topic;
#   4k     4K ARGB, one remote subscriber flat out, against the raw rates.
# UCX's TCP segments are enlarged for every process (UCX_TCP_TX_SEG_SIZE=256K, UCX_TCP_RX_SEG_SIZE=1M;
# docs/remote.md says why). About four minutes.
# Needs eglcuda installed from this checkout with the bench extra and the remote extra of the CUDA
# version nvidia-smi shows (pip install -e '.[bench,remote-cu13]', or remote-cu12). What the rows need
# is checked first (bench/remote.py --check): one line and exit status 2 when something is missing.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  -*) echo "usage: bash $0 [OUT] (--help: what it runs)" >&2; exit 2 ;;  # not a folder name: an option
esac
if [ $# -gt 1 ]; then echo "usage: bash $0 [OUT] (--help: what it runs)" >&2; exit 2; fi
OUT=${1:-bench-tables/remote}
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac  # (relative to where it was run, before the cd)
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
COMMON=(--ucx-env UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M --no-plots)
RAW=(--variants eglcuda,ucx-raw --engine-modes blocking)
if ! command -v "$PYTHON" >/dev/null; then
  echo "bench/tables/remote.sh: no $PYTHON here: set PYTHON to the Python that has eglcuda installed" >&2; exit 2
fi
"$PYTHON" bench/remote.py "${COMMON[@]}" --check  # (what every row needs, before any row: one line, status 2)

row() {  # row NAME bench/remote.py arguments...
  local name=$1; shift
  echo "== $name"
  "$PYTHON" bench/remote.py "${COMMON[@]}" --out "$OUT/$name" "$@"
}
row 1080p --sizes 1080p-nv12 --duration 2 --rounds 3 --subscribers 1 --rates max "${RAW[@]}" --raw-gpu
row 320 --width 320 --height 240 --duration 2 --subscribers 1 --rates max "${RAW[@]}"
row fanout --sizes 1080p-nv12 --duration 1 --subscribers 8 --rates 60 --variants eglcuda
row 4k --sizes 4k-argb --duration 1 --subscribers 1 --rates max "${RAW[@]}" --raw-gpu
echo "results: $OUT/{1080p,320,fanout,4k} (results.json, results.md)"

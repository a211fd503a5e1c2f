#!/usr/bin/env bash
# remote_handover_probe.py for two trees of eglcuda in alternate rounds of one run: BEFORE (a git
# revision's eglcuda/remote/ laid over this tree's compiled modules) and this tree, on the stand-in
# libcuda (tests/fakes), UCX over TCP loopback.
#
#   bash research/probes/remote_handover_probe.sh [BEFORE_REV] [ROUNDS]      (defaults: HEAD~1, 3)
set -euo pipefail
cd "$(dirname "$0")/../.."
before=${1:-HEAD~1}
rounds=${2:-3}
py=${PYTHON:-.venv/bin/python}
work=$(mktemp -d /tmp/eglcuda-handover-probe.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$py" -c 'import sys; sys.path.insert(0, "."); from tests.fakes import build; build.build_libcuda(sys.argv[1])' "$work/cuda"
mkdir -p "$work/before"
cp -r eglcuda "$work/before/"
find "$work/before" -name __pycache__ -prune -exec rm -rf {} +
for f in $(git ls-tree --name-only "$before" eglcuda/remote/); do
  git show "$before:$f" > "$work/before/$f"
done
export LD_LIBRARY_PATH="$work/cuda" __EGL_VENDOR_LIBRARY_FILENAMES=/nonexistent.json
for round in $(seq "$rounds"); do
  PYTHONPATH="$work/before" "$py" research/probes/remote_handover_probe.py --label before
  "$py" research/probes/remote_handover_probe.py --label after
done

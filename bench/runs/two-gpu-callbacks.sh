#!/bin/bash
# Session 7, on nvidia-h200-x2: the two-GPU remote tests (a remote subscriber on the other GPU, both ways, over
# tcp + cuda_ipc) on the callback frame path, with the rest of the remote GPU tier.
set -u
command -v nvidia-smi > /dev/null || { echo "$0: needs an NVIDIA GPU machine (nvidia-smi not found); see bench/runs/README.md"; exit 2; }
[ -f .device/setup.sh ] || { echo "$0: needs .device/ staged in the repository root (bench/runs/README.md)"; exit 2; }
ls .wheels/*.whl > /dev/null 2>&1 || { echo "$0: needs the UCXX wheels in .wheels/ (bench/runs/README.md says how to get them)"; exit 2; }
T0=$(date +%s)
source .device/setup.sh > /tmp/setup.log 2>&1; tail -1 /tmp/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ucxx .wheels/*.whl > /tmp/ucxx-install.log 2>&1 || tail -3 /tmp/ucxx-install.log
export PYTHONPATH=/tmp/ucxx${PYTHONPATH:+:$PYTHONPATH}
echo "setup $(( $(date +%s) - T0 )) s; $(nvidia-smi -L | wc -l) GPUs"
EGLCUDA_REQUIRE_GPU=1 timeout 170 python3 -m pytest tests/gpu/test_remote.py -v -ra -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "(PASSED|FAILED|ERROR|SKIPPED)" $OUT/tests.log | grep "::" | sed -E 's/ +\[ *[0-9]+%\]//' | cut -c1-150; tail -1 $OUT/tests.log

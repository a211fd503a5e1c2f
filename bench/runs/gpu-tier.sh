#!/bin/bash
# The whole GPU tier: every test, with UCXX from .wheels (argument: the time limit in seconds, default 500).
set -u
command -v nvidia-smi > /dev/null || { echo "$0: needs an NVIDIA GPU machine (nvidia-smi not found); see bench/runs/README.md"; exit 2; }
[ -f .device/setup.sh ] || { echo "$0: needs .device/ staged in the repository root (bench/runs/README.md)"; exit 2; }
ls .wheels/*.whl > /dev/null 2>&1 || { echo "$0: needs the UCXX wheels in .wheels/ (bench/runs/README.md says how to get them)"; exit 2; }
T0=$(date +%s)
source .device/setup.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ucxx .wheels/*.whl > $OUT/ucxx-install.log 2>&1 || tail -3 $OUT/ucxx-install.log
export PYTHONPATH=/tmp/ucxx${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import ucxx; print('ucxx', ucxx.__version__, 'ucx', ucxx.get_ucx_version())" 2>&1 | tail -1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
EGLCUDA_REQUIRE_GPU=1 timeout ${1:-500} python3 -m pytest tests -q -ra -p no:cacheprovider --maxfail=40 --durations=15 > $OUT/full.log 2>&1
echo "full rc=$? ($(( $(date +%s) - T0 )) s)"
grep -E "^(FAILED|ERROR)" $OUT/full.log | cut -c1-220 | head -40
grep -E "^SKIPPED" $OUT/full.log | sed -E 's/\[[0-9]+\] //' | cut -c1-160 | sort | uniq -c | sort -rn | head -15
tail -1 $OUT/full.log

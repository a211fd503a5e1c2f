#!/bin/bash
# Session 9, on nvidia-h200-x2: the remote GPU tests with the two-GPU cases (a remote subscriber on the other GPU,
# both ways, over tcp + cuda_ipc) with the UCX engine in thread mode (the default since session 8).
set -u
source bench/runs/_remote_setup.sh /tmp
echo "setup $(( $(date +%s) - T0 )) s; $(nvidia-smi -L | wc -l) GPUs; HEAD $(git rev-parse --short HEAD) + working tree"
EGLCUDA_REQUIRE_GPU=1 timeout 200 python3 -m pytest tests/gpu/test_remote.py -v -ra -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "(PASSED|FAILED|ERROR|SKIPPED)" $OUT/tests.log | grep "::" | sed -E 's/ +\[ *[0-9]+%\]//' | cut -c1-150; tail -1 $OUT/tests.log

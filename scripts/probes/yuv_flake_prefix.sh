#!/bin/bash
# Which earlier GPU test files make test_every_byte_arrives[640x480-YUV420_PLANAR-pitch] fail?
# Runs test_stream.py's every-byte test after growing sets of the files that precede it.
K='test_every_byte_arrives'
run() { echo "== $*"; timeout 150 python3 -m pytest -q -p no:cacheprovider "$@" -k "not test_stream.py or $K" 2>&1 | grep -E "^FAILED|passed|failed" | cut -c1-160; }
S=tests/gpu/test_stream.py
run $S
run tests/gpu/test_samples.py $S
run tests/gpu/test_platform.py tests/gpu/test_samples.py $S
run tests/gpu/test_memory.py tests/gpu/test_platform.py tests/gpu/test_samples.py $S
run tests/gpu/test_interop.py tests/gpu/test_memory.py tests/gpu/test_platform.py tests/gpu/test_samples.py $S
run tests/gpu/test_image.py tests/gpu/test_interop.py $S
run tests/gpu/test_glstream.py tests/gpu/test_image.py $S
run tests/gpu/test_crossprocess.py tests/gpu/test_gc_in_locks.py $S
run tests/gpu/test_crossprocess.py tests/gpu/test_gc_in_locks.py tests/gpu/test_glstream.py tests/gpu/test_image.py tests/gpu/test_interop.py tests/gpu/test_memory.py tests/gpu/test_platform.py tests/gpu/test_samples.py $S

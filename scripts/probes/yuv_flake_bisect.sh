#!/bin/bash
# Which earlier tests make test_every_byte_arrives[640x480-YUV420_PLANAR-pitch] fail?
# Runs the target after each other GPU test file alone, then inside test_stream.py variants.
T='tests/gpu/test_stream.py::test_every_byte_arrives[640x480-YUV420_PLANAR-Layout.PITCH]'
run() { echo "== $*"; timeout 120 python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | grep -E "^FAILED|passed|failed" | cut -c1-160; }
run "$T"
run tests/gpu/test_stream.py
run tests/gpu/test_stream.py -k test_every_byte_arrives
run tests/gpu/test_stream.py -k "test_every_byte_arrives and 640x480"
run tests/gpu/test_stream.py -k "test_every_byte_arrives and YUV420_PLANAR"
for f in crossprocess image interop memory platform samples sync; do run tests/gpu/test_$f.py "$T"; done

#!/bin/bash
# Run the failing case right after each single other 640x480 case of test_every_byte_arrives.
T='tests/gpu/test_stream.py::test_every_byte_arrives[640x480-YUV420_PLANAR-Layout.PITCH]'
for fmt in ARGB ABGR RGBA BGRA Y A YUV420_PLANAR NV12 YUV444_PLANAR; do
  for layout in PITCH ARRAY; do
    C="tests/gpu/test_stream.py::test_every_byte_arrives[640x480-$fmt-Layout.$layout]"
    [ "$C" = "$T" ] && continue
    r=$(timeout 60 python3 -m pytest -q -p no:cacheprovider "$C" "$T" 2>&1 | grep -E "passed|failed" | tail -1)
    echo "$fmt $layout then target: $r"
  done
done

#!/bin/bash
# Research record (see research/README.md): frozen record (uses the old layout: rebuilds csrc/hotpath.c as eglcuda._hotpath; ran at 33c8fe6).
# Probe: what does releasing the GIL around each driver call cost on the serial round trip?
# Builds a copy of the package whose _hotpath keeps the GIL (Py_BEGIN/END_ALLOW_THREADS removed),
# then runs the serial loops with each build in turn, 5 rounds, 20,000 frames, 1920x1080.
set -e
NOGIL=/tmp/nogil
rm -rf $NOGIL && mkdir -p $NOGIL && cp -r eglcuda $NOGIL/
SO=$(ls eglcuda/_hotpath*.so)
sed 's/Py_BEGIN_ALLOW_THREADS//; s/Py_END_ALLOW_THREADS//' csrc/hotpath.c > $NOGIL/hotpath.c
gcc -O2 -shared -fPIC $(python3-config --includes) $NOGIL/hotpath.c -o $NOGIL/$SO
mkdir -p /tmp/gil_loops && cat > /tmp/gil_loops/loops.py <<'PY'
import sys, threading, eglcuda
sys.path.insert(0, "bench")
from stream_roundtrip import eglcuda_serial, eglcuda_serial_steps
d = eglcuda.Display.for_cuda_device(0)
n = 20000
print(f"{sys.argv[1]:7s} four {eglcuda_serial(d, 1920, 1080, n):6.2f}  steps {eglcuda_serial_steps(d, 1920, 1080, n):6.2f}"
      f"  bare {eglcuda_serial_steps(d, 1920, 1080, n, frame_numbers=False):6.2f}  ({eglcuda._hotpath.__file__})")
print("  threads:", [t.name for t in threading.enumerate()])
PY
B=bench/c/stream_roundtrip
gcc -O2 -o /tmp/rt_c $B.c -ldl -lpthread
for r in 1 2 3 4 5; do
  python3 /tmp/gil_loops/loops.py gil
  PYTHONPATH=$NOGIL:$PYTHONPATH python3 /tmp/gil_loops/loops.py nogil
  echo "C       same $(/tmp/rt_c 1920 1080 20000 serial_same)  counter $(/tmp/rt_c 1920 1080 20000 serial_counter)  plain $(/tmp/rt_c 1920 1080 20000 serial)"
done

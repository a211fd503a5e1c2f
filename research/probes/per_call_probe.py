# Research record (see research/README.md): runs against the current package (public API through bench/stream_roundtrip.py).
"""Probe: per-call medians of the serial round trip, C reference vs eglcuda's four calls, pinned to
one CPU (argv[1]), interleaved: which call carries eglcuda's extra time?"""
import os, pathlib, statistics, subprocess, sys

import _needs  # research/probes/_needs.py: a missing need is one line and status 2

_needs.answer_help(__doc__)
if len(sys.argv) > 1 and not sys.argv[1].isdigit():
    _needs.unmet(__file__, f"usage: python {_needs.program_path(__file__)} [CPU] (a CPU number to pin to, default 2)")
CPU = int(sys.argv[1]) if len(sys.argv) > 1 else 2
_needs.needs_cuda(__file__, "cuda", "cuda-stream")
_needs.needs_command(__file__, "gcc", "apt install gcc")
_needs.needs_cpus(__file__, 1, {CPU})
ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import eglcuda  # noqa: E402
from stream_roundtrip import build_c, eglcuda_breakdown  # noqa: E402

os.sched_setaffinity(0, {CPU})
binary = build_c()
display = eglcuda.Display.for_cuda_device(0)
W, H, N = 1920, 1080, 10000
c_runs, py_runs = [], []
for _ in range(5):
    out = subprocess.run([str(binary), str(W), str(H), str(N), "breakdown"], check=True, capture_output=True,
                         text=True).stdout.split()
    c_runs.append({k: float(v) for k, v in (item.split("=") for item in out if "=" in item and "us_per" not in item and "fps" not in item)})
    py_runs.append(eglcuda_breakdown(display, W, H, N))
c = {k: statistics.median(r[k] for r in c_runs) for k in c_runs[0]}
py = {k: statistics.median(r[k] for r in py_runs) for k in py_runs[0]}
print("C       " + "  ".join(f"{k} {v:.2f}" for k, v in c.items()) + f"  sum {sum(c.values()):.2f}")
print("eglcuda " + "  ".join(f"{k} {v:.2f}" for k, v in py.items()) + f"  sum {sum(py.values()):.2f}")
print(f"present +{py['present'] - c['present']:.2f}  acquire(+map+counter) +{py['acquire'] - c['acquire'] - c['map']:.2f}"
      f"  release +{py['release'] - c['release']:.2f}  return +{py['return_frame'] - c['return']:.2f}")
